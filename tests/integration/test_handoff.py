"""Handoff (issue 28; docs/handoff.md): a long task runs as a chain of fresh-context
iterations, each started on any instance from a verified checkpoint and a continuation
prompt, never from the old conversation; the caller sees one task and one answer. On
a SQLite file and on PostgreSQL (and NATS where the broker carries the handoff)."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from typing import Any

import pytest

from meshpoint import a2a
from meshpoint.context import TaskExecutionContext
from meshpoint.errors import ModelError
from meshpoint.llm import ScriptedModel, ToolSpec
from meshpoint.llm.base import CONTINUATION_HEADER, ModelResponse
from meshpoint.runtime import Agent, LocalTool, Peer
from meshpoint.runtime.options import HandoffPolicy, Phase
from meshpoint.store import SqlStore
from tests.integration.mesh import ManualPeer, Mesh, eventually
from tests.integration.test_approvals import SideEffects, approving, paused
from tests.integration.test_history import flip_a_byte
from tests.integration.test_runtime import no_rows_left

TOOLS = ("fetch", "parse")


def tools() -> list[LocalTool]:
    """Two tools whose results are long (a page each): they fill a context fast."""
    def tool(name: str) -> LocalTool:
        return LocalTool(name, f"The {name} step.",
                         lambda args: f"{name} of {args['query']}: " + "lorem ipsum " * 35)

    return [tool(name) for name in TOOLS]


class Watching:
    """A scripted model that records, per call, the conversation it was shown."""

    def __init__(self, inner: ScriptedModel) -> None:
        self.inner = inner
        self.name = inner.name
        self.context_window = inner.context_window
        self.shown: list[list[dict[str, Any]]] = []

    async def complete(self, messages: list[dict[str, Any]],
                       tools: list[ToolSpec]) -> ModelResponse:
        self.shown.append(messages)
        return await self.inner.complete(messages, tools)


async def history(store: SqlStore, task_id: str) -> list[Any]:
    """The task's records, oldest first, once it ended (its caller is answered just
    before its rows go and its last record is written)."""
    await no_rows_left(store)
    return list(reversed(await store.history.get_checkpoint_history(task_id)))


async def test_context_utilization_hands_off_before_the_window_fills(
        mesh: Mesh, live_store: SqlStore) -> None:
    """A task of six rounds on a model with a small context window hands off whenever
    the next prompt would fill more than 0.70 of it: it runs as several iterations,
    each starting from the continuation prompt alone, and answers once with every
    round's results. Each handoff record carries the prompt; each next iteration's
    first record names the handoff record it read and counts one more iteration."""
    model = Watching(ScriptedModel("worker", rounds=6, context_window=1000))
    agent = Agent("worker", model, tools=tools(), handoff=HandoffPolicy())
    await mesh.run(agent, 2)
    answer = await mesh.client.ask("worker", "Survey: alpha, beta", timeout_s=30)
    assert answer.status.state is a2a.TaskState.COMPLETED, answer
    text = answer.status.message.text  # type: ignore[union-attr]
    for round_no in range(1, 7):
        assert f"(round {round_no})" in text, text
    assert len(mesh.client.answers[next(iter(mesh.client.answers))]) == 1
    task_id = answer.id
    records = await history(live_store, task_id)
    handoffs = [r for r in records if r.execution_state.phase == "handoff"]
    starts = [r for r in records if r.execution_state.phase == "iteration"]
    assert len(handoffs) >= 2 and len(starts) == len(handoffs), \
        [r.execution_state.phase for r in records]
    for number, (handoff, start) in enumerate(zip(handoffs, starts, strict=True), 1):
        assert handoff.metadata.iteration == number
        assert start.metadata.iteration == number + 1
        received = start.extensions["handoff_received"]
        assert received["record"] == handoff.metadata.checkpoint_id
        assert start.recovery.last_successful_state == handoff.metadata.checkpoint_id
        detail = handoff.extensions["handoff"]
        assert detail["trigger"] == "context_utilization"
        assert detail["detail"]["utilization"] < 0.70
        assert handoff.recovery.continuation_prompt.startswith(CONTINUATION_HEADER)
    assert records[-1].execution_state.phase == "completed"
    assert records[-1].metadata.iteration == len(handoffs) + 1
    # Every iteration after the first started from the continuation prompt alone.
    fresh = [shown for shown in model.shown if str(shown[0]["content"]).startswith(
        CONTINUATION_HEADER)]
    assert fresh and all(len([m for m in shown if m["role"] == "user"]) == 1
                         for shown in fresh)
    assert (await live_store.history.verify_task(task_id)).ok
    await no_rows_left(live_store)


async def test_the_model_may_ask_for_a_handoff(mesh: Mesh, live_store: SqlStore) -> None:
    """The built-in ``handoff(reason)`` tool ends the iteration before the next model
    call; the task goes on in a fresh one and completes."""
    model = ScriptedModel("worker", rounds=3, handoff_after=1)
    await mesh.run(Agent("worker", model, tools=tools(), handoff=HandoffPolicy(
        context_utilization=None)), 2)
    answer = await mesh.client.ask("worker", "Survey: alpha", timeout_s=30)
    assert answer.status.state is a2a.TaskState.COMPLETED, answer
    records = await history(live_store, answer.id)
    triggers = [r.extensions["handoff"]["trigger"] for r in records
                if r.execution_state.phase == "handoff"]
    assert triggers == ["explicit", "explicit"], triggers
    assert "(round 3)" in answer.status.message.text  # type: ignore[union-attr]
    await no_rows_left(live_store)


class Failing:
    """A model whose first ``failures`` calls raise ModelError."""

    def __init__(self, failures: int) -> None:
        self.inner = ScriptedModel("flaky", rounds=1)
        self.name = "flaky"
        self.failures = failures
        self.calls = 0

    async def complete(self, messages: list[dict[str, Any]],
                       tools: list[ToolSpec]) -> ModelResponse:
        self.calls += 1
        if self.calls <= self.failures:
            raise ModelError(f"the endpoint answered 503 (call {self.calls})")
        return await self.inner.complete(messages, tools)


async def test_model_errors_are_retried_and_past_the_limit_hand_off(
        mesh: Mesh, live_store: SqlStore) -> None:
    """Each model error is checkpointed (phase ``error``, its text) and retried, not
    a failed task; the third in a row, past ``consecutive_errors=2``, hands off with
    the errors in the continuation prompt, and the next iteration completes."""
    model = Failing(3)
    await mesh.run(Agent("worker", model, tools=tools(), handoff=HandoffPolicy(
        consecutive_errors=2, context_utilization=None)))
    answer = await mesh.client.ask("worker", "Survey: alpha", timeout_s=30)
    assert answer.status.state is a2a.TaskState.COMPLETED, answer
    records = await history(live_store, answer.id)
    phases = [r.execution_state.phase for r in records]
    assert phases[:4] == ["error", "error", "error", "handoff"], phases
    assert "503 (call 1)" in records[0].extensions["error"]
    handoff = records[3]
    assert handoff.extensions["handoff"]["trigger"] == "consecutive_errors"
    assert "503 (call 3)" in handoff.recovery.continuation_prompt
    assert phases[-1] == "completed"
    await no_rows_left(live_store)


async def test_without_a_handoff_policy_a_model_error_still_fails_the_task(
        mesh: Mesh, live_store: SqlStore) -> None:
    await mesh.run(Agent("worker", Failing(1), tools=tools()))
    answer = await mesh.client.ask("worker", "Survey: alpha", timeout_s=30)
    assert answer.status.state is a2a.TaskState.FAILED


async def test_handoffs_are_taken_once_across_instances_on_each_broker(
        broker_mesh: Mesh, live_store: SqlStore) -> None:
    """Eight long tasks on three instances: every handoff is taken by exactly one
    instance (whichever the broker gives it to), every task answers once."""
    mesh = broker_mesh
    await mesh.run(Agent("worker", ScriptedModel("worker", rounds=4, context_window=1000),
                         tools=tools(), handoff=HandoffPolicy()), 3)
    requests = [await mesh.client.submit("worker", f"Survey: topic {n}") for n in range(8)]
    answers = [await mesh.client.wait(r, timeout_s=60) for r in requests]
    assert {a.status.state for a in answers} == {a2a.TaskState.COMPLETED}
    assert all(len(mesh.client.answers[r]) == 1 for r in requests)
    taken = Counter(task for _, task in mesh.events("handoff_taken"))
    started = Counter(task for _, task in mesh.events("iteration_started"))
    handed = Counter(task for _, task in mesh.events("handed_off"))
    assert handed and taken == handed == started, (handed, taken, started)
    await no_rows_left(live_store)


async def test_a_tampered_handoff_record_is_never_continued(
        mesh: Mesh, live_store: SqlStore) -> None:
    """A task handed off whose handoff record was changed in the database is not
    carried on: the taker's restore verifies the chain and blocks the task."""
    ctx = TaskExecutionContext("t1", {"agent": "worker"})
    ctx.append_session_event({"role": "user", "content": "Survey: alpha"})
    ctx.flags["handoff"] = {"trigger": "explicit", "reason": "test", "iteration": 1,
                            "prompt": f"{CONTINUATION_HEADER} (test)", "accomplished": []}
    await live_store.checkpoint_task(ctx, "worker", status="handoff")
    await flip_a_byte(live_store, 1)
    model = Watching(ScriptedModel("worker"))
    instance, = await mesh.run(Agent("worker", model, tools=tools(), handoff=HandoffPolicy()))
    await mesh.broker.publish(instance.subjects.handoff("worker"), b'{"task_id": "t1"}')
    await eventually(lambda: bool(mesh.events("blocked")), what="the task blocked")
    assert model.shown == []
    summaries = await live_store.list_paused_tasks()
    assert [s.status for s in summaries] == ["blocked"]


@pytest.mark.parametrize("body", [b"not json", b'{"task": 1}', b'{"task_id": ""}',
                                  b'{"task_id": "' + b"x" * 300 + b'"}'])
async def test_a_malformed_handoff_message_is_dead_lettered(
        mesh: Mesh, live_store: SqlStore, body: bytes) -> None:
    instance, = await mesh.run(Agent("worker", ScriptedModel("worker"), tools=tools(),
                                     handoff=HandoffPolicy()))
    await mesh.broker.publish(instance.subjects.handoff("worker"), body)
    await eventually(lambda: bool(mesh.dead_letters), what="the dead letter")


# -- a crash at each step of the protocol -----------------------------------------------

#: Where the instance doing the step is killed: after the handoff's checkpoint commits
#: (before its message is published), after the message is published (before the
#: request is acknowledged), as the taker starts the next iteration (lease taken, not
#: written), and during the next iteration's first model call.
KILL_POINTS = ("after_commit", "after_publish", "during_take", "first_turn")


class Killer:
    """Kills, once, the instance at ``point`` of the first handoff (see KILL_POINTS)."""

    def __init__(self, mesh: Mesh, point: str) -> None:
        self.mesh, self.point, self.kills = mesh, point, 0
        self.chosen = False

    def first(self) -> bool:
        """True once: chosen before any await, so that the next iteration's handoff,
        which may begin before the first one's publish returns, is not taken for it."""
        chosen, self.chosen = self.chosen, True
        return not chosen

    def victim(self, instance_id: str | None = None, task_id: str | None = None) -> Any:
        """The instance of that id, or the one running that task (chosen before an
        await, while only the publisher of its handoff runs it)."""
        return next(i for i in self.mesh.instances if i.running and (
            i.instance_id == instance_id if instance_id else task_id in i.active))

    async def die(self, victim: Any) -> None:
        self.kills += 1
        asyncio.get_running_loop().create_task(victim.kill())
        await asyncio.Event().wait()  # cancelled by the kill

    def install(self, store: SqlStore, model: Watching) -> None:
        broker, publish = self.mesh.broker, self.mesh.broker.publish

        async def publishing(subject: str, data: bytes, *args: Any, **kwargs: Any) -> None:
            handoff = ".agent.handoff." in subject and \
                self.point in ("after_commit", "after_publish") and self.first()
            victim = self.victim(task_id=json.loads(data)["task_id"]) if handoff else None
            if handoff and self.point == "after_commit":
                await self.die(victim)
            await publish(subject, data, *args, **kwargs)
            if handoff and self.point == "after_publish":
                await self.die(victim)

        broker.publish = publishing  # type: ignore[method-assign]
        begin = store.begin_iteration

        async def beginning(ctx: Any, agent: str, *, lease_owner: str, **kw: Any) -> None:
            if self.point == "during_take" and not self.kills:
                await self.die(self.victim(instance_id=lease_owner.split("#")[0]))
            await begin(ctx, agent, lease_owner=lease_owner, **kw)

        store.begin_iteration = beginning  # type: ignore[method-assign]
        complete = model.complete

        async def completing(messages: list[dict[str, Any]], tools: list[ToolSpec]
                             ) -> ModelResponse:
            if self.point == "first_turn" and not self.kills and str(
                    messages[0]["content"]).startswith(CONTINUATION_HEADER):
                running = next(i for i in self.mesh.instances if i.running and any(
                    run.ctx.session_events and run.ctx.session_events[0] is not None
                    and run.ctx.session_events[0]["content"] == messages[0]["content"]
                    for run in i.active.values()))
                await self.die(running)
            return await complete(messages, tools)

        model.complete = completing  # type: ignore[method-assign]


@pytest.mark.parametrize("point", KILL_POINTS)
async def test_a_crash_at_any_step_gives_one_next_iteration_and_one_answer(
        broker_mesh: Mesh, live_store: SqlStore, point: str) -> None:
    """The instance doing a step of the first handoff is killed there (in-process, as a
    crash: nothing acknowledged, no lease released); the others carry the task on. Each
    handoff is followed by exactly one next iteration, the iterations are numbered
    1, 2, ... without a gap or a repeat, and the caller gets one answer with every
    round's results. On each store and each broker."""
    mesh = broker_mesh
    model = Watching(ScriptedModel("worker", rounds=3, handoff_after=1))
    killer = Killer(mesh, point)
    killer.install(live_store, model)
    await mesh.run(Agent("worker", model, tools=tools(), handoff=HandoffPolicy(
        context_utilization=None)), 3)
    answer = await mesh.client.ask("worker", "Survey: alpha", timeout_s=60)
    assert killer.kills == 1
    assert answer.status.state is a2a.TaskState.COMPLETED, answer
    assert "(round 3)" in answer.status.message.text  # type: ignore[union-attr]
    assert len(mesh.client.answers[next(iter(mesh.client.answers))]) == 1
    records = await history(live_store, answer.id)
    handoffs = [r.metadata.iteration for r in records if r.execution_state.phase == "handoff"]
    starts = [r.metadata.iteration for r in records if r.execution_state.phase == "iteration"]
    assert handoffs == [1, 2] and starts == [2, 3], [
        (r.metadata.iteration, r.execution_state.phase) for r in records]
    assert records[-1].execution_state.phase == "completed"
    assert (await live_store.history.verify_task(answer.id)).ok


async def test_a_phase_complete_hands_the_task_to_the_next_phases_agent(
        mesh: Mesh, live_store: SqlStore) -> None:
    """An agent declares its phases; when the model says one is complete, the next
    phase's agent takes the task in a fresh iteration told the phase's instruction,
    and answers the original caller. The chain goes on across the two agents."""
    phases = (Phase("research"), Phase("write", agent="writer",
                                       instruction="Write the report from the findings."))
    researcher_model = Watching(ScriptedModel("researcher", rounds=2, phase_after=1))
    writer_model = Watching(ScriptedModel("writer", rounds=2))
    await mesh.run(Agent("researcher", researcher_model, tools=tools(), handoff=HandoffPolicy(
        phases=phases, context_utilization=None)), 2)
    await mesh.run(Agent("writer", writer_model, tools=tools(), handoff=HandoffPolicy(
        phases=phases, context_utilization=None)), 2)
    answer = await mesh.client.ask("researcher", "Survey: alpha", timeout_s=30)
    assert answer.status.state is a2a.TaskState.COMPLETED, answer
    text = answer.status.message.text  # type: ignore[union-attr]
    assert "(round 1)" in text and "(round 2)" in text, text
    assert len(mesh.client.answers[next(iter(mesh.client.answers))]) == 1
    records = await history(live_store, answer.id)
    assert [(r.metadata.agent_id, r.execution_state.phase) for r in records] == [
        ("researcher", "handoff"), ("writer", "iteration"), ("writer", "completed")]
    detail = records[0].extensions["handoff"]
    assert (detail["trigger"], detail["detail"]["next_phase"]) == ("phase_complete", "write")
    prompt = writer_model.shown[0][0]["content"]
    assert "Write the report from the findings." in prompt and "## The next phase" in prompt
    assert (await live_store.history.verify_task(answer.id)).ok


def approving_with_handoff(effects: SideEffects, peer: str) -> Agent:
    """The approvals tests' coordinator, with a peer, making two rounds (each: the peer
    and a tool that needs approval) and handing off after each round."""
    base = approving(effects, peers=[Peer(peer, timeout_s=30)])
    return Agent(base.name, ScriptedModel("coordinator", rounds=2, handoff_after=1),
                 tools=base.tools, peers=base.peers,
                 handoff=HandoffPolicy(context_utilization=None))


async def test_approvals_peers_and_cancel_work_in_a_later_iteration(
        mesh: Mesh, live_store: SqlStore) -> None:
    """Iteration 2 of a task pauses for a human and a peer as iteration 1 did, on any
    instance; the approved tool runs once per iteration's call; the caller sees one
    task throughout. A second task is canceled while iteration 2 waits: canceled,
    nothing left."""
    effects = SideEffects()
    peer = await ManualPeer(mesh, "researcher").start()
    await mesh.run(approving_with_handoff(effects, "researcher"), 2)
    request_id, task_id, pending = await paused(mesh, "Send the report")
    for iteration in (1, 2):
        await eventually(lambda n=iteration: len(peer.requests) == n, what="the peer's request")
        await mesh.client.approve(task_id, pending[0]["call_id"])
        await peer.answer(list(peer.requests)[-1], f"figures {iteration}")
        if iteration == 1:
            pending = await mesh.client.wait_input(request_id, timeout_s=20)
    answer = await mesh.client.wait(request_id, timeout_s=20)
    assert answer.status.state is a2a.TaskState.COMPLETED, answer
    assert sorted(effects.runs.values()) == [1, 1]
    records = await history(live_store, task_id)
    assert [r.metadata.iteration for r in records if r.execution_state.phase ==
            "input_required"] == [1, 2]

    request_id, task_id, pending = await paused(mesh, "Send another report")
    await eventually(lambda: len(peer.requests) == 3, what="the peer's request")
    await mesh.client.approve(task_id, pending[0]["call_id"])
    await peer.answer(list(peer.requests)[-1], "figures")
    await mesh.client.wait_input(request_id, timeout_s=20)  # iteration 2 waits
    await mesh.client.cancel("coordinator", task_id)
    answer = await mesh.client.wait(request_id, timeout_s=20)
    assert answer.status.state is a2a.TaskState.CANCELED
    await no_rows_left(live_store)


async def test_a_models_summary_is_the_continuation_when_asked(
        mesh: Mesh, live_store: SqlStore) -> None:
    """``continuation: model``: the agent's model writes what the next iteration starts
    from (a call without tools); its tokens are counted; it is in the handoff record."""
    model = Watching(ScriptedModel("worker", rounds=2, handoff_after=1))
    await mesh.run(Agent("worker", model, tools=tools(), handoff=HandoffPolicy(
        context_utilization=None, continuation="model")))
    answer = await mesh.client.ask("worker", "Survey: alpha", timeout_s=30)
    assert answer.status.state is a2a.TaskState.COMPLETED, answer
    summaries = [shown for shown in model.shown if str(
        shown[-1]["content"]).startswith("Your context is handed to a fresh one")]

    assert len(summaries) == 1
    records = await history(live_store, answer.id)
    handoff = next(r for r in records if r.execution_state.phase == "handoff")
    assert "[agent]" in handoff.recovery.continuation_prompt  # the scripted model's words


async def test_past_max_iterations_the_task_is_blocked_and_its_caller_told(
        mesh: Mesh, live_store: SqlStore) -> None:
    """A trigger that fires in the last allowed iteration blocks the task (never a
    chain without end): it stays stored, blocked, its caller told, nothing run after."""
    await mesh.run(Agent("worker", ScriptedModel("worker", rounds=5, handoff_after=1),
                         tools=tools(), handoff=HandoffPolicy(context_utilization=None,
                                                              max_iterations=2)), 2)
    request_id = await mesh.client.submit("worker", "Survey: alpha")
    await eventually(lambda: request_id in mesh.client.updates, what="the blocked notice")
    update = mesh.client.updates[request_id][-1]
    assert update.status.state is a2a.TaskState.UNKNOWN and not update.final
    assert "max_iterations (2)" in update.metadata["meshpoint_blocked"]  # type: ignore[index]
    assert request_id not in mesh.client.answers
    summaries = await live_store.list_paused_tasks()
    assert [s.status for s in summaries] == ["blocked"]
    records = await live_store.history.get_checkpoint_history(summaries[0].task_id)
    assert [r.execution_state.phase for r in reversed(records)][-1] == "blocked"
