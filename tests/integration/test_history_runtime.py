"""The checkpoint history in the runtime (issue 15 §1-2), several instances on a SQLite
file and on PostgreSQL: every pause kind and the end write their records; a task
whose history fails verification is rewound or blocked, never resumed silently, and
its caller is told."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from sqlalchemy import delete, select

from meshpoint import a2a
from meshpoint.history.integrity import SigningKeys
from meshpoint.history.planning import HistoryOptions
from meshpoint.llm import ScriptedModel
from meshpoint.runtime import Agent, AgentInstance, Peer
from meshpoint.runtime.agent import CheckpointPolicy
from meshpoint.store import SqlStore
from meshpoint.store.schema import checkpoints, events, paused_tasks
from tests.integration.mesh import ManualPeer, Mesh, eventually
from tests.integration.test_approvals import SideEffects, approving, paused
from tests.integration.test_history_security import public_half
from tests.integration.test_runtime import no_rows_left


def phases(records: list[Any]) -> list[str]:
    return [r.execution_state.phase for r in reversed(records)]


async def test_each_pause_kind_and_the_end_write_a_record(
        mesh: Mesh, live_store: SqlStore) -> None:
    effects = SideEffects()
    peer = await ManualPeer(mesh, "researcher").start()
    agent = approving(effects, peers=[Peer("researcher", timeout_s=30)])
    agent = Agent(agent.name, agent.model, tools=agent.tools, peers=agent.peers,
                  checkpoint=CheckpointPolicy(after_tools=True), agent_type="qa",
                  history_hook=lambda ctx: ctx.history.update(
                      record={"context_summary": {"assumptions": ["figures are current"]}}))
    await mesh.run(agent, 2)
    request_id, task_id, pending = await paused(mesh, "Send the report")
    await eventually(lambda: len(peer.requests) == 1, what="the peer's request")
    await mesh.client.approve(task_id, pending[0]["call_id"])
    await peer.answer(next(iter(peer.requests)), "the figures")
    answer = await mesh.client.wait(request_id, timeout_s=10)
    assert answer.status.state is a2a.TaskState.COMPLETED
    await no_rows_left(live_store)
    records = await live_store.history.get_checkpoint_history(task_id)
    # The plan (after_tools), the pause for a human and a peer, the approved tool's run
    # (after_tools), the end.
    assert phases(records) == ["working", "input_required", "working", "completed"], \
        phases(records)
    assert {r.metadata.agent_type for r in records} == {"qa"}
    assert records[-1].context_summary.assumptions == ["figures are current"]
    assert (await live_store.history.verify_task(task_id)).ok
    # the tokens of the whole task, by model and by source, in its last record
    total = records[0].metrics.tokens["total"]
    assert total["by_source"]["coordinator"]["completion_tokens"] > 0


async def test_a_history_hook_that_sets_a_bad_record_is_logged_and_left_out(
        mesh: Mesh, live_store: SqlStore, caplog: pytest.LogCaptureFixture) -> None:
    peer = await ManualPeer(mesh, "researcher").start()

    def hook(ctx: Any) -> None:  # a figure meshpoint fills, and a field of a wrong type
        ctx.history["record"] = {"metrics": {"cost": "free", "tests_status": "green"}}

    await mesh.run(Agent("coordinator", ScriptedModel(), history_hook=hook,
                         peers=[Peer("researcher", timeout_s=30)]))
    request_id = await mesh.client.submit("coordinator", "Look into it")
    await eventually(lambda: len(peer.requests) == 1, what="the peer's request")
    await peer.answer(next(iter(peer.requests)), "found it")
    answer = await mesh.client.wait(request_id, timeout_s=10)
    assert answer.status.state is a2a.TaskState.COMPLETED  # the task went on
    await no_rows_left(live_store)
    task_id = mesh.client.task_id("coordinator", request_id)
    records = await live_store.history.get_checkpoint_history(task_id)
    assert phases(records) == ["waiting_peers", "completed"]
    assert all(r.metrics.cost["currency"] and r.metrics.tests_status is None
               for r in records)  # what the hook set is not in them
    assert "its history hook failed" in caplog.text and "cost is filled by" in caplog.text


class OverCachedModel(ScriptedModel):
    """Reports more cached tokens than prompt tokens (an endpoint counting them apart)."""

    def _respond(self, messages: list[dict[str, Any]], text: str | None,
                 calls: tuple[Any, ...]) -> Any:
        response = super()._respond(messages, text, calls)
        usage = replace(response.usage, cached_tokens=response.usage.prompt_tokens + 100)
        return replace(response, usage=usage)


async def test_a_models_token_report_that_cannot_be_counted_does_not_fail_the_task(
        mesh: Mesh, live_store: SqlStore, caplog: pytest.LogCaptureFixture) -> None:
    await mesh.run(Agent("coordinator", OverCachedModel()))
    request_id = await mesh.client.submit("coordinator", "Say hello")
    answer = await mesh.client.wait(request_id, timeout_s=10)
    assert answer.status.state is a2a.TaskState.COMPLETED
    assert "the model's token usage is not counted: cached_tokens" in caplog.text


async def test_a_broken_history_blocks_the_task_and_tells_its_caller(
        mesh: Mesh, live_store: SqlStore) -> None:
    peer = await ManualPeer(mesh, "researcher").start()
    await mesh.run(Agent("coordinator", ScriptedModel(),
                         peers=[Peer("researcher", timeout_s=30)]), 2)
    request_id = await mesh.client.submit("coordinator", "Look into it")
    await eventually(lambda: len(peer.requests) == 1, what="the peer's request")
    task_id = mesh.client.task_id("coordinator", request_id)
    await live_store.run(lambda conn: conn.execute(delete(checkpoints).where(
        checkpoints.c.logical_task_id == task_id)), write=True)  # the whole chain, gone
    await peer.answer(next(iter(peer.requests)), "found it")
    await eventually(lambda: request_id in mesh.client.updates, what="the blocked notice")
    update = mesh.client.updates[request_id][-1]
    assert update.status.state is a2a.TaskState.UNKNOWN and not update.final
    assert "blocked" in update.status.message.text  # type: ignore[union-attr]
    assert update.metadata and "meshpoint_blocked" in update.metadata
    assert request_id not in mesh.client.answers
    statuses = await live_store.run(lambda conn: [r.status for r in conn.execute(
        select(paused_tasks.c.status))])
    assert statuses == ["blocked"]
    assert len(mesh.events("blocked")) == 1
    await mesh.client.cancel("coordinator", task_id)  # an operator ends it
    answer = await mesh.client.wait(request_id, timeout_s=10)
    assert answer.status.state is a2a.TaskState.CANCELED
    await no_rows_left(live_store)


async def test_a_rewound_task_goes_on_and_its_model_sees_what_was_lost(
        mesh: Mesh, live_store: SqlStore) -> None:
    """Record 1: the task waits on a peer. Its answer is taken by an instance that
    pauses the task again (record 2, a second call) and dies; record 2 is then
    damaged, and the second call answered. Recovery resumes the task: record 2 fails,
    so the task is rewound to record 1, whose call's answer is lost with record 2.
    The model sees that and the task completes; the records say what happened."""
    peer = await ManualPeer(mesh, "researcher").start()
    await mesh.run(Agent("coordinator", ScriptedModel(),
                         peers=[Peer("researcher", timeout_s=30)]), 2)
    request_id = await mesh.client.submit("coordinator", "Look into it")
    await eventually(lambda: len(peer.requests) == 1, what="the peer's request")
    task_id = mesh.client.task_id("coordinator", request_id)
    first = next(iter(peer.requests))
    await live_store.resolve_peer_sub_task(
        first, {"status": "completed", "text": "found it", "artifacts": []},
        lease_owner="dead#1", lease_ttl_s=30)
    ctx = (await live_store.restore_task(task_id, lease_owner="dead#1")).context
    ctx.current_invocation_id = "again"
    ctx.register_peer_sub_task("second-call", {"peer_agent_name": "researcher",
                                               "timeout_s": 30})
    await live_store.checkpoint_task(ctx, "coordinator", lease_owner="dead#1")
    record = await live_store.history.get_latest_checkpoint(task_id)
    assert record is not None and record.metadata.seq == 2
    data = record.model_dump(mode="json", exclude={"compliance": {"hash", "signature",
                                                                  "key_id"}})
    data["execution_state"]["phase"] = "tampered"
    await live_store.run(lambda conn: conn.execute(checkpoints.update().where(
        checkpoints.c.checkpoint_id == record.metadata.checkpoint_id).values(data=data)),
        write=True)
    await live_store.resolve_peer_sub_task(
        "second-call", {"status": "completed", "text": "more", "artifacts": []},
        lease_owner="dead#2", lease_ttl_s=0.3)  # its taker dies: recovery resumes it
    answer = await mesh.client.wait(request_id, timeout_s=10)
    assert answer.status.state is a2a.TaskState.COMPLETED
    assert "lost" in answer.status.message.text  # type: ignore[union-attr]
    await no_rows_left(live_store)  # the end (and its record) follows the answer
    report = await live_store.history.verify_task(task_id)  # the evidence stays
    assert not report.ok and report.first_bad_seq == 2
    phases_stored = await live_store.run(lambda conn: [
        r.data["execution_state"]["phase"] for r in conn.execute(
            select(checkpoints).where(checkpoints.c.logical_task_id == task_id)
            .order_by(checkpoints.c.seq))])
    assert phases_stored == ["waiting_peers", "tampered", "rewound", "completed"], \
        phases_stored


@pytest.mark.parametrize("ring", ["none", "public"])
async def test_an_instance_without_the_signing_key_leaves_a_signed_task_to_one_with_it(
        live_store: SqlStore, ring: str) -> None:
    """The answer that completes a signed task's join reaches an instance whose store
    has no signing key (none at all, or a verifier's public key): it records the
    answer, cannot continue the task, writes nothing else and gives the lease up
    (before: it blocked the task, which no instance could then take). An instance
    with the key then completes it, its chain signed throughout."""
    keys = SigningKeys.generate("k1")
    signed = live_store.with_history(HistoryOptions(signing=keys))
    keyless = live_store if ring == "none" else live_store.with_history(
        HistoryOptions(signing=public_half(keys)))
    mesh = await Mesh(signed).start()
    try:
        peer = await ManualPeer(mesh, "researcher").start()
        agent = Agent("coordinator", ScriptedModel(), peers=[Peer("researcher", timeout_s=30)])
        (first,) = await mesh.run(agent)
        request_id = await mesh.client.submit("coordinator", "Look into it")
        await eventually(lambda: len(peer.requests) == 1, what="the peer's request")
        task_id = mesh.client.task_id("coordinator", request_id)
        await first.stop()
        wrong = AgentInstance(agent, keyless, mesh.broker, options=mesh.options,
                              instance_id="no-key")
        await wrong.start()
        mesh.instances.append(wrong)
        await peer.answer(next(iter(peer.requests)), "found it")
        await eventually(lambda: any(wrong.stats.tasks(what) for what in (
            "key_missing", "blocked", "resumed")), what="the keyless instance meeting it")
        assert wrong.stats.tasks("blocked") == [], "blocked a healthy task"
        assert wrong.stats.tasks("resumed") == [], "went on without signing"
        assert wrong.stats.tasks("key_missing") == [task_id]
        task = await live_store.run(lambda conn: conn.execute(
            select(paused_tasks.c.status, paused_tasks.c.owner)).one())
        assert (task.status, task.owner) == ("resuming", None)  # left, lease given up
        assert len(await live_store.run(lambda conn: conn.execute(
            select(checkpoints.c.seq)).all())) == 1  # no record written
        assert await live_store.run(lambda conn: conn.execute(
            select(events.c.event_type)).all()) == []  # nor an integrity event
        assert mesh.events("blocked") == [] and request_id not in mesh.client.updates
        await mesh.run(agent)  # an instance with the key takes it over
        answer = await mesh.client.wait(request_id, timeout_s=10)
        assert answer.status.state is a2a.TaskState.COMPLETED
        assert wrong.stats.tasks("key_missing") == [task_id]  # it did not try again
        await no_rows_left(live_store)  # its end, and its last record, written
        report = await signed.history.verify_task(task_id)
        assert report.ok and report.signatures_checked and report.records == 2, report
    finally:
        await mesh.close()


async def test_a_cancel_taken_by_an_instance_without_the_key_is_left_to_one_with_it(
        live_store: SqlStore) -> None:
    """Ending a signed task appends its last record, which must be signed: an instance
    without the key leaves the cancel (its request goes back, and is broadcast to the
    agent's instances) to one with it, and the chain stays signed to its end (before:
    the keyless instance ended it with an unsigned record every verifier rejects)."""
    keys = SigningKeys.generate("k1")
    signed = live_store.with_history(HistoryOptions(signing=keys))
    mesh = await Mesh(signed).start()
    try:
        peer = await ManualPeer(mesh, "researcher").start()
        agent = Agent("coordinator", ScriptedModel(), peers=[Peer("researcher", timeout_s=30)])
        (first,) = await mesh.run(agent)
        request_id = await mesh.client.submit("coordinator", "Look into it")
        await eventually(lambda: len(peer.requests) == 1, what="the peer's request")
        task_id = mesh.client.task_id("coordinator", request_id)
        await first.stop()
        wrong = AgentInstance(agent, live_store, mesh.broker, options=mesh.options,
                              instance_id="no-key")
        await wrong.start()
        mesh.instances.append(wrong)
        await mesh.client.cancel("coordinator", task_id)
        await eventually(lambda: bool(wrong.stats.tasks("key_missing")
                                      or wrong.stats.tasks("canceled")),
                         what="the keyless instance taking the cancel")
        assert wrong.stats.tasks("canceled") == [], "ended without the key"
        assert set(wrong.stats.tasks("key_missing")) == {task_id}  # each time it came
        assert len(await live_store.run(lambda conn: conn.execute(
            select(checkpoints.c.seq)).all())) == 1  # no end written
        await mesh.run(agent)
        answer = await mesh.client.wait(request_id, timeout_s=10)
        assert answer.status.state is a2a.TaskState.CANCELED
        await no_rows_left(live_store)
        report = await signed.history.verify_task(task_id)
        assert report.ok and report.signatures_checked and report.records == 2, report
    finally:
        await mesh.close()
