"""``meshpoint tasks resume`` and ``meshpoint alerts``, run as subprocesses against the
store of a running mesh, on a SQLite file and on PostgreSQL."""

from __future__ import annotations

import asyncio
from typing import Any

from meshpoint import a2a
from meshpoint.llm import ScriptedModel
from meshpoint.llm.base import ModelResponse, ToolSpec
from meshpoint.runtime import Agent
from meshpoint.runtime.agent import CheckpointPolicy, RecoveryPolicy
from meshpoint.store import SqlStore
from tests.acceptance.test_cli_tasks import ok_json, tasks, where  # noqa: F401 (a fixture)
from tests.integration.mesh import Mesh, eventually


class KillsTwice(ScriptedModel):
    """The scripted model, but its first two calls kill the instance running the task
    (a crash loop an operator then fixes)."""

    def __init__(self, mesh: Mesh) -> None:
        super().__init__("worker")
        self.mesh = mesh
        self.kills = 0

    async def complete(self, messages: list[dict[str, Any]],
                       tools: list[ToolSpec]) -> ModelResponse:
        if self.kills < 2:
            self.kills += 1
            victim = next(i for i in self.mesh.instances if i.running and i.active)
            asyncio.get_running_loop().create_task(victim.kill())
            await asyncio.Event().wait()
        return await super().complete(messages, tools)


async def test_an_operator_resumes_a_blocked_task_and_reads_its_alert(
        mesh: Mesh, live_store: SqlStore, where: list[str]) -> None:  # noqa: F811
    agent = Agent("worker", KillsTwice(mesh), checkpoint=CheckpointPolicy(before_llm=True),
                  recovery=RecoveryPolicy(max_recoveries=1, breaker_failures=0))
    await mesh.run(agent, 3)
    request_id = await mesh.client.submit("worker", "Summarise the report")
    task_id = mesh.client.task_id("worker", request_id)

    async def status() -> list[str]:
        return [t.status for t in await live_store.list_paused_tasks()]

    async def blocked() -> bool:
        return await status() == ["blocked"]

    await eventually(blocked, timeout_s=20, what="the task blocked")
    listed = await ok_json(where, "alerts", "--agent", "worker")
    assert [(a["kind"], a["task_id"]) for a in listed["alerts"]] == [("blocked", task_id)]
    assert "max_recoveries" in listed["alerts"][0]["text"]

    done = await ok_json(where, "resume", task_id)
    assert (done["was"], done["status"], done["agent"]) == ("blocked", "resuming", "worker")
    answer = await mesh.client.wait(request_id, timeout_s=20)
    assert answer.status.state is a2a.TaskState.COMPLETED
    code, _, err = await tasks(where, "resume", task_id)
    assert code == 1 and task_id in err, "an ended task is not resumed"


async def test_alerts_follow_prints_an_alert_as_it_is_raised(tmp_path: Any) -> None:
    """``meshpoint alerts --follow --json``: one JSON line per alert, the one raised
    after it printed the first too, and only alerts (not the other events of the log)."""
    import json
    import signal
    import subprocess
    import sys

    from meshpoint import open_store
    from meshpoint.events.log import EventStore
    from tests.acceptance.test_cli_history import _line

    url = f"sqlite:///{tmp_path / 'alerts.db'}"
    async with open_store(url):
        pass  # migrated
    follower = subprocess.Popen(
        # --since: whether the alert is raised before the follower has read the log or
        # after, it is printed once (no race with the process's start).
        [sys.executable, "-m", "meshpoint.cli", "alerts", "--follow", "--json", "--since",
         "1h", "--url", url],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    async def raise_alert(task_id: str) -> None:
        async with open_store(url, migrate=False) as store, EventStore(store) as log:
            log.log_event("worker", task_id, "step_complete", step_name="not an alert")
            log.log_event("worker", task_id, "alert", step_name="blocked", output_data={
                "kind": "blocked", "task_id": task_id, "text": "stuck"})

    try:
        for task_id in ("t1", "t2"):  # t2 after the follower printed t1: by its polls
            await raise_alert(task_id)
            alert = json.loads(await asyncio.to_thread(_line, follower))
            assert (alert["kind"], alert["task_id"]) == ("blocked", task_id), alert
    finally:
        follower.send_signal(signal.SIGINT)
        follower.communicate(timeout=30)
    assert follower.returncode == 0
