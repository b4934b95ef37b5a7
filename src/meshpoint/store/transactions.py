"""How one tenant's operations run on the store's database: a transaction of the
tenant (its rows only, under PostgreSQL's row-level security), translated errors, and
a write run again whole when PostgreSQL picks it as a deadlock victim.

:class:`~meshpoint.store.sqlstore.SqlStore` and the parts built beside it
(:class:`~meshpoint.store.history_store.HistoryStore`,
:class:`~meshpoint.store.history_restore.VerifiedRestore`,
:mod:`meshpoint.store.reads`) run their bodies through one :class:`Transactions`.
"""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from sqlalchemy import Connection
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception, stop_after_attempt

from meshpoint._retry import retried
from meshpoint.store.engine import Database, is_retryable, translate
from meshpoint.store.hooks import FastPaths, Portable
from meshpoint.store.statement import Statement

R = TypeVar("R")


def _deadlock_backoff(state: RetryCallState) -> float:
    """Up to 2 ms more after each attempt, at random, so the victims do not meet again."""
    return random.uniform(0, 0.002 * state.attempt_number)


def _deadlock_retries() -> AsyncRetrying:
    """A transaction PostgreSQL picks as a deadlock victim is run again, up to 6 times."""
    return AsyncRetrying(retry=retry_if_exception(is_retryable), stop=stop_after_attempt(6),
                         wait=_deadlock_backoff, reraise=True)


class Transactions:
    """The transactions of one tenant on ``db``; ``fast`` is the dialect's fast paths
    (or :data:`~meshpoint.store.hooks.NO_FAST_PATHS`), for :meth:`statement`."""

    def __init__(self, db: Database, tenant_id: str, fast: FastPaths) -> None:
        self.db = db
        self.tenant_id = tenant_id
        self.fast = fast

    def keys(self, **extra: Any) -> dict[str, Any]:
        """``extra`` with the tenant's key, ``p_tenant``."""
        return {"p_tenant": self.tenant_id, **extra}

    async def write(self, doing: str, body: Callable[[Connection], R], *,
                    one_statement: bool = False, short: bool = True) -> R:
        """Run a write transaction (``short`` and ``one_statement``: see Database.run)."""
        return await self.retried(doing, lambda: self.db.run(
            body, write=True, one_statement=one_statement, short=short,
            tenant=self.tenant_id))

    async def retried(self, doing: str, attempt: Callable[[], Awaitable[R]]) -> R:
        """Run ``attempt`` (a write), again if PostgreSQL picked it as a deadlock
        victim: nothing was committed then."""
        with translate(doing):
            return await retried(attempt, _deadlock_retries, is_retryable)

    async def read(self, doing: str, body: Callable[[Connection], R], *,
                   short: bool = True) -> R:
        """Run a read-only transaction (``short``: see Database.run)."""
        with translate(doing):
            return await retried(lambda: self.db.run(body, write=False, short=short,
                                                     tenant=self.tenant_id),
                                 _deadlock_retries, is_retryable)

    async def long_read(self, doing: str, body: Callable[[Connection], R]) -> R:
        """A read that may return many rows (never run on the caller's thread)."""
        return await self.read(doing, body, short=False)

    async def statement(self, statement: Statement, params: dict[str, Any], *,
                        write: bool = False, doing: str = "running a statement") -> list[Any]:
        """Run one named statement as a transaction of its own (see
        :meth:`SqlStore.statement <meshpoint.store.sqlstore.SqlStore.statement>`)."""
        keyed = self.keys(**params)
        rows = await self.retried(doing, lambda: self.fast.statement(statement, keyed))
        if not isinstance(rows, Portable):
            return rows

        def body(conn: Connection) -> list[Any]:
            return statement.rows(conn, keyed)

        if write:
            return await self.write(doing, body, one_statement=True)
        return await self.read(doing, body)
