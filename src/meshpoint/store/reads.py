"""The store's reads that change nothing: a task's sub-tasks and results, and the
listings, counts and stats operators and the recovery loop ask for.

:class:`Reads` is a part of :class:`~meshpoint.store.sqlstore.SqlStore`, which answers
these operations of the :class:`~meshpoint.store.base.Store` contract (their
docstrings are there) by calling it; it runs its bodies through the store's
:class:`~meshpoint.store.transactions.Transactions`. The two checks below, which tell a
missing id from a refused one, serve the store's writes too.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from sqlalchemy import Connection

from meshpoint.context import ParallelCalls
from meshpoint.errors import (
    InvalidArgumentError,
    SubTaskMovingError,
    UnknownInvocationError,
    UnknownSubTaskError,
    UnknownTaskError,
)
from meshpoint.store import queries as q
from meshpoint.store.checks import MAX_ID, check_agent, check_id, check_limit, check_timeout
from meshpoint.store.results import (
    PausedTaskSummary,
    StoreStats,
    SubTask,
)
from meshpoint.store.rows import invocation_results, sub_task
from meshpoint.store.sealing import RESULT, Sealer
from meshpoint.store.transactions import Transactions


def raise_if_unknown_sub_task(conn: Connection, keys: dict[str, Any], sub_task_id: str,
                              agent_name: str | None = None) -> None:
    """UnknownSubTaskError for an id the tenant does not have; WrongAgentError for
    a sub-task of another agent's task than ``agent_name`` (if given)."""
    row = q.SUB_TASK_STATUS.first(conn, {**keys, "p_sub": sub_task_id})
    if row is None:
        raise UnknownSubTaskError(sub_task_id)
    check_agent(f"the task of sub-task {sub_task_id!r}", row.agent_name, agent_name)
    if row.status == "moving":  # its task leaves for the cloud (meshpoint.sync.move)
        raise SubTaskMovingError(sub_task_id)


def raise_if_unknown_task(conn: Connection, keys: dict[str, Any], task_id: str,
                          agent_name: str | None = None) -> None:
    """UnknownTaskError for an id the tenant does not have; WrongAgentError for
    another agent's task than ``agent_name`` (if given)."""
    row = q.TASK_STATE.first(conn, {**keys, "p_task": task_id})
    if row is None:
        raise UnknownTaskError(task_id)
    check_agent(f"task {task_id!r}", row.agent_name, agent_name)


#: Sorts after every character an id may hold: ``prefix + PAST_ANY`` bounds the ids
#: that start with ``prefix``.
PAST_ANY = "\U0010ffff"


class Reads:
    """The reads of one tenant's store (see the module docstring)."""

    def __init__(self, tx: Transactions, sealer: Sealer, clock: Callable[[], float]) -> None:
        self._tx = tx
        self.sealer = sealer
        self._clock = clock

    async def get_peer_sub_task(self, sub_task_id: str) -> SubTask:
        check_id("sub_task_id", sub_task_id)

        def body(conn: Connection) -> SubTask:
            row = q.GET_SUB_TASK.first(conn, self._tx.keys(p_sub=sub_task_id))
            if row is None:
                raise UnknownSubTaskError(sub_task_id)
            return sub_task(row, self.sealer)

        return await self._tx.read(f"reading sub-task {sub_task_id!r}", body)

    async def get_peer_sub_tasks_for_task(self, task_id: str) -> list[SubTask]:
        check_id("task_id", task_id)
        keys = self._tx.keys(p_task=task_id)

        def body(conn: Connection) -> list[SubTask]:
            raise_if_unknown_task(conn, self._tx.keys(), task_id)
            return [sub_task(row, self.sealer)
                    for row in q.GET_TASK_SUB_TASKS.rows(conn, keys)]

        return await self._tx.read(f"listing the sub-tasks of task {task_id!r}", body)

    async def get_parallel_results(self, task_id: str,
                                   invocation_id: str) -> list[tuple[str, Any]]:
        check_id("task_id", task_id)
        check_id("invocation_id", invocation_id)
        keys = self._tx.keys(p_task=task_id, p_invocation=invocation_id)

        def body(conn: Connection) -> list[tuple[str, Any]]:
            invocation = q.GET_INVOCATION.first(conn, keys)
            if invocation is None:
                raise_if_unknown_task(conn, self._tx.keys(), task_id)
                raise UnknownInvocationError(task_id, invocation_id)
            calls = ParallelCalls(list(invocation.call_order),
                                  invocation_results(task_id, invocation, self.sealer))
            for sub_task_id, call, value in q.GET_INVOCATION_RESULTS.rows(conn, keys):
                calls.results[call] = self.sealer.open(value, RESULT, sub_task=sub_task_id)
            return calls.ordered_results()

        return await self._tx.read(f"reading the results of task {task_id!r}", body)

    async def task_known(self, task_id: str, agent_name: str) -> bool:
        check_id("task_id", task_id)
        check_id("agent_name", agent_name)

        def body(conn: Connection) -> bool:
            return bool(q.TASK_KNOWN.scalar(conn, self._tx.keys(p_task=task_id,
                                                                p_agent=agent_name)))

        return await self._tx.read(f"looking for task {task_id!r}", body)

    async def list_paused_tasks(self, *, agent_name: str | None = None,
                                status: str | None = None,
                                limit: int = 100) -> list[PausedTaskSummary]:
        check_limit(limit)
        params = self._tx.keys(p_agent=agent_name, p_any_agent=agent_name is None,
                               p_status=status, p_any_status=status is None, p_limit=limit)

        def body(conn: Connection) -> list[PausedTaskSummary]:
            return [PausedTaskSummary(
                task_id=r[0], agent_name=r[1], status=r[2], owner=r[3], lease_expires_at=r[4],
                version=r[5], checkpointed_at=r[6], pending_sub_tasks=r[7] or 0,
                next_deadline=r[8]) for r in q.LIST_PAUSED_TASKS.rows(conn, params)]

        return await self._tx.read("listing paused tasks", body, short=False)

    async def tasks_page(self, *, after: str = "", prefix: str = "",
                         agent_name: str | None = None, status: str | None = None,
                         limit: int = 50) -> list[PausedTaskSummary]:
        check_limit(limit)
        for name, value in (("after", after), ("prefix", prefix)):
            if not isinstance(value, str) or len(value) > MAX_ID:
                raise InvalidArgumentError(f"{name} must be a string of at most {MAX_ID} "
                                           f"characters, got {value!r:.80}")
        # The ids that start with the prefix, as a range of the primary key: under
        # the byte order of SQLite and of PostgreSQL's C collation, which the
        # migrations create the tables in, nothing sorts after it but its own.
        params = self._tx.keys(p_after=after, p_from=prefix, p_to=prefix + PAST_ANY,
                               p_agent=agent_name, p_any_agent=agent_name is None,
                               p_status=status, p_any_status=status is None, p_limit=limit)

        def body(conn: Connection) -> list[PausedTaskSummary]:
            return [PausedTaskSummary(
                task_id=r[0], agent_name=r[1], status=r[2], owner=r[3], lease_expires_at=r[4],
                version=r[5], checkpointed_at=r[6], pending_sub_tasks=r[7] or 0,
                next_deadline=None) for r in q.TASKS_PAGE.rows(conn, params)]

        return await self._tx.read("listing a page of paused tasks", body, short=False)

    async def resumable_tasks(self, agent_name: str, *, limit: int = 100) -> list[str]:
        check_id("agent_name", agent_name)
        check_limit(limit)
        params = self._tx.keys(p_agent=agent_name, p_now=self._clock(), p_limit=limit)

        def body(conn: Connection) -> list[str]:
            return [row[0] for row in q.RESUMABLE_TASKS.rows(conn, params)]

        return await self._tx.read(f"listing resumable tasks of {agent_name!r}", body, short=False)

    async def expired_tasks(self, agent_name: str, *, older_than_s: float,
                            limit: int = 100) -> list[str]:
        check_id("agent_name", agent_name)
        check_limit(limit)
        if type(older_than_s) not in (int, float) or not 0 < older_than_s < math.inf:
            raise InvalidArgumentError(
                f"older_than_s must be a finite number > 0, got {older_than_s!r}")
        now = self._clock()
        params = self._tx.keys(p_agent=agent_name, p_now=now, p_before=now - older_than_s,
                               p_limit=limit)

        def body(conn: Connection) -> list[str]:
            return [row[0] for row in q.EXPIRED_TASKS.rows(conn, params)]

        return await self._tx.read(f"listing expired tasks of {agent_name!r}", body, short=False)

    async def next_deadlines(self, *, agent_name: str | None = None,
                             limit: int = 10) -> list[SubTask]:
        check_limit(limit)
        statement = q.NEXT_DEADLINES if agent_name is None else q.NEXT_DEADLINES_OF_AGENT
        params = self._tx.keys(p_agent=agent_name, p_limit=limit)

        def body(conn: Connection) -> list[SubTask]:
            return [sub_task(row, self.sealer) for row in statement.rows(conn, params)]

        return await self._tx.read("listing deadlines", body, short=False)

    async def live_row_counts(self) -> dict[str, int]:
        def body(conn: Connection) -> dict[str, int]:
            row = q.LIVE_ROW_COUNTS.first(conn, {})
            return {name: int(count) for name, count in row._asdict().items()}

        return await self._tx.read("counting live rows", body, short=False)

    async def stats(self, *, expire_after_s: float = 0.0) -> StoreStats:
        check_timeout("expire_after_s", expire_after_s)
        now = self._clock()
        keys = self._tx.keys(p_now=now, p_expiring=expire_after_s > 0,
                             p_before=now - expire_after_s)

        def body(conn: Connection) -> StoreStats:
            by_status = {(a, s): n for a, s, n in q.COUNT_BY_AGENT_STATUS.rows(conn, keys)}
            pending, next_deadline = q.PENDING_SUMMARY.first(conn, keys)
            total, expired, waiting, working, oldest, mean = q.TASK_COUNTS.first(conn, keys)
            return StoreStats(
                paused_tasks=by_status, pending_sub_tasks=pending,
                expired_sub_tasks=q.EXPIRED_COUNT.scalar(conn, keys),
                oldest_checkpointed_at=oldest, next_deadline=next_deadline,
                total=total, expired=expired, input_required=waiting, working=working,
                oldest_age_s=None if oldest is None else max(0.0, now - oldest),
                mean_age_s=None if mean is None else max(0.0, now - float(mean)))

        return await self._tx.read("computing store stats", body, short=False)
