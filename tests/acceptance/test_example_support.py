"""examples/support, run as its README says, as a new user would: ``client.py``
embedded (a SQLite file, every agent in one process), then ``meshpoint serve``
processes on PostgreSQL + NATS, ``meshpoint submit``, the ``approve`` command it
prints pasted into a shell, and a ``kill -9`` of the instance that runs the approved
refund: the refund is made once, and the task is answered once, by the other one.
The offline model here; the local one in ``test_llm_server.py``."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import pytest

from meshpoint.serve import READY
from tests.conftest import forget_namespace, pg_execute

EXAMPLE = Path(__file__).parents[2] / "examples" / "support"
REQUEST = "Refund order A-1002: 8900 cents, it arrived damaged"

pytestmark = pytest.mark.timeout(300)


def copy_of_the_example(into: Path) -> Path:
    """The example's folder as a user has it (nothing it made when run before)."""
    target = into / "support"
    shutil.copytree(EXAMPLE, target, ignore=shutil.ignore_patterns(
        "*.db", "*.db-*", "refunds.jsonl", "__pycache__"))
    return target


def environment(**extra: str) -> dict[str, str]:
    """The README's shell: the venv's ``bin`` first on PATH, the offline model, and
    no meshpoint setting of the test's own environment."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MESHPOINT_")}
    return {**env, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}",
            "SUPPORT_MODEL": "offline", **extra}


def refunds(folder: Path) -> list[dict[str, Any]]:
    ledger = folder / "refunds.jsonl"
    return [json.loads(line) for line in ledger.read_text().splitlines()] \
        if ledger.exists() else []


def client_py(folder: Path, env: dict[str, str], said: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "client.py", REQUEST], cwd=folder, env=env,
                          input=said, capture_output=True, text=True, timeout=120)


def test_embedded_the_client_approves_at_the_terminal_and_the_refund_is_made_once(
        tmp_path: Path) -> None:
    folder = copy_of_the_example(tmp_path)
    env = environment()
    approved = client_py(folder, env, "y\n")
    assert approved.returncode == 0, approved.stdout + approved.stderr
    lines = approved.stdout.splitlines()
    assert lines[0].startswith("task support-")
    assert 'refund {"order_id": "A-1002", "amount_cents": 8900} waits for approval' in lines
    assert "approve? [y/N] completed: Answer to " in approved.stdout  # after the prompt
    assert "refund(order_id=A-1002, amount_cents=8900) = refunded 8900 cents" in \
        approved.stdout
    assert [(r["order_id"], r["amount_cents"]) for r in refunds(folder)] == [("A-1002", 8900)]
    assert (folder / "support.db").exists()  # the tasks were checkpointed there
    # Denied, the refund is not made; the model is told, and answers.
    denied = client_py(folder, env, "n\n")
    assert denied.returncode == 0, denied.stdout + denied.stderr
    assert "the approver said no" in denied.stdout and len(refunds(folder)) == 1


class Served:
    """``meshpoint serve`` processes started as the README says (its shell)."""

    def __init__(self, folder: Path, env: dict[str, str]) -> None:
        self.folder, self.env = folder, env
        self.procs: dict[str, subprocess.Popen[str]] = {}
        self.files: list[IO[str]] = []

    def start(self, agent: str, instance_id: str) -> subprocess.Popen[str]:
        log = (self.folder / f"{instance_id}.log").open("w")
        self.files.append(log)
        proc = subprocess.Popen(
            ["meshpoint", "serve", "--agent", agent, "--instance-id", instance_id],
            cwd=self.folder, env=self.env, stdout=subprocess.PIPE, stderr=log, text=True)
        assert proc.stdout is not None
        self.files.append(proc.stdout)
        line = proc.stdout.readline()  # the process says when it takes work
        assert line.startswith(READY), self.log(instance_id)
        self.procs[instance_id] = proc
        return proc

    def log(self, instance_id: str) -> str:
        return (self.folder / f"{instance_id}.log").read_text()

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs.values():
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
        for file in self.files:
            file.close()


def read_until(stream: IO[str], needle: str, timeout_s: float) -> list[str]:
    """Lines of ``stream`` up to the first holding ``needle``."""
    deadline, lines = time.monotonic() + timeout_s, []
    while time.monotonic() < deadline:
        line = stream.readline()
        if not line:
            break
        lines.append(line.rstrip("\n"))
        if needle in line:
            return lines
    raise AssertionError(f"no line with {needle!r} in:\n" + "\n".join(lines))


@contextlib.contextmanager
def served_example(folder: Path, env: dict[str, str], prefix: str, postgres_url: str,
                   nats_url: str) -> Iterator[Served]:
    """An example's ``meshpoint serve`` processes on this test's PostgreSQL schema and
    NATS namespace (named ``prefix`` and a random suffix), stopped and cleaned after."""
    name = f"{prefix}{uuid.uuid4().hex[:10]}"
    served = Served(folder, env | dict(
        MESHPOINT_STORE_URL=postgres_url, MESHPOINT_STORE_SCHEMA=f"mp_{name}",
        MESHPOINT_BROKER_URL=nats_url, MESHPOINT_NAMESPACE=name,
        MESHPOINT_CONFIG="mesh.yaml"))
    try:
        yield served
    finally:
        served.stop()
        pg_execute(f"DROP SCHEMA IF EXISTS mp_{name} CASCADE")
        asyncio.run(forget_namespace(nats_url, name))


@pytest.fixture
def deployment(tmp_path: Path, postgres_url: str, nats_url: str) -> Iterator[Served]:
    with served_example(copy_of_the_example(tmp_path), environment(), "sup", postgres_url,
                        nats_url) as served:
        yield served


def test_served_the_printed_approve_command_and_a_kill_9_make_one_refund_and_one_answer(
        deployment: Served) -> None:
    folder, env = deployment.folder, deployment.env
    first = deployment.start("support", "support-a")
    deployment.start("policy", "policy-a")
    with subprocess.Popen(["meshpoint", "submit", "support", REQUEST, "--timeout", "150"],
                          cwd=folder, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True) as submit:
        assert submit.stderr is not None and submit.stdout is not None
        told = read_until(submit.stderr, "approve: ", timeout_s=60)
        task_id = told[0].split(":")[0]
        assert told[0] == f"{task_id}: submitted to agent support (namespace " \
                          f"{env['MESHPOINT_NAMESPACE']})"
        assert any('refund {"amount_cents": 8900, "order_id": "A-1002"}' in t for t in told)
        command = told[-1].split("approve: ", 1)[1]
        assert command.startswith(f"meshpoint tasks approve {task_id} ")
        # The printed command, pasted into a shell; then the instance that took the
        # approval is killed while it runs the turn on (the model thinks 1.5 s a call).
        approved = subprocess.run(command, shell=True, cwd=folder, env=env,
                                  capture_output=True, text=True, timeout=60)
        assert approved.returncode == 0, approved.stdout + approved.stderr
        first.kill()
        first.wait(10)
        deployment.start("support", "support-b")
        out, rest = submit.communicate(timeout=160)
    assert submit.returncode == 0, out + rest
    assert out.startswith(f"Answer to {REQUEST!r}:")
    assert "refund(order_id=A-1002, amount_cents=8900) = refunded 8900 cents" in out
    assert f"{task_id}: ended completed" in rest
    # One refund, whichever step the kill came at; the other instance ended the task.
    assert [r["idempotency_key"].split("/")[0] for r in refunds(folder)] == [task_id]
    shown = subprocess.run(["meshpoint", "events", "--task", task_id, "--json"],
                           cwd=folder, env=env, capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0, shown.stderr
    events = json.loads(shown.stdout)["events"]
    # Each event names the instance, as serve was given it: the task was started by
    # support-a and ended by support-b. The refund ran on whichever held the task when
    # it was approved, once: at most one logged run (support-a's log is buffered, and a
    # kill -9 loses what it had not written yet; the ledger above is the count).
    by = [(e["state_snapshot"] or {}).get("instance_id") for e in events]
    assert by[0] == "support-a" and by[-1] == "support-b", by
    ran = [(e["state_snapshot"] or {}).get("instance_id") for e in events
           if e["step_name"] == "tool:refund" and e["event_type"] == "step_complete"]
    assert len(ran) <= 1, ran
    # In the schema the README's variable names (a missing table, or none, fails).
    pg_execute(f"SELECT 1 / count(*) FROM {env['MESHPOINT_STORE_SCHEMA']}.agent_events")
    # Ended, the task is still found: with its answer.
    listed = subprocess.run(["meshpoint", "tasks", "show", task_id, "--json"], cwd=folder,
                            env=env, capture_output=True, text=True, timeout=60)
    assert listed.returncode == 0, listed.stderr
    assert "refunded 8900 cents" in json.loads(listed.stdout)["answer"]
