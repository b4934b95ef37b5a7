"""Property test of claim races: any mix of answers, duplicates, two-step claims and
sweeps, run concurrently on several pooled connections, resolves each sub-task once
and completes each join once."""

from __future__ import annotations

import asyncio
import itertools
from collections import Counter
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from meshpoint import TaskExecutionContext
from meshpoint.errors import NotFoundError
from meshpoint.store import Resolution, SqlStore, open_store
from tests.conftest import FakeClock

#: The store's own suite: also run with PostgreSQL's fast paths off.
pytestmark = pytest.mark.portable_too

AGENT = "coordinator"
_examples = itertools.count()

operations = st.lists(st.one_of(
    st.tuples(st.just("answer"), st.integers(0, 40), st.integers(1, 3)),  # sub, deliveries
    st.tuples(st.just("claim_record"), st.integers(0, 40), st.just(1)),
    st.tuples(st.just("sweep"), st.integers(1, 10), st.just(0)),
    st.tuples(st.just("advance"), st.integers(1, 20), st.just(0)),
), min_size=1, max_size=40)
shapes = st.lists(st.tuples(st.integers(1, 4), st.integers(0, 10)), min_size=1, max_size=6)


async def _apply(store: SqlStore, clock: FakeClock, op: tuple[str, int, int],
                 subs: list[str]) -> list[Resolution]:
    kind, n, repeat = op
    if kind == "advance":
        clock.advance(n)
        return []
    if kind == "sweep":
        return await store.sweep_expired_timeouts(AGENT, n, lease_owner="sweeper")
    sub_task_id = subs[n % len(subs)]
    out: list[Resolution] = []
    for _ in range(repeat):
        try:
            if kind == "answer":
                got = await store.resolve_peer_sub_task(sub_task_id, {"from": sub_task_id},
                                                        lease_owner="answerer")
            else:
                claimed = await store.claim_peer_sub_task(sub_task_id)
                got = None if claimed is None else await store.record_parallel_result(
                    claimed.task_id, claimed.invocation_id, claimed.function_call_id, "two-step")
        except NotFoundError:  # late: the task already finished and was cleaned up
            got = None
        if got is not None:
            out.append(got)
    return out


@pytest.fixture
async def shared_store(store_url: str, store_options: dict[str, Any],
                       clock: FakeClock) -> Any:
    async with open_store(store_url, clock=clock, pool_size=4, **store_options) as store:
        yield store


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(shape=shapes, ops=operations)
async def test_any_concurrent_mix_resolves_once_and_completes_each_join_once(
        shared_store: SqlStore, clock: FakeClock, shape: list[tuple[int, int]],
        ops: list[tuple[str, int, int]]) -> None:
    store = shared_store.for_tenant(f"example-{next(_examples)}")  # isolates examples
    subs: list[str] = []
    for t, (peers, timeout_s) in enumerate(shape):
        ctx = TaskExecutionContext(f"t{t}")
        ctx.current_invocation_id = "inv"
        for p in range(peers):
            ctx.register_peer_sub_task(f"t{t}/s{p}", {"peer_agent_name": "p",
                                                      "timeout_s": timeout_s})
            subs.append(f"t{t}/s{p}")
        await store.checkpoint_task(ctx, AGENT)

    batches = await asyncio.gather(*(_apply(store, clock, op, subs) for op in ops))
    resolutions = [r for batch in batches for r in batch]
    winners = Counter(r.sub_task.sub_task_id for r in resolutions)
    assert all(n == 1 for n in winners.values()), "a sub-task was resolved twice"
    joins = Counter(r.sub_task.task_id for r in resolutions if r.join_complete)
    assert all(n == 1 for n in joins.values()), "a join completed twice"
    for t, (peers, _) in enumerate(shape):
        resolved = sum(1 for s in winners if s.startswith(f"t{t}/"))
        assert (joins[f"t{t}"] == 1) == (resolved == peers)
        counted = sorted(r.completed for r in resolutions if r.sub_task.task_id == f"t{t}")
        assert counted == list(range(1, resolved + 1))  # the counter is exact
        stored = await store.get_peer_sub_tasks_for_task(f"t{t}")
        # Every resolution we saw is stored, and nothing else moved out of pending
        # except claims whose record was skipped (none here: claim and record pair up).
        assert {s.sub_task_id for s in stored if s.status == "resolved"} == {
            s for s in winners if s.startswith(f"t{t}/")}
        await store.cleanup_task(f"t{t}")
