"""The event log's times, on a SQLite file and on PostgreSQL: one exact value per event
(integer microseconds), returned as it is stored, so that an event's own timestamp is
a bound it falls on (``since`` inclusive, ``until`` exclusive); paging by the log's
order (time, then event id) never skips or repeats an event, however many share a
microsecond; and a thread's events come back whole."""

from __future__ import annotations

import itertools
import time
import types
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import meshpoint.events.log
from meshpoint.events.log import Event, EventStore
from meshpoint.store import SqlStore

#: Microseconds since the epoch of a day in 2026, where the frozen clock starts.
BASE_US = 1_795_000_000_000_000
_examples = itertools.count()


class FrozenClock:
    """The event log's clock, set by hand to ``ns`` nanoseconds since the epoch: the
    ``time`` module as :mod:`meshpoint.events.log` sees it (``time()`` as a float, as the
    real one, ``time_ns()`` exact)."""

    def __init__(self, ns: int = BASE_US * 1000) -> None:
        self.ns = ns

    def module(self) -> Any:
        return types.SimpleNamespace(time=lambda: self.ns / 1e9, time_ns=lambda: self.ns,
                                     perf_counter=time.perf_counter,
                                     monotonic=time.monotonic)


@pytest.fixture
def frozen(monkeypatch: pytest.MonkeyPatch) -> Iterator[FrozenClock]:
    clock = FrozenClock()
    monkeypatch.setattr(meshpoint.events.log, "time", clock.module())
    yield clock


def micros(when: datetime) -> int:
    return (when - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(microseconds=1)


async def test_an_events_own_timestamp_is_a_bound_it_falls_on(live_store: SqlStore) -> None:
    """On the real clock: ``since=e.timestamp`` finds ``e`` and ``until=e.timestamp``
    does not, for every event, given as the datetime the API returned or as its epoch
    seconds. (With times stored as float seconds and returned rounded to the
    microsecond, 30-50 % of events were missed by one bound or caught by the other.)"""
    log = EventStore(live_store)
    for n in range(300):
        log.log_event("a", "bounds", "step_start", step_name=f"s{n}")
    await log.flush()
    every = await log.get_events(thread_id="bounds")
    assert len(every) == 300
    wrong = []
    for event in every:
        for bound in (event.timestamp, event.timestamp.timestamp()):
            since = await log.get_events(thread_id="bounds", since=bound)
            until = await log.get_events(thread_id="bounds", until=bound)
            if event not in since or event in until:
                wrong.append((event.step_name, type(bound).__name__))
    assert wrong == [], f"{len(wrong)} of {2 * len(every)} bounds miss their event"
    assert all(e.timestamp_us == micros(e.timestamp) for e in every)


async def test_a_threads_events_come_back_whole_and_paging_never_skips_a_tie(
        live_store: SqlStore, frozen: FrozenClock) -> None:
    """2,500 events of one thread, 1,500 of them in one microsecond: ``get_events``
    returns all of them (it pages under the hood), in the log's order, and paging by
    hand with ``after=`` (the cursor is an event: its time and its id) gives each once,
    in pages that split the microsecond anywhere."""
    log = EventStore(live_store)
    for n in range(2500):
        frozen.ns = (BASE_US + (0 if n < 1500 else n)) * 1000 + n % 1000
        log.log_event("a", "whole", "step_start", step_name=f"s{n}")
    await log.flush()
    every = await log.get_events(thread_id="whole")
    assert len(every) == 2500
    assert every == sorted(every, key=lambda e: (e.timestamp_us, e.event_id))
    assert len({e.event_id for e in every}) == 2500
    paged: list[Event] = []
    page = await log.get_events(thread_id="whole", limit=333)
    while page:
        paged += page
        page = await log.get_events(thread_id="whole", limit=333, after=page[-1])
    assert paged == every
    newest = await log.get_events(thread_id="whole", newest_first=True, limit=700)
    newest += await log.get_events(thread_id="whole", newest_first=True, after=newest[-1])
    assert newest == every[::-1]
    assert len(await log.get_events(thread_id="whole", limit=10)) == 10  # a limit holds


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(offsets_ns=st.lists(st.integers(0, 6999), min_size=1, max_size=25),
       since=st.one_of(st.none(), st.integers(-1, 7)),
       until=st.one_of(st.none(), st.integers(-1, 8)),
       as_seconds=st.booleans())
async def test_since_is_inclusive_and_until_exclusive_to_the_microsecond(
        live_store: SqlStore, frozen: FrozenClock, offsets_ns: list[int],
        since: int | None, until: int | None, as_seconds: bool) -> None:
    """Events logged at a few microseconds (many in the same one, nanoseconds apart),
    and any bounds at, between or around them, given as datetimes or as epoch
    seconds: an event's time is the microsecond it was logged in, and exactly the
    events at or after ``since`` and strictly before ``until`` come back, each with
    that time."""
    log = EventStore(live_store.for_tenant(f"times-{next(_examples)}"))
    for n, offset in enumerate(offsets_ns):
        frozen.ns = BASE_US * 1000 + offset
        log.log_event("a", "t", "step_start", step_name=f"s{n}")
    await log.flush()

    def bound(offset_us: int | None) -> Any:
        if offset_us is None:
            return None
        when = datetime(1970, 1, 1, tzinfo=UTC) + timedelta(microseconds=BASE_US + offset_us)
        return when.timestamp() if as_seconds else when

    found = await log.get_events(thread_id="t", since=bound(since), until=bound(until))
    at = {f"s{n}": offset // 1000 for n, offset in enumerate(offsets_ns)}  # microseconds
    expected = sorted(name for name, us in at.items()
                      if (since is None or us >= since) and (until is None or us < until))
    assert sorted(e.step_name or "" for e in found) == expected
    assert all(micros(e.timestamp) == BASE_US + at[e.step_name or ""] for e in found)
    assert [micros(e.timestamp) for e in found] == sorted(micros(e.timestamp) for e in found)


async def test_follow_prints_each_event_that_commits_late_once_and_nothing_left_out(
        live_store: SqlStore) -> None:
    """``meshpoint events --follow`` without ``--since``: the newest ``--limit``, then
    every event that commits later, however far behind newer ones it is timed, once;
    never one that was there before (left out by ``--limit``). A writer may commit an
    event before the first read, between it and the newest (it then was not there when
    the follow began), or after. (The follower once read "what was there" after
    printing the newest, so an event that committed in between was taken for one that
    had been there and never printed; CI's loaded machine hit it.)"""
    from meshpoint.cli.events import Follower

    log = EventStore(live_store)
    thread = {"thread_id": "followed", "agent_id": None, "event_type": None}
    slow = [EventStore(live_store, flush_interval_s=3600) for _ in range(2)]
    log.log_event("a", "followed", "step_complete", step_name="left-out")
    await log.flush()
    slow[0].log_event("a", "followed", "step_complete", step_name="late-before-newest")
    slow[1].log_event("a", "followed", "step_complete", step_name="late-after-start")
    log.log_event("a", "followed", "step_complete", step_name="newest")
    await log.flush()

    follower = await Follower.tail(log, thread, until=None)
    await slow[0].close()  # commits after the follow began, before the newest are read
    found = (await log.get_events(**thread, limit=1, newest_first=True))[::-1]
    assert [e.step_name for e in found] == ["newest"]
    follower.shown(found)
    await slow[1].close()  # and after they were read
    assert sorted(e.step_name for e in await follower.poll()) == [
        "late-after-start", "late-before-newest"]
    assert await follower.poll() == []
    log.log_event("a", "followed", "step_complete", step_name="new")
    await log.flush()
    assert [e.step_name for e in await follower.poll()] == ["new"]
    await log.close()


async def test_follow_since_prints_a_late_event_from_that_time_but_none_before_it(
        live_store: SqlStore) -> None:
    """``--follow --since T``: every event from T (the first ``--limit``, then the
    rest), and an event timed before T never, even one that commits late."""
    from meshpoint.cli.events import Follower

    log = EventStore(live_store)
    thread = {"thread_id": "since", "agent_id": None, "event_type": None}
    before, after = (EventStore(live_store, flush_interval_s=3600) for _ in range(2))
    before.log_event("a", "since", "step_complete", step_name="before")
    log.log_event("a", "since", "step_complete", step_name="from")
    await log.flush()
    (since,) = await log.get_events(**thread)
    after.log_event("a", "since", "step_complete", step_name="late")
    follower = Follower(log, thread, since_us=since.timestamp_us)
    found = await log.get_events(**thread, since=since.timestamp)
    assert [e.step_name for e in found] == ["from"]
    follower.shown(found)
    await before.close()
    await after.close()
    assert [e.step_name for e in await follower.poll()] == ["late"]
    assert await follower.poll() == []
    await log.close()
