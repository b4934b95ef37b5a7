"""examples/research, run as its README says, as a new user would: ``client.py``
embedded (a SQLite file, every agent in one process), then one ``meshpoint serve``
process per agent on PostgreSQL + NATS, ``meshpoint submit``, and a ``kill -9`` of
the research workflow's process mid-workflow: the answer comes once, and every
stage's agent ran once per stage (the critic once per round), counted in the event
log. The offline models (examples/research/models.py)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.acceptance.test_example_support import (
    Served,
    environment,
    read_until,
    served_example,
)

EXAMPLE = Path(__file__).parents[2] / "examples" / "research"
TOPIC = "Heat pumps in cold climates"
#: The brief the offline models write: the writer's draft, each point cited by the
#: reviser after the critic's first review; the critic's second review escalates.
BRIEF = (f"# {TOPIC}\n\n"
         f"- three findings on {TOPIC} (source: web)\n"
         f"- three findings on {TOPIC} (source: papers)")
AGENTS = ("research", "gather", "polish", "web", "papers", "writer", "critic", "reviser")

pytestmark = pytest.mark.timeout(300)


def copy_of_the_example(into: Path) -> Path:
    """The example's folder as a user has it (nothing it made when run before)."""
    target = into / "research"
    shutil.copytree(EXAMPLE, target, ignore=shutil.ignore_patterns(
        "*.db", "*.db-*", "__pycache__"))
    return target


def meshpoint_json(folder: Path, env: dict[str, str], *args: str) -> Any:
    done = subprocess.run(["meshpoint", *args, "--json"], cwd=folder, env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout)


def ran(events: list[dict[str, Any]]) -> dict[str, int]:
    """Model calls by agent (the stages' agents), and workflow stages started by
    ``<workflow>:<output_key>``: what ran how many times."""
    counted: Counter[str] = Counter()
    for e in events:
        if e["event_type"] != "step_start":
            continue
        if e["step_name"] == "model":
            counted[e["agent_id"]] += 1
        elif e["step_name"].startswith("stage:"):
            counted[f"{e['agent_id']}:{e['step_name'][6:]}"] += 1
    return dict(counted)


#: Once each; the critic twice (round 1 asks for sources, round 2 escalates), the
#: reviser once (round 2 ended at the critic).
RAN_ONCE_PER_STAGE = {
    "web": 1, "papers": 1, "writer": 1, "critic": 2, "reviser": 1,
    "research:gather": 1, "research:writer": 1, "research:polish": 1,
    "gather:web": 1, "gather:papers": 1, "polish:review": 2, "polish:reviser": 1}


def offline() -> dict[str, str]:
    """The README's shell, with the offline models (RESEARCH_MODEL unset)."""
    env = environment()
    env.pop("RESEARCH_MODEL", None)
    return env


def test_embedded_the_client_prints_the_reviewed_brief(tmp_path: Path) -> None:
    folder = copy_of_the_example(tmp_path)
    env = offline()
    done = subprocess.run([sys.executable, "client.py", TOPIC], cwd=folder, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("task research-")
    assert done.stdout.endswith(f"completed:\n{BRIEF}\n")
    task_id = lines[0].split()[1]
    # The README's next commands, on the SQLite file the run left.
    shown = meshpoint_json(folder, env, "tasks", "show", task_id, "--config", "mesh.yaml")
    assert shown["answer"] == BRIEF and shown["workflow"]["type"] == "sequential"
    assert [s["state"] for s in shown["workflow"]["stages"]] == ["done"] * 3
    events = meshpoint_json(folder, env, "events", "--config", "mesh.yaml",
                            "--limit", "1000")["events"]
    assert ran(events) == RAN_ONCE_PER_STAGE


@pytest.fixture
def deployment(tmp_path: Path, postgres_url: str, nats_url: str) -> Iterator[Served]:
    with served_example(copy_of_the_example(tmp_path), offline(), "res", postgres_url,
                        nats_url) as served:
        yield served


def test_served_a_kill_9_of_the_workflow_mid_workflow_runs_no_stage_twice(
        deployment: Served) -> None:
    folder, env = deployment.folder, deployment.env
    first = deployment.start("research", "research-a")
    for agent in AGENTS[1:]:
        deployment.start(agent, f"{agent}-a")
    with subprocess.Popen(["meshpoint", "submit", "research", TOPIC, "--timeout", "150"],
                          cwd=folder, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True) as submit:
        assert submit.stderr is not None and submit.stdout is not None
        task_id = read_until(submit.stderr, "submitted to agent research",
                             timeout_s=60)[-1].split(":")[0]
        # Mid-workflow: the gatherers answered, and the polish stage has not (the
        # writer, or the critic and the reviser, think a second a call).
        deadline = time.monotonic() + 60
        stages: list[str] = []
        while not (stages and stages[0] == "done" and stages[2] != "done"):
            assert time.monotonic() < deadline, stages
            workflow = meshpoint_json(folder, env, "tasks", "show", task_id)["workflow"]
            stages = [s["state"] for s in workflow["stages"]] if workflow else []
        first.kill()
        first.wait(10)
        deployment.start("research", "research-b")
        out, rest = submit.communicate(timeout=160)
    assert submit.returncode == 0, out + rest
    assert out == f"{BRIEF}\n"
    assert f"{task_id}: ended completed" in rest
    events = meshpoint_json(folder, env, "events", "--limit", "1000")["events"]
    assert ran(events) == RAN_ONCE_PER_STAGE
    # Started by the killed process, ended by the other one.
    by = [(e["state_snapshot"] or {}).get("instance_id") for e in events
          if e["thread_id"] == task_id]
    assert by[0] == "research-a" and by[-1] == "research-b", by
    shown = meshpoint_json(folder, env, "tasks", "show", task_id)
    assert shown["answer"] == BRIEF and shown["live"] is False
    assert [s["state"] for s in shown["workflow"]["stages"]] == ["done"] * 3
