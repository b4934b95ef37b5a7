"""``meshpoint alerts``: the alerts the agents' instances raised (runtime/alerts.py),
read from the event log, where each is an event of type ``alert``; with ``--follow``,
new ones as they are raised. Works on the store directly (see
:mod:`meshpoint.cli.common` for ``--url``, ``--config``, ``--tenant``)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Annotated, Any

import typer
from rich.table import Table

from meshpoint.cli.common import AsJson, Config, Schema, Tenant, Url, console, run_on_store, shown
from meshpoint.cli.events import Follower, follow_on, parse_time
from meshpoint.store.checks import MAX_LIMIT


def _alert(event: Any) -> dict[str, Any]:
    """An alert as raised, from its event (the event's own fields if the payload is not
    an alert's: sealed with a key this process lacks, say)."""
    body = event.output_data if isinstance(event.output_data, dict) else {}
    return {"at": event.timestamp.isoformat(), "kind": body.get("kind", event.step_name),
            "agent": body.get("agent", event.agent_id),
            "task_id": body.get("task_id", event.thread_id),
            "instance": body.get("instance"), "text": body.get("text", ""),
            "detail": body.get("detail") or {}}


def _show(found: list[Any], as_json: bool, *, lines: bool, header: bool = True) -> None:
    alerts = [_alert(e) for e in found]
    if as_json:
        if lines:
            for alert in alerts:
                print(json.dumps(alert), flush=True)
        else:
            print(json.dumps({"alerts": alerts}))
        return
    if not alerts:
        if not lines:
            console.print("no alerts")
        return
    table = Table(show_header=header and not lines)
    for column in ("time", "kind", "agent", "task", "text"):
        table.add_column(column, overflow="fold", no_wrap=column in ("time", "kind"))
    for a in alerts:
        when = datetime.fromisoformat(a["at"]).astimezone(UTC).strftime("%H:%M:%S")
        table.add_row(when, shown(a["kind"]), shown(a["agent"]), shown(a["task_id"] or "-"),
                      shown(a["text"]))
    console.print(table)


def alerts(agent: Annotated[str | None, typer.Option("--agent", help="An agent.")] = None,
           since: Annotated[str | None, typer.Option(
               "--since", help="From this time (ISO time, epoch seconds, or a span ago: "
               "10m).")] = None,
           limit: Annotated[int, typer.Option(min=1, max=MAX_LIMIT,
                                              help="Alerts at most.")] = 100,
           follow: Annotated[bool, typer.Option(
               "--follow", "-f", help="Keep printing new alerts until Ctrl-C.")] = False,
           url: Url = None, config: Config = None, schema: Schema = None,
           tenant: Tenant = None, as_json: AsJson = False) -> None:
    """Alerts, oldest first: tasks blocked or expired, breakers opened or closed,
    messages dead-lettered (docs/runtime.md, "Recovery limits, the circuit breaker and
    alerts"). With ``--follow``, the newest ``--limit`` (or those from ``--since``), then
    new ones as they are raised (``--json``: one JSON line each)."""
    from meshpoint.events.log import EventStore
    from meshpoint.runtime.alerts import ALERT_EVENT

    first = parse_time(since, "--since")
    filters: dict[str, Any] = {"thread_id": None, "agent_id": agent, "event_type": ALERT_EVENT}

    async def body(store: Any) -> list[Any]:
        log = EventStore(store)
        follower = None
        if follow and first is None:
            follower = await Follower.tail(log, filters, until=None)
            found = (await log.get_events(**filters, limit=limit, newest_first=True))[::-1]
        else:
            found = await log.get_events(**filters, since=first, limit=limit)
        if not follow:
            return list(found)
        await follow_on(follower or Follower.since(log, filters, first), found,
                        lambda alerts: _show(alerts, as_json, lines=True))

    try:
        found = run_on_store(url, config, schema, tenant, as_json, body)
    except KeyboardInterrupt:
        return
    _show(found, as_json, lines=False)


def alert_commands(app: typer.Typer) -> None:
    """Register this module's command on the ``meshpoint`` app."""
    app.command()(alerts)
