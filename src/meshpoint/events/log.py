"""The event log (docs/events.md): every agent step and protocol message, queryable.

An :class:`EventStore` writes to the store's ``agent_events`` table (same URL, same
tenant, same row-level security). Writing never blocks the caller: ``log_event``
puts the event in a bounded in-memory buffer and returns, and a background task
writes what the buffer holds in one transaction every ``flush_interval_s`` (or as
soon as ``batch`` events wait). So a process killed with SIGKILL loses at most the
events of its last ``flush_interval_s`` (0.2 s by default) and of a write in flight;
a buffer that outgrows ``max_buffered`` drops its oldest events and counts them
(``dropped``), rather than grow without bound while the database is away.

Queries are async: :meth:`EventStore.get_events` (by thread, agent, type, time range,
oldest first; every match unless ``limit`` says otherwise, read a page at a time) and
:meth:`EventStore.get_latest_event`. ``thread_id`` is what LangGraph calls a thread
and meshpoint a task (``logical_task_id``); ``agent_id`` the agent's name.

An event's time is the microsecond it was logged in, stored as an integer and
returned exactly (:attr:`Event.timestamp`, :attr:`Event.timestamp_us`): an event's
own timestamp is a bound it falls on. ``since`` is inclusive, ``until`` exclusive;
a bound in epoch seconds is taken to the nearest microsecond. The log's order is
(time, event id), and ``after=event`` continues from an event in that order: the
cursor to page with, which no number of events logged in one microsecond can stall.

Values are stored as plain JSON (:func:`to_json`, in :mod:`meshpoint.events.values`):
LangChain messages as dicts with ``type``, ``content`` and the rest, pydantic models
(A2A messages among them) as their JSON, dataclasses, datetimes, enums, sets and bytes
by documented rules, and anything else as ``{"$type": ..., "$repr": ...}``. Nothing is
ever pickled, so reading an event imports nothing and runs nothing.

:func:`with_logging` wraps a sync or async step: ``step_start``, then
``step_complete`` (with its duration) or ``error`` (and the error goes on).
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import dataclasses
import functools
import inspect
import logging
import math
import threading
import time
from collections.abc import Awaitable, Callable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar, cast

from sqlalchemy import Connection, exc

from meshpoint.errors import InvalidArgumentError, KeyMissingError, StoreError
from meshpoint.events.values import converted
from meshpoint.events.values import to_json as to_json  # re-exported: part of the API
from meshpoint.history.planning import new_checkpoint_id
from meshpoint.store import event_queries as eq
from meshpoint.store.base import Transactional
from meshpoint.store.checks import check_id, check_limit
from meshpoint.store.sealing import CLEAR, Sealer, open_event_payload, seal_event_row

logger = logging.getLogger("meshpoint.events")
F = TypeVar("F", bound=Callable[..., Any])

# Event types: the step and protocol events first, then the runtime's own.
STEP_START = "step_start"
STEP_COMPLETE = "step_complete"
ERROR = "error"
PROTOCOL_HANDOFF = "protocol_handoff"
PROTOCOL_RECEIVE = "protocol_receive"
PAUSE = "pause"
RESUME = "resume"
ANSWER = "answer"
APPROVAL = "approval"
TIMEOUT = "timeout"
CANCEL = "cancel"
RECOVERY = "recovery"
#: An iteration handed off (seed 001's AGENT_HANDOFF), and the next one read it.
AGENT_HANDOFF = "agent_handoff"
AGENT_HANDOFF_RECEIVED = "agent_handoff_received"
#: Written by the store when a task's history fails verification (docs/history.md).
INTEGRITY = ("integrity_repaired", "integrity_rewound", "integrity_blocked",
             "integrity_restarted")
EVENT_TYPES = (STEP_START, STEP_COMPLETE, ERROR, PROTOCOL_HANDOFF, PROTOCOL_RECEIVE, PAUSE,
               RESUME, ANSWER, APPROVAL, TIMEOUT, CANCEL, RECOVERY, AGENT_HANDOFF,
               AGENT_HANDOFF_RECEIVED, *INTEGRITY)

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)
#: The widest bounds a query can have (``until`` is exclusive).
_FIRST_US, _LAST_US = -(2**63), 2**63 - 1
#: Events read per query when :meth:`EventStore.get_events` pages under the hood.
PAGE = 1000


@dataclasses.dataclass(frozen=True, slots=True)
class Event:
    """One event of the log, as read back. ``timestamp`` is the microsecond it was
    logged in (UTC), exactly as stored: pass it (or the event itself, as ``after``)
    back as a bound and it falls on this event."""

    event_id: str
    agent_id: str
    thread_id: str | None
    event_type: str
    step_name: str | None
    input_data: Any
    output_data: Any
    state_snapshot: Any
    timestamp: datetime

    @property
    def timestamp_us(self) -> int:
        """The time as stored: integer microseconds since the epoch."""
        return (self.timestamp - _EPOCH) // _MICROSECOND

    def to_dict(self) -> dict[str, Any]:
        return {**{f.name: getattr(self, f.name) for f in dataclasses.fields(self)},
                "timestamp": self.timestamp.isoformat()}


def _micros(value: datetime | float | None, name: str) -> int | None:
    """A bound as integer microseconds since the epoch: a datetime exactly (naive is
    UTC), epoch seconds to the nearest microsecond."""
    if value is None:
        return None
    us: int | None = None
    if isinstance(value, datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=UTC)
        us = (value - _EPOCH) // _MICROSECOND
    elif type(value) is int:
        us = value * 1_000_000
    elif type(value) is float and math.isfinite(value):
        us = round(value * 1_000_000)
    if us is None or not _FIRST_US <= us <= _LAST_US:
        raise InvalidArgumentError(
            f"{name} must be a datetime or finite epoch seconds, got {value!r:.80}")
    return us


class EventStore:
    """The event log of one tenant (see the module docstring). Build it on an open
    store (``EventStore(store)``) and close it to write what is buffered."""

    def __init__(self, store: Transactional, *, flush_interval_s: float = 0.2, batch: int = 200,
                 max_buffered: int = 10_000) -> None:
        if not flush_interval_s > 0 or batch < 1 or max_buffered < batch:
            raise InvalidArgumentError("flush_interval_s must be > 0, batch >= 1 and "
                                       "max_buffered >= batch")
        self.store = store
        #: How the store encrypts payloads (store/sealing.py): sealed when written,
        #: opened when read (a payload whose key is gone reads as unreadable).
        self._sealer: Sealer = getattr(store, "sealer", CLEAR)
        self.flush_interval_s = flush_interval_s
        self.batch = batch
        #: ``(seq, row)`` in the order logged; ``seq`` counts every event logged.
        self._buffer: collections.deque[tuple[int, dict[str, Any]]] = collections.deque(
            maxlen=max_buffered)
        self._lock = threading.Lock()  # log_event may be called from worker threads
        self._logged = 0
        #: The batches being written, by their first ``seq``: ``(last seq, done)``,
        #: ``done`` resolved once the write ended (committed, or its rows put back).
        #: A concurrent future, so a flush on any loop or thread can wait for it.
        self._in_flight: dict[int, tuple[int, concurrent.futures.Future[None]]] = {}
        self._wake = asyncio.Event()
        self._flusher: asyncio.Task[None] | None = None
        self._closing = False
        # The loop the writer runs on: the one this store is built on, or, when that
        # one is not running, the one an event is logged from (events logged from
        # other threads wake it there).
        self._loop: asyncio.AbstractEventLoop | None = None
        with contextlib.suppress(RuntimeError):
            self._loop = asyncio.get_running_loop()
        # A writer start asked for from another thread before close() or abandon()
        # is void: each of them moves on to the next generation.
        self._generation = 0
        #: Events dropped because the buffer was full (the database was away too long).
        self.dropped = 0
        #: Events dropped because the database refused them (logged with the reason).
        self.refused = 0
        #: Events written so far.
        self.written = 0

    @property
    def buffered(self) -> int:
        """Events logged and not written yet."""
        return len(self._buffer)

    # -- writing ---------------------------------------------------------------------

    def log_event(self, agent_id: str, thread_id: str | None, event_type: str, *,
                  step_name: str | None = None, input_data: Any = None,
                  output_data: Any = None, state_snapshot: Any = None,
                  protocol_message: Any = None) -> str:
        """Log one event and return its id at once; it is written within
        ``flush_interval_s`` (see the module docstring). ``protocol_message`` (an A2A
        message, say) is kept in ``input_data["_protocol_message"]``, as the log's
        does. InvalidArgumentError for a missing agent or event type."""
        check_id("agent_id", agent_id)
        check_id("event_type", event_type, max_len=64)
        if thread_id is not None:
            check_id("thread_id", thread_id)
        if step_name is not None:
            check_id("step_name", step_name)
        data = converted(input_data)
        if protocol_message is not None:
            data = {**(data if isinstance(data, dict) else
                       {} if data is None else {"value": data}),
                    "_protocol_message": converted(protocol_message)}
        event_id = new_checkpoint_id()  # a UUIDv7: events sort by time
        row = {"p_tenant": self.store.tenant_id, "p_event_id": event_id, "p_agent": agent_id,
               "p_task": thread_id, "p_event_type": event_type, "p_step": step_name,
               "p_input": data, "p_output": converted(output_data),
               "p_state": converted(state_snapshot),
               "p_at_us": time.time_ns() // 1000}  # exact: no float seconds
        with self._lock:
            if len(self._buffer) == self._buffer.maxlen:
                self.dropped += 1
            self._logged += 1
            self._buffer.append((self._logged, row))
            size = len(self._buffer)
        self._notify(size)
        return event_id

    def _notify(self, size: int) -> None:
        """Start the writer with the first event (on the store's loop, from whichever
        thread logs it), and wake it early when a batch is waiting."""
        try:
            loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        if loop is not None and (self._loop is None or not self._loop.is_running()):
            self._loop = loop
        target, writer = self._loop, self._flusher
        if target is None or (writer is not None and not writer.done()
                              and size < self.batch):
            return  # no loop yet (flush() or the next event from a loop writes it)
        if loop is target:
            self._wake_writer(self._generation)
        else:
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                target.call_soon_threadsafe(self._wake_writer, self._generation)

    def _wake_writer(self, generation: int) -> None:
        """On the writer's loop: start the writer (again, if the one there is gone or
        of another loop), or wake it; nothing once closing, or if close() or abandon()
        came after the event that asked."""
        if self._closing or generation != self._generation:
            return
        loop = asyncio.get_running_loop()
        writer = self._flusher
        if writer is None or writer.done() or writer.get_loop() is not loop:
            self._wake = asyncio.Event()  # an Event belongs to the loop that waits on it
            self._flusher = loop.create_task(self._flush_forever())
        else:
            self._wake.set()

    async def _flush_forever(self) -> None:
        while not self._closing:
            try:
                await asyncio.wait_for(self._wake.wait(), self.flush_interval_s)
            except TimeoutError:
                pass
            self._wake.clear()
            if getattr(self.store, "closed", False):  # nothing will be written any more
                if self._buffer:
                    logger.error("the store is closed: %d event(s) are not written "
                                 "(logged after this event log was closed?)",
                                 len(self._buffer))
                self._flusher = None
                return
            try:
                await self.flush()
            except Exception as error:
                logger.warning("could not write %d event(s) yet (%s); retrying",
                               len(self._buffer), error)

    async def flush(self) -> int:
        """Write every event logged before this call, in batches of ``batch``, and
        return once each is committed (or dropped as refused, see :meth:`_write`):
        a batch the background writer took before the call and is still writing is
        waited for, and if that write failed, its events (back in the buffer) are
        written here. How many events this call wrote; raises what a write of its
        own raised (the events are kept for the next attempt)."""
        with self._lock:
            target = self._logged
        total = 0
        while True:
            total += await self._drain(target)
            with self._lock:
                taken = [done for first, (_, done) in self._in_flight.items()
                         if first <= target]
            if not taken:
                return total
            # Another writer's batch holds some of them: wait for it to end. Its rows
            # were committed, or went back to the buffer for the next pass to write.
            for done in taken:
                await asyncio.wrap_future(done)

    async def _drain(self, through: int) -> int:
        """Write the buffered events up to ``seq`` ``through``, a batch at a time;
        how many were written."""
        total = 0
        while True:
            with self._lock:
                taken: list[tuple[int, dict[str, Any]]] = []
                while self._buffer and len(taken) < self.batch and \
                        self._buffer[0][0] <= through:
                    taken.append(self._buffer.popleft())
                if not taken:
                    return total
                done: concurrent.futures.Future[None] = concurrent.futures.Future()
                self._in_flight[taken[0][0]] = (taken[-1][0], done)
            try:
                written = await self._write([row for _, row in taken])
            except BaseException:
                with self._lock:  # put them back, in order, for the next attempt
                    self._buffer.extendleft(reversed(taken))
                raise
            finally:
                # Ended either way (the rows committed, or are back in the buffer):
                # whoever waits on this batch may go on.
                with self._lock:
                    del self._in_flight[taken[0][0]]
                done.set_result(None)
            total += written
            self.written += written

    async def _write(self, rows: list[dict[str, Any]]) -> int:
        """Write ``rows`` in one transaction; how many were written. Rows the database
        refuses for what they hold (:func:`_refused`; anything else, the database
        being away among them, is raised) are written in halves, so that an event it
        cannot store is dropped (logged and counted in ``refused``) and never holds
        back the others. A row written before a retry is not written twice: the
        insert skips an event id already stored."""
        # Sealed here, off the callers' path, once per attempt (a batch put back in
        # the buffer is sealed again: a fresh nonce, the same event id). Without the
        # tenant's key nothing can be written, and nothing is written in clear.
        try:
            sealed = [seal_event_row(self._sealer, row) for row in rows]
        except KeyMissingError as error:
            self.refused += len(rows)
            logger.error("%d event(s) are dropped: %s", len(rows), error)
            return 0

        def write(conn: Connection) -> None:
            eq.INSERT_EVENT.execute_many(conn, sealed)

        try:
            await self.store.transaction(write, write=True, doing="writing events")
        except Exception as error:
            if not _refused(error):
                raise
            if len(rows) > 1:
                half = len(rows) // 2
                return await self._write(rows[:half]) + await self._write(rows[half:])
            self.refused += 1
            logger.error("event %s (%s of agent %r) was refused by the database and is "
                         "dropped: %s", rows[0]["p_event_id"], rows[0]["p_event_type"],
                         rows[0]["p_agent"], error)
            return 0
        return len(rows)

    async def close(self) -> None:
        """Stop the background writer and write what is left. A write in flight is
        let finish, not canceled (canceled, its commit could land unseen and its
        events be written twice; the insert ignores an event id already written)."""
        self._generation += 1
        self._closing = True
        try:
            writer, self._flusher = self._flusher, None
            if writer is not None and writer.get_loop() is asyncio.get_running_loop():
                self._wake.set()
                await writer
            # a writer of another loop ended with it (or waits there, never woken)
            await self.flush()
        finally:
            self._closing = False

    def abandon(self) -> None:
        """Stop the background writer and drop what is buffered (a crash's loss)."""
        self._generation += 1
        if self._flusher is not None:
            self._flusher.cancel()
            self._flusher = None
        with self._lock:
            self.dropped += len(self._buffer)
            self._buffer.clear()

    async def __aenter__(self) -> EventStore:
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.close()

    # -- reading ---------------------------------------------------------------------

    async def get_events(self, *, thread_id: str | None = None, agent_id: str | None = None,
                         event_type: str | None = None,
                         since: datetime | float | None = None,
                         until: datetime | float | None = None,
                         limit: int | None = None, newest_first: bool = False,
                         after: Event | None = None) -> list[Event]:
        """Events matching every filter given, oldest first (``newest_first``: the
        other way), in the log's order: by time, then by event id.

        ``since`` is inclusive and ``until`` exclusive, each a datetime (naive is
        UTC) or epoch seconds (to the nearest microsecond, the log's resolution):
        ``since=e.timestamp`` finds ``e``, ``until=e.timestamp`` does not. ``after``
        continues from an event (one this returned) in the same order: the cursor to
        page with. ``limit``: at most that many; None (the default) returns every
        match, read :data:`PAGE` at a time, so that a thread's events come back whole,
        as the event log's readers expect them."""
        if limit is not None:
            check_limit(limit)
        for name, value in (("thread_id", thread_id), ("agent_id", agent_id),
                            ("event_type", event_type)):
            if value is not None:
                check_id(name, value)
        if after is not None and not isinstance(after, Event):
            raise InvalidArgumentError(f"after must be an Event, got {after!r:.80}")
        first, last = _micros(since, "since"), _micros(until, "until")
        params: dict[str, Any] = {
            "p_tenant": self.store.tenant_id, "p_task": thread_id,
            "p_any_task": thread_id is None, "p_agent": agent_id,
            "p_any_agent": agent_id is None, "p_event_type": event_type,
            "p_any_type": event_type is None,
            "p_since_us": _FIRST_US if first is None else first,
            "p_until_us": _LAST_US if last is None else last}
        statement = eq.GET_LOG_EVENTS_DESC if newest_first else eq.GET_LOG_EVENTS
        def payload(value: Any, param: str, event_id: str) -> Any:
            return open_event_payload(self._sealer, value, param, event_id)

        found: list[Event] = []
        while limit is None or len(found) < limit:
            page = PAGE if limit is None else min(PAGE, limit - len(found))
            cursor = found[-1] if found else after
            query = {**params, "p_limit": page, "p_no_cursor": cursor is None,
                     "p_after_us": 0 if cursor is None else cursor.timestamp_us,
                     "p_after_id": "" if cursor is None else cursor.event_id}
            rows = await self.store.transaction(
                functools.partial(statement.rows, params=query), doing="reading events")
            found += [Event(event_id=r.event_id, agent_id=r.agent_name,
                            thread_id=r.logical_task_id, event_type=r.event_type,
                            step_name=r.step_name,
                            input_data=payload(r.input_data, "p_input", r.event_id),
                            output_data=payload(r.output_data, "p_output", r.event_id),
                            state_snapshot=payload(r.state_snapshot, "p_state", r.event_id),
                            timestamp=_EPOCH + timedelta(microseconds=r.created_at_us))
                      for r in rows]
            if len(rows) < page:
                break
        return found

    async def get_latest_event(self, **filters: Any) -> Event | None:
        """The newest event matching the filters of :meth:`get_events`, or None."""
        events = await self.get_events(**filters, limit=1, newest_first=True)
        return events[0] if events else None


def _refused(error: Exception) -> bool:
    """Whether a write failed for what its rows hold: a value the store's JSON cannot
    encode, or the database's verdict on the data (a data exception, a constraint, a
    size limit),
    as opposed to the database being away, the schema missing, or a bug."""
    if isinstance(error, InvalidArgumentError):
        return True
    if type(error) is not StoreError:
        return False  # StoreUnavailableError, SchemaError, ..., or not the store's
    cause = error.__cause__
    if isinstance(cause, exc.DataError | exc.IntegrityError):
        return True
    # 22 data exception, 23 a constraint, 54 a program limit (a JSON value too large)
    return str(getattr(getattr(cause, "orig", None), "sqlstate", "") or "")[:2] in (
        "22", "23", "54")


def with_logging(events: EventStore, *, agent_id: str, step_name: str | None = None,
                 thread_id: str | Callable[..., str | None] | None = None) -> Callable[[F], F]:
    """Log a step (sync or async) into ``events``: ``step_start`` with its
    arguments, then ``step_complete`` with its result and ``duration_ms``, or
    ``error`` with the exception and ``duration_ms`` (the exception goes on).

    ``thread_id`` is a string, a function of the step's arguments, or, by default,
    found in them: a ``thread_id`` keyword, or a LangGraph ``config`` whose
    ``configurable`` has one. ``step_name`` defaults to the function's name."""
    def find_thread(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
        if callable(thread_id):
            return thread_id(*args, **kwargs)
        if thread_id is not None:
            return thread_id
        if isinstance(kwargs.get("thread_id"), str):
            return cast(str, kwargs["thread_id"])
        for value in (kwargs.get("config"), *args):
            if isinstance(value, Mapping):
                found = (value.get("configurable") or {}).get("thread_id")
                if isinstance(found, str):
                    return found
        return None

    def decorate(step: F) -> F:
        name = step_name or step.__name__

        def log(thread: str | None, event_type: str, **data: Any) -> None:
            # The step runs, and its error goes on, whatever logging it makes of them.
            try:
                events.log_event(agent_id, thread, event_type, step_name=name, **data)
            except Exception as error:
                logger.warning("could not log %s of step %r: %s", event_type, name, error)

        def start(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[str | None, float]:
            try:
                thread = find_thread(args, kwargs)
            except Exception as error:
                logger.warning("could not find the thread of step %r: %s", name, error)
                thread = None
            log(thread, STEP_START, input_data={"args": args, "kwargs": kwargs})
            return thread, time.perf_counter()

        def done(thread: str | None, started: float, result: Any) -> None:
            log(thread, STEP_COMPLETE, output_data=result, state_snapshot={
                "duration_ms": round((time.perf_counter() - started) * 1000, 3)})

        def failed(thread: str | None, started: float, error: BaseException) -> None:
            log(thread, ERROR, output_data=error, state_snapshot={
                "duration_ms": round((time.perf_counter() - started) * 1000, 3)})

        if inspect.iscoroutinefunction(step):
            @functools.wraps(step)
            async def run_async(*args: Any, **kwargs: Any) -> Any:
                thread, started = start(args, kwargs)
                try:
                    result = await cast(Callable[..., Awaitable[Any]], step)(*args, **kwargs)
                except BaseException as error:
                    failed(thread, started, error)
                    raise
                done(thread, started, result)
                return result

            return cast(F, run_async)

        @functools.wraps(step)
        def run(*args: Any, **kwargs: Any) -> Any:
            thread, started = start(args, kwargs)
            try:
                result = step(*args, **kwargs)
            except BaseException as error:
                failed(thread, started, error)
                raise
            done(thread, started, result)
            return result

        return cast(F, run)

    return decorate


class EventJournal:
    """An instance's journal (:class:`meshpoint.runtime.stats.Journal`): logs its
    agent's steps into an :class:`EventStore`, never blocking the turn that calls it
    and never failing it (an event that cannot be logged is dropped and counted).
    Each event's ``state_snapshot`` carries ``instance_id``, the instance's id as it
    was given (``serve --instance-id``): who did it. A lease's per-attempt owner
    (``ID#N``) is never put in its place; the events that take a lease name it
    apart, as ``lease_owner`` in their ``output_data``."""

    def __init__(self, events: EventStore, agent_name: str,
                 instance_id: str | None = None) -> None:
        self.events = events
        self.agent_name = agent_name
        self.instance_id = instance_id

    def __call__(self, event_type: str, task_id: str | None, *, step: str | None = None,
                 input: Any = None, output: Any = None, state: Any = None,
                 message: Any = None) -> None:
        if self.instance_id is not None:
            state = ({"instance_id": self.instance_id, **state} if isinstance(state, dict)
                     else {"instance_id": self.instance_id} if state is None
                     else {"instance_id": self.instance_id, "state": state})
        try:
            self.events.log_event(self.agent_name, task_id, event_type, step_name=step,
                                  input_data=input, output_data=output,
                                  state_snapshot=state, protocol_message=message)
        except Exception as error:
            self.events.dropped += 1
            logger.warning("could not log %s of %s: %s", event_type, task_id, error)
