"""The deadlines of a task's open sub-tasks: the sweep that times them out, the
status update that restarts one, and the announcement check that publishes a
request again when its caller may have died before publishing it.

:class:`Deadlines` is a part of :class:`~meshpoint.store.sqlstore.SqlStore`, which
answers these operations of the :class:`~meshpoint.store.base.Store` contract (their
docstrings are there) by calling it.
"""

from __future__ import annotations

from collections.abc import Callable

from sqlalchemy import Connection

from meshpoint.store import queries as q
from meshpoint.store.base import TIMEOUT_RESULT
from meshpoint.store.checks import check_id, check_lease, check_limit, check_timeout
from meshpoint.store.joins import advance
from meshpoint.store.reads import raise_if_unknown_sub_task
from meshpoint.store.results import Resolution, SubTask
from meshpoint.store.rows import sub_task
from meshpoint.store.sealing import Sealer
from meshpoint.store.transactions import Transactions


class Deadlines:
    """One tenant's sub-task deadlines (see the module docstring)."""

    def __init__(self, tx: Transactions, sealer: Sealer, clock: Callable[[], float]) -> None:
        self._tx = tx
        self.sealer = sealer
        self._clock = clock

    async def sweep_expired_timeouts(self, agent_name: str, limit: int = 100, *,
                                     lease_owner: str | None = None,
                                     lease_ttl_s: float = 30.0) -> list[Resolution]:
        check_id("agent_name", agent_name)
        check_limit(limit)
        check_lease(lease_owner, lease_ttl_s)

        def body(conn: Connection) -> list[Resolution]:
            rows = q.SWEEP_EXPIRED.rows(conn, self._tx.keys(
                p_agent=agent_name, p_now=self._clock(), p_limit=limit,
                p_result=TIMEOUT_RESULT))
            return advance(conn, self._tx.keys(), self._clock,
                           [sub_task(row, self.sealer) for row in rows], lease_owner,
                           lease_ttl_s, quarantine=True)

        return await self._tx.write(f"sweeping expired sub-tasks of {agent_name!r}", body,
                                    short=False)

    async def reset_timeout_deadline(self, sub_task_id: str, *, timeout_s: float | None = None,
                                     peer_task_id: str | None = None) -> float | None:
        check_id("sub_task_id", sub_task_id)
        if timeout_s is not None:
            check_timeout("timeout_s", timeout_s)
        if peer_task_id is not None:
            check_id("peer_task_id", peer_task_id)

        def body(conn: Connection) -> float | None:
            deadline = q.RESET_DEADLINE.scalar(conn, self._tx.keys(
                p_sub=sub_task_id, p_now=self._clock(), p_timeout=timeout_s,
                p_peer_task=peer_task_id))
            if deadline is None:
                raise_if_unknown_sub_task(conn, self._tx.keys(), sub_task_id)
            return None if deadline is None else float(deadline)

        return await self._tx.write(f"resetting the deadline of {sub_task_id!r}", body,
                                    one_statement=True)

    async def check_announcements(self, agent_name: str, limit: int = 100) -> list[SubTask]:
        check_id("agent_name", agent_name)
        check_limit(limit)

        def body(conn: Connection) -> list[SubTask]:
            rows = q.CHECK_ANNOUNCED.rows(conn, self._tx.keys(
                p_agent=agent_name, p_now=self._clock(), p_limit=limit))
            return [sub_task(row, self.sealer) for row in rows]

        return await self._tx.write(f"checking the announcements of {agent_name!r}", body,
                                    short=False)
