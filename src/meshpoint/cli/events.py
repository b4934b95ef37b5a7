"""``meshpoint events``: the event log from the command line, and ``meshpoint tasks
reconstruct``: a task's recovery prompt.

Both work on the store directly (see :mod:`meshpoint.cli.common` for ``--url``,
``--config``, ``--tenant``), print a table or, with ``--json``, JSON, and exit 1 with
the reason on an error.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
import time
from collections.abc import AsyncIterator, Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any, NoReturn

import typer
from rich.table import Table

from meshpoint.cli.common import (
    AsJson,
    Config,
    Schema,
    Tenant,
    Url,
    console,
    run_on_store,
    shown,
)
from meshpoint.store.checks import MAX_LIMIT

#: How far back each poll of ``--follow`` looks again. An event's time is when it was
#: logged, and a writer buffers it for up to its ``flush_interval_s`` (and a busy
#: machine longer) before it commits, so an event can appear after later ones did.
FOLLOW_LOOKBACK_S = 30.0
_LOOKBACK_US = int(FOLLOW_LOOKBACK_S * 1_000_000)
_PAGE = 1000
_POLL_PAGES = 10

_RELATIVE = re.compile(r"(\d+(?:\.\d+)?)([smhd])")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86_400}


def parse_time(text: str | None, option: str) -> float | None:
    """Epoch seconds from an ISO 8601 time, epoch seconds, or a span ago (``90s``,
    ``10m``, ``2h``, ``1d``)."""
    if text is None:
        return None
    match = _RELATIVE.fullmatch(text.strip())
    if match:
        return time.time() - float(match.group(1)) * _UNITS[match.group(2)]
    try:
        seconds = float(text)
    except ValueError:
        pass
    else:
        if math.isfinite(seconds):
            return seconds
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise typer.BadParameter(f"{text!r} is not a time: give ISO 8601 "
                                 "(2026-11-24T12:00:00), epoch seconds, or a span ago "
                                 "(90s, 10m, 2h, 1d)", param_hint=option) from None
    return (when if when.tzinfo else when.replace(tzinfo=UTC)).timestamp()


def events(task: Annotated[str | None, typer.Option("--task", help="A task (thread).")] = None,
           agent: Annotated[str | None, typer.Option("--agent", help="An agent.")] = None,
           kind: Annotated[str | None, typer.Option(
               "--type", help="An event type (step_start, error, pause, ...).")] = None,
           since: Annotated[str | None, typer.Option(
               "--since", help="From this time, inclusive (ISO time, epoch seconds, or a "
               "span ago: 10m); to the microsecond.")] = None,
           until: Annotated[str | None, typer.Option(
               "--until", help="Before this time, exclusive (as --since).")] = None,
           limit: Annotated[int, typer.Option(
               min=1, max=MAX_LIMIT, help="Events at most (whether more match is "
               "said).")] = 100,
           follow: Annotated[bool, typer.Option(
               "--follow", "-f", help="Keep printing new events until Ctrl-C.")] = False,
           url: Url = None, config: Config = None, schema: Schema = None,
           tenant: Tenant = None, as_json: AsJson = False) -> None:
    """The event log, oldest first: every step and protocol message of agents that
    keep one (``events: true``), and the integrity events of the history; the first
    ``--limit``, and a line (``"more": true`` in JSON) when more match. ``--since`` is
    inclusive, ``--until`` exclusive, to the microsecond an event was logged in. With
    ``--follow``, the newest ``--limit`` (or those from ``--since``), then new events as
    they are written (``--json``: one JSON line each)."""
    from meshpoint.events.log import EventStore

    first = parse_time(since, "--since")
    last = parse_time(until, "--until")
    filters: dict[str, Any] = {"thread_id": task, "agent_id": agent, "event_type": kind}

    async def body(store: Any) -> tuple[list[Any], bool]:
        log = EventStore(store)
        follower = None
        if follow and first is None:  # as tail -f: the newest, then what comes
            # What is there before the newest are read is never printed later; read
            # first, so that an event that commits meanwhile is printed, not lost.
            follower = await Follower.tail(log, filters, until=last)
            found = (await log.get_events(**filters, until=last, limit=limit,
                                          newest_first=True))[::-1]
        else:
            # One more than asked for: whether more match is said, not left unseen.
            found = await log.get_events(**filters, since=first, until=last,
                                         limit=min(limit + 1, MAX_LIMIT))
        more, found = len(found) > limit, found[:limit]
        if not follow:
            return found, more
        await follow_on(follower or Follower.since(log, filters, first), found,
                        lambda events: show(events, as_json, lines=True))

    try:
        found, more = run_on_store(url, config, schema, tenant, as_json, body)
    except KeyboardInterrupt:
        return
    show(found, as_json, lines=False, more=more)


class Follower:
    """What ``--follow`` prints after the first events: each event that appears
    later, once, however late it commits.

    An event's time is when it was logged, and a writer commits it up to its
    ``flush_interval_s`` later (a busy machine, later still), behind events timed
    after it. So each :meth:`poll` reads again from ``FOLLOW_LOOKBACK_S`` before the
    newest time printed, and prints what it has not printed yet. What was there
    before the follow began is not printed later: with ``--since``, everything from
    that time was printed first (events before it never are); without, the events
    there before the newest were read (:meth:`tail`) before them."""

    def __init__(self, log: Any, filters: dict[str, Any], *, since_us: int | None,
                 already: Sequence[Any] = ()) -> None:
        self.log, self.filters, self.since_us = log, filters, since_us
        self.newest = since_us if since_us is not None else time.time_ns() // 1000
        self.printed: dict[str, int] = {}
        self.shown(list(already))

    @classmethod
    async def tail(cls, log: Any, filters: dict[str, Any], *,
                   until: float | None) -> Follower:
        """A follower that will not print what is there now: the events from
        ``FOLLOW_LOOKBACK_S`` before the newest one (all that a poll reads again)."""
        latest = await log.get_latest_event(**filters, until=until)
        already = [] if latest is None else await log.get_events(
            **filters, since=_at(latest.timestamp_us - _LOOKBACK_US), until=until)
        return cls(log, filters, since_us=None, already=already)

    @classmethod
    def since(cls, log: Any, filters: dict[str, Any], first: float | None) -> Follower:
        """A follower of what comes after the events read from ``first`` (epoch
        seconds; None: from now), which it never prints an event before."""
        return cls(log, filters, since_us=None if first is None else round(first * 1_000_000))

    def shown(self, events: list[Any]) -> None:
        """Note ``events`` as printed (not to be printed again)."""
        self.printed.update((e.event_id, e.timestamp_us) for e in events)
        if events:
            self.newest = max(self.newest, max(e.timestamp_us for e in events))

    async def poll(self) -> list[Any]:
        """The events not printed yet, oldest first: at most ``_POLL_PAGES`` pages
        with new ones (the next poll goes on)."""
        fresh_pages, out = 0, []
        since = self.newest - _LOOKBACK_US
        if self.since_us is not None:
            since = max(since, self.since_us)
        async for page in _pages(self.log, self.filters, since):
            fresh = [e for e in page if e.event_id not in self.printed]
            if fresh:
                self.shown(fresh)
                out += fresh
                fresh_pages += 1
                if fresh_pages >= _POLL_PAGES:
                    break
        self.printed = {i: at for i, at in self.printed.items()
                        if at >= self.newest - _LOOKBACK_US}
        return out


async def follow_on(follower: Follower, found: list[Any],
                    show_lines: Callable[[list[Any]], None]) -> NoReturn:
    """Print ``found``, then, every second until Ctrl-C, what ``follower`` finds."""
    follower.shown(found)
    show_lines(found)
    while True:
        await asyncio.sleep(1.0)
        show_lines(await follower.poll())


def _at(us: int) -> datetime:
    """A time of the log (integer microseconds) as the exact datetime it is."""
    return datetime(1970, 1, 1, tzinfo=UTC) + timedelta(microseconds=us)


async def _pages(log: Any, filters: dict[str, Any], since_us: int,
                 until: int | None = None) -> AsyncIterator[list[Any]]:
    """The events from ``since_us`` (to before ``until``, microseconds), oldest first,
    a page at a time. Each page goes on after the last event of the one before (its
    time and id: the log's order), so no page is read twice and none is skipped,
    however many events share a microsecond."""
    after = None
    while True:
        page = await log.get_events(**filters, since=_at(since_us),
                                    until=None if until is None else _at(until),
                                    limit=_PAGE, after=after)
        yield page
        if len(page) < _PAGE:
            return
        after = page[-1]


def show(found: list[Any], as_json: bool, *, lines: bool, more: bool = False) -> None:
    """Print events: a table, one JSON object, or (following) JSON lines. ``more``:
    further events match than ``--limit`` let through, which is said (``"more":
    true`` in JSON), never left for the reader to guess."""
    if as_json:
        if lines:
            for event in found:
                print(json.dumps(event.to_dict()), flush=True)
        else:
            print(json.dumps({"events": [e.to_dict() for e in found], "more": more}))
        return
    table = Table(show_header=not lines)
    for column in ("time", "agent", "instance", "task", "type", "step", "data"):
        # the time and the event type stay whole on a narrow terminal; the rest fold
        table.add_column(column, overflow="fold", no_wrap=column in ("time", "type"))
    for e in found:
        data = e.output_data if e.output_data is not None else e.input_data
        # Who did it: the instance's id as it was given (events.log.EventJournal).
        state = e.state_snapshot if isinstance(e.state_snapshot, dict) else {}
        table.add_row(e.timestamp.strftime("%H:%M:%S.%f")[:-3], shown(e.agent_id),
                      shown(state.get("instance_id") or "-"),
                      shown(e.thread_id or "-"), shown(e.event_type), shown(e.step_name or "-"),
                      shown(json.dumps(data)[:120]) if data is not None else "")
    if found or not lines:
        console.print(table if found else "no events")
    if more:
        console.print(f"the first {len(found)} events; more match (raise --limit, or "
                      "narrow --since/--until)")


def reconstruct(task_id: Annotated[str, typer.Argument(help="The task.")],
                url: Url = None, config: Config = None, schema: Schema = None,
                tenant: Tenant = None, as_json: AsJson = False) -> None:
    """A task's recovery prompt, rebuilt from its newest verified checkpoint and the
    events after it: what it was asked, what is done, what remains, the last error
    (docs/events.md; what ``recovery: {reconstruct: true}`` restarts a blocked task from),
    and what each part rests on: the event log is not signed, and the request is
    checked against the hash the newest verified record holds."""
    from meshpoint.events.reconstruction import reconstruct as rebuild

    async def body(store: Any) -> Any:
        return await rebuild(store, task_id)

    rebuilt = run_on_store(url, config, schema, tenant, as_json, body)
    if as_json:
        print(json.dumps(rebuilt.to_dict()))
        return
    checkpoint = rebuilt.checkpoint
    console.print(f"task [bold]{shown(task_id)}[/bold]: "
                  + (f"from record {checkpoint.metadata.seq} "
                     f"({shown(checkpoint.execution_state.phase)})" if checkpoint else
                     "no verified checkpoint")
                  + f", {rebuilt.events_after} event(s) after it")
    if rebuilt.history_problem:
        console.print(f"[yellow]history: {shown(rebuilt.history_problem)}[/yellow]")
    for line in rebuilt.trusts:
        console.print(f"trusting {shown(line)}", highlight=False,
                      style=None if rebuilt.request_verified else "yellow")
    if rebuilt.restart_refusal:
        console.print(f"[red]an automatic restart refuses this: "
                      f"{shown(rebuilt.restart_refusal)}[/red]")
    console.print(shown(rebuilt.prompt), highlight=False)


def event_commands(app: typer.Typer, tasks_app: typer.Typer) -> None:
    """Register this module's commands on the ``meshpoint`` app."""
    app.command()(events)
    tasks_app.command()(reconstruct)
