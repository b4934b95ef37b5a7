"""Every store operation, on SQLite and on PostgreSQL (one suite, both backends)."""

from __future__ import annotations

import asyncio

import pytest
from sqlalchemy import delete, insert, update

from meshpoint import TaskExecutionContext
from meshpoint.errors import (
    CheckpointConflictError,
    InvalidArgumentError,
    LeaseNotHeldError,
    StoreError,
    StoreUnavailableError,
    TaskEndedError,
    UnknownCallError,
)
from meshpoint.store import TIMEOUT_RESULT, SqlStore, open_store
from meshpoint.store.schema import parallel_invocations, paused_tasks, session_events
from tests.conftest import FakeClock, pg_execute_async, row_counts, snapshot, someone_waits_for
from tests.integration.mesh import eventually

#: The store's own suite: also run with PostgreSQL's fast paths off.
pytestmark = pytest.mark.portable_too

AGENT = "coordinator"


def fan_out(task_id: str, peers: int = 3, *, local: bool = True, timeout_s: float = 60.0,
            invocation: str = "inv-1") -> TaskExecutionContext:
    """A task whose turn called a local tool (already answered) and ``peers`` peers."""
    ctx = TaskExecutionContext(task_id, {"session_id": f"session-{task_id}"})
    ctx.current_invocation_id = invocation
    calls = (["local"] if local else []) + [f"call-{n}" for n in range(peers)]
    ctx.begin_parallel_calls(invocation, calls)
    if local:
        ctx.record_parallel_result(invocation, "local", {"clock": "12:00"})
    for n in range(peers):
        ctx.register_peer_sub_task(f"{task_id}/sub-{n}", {
            "function_call_id": f"call-{n}", "peer_agent_name": f"peer-{n}",
            "timeout_s": timeout_s, "peer_tool": "ask"})
    ctx.append_session_event({"role": "user", "text": f"question of {task_id}"})
    ctx.append_session_event({"role": "model", "calls": calls})
    return ctx


async def test_checkpoint_writes_task_sub_tasks_invocation_and_events(
        store: SqlStore, clock: FakeClock) -> None:
    receipt = await store.checkpoint_task(fan_out("t1", timeout_s=30), AGENT)
    assert receipt.version == 1 and receipt.events_appended == 2 and not receipt.compressed
    assert receipt.sub_task_deadlines == {f"t1/sub-{n}": clock.now + 30 for n in range(3)}
    counts = await row_counts(store)
    assert counts["agent_paused_tasks"] == 1
    assert counts["agent_peer_sub_tasks"] == 3
    assert counts["agent_parallel_invocations"] == 1
    assert counts["agent_session_events"] == 1  # the 2 events, as one row
    sub = await store.get_peer_sub_task("t1/sub-1")
    assert (sub.task_id, sub.invocation_id, sub.function_call_id) == ("t1", "inv-1", "call-1")
    assert sub.peer_agent_name == "peer-1" and sub.status == "pending"
    assert sub.correlation_data["peer_tool"] == "ask"
    assert sub.timeout_deadline == clock.now + 30


async def test_every_sub_task_gets_a_deadline_even_without_a_timeout(
        store: SqlStore, clock: FakeClock) -> None:
    ctx = TaskExecutionContext("t")
    ctx.current_invocation_id = "inv"
    ctx.register_peer_sub_task("s", {"peer_agent_name": "p"})
    receipt = await store.checkpoint_task(ctx, AGENT, default_timeout_s=90)
    assert receipt.sub_task_deadlines == {"s": clock.now + 90}


async def test_resolve_counts_the_join_and_completes_it_exactly_once(store: SqlStore) -> None:
    await store.checkpoint_task(fan_out("t1"), AGENT)
    first = await store.resolve_peer_sub_task("t1/sub-2", {"text": "two"})
    assert first is not None and (first.completed, first.total) == (2, 4)
    assert not first.join_complete and first.sub_task.result == {"text": "two"}
    assert await store.resolve_peer_sub_task("t1/sub-2", {"text": "duplicate"}) is None
    second = await store.resolve_peer_sub_task("t1/sub-0", {"text": "zero"})
    assert second is not None and (second.completed, second.join_complete) == (3, False)
    assert (await store.restore_task("t1")).status == "waiting_peers"
    last = await store.resolve_peer_sub_task("t1/sub-1", {"text": "one"}, lease_owner="i-2")
    assert last is not None and last.join_complete and last.lease_owner == "i-2"
    restored = await store.restore_task("t1", lease_owner="i-2")
    assert restored.status == "resuming" and restored.owner == "i-2"
    # Results come back in the model's call order, not the arrival order.
    assert await store.get_parallel_results("t1", "inv-1") == [
        ("local", {"clock": "12:00"}), ("call-0", {"text": "zero"}),
        ("call-1", {"text": "one"}), ("call-2", {"text": "two"})]
    assert restored.context.parallel_tool_calls["inv-1"].ordered_results() == \
        await store.get_parallel_results("t1", "inv-1")
    assert restored.context.active_peer_sub_tasks == {}


async def test_two_step_claim_then_record(store: SqlStore) -> None:
    await store.checkpoint_task(fan_out("t1", peers=1, local=False), AGENT)
    claimed = await store.claim_peer_sub_task("t1/sub-0")
    assert claimed is not None and claimed.function_call_id == "call-0"
    assert await store.claim_peer_sub_task("t1/sub-0") is None
    # A claimed sub-task can no longer be resolved by an answer or a timeout...
    assert await store.resolve_peer_sub_task("t1/sub-0", "late") is None
    # ...and counts once its result is recorded.
    done = await store.record_parallel_result("t1", "inv-1", "call-0", {"text": "ok"})
    assert done is not None and (done.completed, done.total, done.join_complete) == (1, 1, True)
    assert await store.record_parallel_result("t1", "inv-1", "call-0", {"text": "again"}) is None
    with pytest.raises(UnknownCallError, match="no peer call 'nope'"):
        await store.record_parallel_result("t1", "inv-1", "nope", 1)
    assert await store.get_parallel_results("t1", "inv-1") == [("call-0", {"text": "ok"})]


async def test_a_claim_never_recorded_still_times_out(store: SqlStore, clock: FakeClock) -> None:
    await store.checkpoint_task(fan_out("t1", peers=2, local=False, timeout_s=5), AGENT)
    await store.resolve_peer_sub_task("t1/sub-1", "answered")
    claimed = await store.claim_peer_sub_task("t1/sub-0")  # ... and its claimer dies
    assert claimed is not None
    assert (await store.stats()).pending_sub_tasks == 1  # counted as open
    assert [t.pending_sub_tasks for t in await store.list_paused_tasks()] == [1]
    assert [d.sub_task_id for d in await store.next_deadlines()] == ["t1/sub-0"]
    clock.advance(6)
    swept = await store.sweep_expired_timeouts(AGENT)
    assert [(r.sub_task.sub_task_id, r.join_complete) for r in swept] == [("t1/sub-0", True)]
    # A claimer that comes back too late learns it lost to the deadline.
    assert await store.record_parallel_result("t1", "inv-1", "call-0", "late") is None
    await store.checkpoint_task(fan_out("t2", peers=1), AGENT)
    with pytest.raises(CheckpointConflictError, match="never claimed"):
        await store.record_parallel_result("t2", "inv-1", "call-0", "unclaimed")


async def test_status_update_moves_the_deadline_without_claiming(
        store: SqlStore, clock: FakeClock) -> None:
    await store.checkpoint_task(fan_out("t1", timeout_s=10), AGENT)
    clock.advance(8)
    deadline = await store.reset_timeout_deadline("t1/sub-0", peer_task_id="peer-task-9")
    assert deadline == clock.now + 10
    sub = await store.get_peer_sub_task("t1/sub-0")
    assert sub.status == "pending" and sub.timeout_deadline == deadline
    assert sub.peer_task_id == "peer-task-9"
    assert sub.correlation_data["peer_task_id"] == "peer-task-9"
    assert await store.reset_timeout_deadline("t1/sub-0", timeout_s=100) == clock.now + 100
    clock.advance(5)  # sub-1 and sub-2 expired, sub-0 did not
    swept = await store.sweep_expired_timeouts(AGENT)
    assert sorted(r.sub_task.sub_task_id for r in swept) == ["t1/sub-1", "t1/sub-2"]
    await store.resolve_peer_sub_task("t1/sub-1", "late")  # lost to the sweep
    assert await store.reset_timeout_deadline("t1/sub-1") is None


async def test_sweep_resolves_only_expired_sub_tasks_of_the_agent_once(
        store: SqlStore, clock: FakeClock) -> None:
    await store.checkpoint_task(fan_out("t1", timeout_s=5), AGENT)
    await store.checkpoint_task(fan_out("t2", timeout_s=50), AGENT)
    await store.checkpoint_task(fan_out("t3", timeout_s=5), "other-agent")
    assert await store.sweep_expired_timeouts(AGENT) == []
    clock.advance(6)
    first = await store.sweep_expired_timeouts(AGENT, limit=2)
    rest = await store.sweep_expired_timeouts(AGENT, limit=10, lease_owner="sweeper")
    assert len(first) == 2 and len(rest) == 1
    assert {r.sub_task.sub_task_id for r in first + rest} == {f"t1/sub-{n}" for n in range(3)}
    assert all(r.sub_task.result == TIMEOUT_RESULT for r in first + rest)
    assert all(r.sub_task.resolved_by == "timeout" for r in first + rest)
    assert [r.join_complete for r in first + rest] == [False, False, True]
    assert rest[0].lease_owner == "sweeper"
    assert await store.sweep_expired_timeouts(AGENT) == []
    assert await store.resolve_peer_sub_task("t1/sub-0", "too late") is None
    assert (await store.restore_task("t2")).status == "waiting_peers"
    assert len(await store.sweep_expired_timeouts("other-agent")) == 3


async def test_a_sweep_batch_spanning_tasks_counts_each_join(
        store: SqlStore, clock: FakeClock) -> None:
    for n in range(4):
        await store.checkpoint_task(fan_out(f"t{n}", peers=2, timeout_s=1), AGENT)
    await store.resolve_peer_sub_task("t2/sub-0", "answered")
    clock.advance(2)
    swept = await store.sweep_expired_timeouts(AGENT, limit=100)
    assert len(swept) == 7
    assert sorted(r.sub_task.task_id for r in swept if r.join_complete) == ["t0", "t1", "t2",
                                                                            "t3"]
    for n in range(4):
        assert (await store.restore_task(f"t{n}")).status == "resuming"


async def test_lease_is_held_by_one_owner_at_a_time(store: SqlStore, clock: FakeClock) -> None:
    await store.checkpoint_task(fan_out("t1", peers=1), AGENT)
    # A task still waiting on its peers cannot be taken for resumption...
    assert await store.take_resume_lease("t1", "a", ttl_s=10) is None
    # ...unless the caller says which waiting status it resumes from.
    assert await store.take_resume_lease("t1", "a", 10, statuses=["waiting_peers"]) is not None
    assert await store.release_resume_lease("t1", "a")
    await store.resolve_peer_sub_task("t1/sub-0", "done")
    lease = await store.take_resume_lease("t1", "a", ttl_s=10)
    assert lease is not None and lease.owner == "a" and lease.expires_at == clock.now + 10
    assert await store.take_resume_lease("t1", "b", ttl_s=10) is None
    assert await store.take_resume_lease("t1", "a", ttl_s=10) is not None  # re-entrant
    renewed = await store.renew_resume_lease("t1", "a", ttl_s=20)
    assert renewed is not None and renewed.expires_at == clock.now + 20
    clock.advance(15)
    assert await store.take_resume_lease("t1", "b", ttl_s=10) is None  # renewal counted
    clock.advance(6)
    taken = await store.take_resume_lease("t1", "b", ttl_s=10)  # expired: b takes over
    assert taken is not None and taken.version > renewed.version
    assert await store.renew_resume_lease("t1", "a", ttl_s=10) is None
    assert not await store.release_resume_lease("t1", "a")
    with pytest.raises(LeaseNotHeldError):
        await store.restore_task("t1", lease_owner="a")
    assert await store.release_resume_lease("t1", "b")
    assert await store.take_resume_lease("t1", "c", ttl_s=10) is not None


async def test_an_expired_lease_not_taken_by_anyone_is_still_its_owners(
        store: SqlStore, clock: FakeClock) -> None:
    await store.checkpoint_task(fan_out("t1", peers=1), AGENT)
    await store.resolve_peer_sub_task("t1/sub-0", "done", lease_owner="a", lease_ttl_s=5)
    clock.advance(10)
    assert await store.renew_resume_lease("t1", "a", ttl_s=5) is not None


async def test_resumed_task_checkpoints_again_under_its_lease(
        store: SqlStore, clock: FakeClock) -> None:
    await store.checkpoint_task(fan_out("t1", peers=2), AGENT)
    for n in range(2):
        await store.resolve_peer_sub_task(f"t1/sub-{n}", f"answer {n}", lease_owner="i-1")
    ctx = (await store.restore_task("t1", lease_owner="i-1")).context
    assert ctx.session_events_persisted == 2
    ctx.append_session_event({"role": "tool", "results": ["answer 0", "answer 1"]})
    ctx.append_session_event({"role": "model", "calls": ["follow-up"]})
    ctx.current_invocation_id = "inv-2"
    ctx.register_peer_sub_task("t1/follow-up", {"peer_agent_name": "peer-0"})
    with pytest.raises(InvalidArgumentError, match="lease_owner="):
        await store.checkpoint_task(ctx, AGENT)  # without the lease
    with pytest.raises(LeaseNotHeldError):
        await store.checkpoint_task(ctx, AGENT, lease_owner="i-2")
    clock.advance(1)
    receipt = await store.checkpoint_task(ctx, AGENT, lease_owner="i-1")
    assert receipt.version > 1
    assert receipt.events_appended == 2  # only the new events, never the whole conversation
    assert ctx.session_events_persisted == 4
    counts = await row_counts(store)
    assert counts["agent_session_events"] == 2  # one row per checkpoint that appended
    assert counts["agent_peer_sub_tasks"] == 1  # the resolved sub-tasks are gone
    restored = await store.restore_task("t1")
    assert restored.status == "waiting_peers" and restored.owner is None
    assert [e["role"] for e in restored.context.session_events] == ["user", "model", "tool",
                                                                      "model"]
    assert list(restored.context.active_peer_sub_tasks) == ["t1/follow-up"]
    assert restored.context.parallel_tool_calls["inv-1"].completed == 3


async def test_checkpoints_that_append_no_events_write_no_event_row(store: SqlStore) -> None:
    ctx = fan_out("t1", peers=1, local=False)
    ctx.session_events.clear()
    await store.checkpoint_task(ctx, AGENT)  # nothing said yet
    assert (await row_counts(store))["agent_session_events"] == 0
    for turn, new_events in enumerate((0, 3, 0, 1)):
        await store.resolve_peer_sub_task(f"t1/sub-{turn}", "x", lease_owner="i-1")
        ctx = (await store.restore_task("t1", lease_owner="i-1")).context
        for n in range(new_events):
            ctx.append_session_event({"role": "tool", "turn": turn, "n": n})
        ctx.current_invocation_id = f"inv-{turn + 2}"
        ctx.register_peer_sub_task(f"t1/sub-{turn + 1}", {"peer_agent_name": "peer-0"})
        receipt = await store.checkpoint_task(ctx, AGENT, lease_owner="i-1")
        assert receipt.events_appended == new_events
    assert (await row_counts(store))["agent_session_events"] == 2
    events = (await store.restore_task("t1")).context.session_events
    assert [(e["turn"], e["n"]) for e in events] == [(1, 0), (1, 1), (1, 2), (3, 0)]


async def test_restore_rebuilds_the_context(store: SqlStore) -> None:
    ctx = fan_out("t1")
    ctx.response_buffer = "So far: "
    ctx.produced_artifacts.append({"name": "notes.md", "version": 2})
    ctx.record_token_usage(model="m", source="agent", prompt_tokens=7)
    await store.checkpoint_task(ctx, AGENT)
    restored = await store.restore_task("t1")
    assert restored.agent_name == AGENT and restored.version == 1
    assert restored.context.to_checkpoint_dict() == ctx.to_checkpoint_dict()


async def test_large_contexts_are_compressed_and_restore_intact(store: SqlStore) -> None:
    ctx = fan_out("t1")
    ctx.flags["notes"] = ["a fairly repetitive research note " * 40 for _ in range(20)]
    receipt = await store.checkpoint_task(ctx, AGENT)
    assert receipt.compressed and receipt.context_bytes < 5_000
    assert (await store.restore_task("t1")).context.to_checkpoint_dict() == \
        ctx.to_checkpoint_dict()


async def test_cleanup_removes_every_live_row(store: SqlStore) -> None:
    await store.checkpoint_task(fan_out("t1"), AGENT)
    await store.checkpoint_task(fan_out("t2"), AGENT)
    await store.resolve_peer_sub_task("t1/sub-0", "x")
    await store.cleanup_task("t1")
    counts = await row_counts(store)
    # The history outlives the live rows: t1's checkpoint and its end, t2's checkpoint.
    assert counts == {"agent_paused_tasks": 1, "agent_peer_sub_tasks": 3,
                      "agent_parallel_invocations": 1, "agent_session_events": 1,
                      "agent_checkpoints": 3, "agent_checkpoint_heads": 2,
                      "agent_events": 0, "agent_ended_tasks": 1, "agent_breakers": 0,
                      # The LangGraph saver's and the sync's tables: no task writes to them.
                      "agent_langgraph_checkpoints": 0, "agent_langgraph_blobs": 0,
                      "agent_langgraph_writes": 0, "meshpoint_sync_sources": 0,
                      "meshpoint_sync_cursors": 0, "meshpoint_sync_conflicts": 0,
                      "meshpoint_sync_thread_changes": 0, "meshpoint_sync_threads": 0,
                      "meshpoint_sync_moves": 0}
    await store.cleanup_task("t2", outcome="canceled")
    assert await row_counts(store) == {**dict.fromkeys(counts, 0), "agent_ended_tasks": 2,
                                       "agent_checkpoints": 4, "agent_checkpoint_heads": 2}
    phases = [[r.execution_state.phase for r in await store.history.get_checkpoint_history(t)]
              for t in ("t1", "t2")]
    assert phases == [["completed", "waiting_peers"], ["canceled", "waiting_peers"]]


async def test_cleanup_under_a_lease_is_reserved_to_its_holder(store: SqlStore) -> None:
    await store.checkpoint_task(fan_out("t1", peers=1), AGENT)
    await store.resolve_peer_sub_task("t1/sub-0", "x", lease_owner="a")
    with pytest.raises(LeaseNotHeldError):
        await store.cleanup_task("t1", lease_owner="b")
    assert (await row_counts(store))["agent_paused_tasks"] == 1
    await store.cleanup_task("t1", lease_owner="a")
    assert set((await store.live_row_counts()).values()) == {0}
    assert (await row_counts(store))["agent_ended_tasks"] == 1


@pytest.mark.parametrize("backend", [
    pytest.param(name, marks=pytest.mark.postgres)
    for name in ("postgres", "postgres-portable")], indirect=True)
async def test_a_cleanup_that_waited_for_a_re_checkpoint_leaves_none_of_its_rows(
        store: SqlStore) -> None:
    """Under READ COMMITTED a cleanup deletes the children, then waits for the task
    row the lease holder is checkpointing again; the events that re-checkpoint adds
    commit after the children were deleted, and must not outlive the task. Staged:
    a transaction holds the task row and adds an event, as the re-checkpoint does.
    (SQLite's write lock runs one of the two wholly before the other.)"""
    await store.checkpoint_task(fan_out("t1"), AGENT)
    async with store._db.engine.connect() as holder:
        await holder.execute(update(paused_tasks).where(
            paused_tasks.c.logical_task_id == "t1").values(version=paused_tasks.c.version + 1))
        await holder.execute(insert(session_events).values(
            tenant_id=store.tenant_id, logical_task_id="t1", seq=1,
            data=[{"role": "model", "text": "written by the re-checkpoint"}], created_at=0.0))
        cleanup = asyncio.create_task(store.cleanup_task("t1"))
        await eventually(lambda: someone_waits_for(holder),
                         what="the cleanup to wait for the task row")
        assert not cleanup.done()
        await holder.commit()
    await cleanup
    assert set((await store.live_row_counts()).values()) == {0}


async def test_operator_listing_and_counts(store: SqlStore, clock: FakeClock) -> None:
    await store.checkpoint_task(fan_out("t1", timeout_s=100), AGENT)
    clock.advance(1)
    await store.checkpoint_task(fan_out("t2", timeout_s=10), AGENT)
    clock.advance(1)
    await store.checkpoint_task(fan_out("t3", peers=1, timeout_s=1), "researcher")
    await store.resolve_peer_sub_task("t3/sub-0", "x")
    clock.advance(20)
    stats = await store.stats()
    assert stats.paused_tasks == {(AGENT, "waiting_peers"): 2, ("researcher", "resuming"): 1}
    assert stats.total_paused == 3 and stats.pending_sub_tasks == 6
    assert stats.expired_sub_tasks == 3  # t2's
    assert stats.oldest_checkpointed_at == clock.now - 22
    assert stats.next_deadline == clock.now - 22 + 1 + 10
    listed = await store.list_paused_tasks(agent_name=AGENT)
    assert [t.task_id for t in listed] == ["t1", "t2"]
    assert listed[0].pending_sub_tasks == 3 and listed[1].next_deadline == stats.next_deadline
    resuming = await store.list_paused_tasks(status="resuming")
    assert [(t.task_id, t.pending_sub_tasks, t.next_deadline) for t in resuming] == [
        ("t3", 0, None)]
    deadlines = await store.next_deadlines(limit=4)
    assert [d.task_id for d in deadlines] == ["t2", "t2", "t2", "t1"]
    assert [d.task_id for d in await store.next_deadlines(agent_name="researcher")] == []


async def test_tenants_share_ids_without_seeing_each_other(store: SqlStore) -> None:
    other = store.for_tenant("tenant-b")
    await store.checkpoint_task(fan_out("t1", peers=1), AGENT)
    await other.checkpoint_task(fan_out("t1", peers=1), AGENT)
    mine = await store.resolve_peer_sub_task("t1/sub-0", "mine")
    theirs = await other.resolve_peer_sub_task("t1/sub-0", "theirs")
    assert mine is not None and theirs is not None and mine.join_complete
    assert await store.get_parallel_results("t1", "inv-1") == [("local", {"clock": "12:00"}),
                                                                ("call-0", "mine")]
    assert (await other.stats()).total_paused == 1
    await other.cleanup_task("t1")
    assert (await store.restore_task("t1")).status == "resuming"


async def test_a_held_lease_is_never_taken_by_the_join_completing(store: SqlStore) -> None:
    await store.checkpoint_task(fan_out("t1", peers=1), AGENT)
    # A canceler holds the lease of the waiting task when the last answer lands.
    assert await store.take_resume_lease("t1", "canceler", 30, statuses=["waiting_peers"])
    done = await store.resolve_peer_sub_task("t1/sub-0", "x", lease_owner="resumer")
    assert done is not None and done.join_complete and done.lease_owner is None
    restored = await store.restore_task("t1")
    assert (restored.status, restored.owner) == ("resuming", "canceler")
    assert await store.take_resume_lease("t1", "resumer", 30) is None


async def test_a_waiting_task_cannot_be_rewritten_over_arriving_answers(
        store: SqlStore) -> None:
    await store.checkpoint_task(fan_out("t1", peers=2), AGENT)
    assert await store.take_resume_lease("t1", "x", 30, statuses=["waiting_peers"])
    ctx = (await store.restore_task("t1", lease_owner="x")).context
    await store.resolve_peer_sub_task("t1/sub-0", "an answer that must not be lost")
    before = await snapshot(store)
    with pytest.raises(CheckpointConflictError, match="still waits on peer sub-tasks"):
        await store.checkpoint_task(ctx, AGENT, lease_owner="x")
    assert await snapshot(store) == before
    assert (await store.get_peer_sub_task("t1/sub-0")).result == \
        "an answer that must not be lost"


async def test_a_checkpoint_must_keep_the_conversation_it_restored(store: SqlStore) -> None:
    await store.checkpoint_task(fan_out("t1", peers=1), AGENT)
    await store.resolve_peer_sub_task("t1/sub-0", "x", lease_owner="x")
    ctx = (await store.restore_task("t1", lease_owner="x")).context
    ctx.session_events = ctx.session_events[:1]  # compacted behind the store's back
    ctx.session_events_persisted = 1
    ctx.current_invocation_id = "inv-2"
    ctx.register_peer_sub_task("t1/next", {"peer_agent_name": "p"})
    before = await snapshot(store)
    with pytest.raises(CheckpointConflictError, match="2 stored conversation events"):
        await store.checkpoint_task(ctx, AGENT, lease_owner="x")
    assert await snapshot(store) == before
    ctx.session_events_persisted = 5
    with pytest.raises(InvalidArgumentError, match="may only grow"):
        await store.checkpoint_task(ctx, AGENT, lease_owner="x")


async def test_one_corrupt_task_does_not_stop_the_sweeper(store: SqlStore,
                                                          clock: FakeClock) -> None:
    await store.checkpoint_task(fan_out("bad", peers=1, timeout_s=1), AGENT)
    await store.checkpoint_task(fan_out("good", peers=1, timeout_s=2), AGENT)
    await store.run(lambda conn: conn.execute(
        delete(parallel_invocations).where(parallel_invocations.c.logical_task_id == "bad")),
        write=True)
    clock.advance(3)
    swept = await store.sweep_expired_timeouts(AGENT, limit=10)
    assert [(r.sub_task.task_id, r.join_complete) for r in swept] == [("good", True)]
    assert (await store.get_peer_sub_task("bad/sub-0")).status == "quarantined"
    assert await store.sweep_expired_timeouts(AGENT) == []  # not picked again
    assert await store.resolve_peer_sub_task("bad/sub-0", "late") is None


async def test_a_closed_store_says_so(store_url: str, store_options: dict[str, object]) -> None:
    store = await open_store(store_url, **store_options)  # type: ignore[arg-type]
    await store.close()
    with pytest.raises(StoreError, match="closed"):
        await store.stats()


@pytest.mark.postgres
async def test_a_connection_the_server_dropped_fails_one_call_and_loses_nothing(
        postgres_url: str, pg_schema: str) -> None:
    """The pause-boundary statements await asyncpg directly (not through SQLAlchemy's
    pool machinery): a connection the server terminated must still be reported as
    the database being unavailable, be thrown away, and cost nothing but that call."""
    store = await open_store(postgres_url, schema=pg_schema, pool_size=1)
    try:
        await store.checkpoint_task(fan_out("dropped", local=False), AGENT)
        for attempt in ("first checkpoint", "resolution"):
            # With one pooled connection, this is the one the next call will use.
            pid = await store.run(
                lambda conn: conn.exec_driver_sql("SELECT pg_backend_pid()").scalar())
            await pg_execute_async(f"SELECT pg_terminate_backend({pid})")
            with pytest.raises(StoreUnavailableError):
                if attempt == "first checkpoint":
                    await store.checkpoint_task(fan_out("dropped-2", local=False), AGENT)
                else:
                    await store.resolve_peer_sub_task("dropped/sub-0", {"ok": True})
        # Nothing was written by the failed calls; the pool reconnects.
        await store.checkpoint_task(fan_out("dropped-2", local=False), AGENT)
        resolution = await store.resolve_peer_sub_task("dropped/sub-0", {"ok": True})
        assert resolution is not None and resolution.completed == 1
        assert await store.resolve_peer_sub_task("dropped/sub-0", {"ok": True}) is None
    finally:
        await store.close()


@pytest.mark.postgres
@pytest.mark.parametrize("pool_size", [1, 2])
async def test_concurrent_calls_on_a_small_pool_all_finish(
        postgres_url: str, pg_schema: str, pool_size: int) -> None:
    """A PostgreSQL store keeps one connection out of its pool between one-statement
    calls; a call waiting for the pool must get it back, whatever the mix."""
    store = await open_store(postgres_url, schema=pg_schema, pool_size=pool_size)

    async def life(n: int) -> None:
        task = f"small-pool-{pool_size}-{n}"  # ids are unique per tenant, ended ones too
        await store.checkpoint_task(fan_out(task, peers=2, local=False), AGENT)  # native
        for k in range(2):
            await store.resolve_peer_sub_task(f"{task}/sub-{k}", {"n": n})  # native
        await store.take_resume_lease(task, f"owner-{n}", 30)  # a transaction
        assert len((await store.restore_task(task)).context.session_events) == 2  # native
        await store.cleanup_task(task)  # a transaction

    try:
        before = await store.live_row_counts()  # the schema may hold other tests' rows
        await asyncio.wait_for(asyncio.gather(*(life(n) for n in range(40))), timeout=60)
        assert await store.live_row_counts() == before
    finally:
        await store.close()


async def test_an_ended_task_cannot_be_stored_again_until_forgotten(
        store: SqlStore, clock: FakeClock) -> None:
    """A late copy of an ended task's request (its instance died between the first
    checkpoint and its ack of the request) must not store the task anew: the ledger
    remembers that it ended until the agent's instances forget it."""
    await store.checkpoint_task(fan_out("t1", peers=1), AGENT)
    await store.cleanup_task("t1")
    before = await snapshot(store)
    with pytest.raises(TaskEndedError, match="'t1' has already ended"):
        await store.checkpoint_task(fan_out("t1", peers=1), AGENT)
    assert await snapshot(store) == before  # nothing written, on any path
    await store.checkpoint_task(fan_out("t2", peers=1), "other-agent")
    await store.cleanup_task("t2")
    clock.advance(60)
    assert await store.forget_ended_tasks(AGENT, older_than_s=120) == 0
    assert await store.forget_ended_tasks(AGENT, older_than_s=30) == 1  # its agent's only
    await store.checkpoint_task(fan_out("t1", peers=1), AGENT)  # forgotten: a new task
    with pytest.raises(TaskEndedError):
        await store.checkpoint_task(fan_out("t2", peers=1), "other-agent")
    with pytest.raises(InvalidArgumentError, match="older_than_s"):
        await store.forget_ended_tasks(AGENT, older_than_s=-1)


def mid_turn(task_id: str, done: int, of: int = 3) -> TaskExecutionContext:
    """A task in the middle of a turn of ``of`` local tool calls, ``done`` made."""
    ctx = TaskExecutionContext(task_id)
    ctx.current_invocation_id = "inv-1"
    ctx.begin_parallel_calls("inv-1", [f"call-{n}" for n in range(of)])
    for n in range(done):
        ctx.record_parallel_result("inv-1", f"call-{n}", f"result {n}")
    ctx.append_session_event({"role": "user", "content": "do three things"})
    return ctx


async def test_a_mid_turn_checkpoint_keeps_its_writers_lease_until_it_expires(
        store: SqlStore, clock: FakeClock) -> None:
    """Seed 004's strategies: a working checkpoint is taken by a task that keeps
    running. Its writer holds the lease through it; only once the lease expires (the
    writer died) does recovery list the task, which resumes from the calls made."""
    ctx = mid_turn("w1", done=1)
    await store.checkpoint_task(ctx, AGENT, status="working", holder="i1#1", hold_lease_s=5)
    assert (await store.restore_task("w1")).owner == "i1#1"
    assert await store.take_resume_lease("w1", "i2#1", 5, statuses=("working",)) is None
    assert await store.resumable_tasks(AGENT) == []
    ctx.record_parallel_result("inv-1", "call-1", "result 1")  # the next call is made
    await store.checkpoint_task(ctx, AGENT, status="working", lease_owner="i1#1",
                                holder="i1#1", hold_lease_s=5)
    clock.advance(4)
    assert await store.resumable_tasks(AGENT) == [], "the re-checkpoint kept the lease"
    clock.advance(2)  # the writer died: nobody renews
    assert await store.resumable_tasks(AGENT) == ["w1"]
    lease = await store.take_resume_lease("w1", "i2#1", 5, statuses=("resuming", "working"))
    assert lease is not None
    restored = (await store.restore_task("w1", lease_owner="i2#1")).context
    calls = restored.parallel_tool_calls["inv-1"]
    assert calls.ordered_results() == [("call-0", "result 0"), ("call-1", "result 1")]
    assert calls.call_order == ["call-0", "call-1", "call-2"]
    # The turn then pauses on a peer: the pause releases the lease as always.
    restored.register_peer_sub_task("w1/sub", {"function_call_id": "call-2",
                                               "peer_agent_name": "peer"})
    await store.checkpoint_task(restored, AGENT, lease_owner="i2#1")
    assert (await store.restore_task("w1")).owner is None


async def test_mid_turn_checkpoints_are_checked(store: SqlStore) -> None:
    before = await snapshot(store)
    for kwargs, reason in (
            ({"status": "working"}, "name its lease holder"),
            ({"holder": "i1"}, "the status must be 'working'"),
            ({"status": "working", "holder": "i1", "lease_owner": "i2"}, "its lease_owner"),
            ({"status": "working", "holder": "i1", "hold_lease_s": 0}, "ttl_s must be"),
            ({"status": "input_required"}, "have neither a result nor a pending")):
        with pytest.raises(InvalidArgumentError, match=reason):
            await store.checkpoint_task(mid_turn("w2", done=1), AGENT, **kwargs)
    assert await snapshot(store) == before


async def test_expiry_boundaries_and_first_match_counting(
        store: SqlStore, clock: FakeClock) -> None:
    """Seed 004's statistics and expiry: strictly older than the timeout is expired, a
    timeout of 0 disables expiry, a leased task is not listed for failing, and each
    task counts once, the first that matches: expired, input_required, working."""
    start = clock.now
    await store.checkpoint_task(fan_out("old-peers"), AGENT)                      # t=0
    clock.advance(10)
    approval = fan_out("old-approval", peers=0)
    approval.register_peer_sub_task("old-approval/a", {"function_call_id": "call-a",
                                                       "approval": {"tool": "t"}})
    await store.checkpoint_task(approval, AGENT, status="input_required")         # t=10
    clock.advance(10)
    await store.checkpoint_task(mid_turn("busy", done=1), AGENT, status="working",
                                holder="i1", hold_lease_s=1000)                    # t=20
    await store.checkpoint_task(fan_out("new-peers"), AGENT)
    clock.advance(10)  # now t=30: ages 30, 20, 10, 10

    stats = await store.stats()
    assert (stats.total, stats.expired, stats.input_required, stats.working) == (4, 0, 1, 1)
    assert stats.oldest_age_s == 30 and stats.mean_age_s == 17.5
    assert stats.oldest_checkpointed_at == start
    stats = await store.stats(expire_after_s=20)  # strictly older: only the first
    assert (stats.expired, stats.input_required, stats.working) == (1, 1, 1)
    stats = await store.stats(expire_after_s=9.5)  # all four; first match wins
    assert (stats.total, stats.expired, stats.input_required, stats.working) == (4, 4, 0, 0)

    assert await store.expired_tasks(AGENT, older_than_s=30) == []
    assert await store.expired_tasks(AGENT, older_than_s=20) == ["old-peers"]
    # The working task's lease is held: not listed, however old.
    assert await store.expired_tasks(AGENT, older_than_s=5) == ["old-peers", "old-approval",
                                                                "new-peers"]
    with pytest.raises(InvalidArgumentError, match="older_than_s must be"):
        await store.expired_tasks(AGENT, older_than_s=0)
    with pytest.raises(InvalidArgumentError, match="expire_after_s"):
        await store.stats(expire_after_s=-1)
