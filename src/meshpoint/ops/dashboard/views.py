"""What each page shows, read from the store through the readers the CLI uses:
``tasks show``'s (:func:`meshpoint.cli.details.task_details`), the history's chain and
its verification, the event log's (:class:`meshpoint.events.log.EventStore`), the
store's stats and breakers. No SQL here: a read the dashboard needs that the store
lacked is a named statement of the store (``tasks_page``).

The overview's four live targets (seed 001) are computed from what the store holds,
each saying where from: the checkpoint write and read from the ``write_s`` of the
latest ``pause`` events and the ``restore_s`` of the latest ``resume`` events (agents
with an event log only), recovery from the latest ``recovered`` and ``blocked`` steps,
audit completeness from walking the latest chains. The Prometheus metrics of
docs/operations.md are the exact figures over a window; these are a sample.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta
from typing import Any

from meshpoint.errors import MeshpointError
from meshpoint.events.log import Event, EventStore
from meshpoint.history.verification import holds_envelope
from meshpoint.runtime.alerts import ALERT_EVENT
from meshpoint.runtime.approvals import APPROVAL, describe
from meshpoint.store.sealing import UNREADABLE

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
#: Events sampled per live target, and chains walked for audit completeness.
SAMPLE_EVENTS = 1000
SAMPLE_CHAINS = 50
#: Tasks per page of the list, and of the approvals inbox.
PAGE = 50


def sealed(value: Any) -> bool:
    """Whether ``value`` holds a field encrypted under a key this process lacks: an
    envelope of the history, or a value the store could not open (``$unreadable``)."""
    return (isinstance(value, dict) and UNREADABLE in value) or holds_envelope(value)


def p99(values: list[float]) -> float | None:
    """The 99th percentile (nearest rank) of ``values``, or None for none."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.99 * len(ordered)) - 1)]


def _figures(events: list[Event], key: str) -> list[float]:
    out = []
    for event in events:
        detail = event.output_data if isinstance(event.output_data, dict) else {}
        value = detail.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool):
            out.append(float(value))
    return out


async def overview(store: Any) -> dict[str, Any]:
    """Tasks by status and agent, the agents' breakers, the latest alerts, and the
    live targets."""
    stats = await store.stats()
    agents = sorted({a for a, _ in stats.paused_tasks})
    by_agent: dict[str, dict[str, int]] = {}
    for (agent, status), count in stats.paused_tasks.items():
        by_agent.setdefault(agent, {})[status] = count
    breakers = [(agent, await store.breakers.state(agent)) for agent in agents]
    log = EventStore(store)
    alerts = await log.get_events(event_type=ALERT_EVENT, limit=10, newest_first=True)
    return {"stats": stats, "by_agent": by_agent, "breakers": breakers,
            "alerts": [alert_of(e) for e in alerts], "targets": await targets(store, log)}


async def targets(store: Any, log: EventStore) -> list[dict[str, Any]]:
    """The four live targets of seed 001, each with its figure, whether it is met
    (None: nothing to judge by) and where the figure comes from."""
    pauses = await log.get_events(event_type="pause", limit=SAMPLE_EVENTS, newest_first=True)
    resumes = await log.get_events(event_type="resume", limit=SAMPLE_EVENTS, newest_first=True)
    writes, reads = _figures(pauses, "write_s"), _figures(resumes, "restore_s")
    write, read = p99(writes), p99(reads)
    recoveries = await log.get_events(event_type="recovery", limit=SAMPLE_EVENTS,
                                      newest_first=True)
    errors = await log.get_events(event_type="error", limit=SAMPLE_EVENTS, newest_first=True)
    recovered = sum(e.step_name == "recovered" for e in recoveries)
    blocked = sum(e.step_name == "blocked" for e in errors)
    chains = await store.history.task_ids(limit=SAMPLE_CHAINS)
    verified = 0
    for task_id in chains:
        try:
            verified += (await store.history.verify_task(task_id)).ok
        except MeshpointError:
            pass
    return [
        {"name": "checkpoint write < 100 ms at p99",
         "figure": None if write is None else f"{write * 1000:.2f} ms p99 of {len(writes)}",
         "met": None if write is None else write < 0.1,
         "source": f"write_s of the latest {SAMPLE_EVENTS} pause events of the event log"},
        {"name": "checkpoint read < 10 ms at p99",
         "figure": None if read is None else f"{read * 1000:.2f} ms p99 of {len(reads)}",
         "met": None if read is None else read < 0.01,
         "source": f"restore_s of the latest {SAMPLE_EVENTS} resume events of the event log"},
        {"name": "recovery success > 99.9 %",
         "figure": None if recovered + blocked == 0 else
         f"{100 * recovered / (recovered + blocked):.2f} % ({recovered} recovered, "
         f"{blocked} blocked)",
         "met": None if recovered + blocked == 0 else recovered / (recovered + blocked) > 0.999,
         "source": "recovered steps over recovered and blocked steps, latest "
                   f"{SAMPLE_EVENTS} of each in the event log"},
        {"name": "audit completeness 100 %",
         "figure": None if not chains else f"{verified} of {len(chains)} chains verify",
         "met": None if not chains else verified == len(chains),
         "source": f"the first {SAMPLE_CHAINS} checkpoint history chains by task id, each "
                   "walked (hashes, links, head; signatures with the config's keys)"},
    ]


async def role_warning(store: Any) -> str:
    """What to warn of about the role the store connects as ("" for nothing): on
    PostgreSQL, a superuser's or a BYPASSRLS role's connection is not held by
    row-level security (the runtime role, or the tenant's, is)."""
    if store.dialect != "postgresql":
        return ""
    from meshpoint.store.postgres_tenancy import bypasses_row_security

    if not await bypasses_row_security(store):
        return ""
    return ("connected as a role that row-level security does not hold (a superuser, or "
            "BYPASSRLS): only the dashboard's own statements keep it to this tenant. "
            "Connect as the runtime role or the tenant's (meshpoint migrate "
            "--runtime-role / --tenant-role)")


def alert_of(event: Event) -> dict[str, Any]:
    """An alert as raised, from its event (as ``meshpoint alerts`` shows it)."""
    body = event.output_data if isinstance(event.output_data, dict) else {}
    return {"at": when(event.timestamp), "kind": body.get("kind", event.step_name),
            "agent": body.get("agent", event.agent_id),
            "task_id": body.get("task_id", event.thread_id), "text": body.get("text", "")}


def when(moment: datetime | float | None) -> str:
    """A time as the pages show it: UTC, to the second."""
    if moment is None:
        return "-"
    if not isinstance(moment, datetime):
        moment = datetime.fromtimestamp(moment, UTC)
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S")


async def inbox(store: Any, *, after: str = "") -> tuple[list[dict[str, Any]], str | None]:
    """The pending approvals of the tasks waiting for a human, a page of tasks at a
    time: (the calls, each with its task, tool, arguments and schema, or ``sealed``
    for one whose call is sealed under a key not held; the last task id of the page
    when there may be more)."""
    tasks = await store.tasks_page(after=after, status="input_required", limit=PAGE)
    calls = []
    for task in tasks:
        try:
            subs = await store.get_peer_sub_tasks_for_task(task.task_id)
        except MeshpointError:  # ended meanwhile
            continue
        for sub in subs:
            approval = sub.correlation_data.get(APPROVAL)
            if sub.status == "pending" and isinstance(approval, dict):
                calls.append({**describe(sub.sub_task_id, sub.correlation_data),
                              "task_id": task.task_id, "agent": task.agent_name,
                              "schema": approval.get("parameters") or {},
                              "deadline": when(sub.timeout_deadline)})
            elif sub.status == "pending" and sealed(sub.correlation_data):
                # waiting, but what for cannot be read here: said, not left out
                calls.append({"call_id": sub.sub_task_id, "sealed": True,
                              "task_id": task.task_id, "agent": task.agent_name,
                              "schema": {}, "arguments": {},
                              "deadline": when(sub.timeout_deadline)})
    return calls, tasks[-1].task_id if len(tasks) == PAGE else None


async def chain(store: Any, task_id: str) -> dict[str, Any]:
    """The task's checkpoint history, oldest first, and the result of walking it."""
    from meshpoint.cli.handoffs import history_of

    report = await store.history.verify_task(task_id)
    try:
        records = await history_of(store, task_id)
    except MeshpointError as error:
        return {"report": report, "records": [], "error": str(error)}
    rows = [{"seq": r.metadata.seq, "id": r.metadata.checkpoint_id,
             "iteration": r.metadata.iteration, "phase": r.execution_state.phase,
             "at": r.metadata.timestamp[:19].replace("T", " "),
             "hash": (r.compliance.hash or "")[:16],
             "signed": r.compliance.signature is not None,
             "continuation": "(sealed: no key to read it)" if sealed(
                 r.recovery.continuation_prompt) else r.recovery.continuation_prompt}
            for r in records]
    return {"report": report, "records": rows, "error": None}


async def events(store: Any, *, task: str | None = None, agent: str | None = None,
                 since_us: int | None = None, limit: int = 100) -> list[dict[str, Any]]:
    """Events as the pages show them, oldest first: the newest ``limit`` (or those
    from ``since_us``, microseconds since the epoch, inclusive)."""
    log = EventStore(store)
    filters: dict[str, Any] = {"thread_id": task, "agent_id": agent}
    if since_us is None:
        found = (await log.get_events(**filters, limit=limit, newest_first=True))[::-1]
    else:
        found = await log.get_events(**filters, since=_EPOCH + timedelta(microseconds=since_us),
                                     limit=limit)
    return [event_row(e) for e in found]


def event_row(event: Event) -> dict[str, Any]:
    """An event as plain values (the live page's JSON), sealed fields never in clear."""
    def text(value: Any) -> str:
        if value is None:
            return ""
        if sealed(value):
            return "(sealed: no key to read it)"
        return str(value)[:300]

    return {"id": event.event_id, "us": event.timestamp_us, "at": when(event.timestamp),
            "agent": event.agent_id, "task": event.thread_id or "", "type": event.event_type,
            "step": event.step_name or "", "output": text(event.output_data),
            "input": text(event.input_data)}
