"""Mid-turn checkpoints (issue 14 §2): an instance killed in the middle of a long
turn costs nothing already done, on a SQLite file and on PostgreSQL."""

from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import replace
from typing import Any

import pytest

from meshpoint import a2a
from meshpoint.llm import ScriptedModel, ToolSpec
from meshpoint.llm.base import ModelResponse
from meshpoint.runtime import Agent, LocalTool, ToolCallInfo
from meshpoint.runtime.agent import CheckpointPolicy
from meshpoint.store import SqlStore
from tests.integration.mesh import Mesh, eventually
from tests.integration.test_approvals import SideEffects, approving
from tests.integration.test_runtime import no_rows_left

#: Two rounds of three local tool calls each, then the answer: 6 tool calls and 3
#: model calls.
TOOLS = ("fetch", "parse", "store")


class Crashing:
    """Counts every model call and tool run that completed, per task and step, and
    kills the instance running the task when the ``kill_at``-th step starts."""

    def __init__(self, mesh: Mesh, kill_at: str | None) -> None:
        self.mesh = mesh
        self.kill_at = kill_at
        self.started: list[str] = []
        self.model_calls: Counter[tuple[str, int]] = Counter()
        self.tool_runs: Counter[str] = Counter()
        self.kills = 0
        self.inner = ScriptedModel("worker", rounds=2)
        self.name = "crashing"

    async def _maybe_die(self, step: str, task_id: str | None) -> None:
        self.started.append(step)
        if step != self.kill_at or self.kills:
            return
        self.kills += 1
        victim = next(i for i in self.mesh.instances if i.running and
                      (task_id is None or task_id in i.active))
        asyncio.get_running_loop().create_task(victim.kill())
        await asyncio.Event().wait()  # cancelled by the kill

    async def complete(self, messages: list[dict[str, Any]],
                       tools: list[ToolSpec]) -> ModelResponse:
        done = sum(1 for m in messages if m.get("role") == "tool")
        await self._maybe_die(f"model-{done}", None)
        response = await self.inner.complete(messages, tools)
        self.model_calls[(str(messages[0]["content"]), done)] += 1
        return response

    def tool(self, name: str) -> LocalTool:
        async def run(arguments: dict[str, Any], call: ToolCallInfo) -> str:
            await self._maybe_die(f"{name}-{call.call_id}", call.task_id)
            self.tool_runs[call.idempotency_key] += 1
            return f"{name} done"

        return LocalTool(name, f"The {name} step.", run)


def worker(crashing: Crashing, policy: CheckpointPolicy) -> Agent:
    return Agent("worker", crashing, tools=[crashing.tool(n) for n in TOOLS],
                 checkpoint=policy)


#: Every step of the task, in order (the scripted model calls its tools in this order).
STEPS = ["model-0", "fetch-call_0_0", "store-call_0_1", "parse-call_0_2", "model-3",
         "fetch-call_1_0", "store-call_1_1", "parse-call_1_2", "model-6"]


@pytest.mark.parametrize("kill_at", STEPS)
async def test_a_crash_mid_turn_repeats_no_completed_call(
        mesh: Mesh, live_store: SqlStore, kill_at: str) -> None:
    """With after_tools, the model's plan and each tool's result are checkpointed as
    they complete. The instance running the task is killed as one step starts; the
    task is taken over (by redelivery before its first checkpoint, by recovery after)
    and every model call and tool run completed before the kill is not made again."""
    crashing = Crashing(mesh, kill_at)
    await mesh.run(worker(crashing, CheckpointPolicy(after_tools=True)), 2)
    answer = await mesh.client.ask("worker", "Run the pipeline", timeout_s=20)
    assert answer.status.state is a2a.TaskState.COMPLETED
    assert crashing.kills == 1
    assert len(crashing.tool_runs) == 6 and set(crashing.tool_runs.values()) == {1}, \
        crashing.tool_runs
    assert len(crashing.model_calls) == 3 and set(crashing.model_calls.values()) == {1}, \
        crashing.model_calls
    assert len(mesh.client.answers[next(iter(mesh.client.answers))]) == 1
    await no_rows_left(live_store)


async def test_without_mid_turn_checkpoints_a_crash_repeats_the_turn(
        mesh: Mesh, live_store: SqlStore) -> None:
    """The control: the same crash with the defaults re-runs the turn from the
    request, so the steps before it run twice (and a task that never pauses writes
    nothing)."""
    crashing = Crashing(mesh, "fetch-call_1_0")
    await mesh.run(worker(crashing, CheckpointPolicy()), 2)
    answer = await mesh.client.ask("worker", "Run the pipeline", timeout_s=20)
    assert answer.status.state is a2a.TaskState.COMPLETED
    assert max(crashing.tool_runs.values()) == 2 and max(crashing.model_calls.values()) == 2
    assert not any(i.stats.counts["mid_turn_checkpoints"] for i in mesh.instances)


@pytest.mark.parametrize("policy", [CheckpointPolicy(before_llm=True),
                                    CheckpointPolicy(strategy="interval", interval=2),
                                    CheckpointPolicy(strategy="hybrid", interval=1,
                                                     after_tools=True)])
async def test_each_strategy_checkpoints_where_it_says(
        mesh: Mesh, live_store: SqlStore, policy: CheckpointPolicy) -> None:
    crashing = Crashing(mesh, None)
    await mesh.run(worker(crashing, policy))
    answer = await mesh.client.ask("worker", "Run the pipeline", timeout_s=20)
    assert answer.status.state is a2a.TaskState.COMPLETED
    written = mesh.instances[0].stats.counts["mid_turn_checkpoints"]
    # 3 model calls; 2 rounds of 3 tools; a checkpoint with nothing new is skipped.
    expected = {CheckpointPolicy(before_llm=True): 3,
                CheckpointPolicy(strategy="interval", interval=2): 1,  # before the 3rd
                # after each plan and tool (8), and before the 2nd and 3rd model calls,
                # whose conversation has the round's results injected since (2)
                CheckpointPolicy(strategy="hybrid", interval=1, after_tools=True): 10}
    assert written == expected[policy]
    await no_rows_left(live_store)


async def test_a_working_task_is_listed_and_canceled_where_it_runs(
        mesh: Mesh, live_store: SqlStore) -> None:
    gate = asyncio.Event()

    async def slow(arguments: dict[str, Any]) -> str:
        await gate.wait()
        return "done"

    agent = Agent("worker", ScriptedModel(), checkpoint=CheckpointPolicy(after_tools=True),
                  tools=[LocalTool("slow", "Slow.", slow)])
    await mesh.run(agent, 2)
    request_id = await mesh.client.submit("worker", "Run it")
    task_id = mesh.client.task_id("worker", request_id)

    async def working() -> bool:
        return [t.status for t in await live_store.list_paused_tasks()] == ["working"]

    await eventually(working, what="the task checkpointed as working")
    await mesh.client.cancel("worker", task_id)  # reaches the instance running it
    await eventually(lambda: any(run.ctx.cancellation_event.is_set()
                                 for i in mesh.instances for run in i.active.values()),
                     what="the cancel to reach the running turn")
    gate.set()  # the turn stops at its next step
    answer = await mesh.client.wait(request_id, timeout_s=10)
    assert answer.status.state is a2a.TaskState.CANCELED
    await no_rows_left(live_store)


class DiesAfterTheTool(ScriptedModel):
    """The scripted model, but the instance running the task is killed during the
    first model call that follows a tool's run (its result is in the conversation)."""

    def __init__(self, mesh: Mesh) -> None:
        super().__init__()
        self.mesh = mesh
        self.kills = 0

    async def complete(self, messages: list[dict[str, Any]],
                       tools: list[ToolSpec]) -> ModelResponse:
        if not self.kills and any(m.get("role") == "tool" for m in messages):
            self.kills += 1
            victim = next(i for i in self.mesh.instances if i.running and i.active)
            asyncio.get_running_loop().create_task(victim.kill())
            await asyncio.Event().wait()  # cancelled by the kill
        return await super().complete(messages, tools)


@pytest.mark.parametrize("path", ["plain", "approved", "approved-edited"])
async def test_after_tools_protects_every_tool_run_from_a_crash_in_the_next_model_call(
        mesh: Mesh, live_store: SqlStore, path: str) -> None:
    """With after_tools, a tool that ran (at once, or once a human approved it, as the
    model gave its arguments or as the human edited them) is checkpointed before the
    next model call: the instance dies during that call, another takes the task over,
    and the tool has run exactly once (a human who approved one booking gets one)."""
    effects = SideEffects()
    model = DiesAfterTheTool(mesh)
    agent = replace(approving(effects, needs=path != "plain"), model=model,
                    checkpoint=CheckpointPolicy(after_tools=True))
    await mesh.run(agent, 2)
    request_id = await mesh.client.submit("coordinator", "Book the flight")
    if path != "plain":
        pending = await mesh.client.wait_input(request_id, timeout_s=10)
        task_id = mesh.client.task_id("coordinator", request_id)
        edited = {"query": "Book the cheaper flight"} if path == "approved-edited" else None
        await mesh.client.approve(task_id, pending[0]["call_id"], edited, by="alice")
    answer = await mesh.client.wait(request_id, timeout_s=20)
    assert answer.status.state is a2a.TaskState.COMPLETED
    assert model.kills == 1
    assert list(effects.runs.values()) == [1], effects.runs
    expected = "Book the cheaper flight" if path == "approved-edited" else "Book the flight"
    assert list(effects.arguments.values()) == [{"query": expected}]
    assert len(mesh.client.answers[request_id]) == 1
    await no_rows_left(live_store)
