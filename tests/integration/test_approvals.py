"""Approval pauses (issue 14 §1, §6): a tool call that waits for a human, answered
from any client, taken by any instance, on a SQLite file and on PostgreSQL."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from dataclasses import replace
from typing import Any

import pytest

from meshpoint import a2a
from meshpoint.errors import (
    AlreadyAnsweredError,
    ArgumentsRejectedError,
    NotPendingError,
    UnknownTaskError,
)
from meshpoint.events.log import EventStore
from meshpoint.llm import ScriptedModel
from meshpoint.runtime import Agent, Client, LocalTool, Peer, wire
from meshpoint.runtime.agent import ToolCallInfo
from meshpoint.runtime.approvals import Approve, decide
from meshpoint.store import SqlStore
from tests.integration.mesh import ManualPeer, Mesh, eventually
from tests.integration.test_runtime import no_rows_left

SCHEMA = {"type": "object", "properties": {"query": {"type": "string"},
                                           "to": {"type": "string", "format": "email"}},
          "required": ["query"], "additionalProperties": False}


class SideEffects:
    """A tool that counts how often it really ran, per call, and what it was given."""

    def __init__(self) -> None:
        self.runs: Counter[str] = Counter()
        self.arguments: dict[str, dict[str, Any]] = {}

    def __call__(self, arguments: dict[str, Any], call: ToolCallInfo) -> str:
        self.runs[call.idempotency_key] += 1
        self.arguments[call.idempotency_key] = arguments
        return f"sent {arguments['query']!r}"


def approving(effects: SideEffects, *, timeout_s: float = 60.0, peers: list[Peer] | None = None,
              needs: Any = True) -> Agent:
    tool = LocalTool("send", "Send the message (needs a human's approval).", effects,
                     parameters=SCHEMA, needs_approval=needs, approval_timeout_s=timeout_s)
    return Agent("coordinator", ScriptedModel(), tools=[tool], peers=peers or [])


async def paused(mesh: Mesh, text: str) -> tuple[str, str, list[dict[str, Any]]]:
    """Submit ``text`` and wait until its task waits for approval: (request id, task
    id, the pending approvals the caller was told about)."""
    request_id = await mesh.client.submit("coordinator", text)
    pending = await mesh.client.wait_input(request_id, timeout_s=10)
    return request_id, mesh.client.task_id("coordinator", request_id), pending


async def status_of(store: SqlStore, task_id: str) -> str:
    return (await store.restore_task(task_id)).status


async def test_a_call_needing_approval_pauses_and_runs_once_approved_on_another_instance(
        mesh: Mesh, live_store: SqlStore) -> None:
    effects = SideEffects()
    first, second = await mesh.run(approving(effects), 2)
    request_id, task_id, pending = await paused(mesh, "Send the report")
    assert [p["tool"] for p in pending] == ["send"]
    assert pending[0]["arguments"] == {"query": "Send the report"}
    assert await status_of(live_store, task_id) == "input_required"
    assert not effects.runs, "the tool ran before its approval"
    # Whichever instance paused it dies; the answer is taken by the other one.
    pauser = next(i for i in (first, second) if task_id in i.stats.tasks("paused"))
    survivor = second if pauser is first else first
    await pauser.kill()

    decision = await mesh.client.approve(task_id, pending[0]["call_id"], by="alice")
    assert decision["decision"] == "approved" and decision["claimed_by"] == "alice"
    assert decision["verified"] is False and "by" not in decision  # no approvers: a claim
    answer = await mesh.client.wait(request_id, timeout_s=10)
    assert answer.status.state is a2a.TaskState.COMPLETED
    assert "sent 'Send the report'" in answer.status.message.text  # type: ignore[union-attr]
    assert list(effects.runs.values()) == [1]
    key = next(iter(effects.runs))
    assert key == f"{task_id}/{pending[0]['function_call_id']}"
    assert task_id in survivor.stats.tasks("resumed")
    await no_rows_left(live_store)


@pytest.mark.parametrize("via", ["client", "store"])
async def test_an_approval_and_the_approved_tools_run_are_in_the_event_log(
        mesh: Mesh, live_store: SqlStore, via: str) -> None:
    """The decision, whichever way it came (a client through an instance, or straight
    into the store as ``meshpoint tasks approve`` writes it), and the tool's run with
    the arguments it ran with, are logged, so the log (and a reconstruction from it)
    knows the tool ran."""
    effects = SideEffects()
    await mesh.run(replace(approving(effects), events=True))
    request_id, task_id, pending = await paused(mesh, "Send the report")
    edited = {"query": "Send the summary"}
    if via == "client":
        await mesh.client.approve(task_id, pending[0]["call_id"], edited, by="alice")
    else:
        await decide(live_store, task_id, Approve(call_id=pending[0]["call_id"],
                                                  arguments=edited), by="alice")
    answer = await mesh.client.wait(request_id, timeout_s=20)
    assert answer.status.state is a2a.TaskState.COMPLETED
    log = EventStore(live_store)

    async def steps() -> list[Any]:
        return [e for e in await log.get_events(thread_id=task_id)
                if e.step_name in ("tool:send", "approved")]

    await eventually(lambda: _count(steps, 3), what="the approval's and the tool's events")
    approval, start, done = await steps()
    assert (approval.event_type, approval.output_data["claimed_by"]) == ("approval", "alice")
    assert (start.event_type, done.event_type) == ("step_start", "step_complete")
    assert start.input_data["arguments"] == edited
    assert done.output_data == "sent 'Send the summary'"
    assert list(effects.runs.values()) == [1]


async def _count(steps: Any, n: int) -> bool:
    return len(await steps()) == n


async def test_edited_arguments_are_checked_before_anything_is_written(
        mesh: Mesh, live_store: SqlStore) -> None:
    """An edit is a JSON merge patch of the proposed arguments, checked once merged:
    a null that removes a required key, or a value of the wrong type, is refused
    before anything is written."""
    effects = SideEffects()
    await mesh.run(approving(effects), 2)
    request_id, task_id, pending = await paused(mesh, "Send the report")
    call_id = pending[0]["call_id"]
    before = await live_store.get_peer_sub_task(call_id)
    with pytest.raises(ArgumentsRejectedError, match="schema: the arguments: 'query' is a "
                                                     "required property"):
        await mesh.client.approve(task_id, call_id, {"query": None, "to": "bob@example.com"})
    with pytest.raises(ArgumentsRejectedError, match="query: 5 is not of type 'string'"):
        await mesh.client.approve(task_id, call_id, {"query": 5})
    assert await live_store.get_peer_sub_task(call_id) == before, "a refused answer wrote"
    assert await status_of(live_store, task_id) == "input_required"

    edited = {"query": "Send the corrected report", "to": "bob@example.com"}
    decision = await mesh.client.approve(task_id, call_id, edited)
    assert decision["edited"] is True and decision["arguments"] == edited
    answer = await mesh.client.wait(request_id, timeout_s=10)
    assert "sent 'Send the corrected report'" in answer.status.message.text  # type: ignore[union-attr]
    assert list(effects.arguments.values()) == [edited]


async def test_a_partial_edit_is_merged_into_the_proposed_arguments(
        mesh: Mesh, live_store: SqlStore) -> None:
    """An approver gives only the key it changes: the proposed ``query`` is kept, the
    tool runs with the merged arguments, and the decision records both the patch as
    given and the arguments that ran (the event log shows what ran)."""
    effects = SideEffects()
    await mesh.run(replace(approving(effects), events=True))
    request_id, task_id, pending = await paused(mesh, "Send the report")
    patch = {"to": "bob@example.com"}
    decision = await mesh.client.approve(task_id, pending[0]["call_id"], patch)
    merged = {"query": "Send the report", "to": "bob@example.com"}
    assert (decision["edited"], decision["patch"], decision["arguments"]) == (
        True, patch, merged)
    answer = await mesh.client.wait(request_id, timeout_s=10)
    assert answer.status.state is a2a.TaskState.COMPLETED
    assert list(effects.arguments.values()) == [merged]
    log = EventStore(live_store)

    async def starts() -> list[Any]:
        return [e for e in await log.get_events(thread_id=task_id)
                if e.step_name == "tool:send" and e.event_type == "step_start"]

    await eventually(lambda: _count(starts, 1), what="the tool's start event")
    assert (await starts())[0].input_data["arguments"] == merged


async def test_a_denied_call_never_runs_and_the_model_is_told_why(mesh: Mesh) -> None:
    effects = SideEffects()
    await mesh.run(approving(effects))
    request_id, task_id, pending = await paused(mesh, "Send the report")
    decision = await mesh.client.deny(task_id, pending[0]["call_id"], "not to customers")
    assert decision["decision"] == "denied"
    answer = await mesh.client.wait(request_id, timeout_s=10)
    assert answer.status.state is a2a.TaskState.COMPLETED
    assert "not approved: not to customers" in answer.status.message.text  # type: ignore[union-attr]
    assert not effects.runs
    await no_rows_left(mesh.store)  # the caller is answered just before the rows go
    with pytest.raises(UnknownTaskError):  # the task has ended
        await mesh.client.approve(task_id, pending[0]["call_id"])


async def test_a_reply_in_words_leaves_the_call_unrun_and_shows_the_model_the_text(
        mesh: Mesh) -> None:
    effects = SideEffects()
    await mesh.run(approving(effects))
    request_id, task_id, _ = await paused(mesh, "Send the report")
    decisions = await mesh.client.reply(task_id, "Wait for Monday's figures")
    assert [d["decision"] for d in decisions] == ["replied"]
    answer = await mesh.client.wait(request_id, timeout_s=10)
    assert "Wait for Monday's figures" in answer.status.message.text  # type: ignore[union-attr]
    assert not effects.runs


@pytest.mark.parametrize("run", range(5))
async def test_of_two_racing_approvers_exactly_one_wins(mesh: Mesh, run: int) -> None:
    """Two humans answer the same call at once, through two instances: one answer is
    recorded, the other is told it lost and what won. Each task waits on two calls,
    so it is still stored when the loser's answer is checked; the second call is
    approved afterwards."""
    effects = SideEffects()
    agent = approving(effects)
    second = LocalTool("archive", "Archive it (needs approval).", effects, parameters=SCHEMA,
                       needs_approval=True)
    await mesh.run(replace(agent, tools=[*agent.tools, second]), 2)
    tasks = [await paused(mesh, f"Send report {n}") for n in range(4)]
    async with Client(mesh.broker, namespace=mesh.options.namespace) as other:

        async def race(task_id: str, call_id: str) -> list[Any]:
            return await asyncio.gather(
                mesh.client.approve(task_id, call_id, by="alice"),
                other.deny(task_id, call_id, "no", by="bob"), return_exceptions=True)

        outcomes = await asyncio.gather(*(race(t, p[0]["call_id"]) for _, t, p in tasks))
    for won, lost in (sorted(o, key=lambda x: isinstance(x, Exception)) for o in outcomes):
        assert isinstance(won, dict), outcomes
        assert isinstance(lost, AlreadyAnsweredError), outcomes
        assert lost.decision is not None
        assert (lost.decision["decision"], lost.decision["claimed_by"]) == (
            won["decision"], won["claimed_by"])
    for request_id, task_id, pending in tasks:
        await mesh.client.approve(task_id, pending[1]["call_id"])
        await mesh.client.wait(request_id, timeout_s=10)
    approved = sum(1 for o in outcomes for x in o
                   if isinstance(x, dict) and x["decision"] == "approved")
    assert sum(effects.runs.values()) == approved + len(tasks)
    assert all(n == 1 for n in effects.runs.values())
    assert all(len(mesh.client.answers[r]) == 1 for r, _, _ in tasks)


async def test_an_unanswered_approval_is_denied_when_its_deadline_passes(
        mesh: Mesh, live_store: SqlStore) -> None:
    effects = SideEffects()
    await mesh.run(approving(effects, timeout_s=0.3))
    request_id, task_id, pending = await paused(mesh, "Send the report")
    answer = await mesh.client.wait(request_id, timeout_s=10)
    assert "not approved: timed out" in answer.status.message.text  # type: ignore[union-attr]
    assert not effects.runs
    await no_rows_left(live_store)
    with pytest.raises(UnknownTaskError):
        await mesh.client.approve(task_id, pending[0]["call_id"])


async def test_a_late_approval_is_told_the_deadline_won(live_store: SqlStore) -> None:
    """Between the sweep and the resume the item is resolved but still stored: a late
    approval is refused with the standing decision."""
    effects = SideEffects()
    mesh = await Mesh(live_store).start()
    try:
        await mesh.run(approving(effects, timeout_s=0.2))
        _, task_id, pending = await paused(mesh, "Send the report")
        for instance in mesh.instances:
            await instance.kill()  # nobody resumes it after the sweep

        async def swept() -> bool:
            return bool(await live_store.sweep_expired_timeouts("coordinator"))

        await eventually(swept, what="the approval's deadline to be swept")
        with pytest.raises(AlreadyAnsweredError, match="denied: timed out") as refused:
            await decide(live_store, task_id, Approve(call_id=pending[0]["call_id"]), by="x")
        assert refused.value.decision is not None
        assert refused.value.decision["reason"] == "timed out"
    finally:
        await mesh.close()


async def test_canceling_a_task_waiting_for_approval(mesh: Mesh, live_store: SqlStore) -> None:
    effects = SideEffects()
    await mesh.run(approving(effects), 2)
    request_id, task_id, pending = await paused(mesh, "Send the report")
    await mesh.client.cancel("coordinator", task_id)
    answer = await mesh.client.wait(request_id, timeout_s=10)
    assert answer.status.state is a2a.TaskState.CANCELED
    await no_rows_left(live_store)
    with pytest.raises(UnknownTaskError):
        await mesh.client.approve(task_id, pending[0]["call_id"])
    assert not effects.runs
    await no_rows_left(live_store)


async def test_a_turn_waits_on_peers_and_an_approval_at_once(
        mesh: Mesh, live_store: SqlStore) -> None:
    effects = SideEffects()
    peer = await ManualPeer(mesh, "researcher").start()
    await mesh.run(approving(effects, peers=[Peer("researcher", timeout_s=30)]), 2)
    request_id, task_id, pending = await paused(mesh, "Send the report")
    await eventually(lambda: len(peer.requests) == 1, what="the peer's request")
    assert await status_of(live_store, task_id) == "input_required"

    await mesh.client.approve(task_id, pending[0]["call_id"])
    assert await status_of(live_store, task_id) == "input_required", "resumed too early"
    assert not effects.runs
    await peer.answer(next(iter(peer.requests)), "the figures")
    answer = await mesh.client.wait(request_id, timeout_s=10)
    text = answer.status.message.text  # type: ignore[union-attr]
    assert "the figures" in text and "sent 'Send the report'" in text
    assert list(effects.runs.values()) == [1]


async def test_a_crash_after_the_answer_is_claimed_resumes_the_task_once(
        mesh: Mesh, live_store: SqlStore) -> None:
    """The answer was recorded, with the resume lease, by an instance that then died
    (here: a lease owner that never resumes): recovery resumes the task when the
    lease expires, once, and the tool runs once."""
    effects = SideEffects()
    await mesh.run(approving(effects), 2)
    request_id, task_id, pending = await paused(mesh, "Send the report")
    decided = await decide(live_store, task_id, Approve(call_id=pending[0]["call_id"]),
                           by="carol", lease_owner="dead-instance#1", lease_ttl_s=0.5)
    assert decided.completing is not None and decided.completing.lease_owner
    answer = await mesh.client.wait(request_id, timeout_s=10)
    assert answer.status.state is a2a.TaskState.COMPLETED
    assert list(effects.runs.values()) == [1]
    assert len(mesh.events("recovered")) == 1
    assert len(mesh.client.answers[request_id]) == 1


async def test_answers_to_what_is_not_pending_are_refused(mesh: Mesh) -> None:
    effects = SideEffects()
    peer = await ManualPeer(mesh, "researcher").start()
    await mesh.run(approving(effects, peers=[Peer("researcher", timeout_s=30)]))
    _, task_id, pending = await paused(mesh, "Send the report")
    await eventually(lambda: len(peer.requests) == 1, what="the peer's request")
    with pytest.raises(NotPendingError, match="has no pending call 'nope'"):
        await mesh.client.approve(task_id, "nope")
    with pytest.raises(NotPendingError, match="is a call to a peer"):
        await mesh.client.approve(task_id, next(iter(peer.requests)))
    with pytest.raises(UnknownTaskError):
        await mesh.client.approve(wire.derive_task_id("coordinator", None, "x"),
                                  pending[0]["call_id"])


async def test_a_predicate_decides_which_calls_wait(mesh: Mesh) -> None:
    effects = SideEffects()
    await mesh.run(approving(effects, needs=lambda args: "customers" in args["query"]))
    answer = await mesh.client.ask("coordinator", "Send the report", timeout_s=10)
    assert "sent 'Send the report'" in answer.status.message.text  # type: ignore[union-attr]
    _, _, pending = await paused(mesh, "Send the report to customers")
    assert [p["tool"] for p in pending] == ["send"]


async def test_bad_answers_are_dead_lettered_and_change_nothing(
        mesh: Mesh, live_store: SqlStore) -> None:
    effects = SideEffects()
    await mesh.run(approving(effects))
    request_id, task_id, pending = await paused(mesh, "Send the report")
    call_id = pending[0]["call_id"]
    before = await live_store.get_peer_sub_task(call_id)
    subject = wire.request_subject(mesh.options.namespace, "coordinator")
    for answer in ({"decision": "maybe", "call_id": call_id},
                   {"decision": "approve"},
                   {"decision": "approve", "call_id": call_id, "arguments": [1]},
                   {"decision": "deny", "call_id": call_id, "extra": 1}):
        await mesh.broker.publish(subject, wire.answer_request(wire.new_id(), task_id, answer))
    await mesh.broker.publish(subject, json.dumps({
        "jsonrpc": "2.0", "id": "x", "method": "message/send", "params": {"message": {
            "role": "user", "messageId": "m", "taskId": task_id,
            "parts": [{"kind": "data", "data": {"other": 1}}]}}}).encode())
    await eventually(lambda: len(mesh.dead_letters) == 5, what="five dead letters")
    assert await live_store.get_peer_sub_task(call_id) == before
    assert not effects.runs
    await mesh.client.approve(task_id, call_id)
    await mesh.client.wait(request_id, timeout_s=10)
