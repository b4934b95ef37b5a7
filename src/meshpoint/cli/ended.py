"""Ended tasks, read from the checkpoint history for ``meshpoint tasks list --all``,
``tasks show`` and ``tasks cost``: a task's live rows go when it ends, its history
stays (docs/history.md), and its last record says how it ended and, since the
runtime writes it there (:func:`meshpoint.runtime.ending.record_ending`), its answer
or its failure reason. A task that never paused wrote nothing (no live rows, no
history: the design's zero writes), so only the event log, if its agent keeps one,
knows it."""

from __future__ import annotations

import time
from typing import Any

from meshpoint.errors import MeshpointError


def ending_of(record: Any) -> dict[str, Any]:
    """How the task whose last history record is ``record`` ended: ``status`` (the
    outcome), ``answer`` or ``reason`` (None when the record does not say: written
    before the runtime kept them, by an append without the runtime, or sealed) and
    ``ended_at`` (ISO 8601)."""
    extensions = getattr(record, "extensions", None)
    said = extensions.get("ending") if isinstance(extensions, dict) else None
    said = said if isinstance(said, dict) else {}
    state = record.execution_state
    phase = state.get("phase") if isinstance(state, dict) else state.phase
    return {"status": str(phase), "answer": said.get("answer"), "reason": said.get("reason"),
            "ended_at": record.metadata.timestamp}


async def ended_rows(store: Any, *, agent: str | None, status: str | None,
                     limit: int) -> list[dict[str, Any]]:
    """The tenant's ended tasks (of ``agent``, ending in ``status`` if given), the latest
    ended first, each with how it ended from its verified last record; one whose
    history fails verification is listed with ``integrity_error`` (``meshpoint
    verify`` says why) and nothing read from it."""
    rows: list[dict[str, Any]] = []
    for head in await store.history.ended_tasks(agent_name=agent, limit=limit):
        if status is not None and head.outcome != status:
            continue
        row: dict[str, Any] = {"task_id": head.logical_task_id, "agent": head.agent_name,
                               "status": head.outcome, "live": False, "answer": None,
                               "reason": None, "ended_at": time.strftime(
                                   "%Y-%m-%dT%H:%M:%S", time.gmtime(head.updated_at)),
                               "integrity_error": None}
        try:
            record = await store.history.get_latest_checkpoint(head.logical_task_id)
        except MeshpointError as error:  # listed still: an operator must see it
            row["integrity_error"] = str(error)
        else:
            if record is not None:
                row.update(ending_of(record))
        rows.append(row)
    return rows


async def ran_unpaused(store: Any, task_id: str) -> list[Any]:
    """The event log's events of ``task_id``, when it has no history: a task that ran
    without ever pausing is known only there (and only if its agent keeps a log)."""
    from meshpoint.events import EventStore

    async with EventStore(store) as events:
        return list(await events.get_events(thread_id=task_id, limit=1000))
