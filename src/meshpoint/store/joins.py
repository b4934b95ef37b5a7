"""Joins that resolutions advance: the part of a resolution every path shares.

A resolved sub-task is counted on its invocation (its turn's join); the resolution
that completes a join marks its task ``resuming`` and may take its lease. Used by
:class:`~meshpoint.store.sqlstore.SqlStore`'s portable bodies of a resolution, a claim's
record and the sweep (PostgreSQL's one-statement resolution does the same in SQL).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from sqlalchemy import Connection

from meshpoint.errors import CorruptCheckpointError
from meshpoint.store import queries as q
from meshpoint.store.results import Resolution, SubTask

logger = logging.getLogger("meshpoint.store")


def advance(conn: Connection, keys: dict[str, Any], clock: Callable[[], float],
            resolved: list[SubTask], lease_owner: str | None, lease_ttl_s: float, *,
            quarantine: bool = False) -> list[Resolution]:
    """Count freshly resolved sub-tasks on their invocations and mark completed joins.

    ``keys`` are the store's (its tenant). Invocations are advanced in key order (see
    the lock order in queries.py). The clock is read here, after any wait for locks,
    so a lease starts when granted. A join whose rows are corrupt raises, unless
    ``quarantine`` (the sweeper): then its sub-tasks are parked as ``quarantined`` and
    the batch goes on.
    """
    groups: dict[tuple[str, str], list[SubTask]] = {}
    for item in resolved:
        groups.setdefault((item.task_id, item.invocation_id), []).append(item)
    out: list[Resolution] = []
    now = clock()
    for (task_id, invocation_id), items in sorted(groups.items()):
        of_join = {**keys, "p_task": task_id, "p_invocation": invocation_id}
        counts = q.ADVANCE_INVOCATION.first(conn, {**of_join, "p_n": len(items)})
        problem = None
        if counts is None:
            problem = f"has sub-tasks but no row for invocation {invocation_id!r}"
        elif counts[0] > counts[1]:
            problem = (f"would count {counts[0]} of {counts[1]} calls in invocation "
                       f"{invocation_id!r}")
        if problem is not None:
            if not quarantine:
                raise CorruptCheckpointError(
                    f"task {task_id!r} {problem}; nothing was resolved", task_id=task_id)
            q.ADVANCE_INVOCATION.rows(conn, {**of_join, "p_n": -len(items)})  # undo it
            for item in items:
                q.QUARANTINE.rows(conn, {**keys, "p_sub": item.sub_task_id, "p_now": now})
            logger.error("quarantined %d sub-task(s) of task %r: it %s", len(items),
                         task_id, problem)
            continue
        assert counts is not None
        completed, total = counts
        granted = None
        if completed == total:
            holder = q.MARK_RESUMING.scalar(conn, {
                **keys, "p_task": task_id, "p_owner": lease_owner, "p_now": now,
                "p_lease_until": None if lease_owner is None else now + lease_ttl_s})
            granted = lease_owner if lease_owner is not None and holder == lease_owner \
                else None
        first = completed - len(items) + 1
        for offset, item in enumerate(items):
            done = first + offset
            out.append(Resolution(sub_task=item, completed=done, total=total,
                                  lease_owner=granted if done == total else None))
    return out
