"""The announcement check of a stored peer call (``announce_check_s``), on SQLite and
PostgreSQL: a caller that dies between its checkpoint and the publish of its calls
leaves them in the store only; the sweeper's check takes each call the peer has said
nothing of, once, moves its deadline to its timeout's, and the runtime publishes it
again (the broker drops the copy of a request it has)."""

from __future__ import annotations

import pytest

from meshpoint import TaskExecutionContext
from meshpoint.store import SqlStore
from tests.conftest import FakeClock
from tests.integration.test_store import AGENT, fan_out

pytestmark = pytest.mark.portable_too


def checked_fan_out(task_id: str, peers: int = 2, *, check_s: float = 5.0,
                    timeout_s: float = 60.0) -> TaskExecutionContext:
    ctx = fan_out(task_id, peers, local=False, timeout_s=timeout_s)
    for correlation in ctx.active_peer_sub_tasks.values():
        correlation["announce_check_s"] = check_s
    return ctx


async def test_a_call_nobody_answered_is_taken_once_at_its_check_then_times_out(
        store: SqlStore, clock: FakeClock) -> None:
    receipt = await store.checkpoint_task(checked_fan_out("t1"), AGENT)
    assert receipt.sub_task_deadlines == {"t1/sub-0": clock.now + 5, "t1/sub-1": clock.now + 5}
    assert await store.check_announcements(AGENT) == []  # not due yet
    clock.advance(6)
    # Due for its check, not expired: no sweep times it out, nor counts it overdue.
    assert await store.sweep_expired_timeouts(AGENT) == []
    assert (await store.stats()).expired_sub_tasks == 0
    due = await store.check_announcements(AGENT)
    assert sorted(s.sub_task_id for s in due) == ["t1/sub-0", "t1/sub-1"]
    created = clock.now - 6
    assert {s.timeout_deadline for s in due} == {created + 60}  # the timeout's, now
    assert due[0].correlation_data["announce_check_s"] == 5
    assert await store.check_announcements(AGENT) == []  # once
    clock.advance(55)
    swept = await store.sweep_expired_timeouts(AGENT)
    assert sorted(r.sub_task.sub_task_id for r in swept) == ["t1/sub-0", "t1/sub-1"]


async def test_a_call_the_peer_spoke_of_or_answered_is_not_checked(
        store: SqlStore, clock: FakeClock) -> None:
    await store.checkpoint_task(checked_fan_out("t1", peers=3), AGENT)
    await store.reset_timeout_deadline("t1/sub-0", peer_task_id="peer-task")  # working on it
    await store.resolve_peer_sub_task("t1/sub-1", "answered")
    clock.advance(6)
    assert [s.sub_task_id for s in await store.check_announcements(AGENT)] == ["t1/sub-2"]


async def test_a_check_later_than_the_timeout_is_the_timeout(
        store: SqlStore, clock: FakeClock) -> None:
    receipt = await store.checkpoint_task(checked_fan_out("t1", check_s=30, timeout_s=10), AGENT)
    assert set(receipt.sub_task_deadlines.values()) == {clock.now + 10}
    clock.advance(11)
    assert await store.check_announcements(AGENT) == []
    assert len(await store.sweep_expired_timeouts(AGENT)) == 2


async def test_a_claim_ends_the_check_and_a_claimer_that_dies_leaves_a_timeout(
        store: SqlStore, clock: FakeClock) -> None:
    """A claimed call is never published again, and still times out when its claimer
    dies before recording its result (the claim's deadline still runs)."""
    await store.checkpoint_task(checked_fan_out("t1", peers=1, timeout_s=60), AGENT)
    assert await store.claim_peer_sub_task("t1/sub-0") is not None  # ...its claimer dies
    assert (await store.stats()).next_deadline == clock.now + 60
    clock.advance(6)
    assert await store.check_announcements(AGENT) == []
    clock.advance(55)
    swept = await store.sweep_expired_timeouts(AGENT)
    assert [r.sub_task.sub_task_id for r in swept] == ["t1/sub-0"]


async def test_operators_are_shown_the_timeout_not_the_check(
        store: SqlStore, clock: FakeClock) -> None:
    await store.checkpoint_task(checked_fan_out("t1", timeout_s=60), AGENT)
    assert (await store.stats()).next_deadline == clock.now + 60
    assert [t.next_deadline for t in await store.list_paused_tasks()] == [clock.now + 60]
