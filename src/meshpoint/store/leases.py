"""A paused task's resume lease: taken by the instance that resumes it, renewed while
its turn runs, released (or left to expire) after. The lease is what makes a task
resumed once (the store's exactly-one-resume guarantee; docs/store.md), and what lets
another instance take a task whose holder died.

:class:`Leases` is a part of :class:`~meshpoint.store.sqlstore.SqlStore`, which answers
these operations of the :class:`~meshpoint.store.base.Store` contract (their docstrings
are there) by calling it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from sqlalchemy import Connection

from meshpoint.errors import (
    InvalidArgumentError,
)
from meshpoint.store import queries as q
from meshpoint.store.checks import check_id, check_ttl
from meshpoint.store.hooks import Portable
from meshpoint.store.reads import raise_if_unknown_task
from meshpoint.store.results import (
    Lease,
)
from meshpoint.store.schema import TASK_STATUSES
from meshpoint.store.transactions import Transactions


class Leases:
    """The resume leases of one tenant's tasks (see the module docstring)."""

    def __init__(self, tx: Transactions, clock: Callable[[], float]) -> None:
        self._tx = tx
        self._clock = clock

    async def take_resume_lease(self, task_id: str, owner: str, ttl_s: float, *,
                                statuses: Sequence[str] = ("resuming",),
                                agent_name: str | None = None) -> Lease | None:
        check_id("task_id", task_id)
        check_id("owner", owner)
        check_ttl(ttl_s)
        if agent_name is not None:
            check_id("agent_name", agent_name)
        if not statuses or any(s not in TASK_STATUSES for s in statuses):
            raise InvalidArgumentError(f"statuses must be non-empty, from {TASK_STATUSES}")
        wanted = list(dict.fromkeys(statuses))
        slots = dict(zip(q.STATUS_SLOTS, wanted + [None] * len(q.STATUS_SLOTS), strict=False))

        def body(conn: Connection) -> Lease | None:
            now = self._clock()
            version = q.TAKE_LEASE.scalar(conn, self._tx.keys(
                p_task=task_id, p_owner=owner, p_now=now, p_lease_until=now + ttl_s,
                p_agent=agent_name, p_any_agent=agent_name is None, **slots))
            if version is None:
                raise_if_unknown_task(conn, self._tx.keys(), task_id, agent_name)
                return None
            return Lease(task_id=task_id, owner=owner, expires_at=now + ttl_s, version=version)

        return await self._tx.write(f"taking the lease of task {task_id!r}", body,
                                    one_statement=True)

    async def renew_resume_lease(self, task_id: str, owner: str, ttl_s: float) -> Lease | None:
        check_id("task_id", task_id)
        check_id("owner", owner)
        check_ttl(ttl_s)
        doing = f"renewing the lease of task {task_id!r}"
        # Every task resumed from the store renews before it answers: one statement
        # (on PostgreSQL, without BEGIN and COMMIT); the body says why it was refused.
        now = self._clock()
        keys = self._tx.keys(p_task=task_id, p_owner=owner, p_lease_until=now + ttl_s)
        rows = await self._tx.retried(doing, lambda: self._tx.fast.statement(q.RENEW_LEASE,
                                                                             keys))
        if not isinstance(rows, Portable) and rows:
            return Lease(task_id=task_id, owner=owner, expires_at=now + ttl_s,
                         version=rows[0].version)

        def body(conn: Connection) -> Lease | None:
            now = self._clock()
            version = q.RENEW_LEASE.scalar(conn, self._tx.keys(
                p_task=task_id, p_owner=owner, p_lease_until=now + ttl_s))
            if version is None:
                raise_if_unknown_task(conn, self._tx.keys(), task_id)
                return None
            return Lease(task_id=task_id, owner=owner, expires_at=now + ttl_s, version=version)

        return await self._tx.write(doing, body, one_statement=True)

    async def release_resume_lease(self, task_id: str, owner: str) -> bool:
        check_id("task_id", task_id)
        check_id("owner", owner)

        def body(conn: Connection) -> bool:
            version = q.RELEASE_LEASE.scalar(conn, self._tx.keys(p_task=task_id, p_owner=owner))
            if version is None:
                raise_if_unknown_task(conn, self._tx.keys(), task_id)
                return False
            return True

        return await self._tx.write(f"releasing the lease of task {task_id!r}", body,
                                    one_statement=True)
