"""Recovery limits and the agent's circuit breaker in the store (docs/runtime.md,
"Recovery limits, the circuit breaker and alerts"), on a SQLite file and on
PostgreSQL, on a fake clock."""

from __future__ import annotations

import asyncio
import json
import multiprocessing
from pathlib import Path

import pytest

from meshpoint.errors import LeaseNotHeldError
from meshpoint.store import SqlStore
from tests.conftest import FakeClock
from tests.integration import breaker_worker
from tests.integration.test_store import AGENT, mid_turn

LIMITS = {"failures": 2, "window_s": 10.0, "cooldown_s": 5.0}


async def phases(store: SqlStore, task_id: str) -> list[str]:
    history = await store.history.get_checkpoint_history(task_id)
    return [record.execution_state.phase for record in reversed(history)]


async def test_take_overs_are_counted_recorded_and_cleared_by_progress(
        store: SqlStore, clock: FakeClock) -> None:
    ctx = mid_turn("w1", done=1)
    await store.checkpoint_task(ctx, AGENT, status="working", holder="i1#1", hold_lease_s=5)
    assert await store.recovery.take_over_task("w1", "i2#1", 5, agent_name=AGENT) is None, "held"
    for attempt, owner in enumerate(("i2#1", "i3#1"), start=1):
        clock.advance(6)  # the holder died
        lease = await store.recovery.take_over_task("w1", owner, 5, agent_name=AGENT)
        assert lease is not None and lease.taken_over and lease.recoveries == attempt
    assert await phases(store, "w1") == ["working", "recovering", "recovering"]
    latest = await store.history.get_latest_checkpoint("w1")
    assert latest is not None
    assert latest.extensions["recovering"]["attempt"] == 2
    assert "'i2#1'" in latest.extensions["recovering"]["why"]
    # The records keep the chain whole, and the live row still restores from it.
    assert (await store.history.verify_task("w1")).ok
    restored = (await store.restore_task("w1", lease_owner="i3#1")).context
    # A mid-turn checkpoint that adds nothing is no progress: the count stands.
    await store.checkpoint_task(restored, AGENT, status="working", lease_owner="i3#1",
                                holder="i3#1", hold_lease_s=5)
    clock.advance(6)
    lease = await store.recovery.take_over_task("w1", "i4#1", 5, agent_name=AGENT)
    assert lease is not None and lease.recoveries == 3
    # Progress (the conversation grew) clears it.
    restored = (await store.restore_task("w1", lease_owner="i4#1")).context
    restored.append_session_event({"role": "assistant", "content": "one step further"})
    await store.checkpoint_task(restored, AGENT, status="working", lease_owner="i4#1",
                                holder="i4#1", hold_lease_s=5)
    clock.advance(6)
    lease = await store.recovery.take_over_task("w1", "i5#1", 5, agent_name=AGENT)
    assert lease is not None and lease.recoveries == 1


async def test_a_released_lease_is_taken_without_counting(store: SqlStore,
                                                          clock: FakeClock) -> None:
    ctx = mid_turn("w1", done=1)
    await store.checkpoint_task(ctx, AGENT, status="working", holder="i1#1", hold_lease_s=5)
    assert await store.release_resume_lease("w1", "i1#1")
    lease = await store.recovery.take_over_task("w1", "i2#1", 5, agent_name=AGENT)
    assert lease is not None and not lease.taken_over and lease.recoveries == 0
    assert await phases(store, "w1") == ["working"]


async def test_a_blocked_task_is_recorded_and_only_a_resume_by_hand_takes_it_back(
        store: SqlStore, clock: FakeClock) -> None:
    ctx = mid_turn("w1", done=1)
    ctx.a2a_context.update({"status_to": "caller.status", "request_id": "r1"})
    await store.checkpoint_task(ctx, AGENT, status="working", holder="i1#1", hold_lease_s=5)
    with pytest.raises(LeaseNotHeldError):
        await store.block_task("w1", lease_owner="someone", reason="too many recoveries")
    blocked = await store.block_task("w1", lease_owner="i1#1", reason="too many recoveries")
    assert blocked.agent_name == AGENT and blocked.a2a_context["status_to"] == "caller.status"
    assert (await store.restore_task("w1")).status == "blocked"
    assert await phases(store, "w1") == ["working", "blocked"]
    assert await store.resumable_tasks(AGENT) == []
    assert await store.recovery.take_over_task("w1", "i2#1", 5, agent_name=AGENT) is None
    lease = await store.recovery.take_task_by_hand("w1", "operator#1", 5)
    assert lease is not None
    assert await store.recovery.take_task_by_hand("w1", "operator#2", 5) is None, "one resumer"
    restored = await store.restore_task("w1", lease_owner="operator#1")
    assert restored.status == "resuming"
    assert await phases(store, "w1") == ["working", "blocked", "recovering"]
    assert (await store.history.verify_task("w1")).ok


async def test_the_breaker_opens_holds_lets_one_trial_through_and_closes(
        store: SqlStore, clock: FakeClock) -> None:
    assert await store.breakers.admit(AGENT, "a#1", trial_ttl_s=3) == (
        True, await store.breakers.state(AGENT))
    _, after = await store.breakers.note(AGENT, "failure", owner="a#1", **LIMITS)
    assert after.state == "closed" and after.failures == 1
    clock.advance(11)  # the window ended: the count starts again
    _, after = await store.breakers.note(AGENT, "failure", owner="a#2", **LIMITS)
    assert after.failures == 1
    before, after = await store.breakers.note(AGENT, "failure", owner="b#1", **LIMITS)
    assert (before.state, after.state) == ("closed", "open")
    assert (await store.breakers.admit(AGENT, "a#3", trial_ttl_s=3))[0] is False
    clock.advance(5)  # the cool-down ended: one trial, decided in the database
    assert (await store.breakers.admit(AGENT, "b#2", trial_ttl_s=3))[0] is True
    assert (await store.breakers.admit(AGENT, "a#4", trial_ttl_s=3))[0] is False
    # Another resume's failure is not the trial's: ignored.
    _, after = await store.breakers.note(AGENT, "failure", owner="a#0", **LIMITS)
    assert after.state == "half_open"
    _, after = await store.breakers.note(AGENT, "failure", owner="b#2", **LIMITS)
    assert after.state == "open", "the trial failed: open again"
    clock.advance(5)
    assert (await store.breakers.admit(AGENT, "a#5", trial_ttl_s=3))[0] is True
    clock.advance(4)  # its holder died: the trial goes to the next asker
    assert (await store.breakers.admit(AGENT, "b#3", trial_ttl_s=3))[0] is True
    before, after = await store.breakers.note(AGENT, "success", owner="b#3", **LIMITS)
    assert (before.state, after.state) == ("half_open", "closed")
    assert (await store.breakers.admit(AGENT, "a#6", trial_ttl_s=3))[0] is True


async def test_the_breaker_opens_holds_and_closes_across_two_processes(
        store: SqlStore, store_url: str, store_options: dict[str, object],
        tmp_path: Path) -> None:
    """Two OS processes, each with its own store on the shared database: the breaker
    both count failures into opens once, holds both, gives exactly one the trial, and
    closes for both; a third store (a restarted instance) sees each state."""
    spawn = multiprocessing.get_context("spawn")
    barrier = spawn.Barrier(2)
    outs = [tmp_path / f"worker-{n}.json" for n in range(2)]
    workers = [spawn.Process(target=breaker_worker.run, args=(
        f"w{n}", store_url, store_options, barrier, str(outs[n]))) for n in range(2)]
    for worker in workers:
        worker.start()
    for worker in workers:
        await asyncio.to_thread(worker.join, 60)
    assert [w.exitcode for w in workers] == [0, 0]
    seen = [json.loads(out.read_text()) for out in outs]
    assert sorted(s["opened"] for s in seen) == [False, True], "opened once"
    assert all(s["held"] for s in seen), "held in both processes"
    assert sorted(s["trial"] for s in seen) == [False, True], "exactly one trial"
    assert [s.get("closed") for s in seen if s["trial"]] == [True]
    assert all(s["after"] for s in seen), "closed for both"
    assert (await store.breakers.state(AGENT)).state == "closed"
