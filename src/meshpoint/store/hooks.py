"""The fast paths a dialect may take instead of the store's portable bodies.

:class:`~meshpoint.store.sqlstore.SqlStore` writes every operation once, as a portable
body that runs on SQLite and PostgreSQL alike. Where a dialect can do an operation
faster, it overrides one of the named hooks below in its own module, beside the
driver code the hook needs (DBOS keeps ``_sys_db_postgres.py`` beside its
``_sys_db.py`` the same way). A hook returns :data:`PORTABLE` to let the portable
body run; that is what every hook of this base class does, and what a hook does
for the cases it leaves to the portable body (rows it would have to refuse, say).

``open_store(url, fast_paths=False)`` runs the portable bodies only. The test suite
runs the store's tests and its process race on PostgreSQL both ways, so a hook that
drifts from its portable body fails a test. Each hook is kept only while
``benchmarks/bench_hooks.py`` shows it pays for itself (docs/store.md).
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import Any

from meshpoint.store.results import Resolution
from meshpoint.store.rows import RestoreRows
from meshpoint.store.sealing import Sealer
from meshpoint.store.statement import Statement


class Portable(enum.Enum):
    """The type of :data:`PORTABLE`."""

    PORTABLE = "portable"


#: What a hook returns to let the portable body run.
PORTABLE = Portable.PORTABLE


class FastPaths:
    """The hooks, each with its portable default. Parameters are the store's: a dict
    of ``p_``-prefixed bind values (the tenant's keys, the clock's reading, ...)
    built once by the operation, whichever path then runs it."""

    #: Named in logs and benchmark tables.
    name = "portable"

    async def first_checkpoint(self, params: dict[str, Any]) -> int | Portable:
        """Write a first checkpoint (the task row, its sub-tasks, invocations and new
        events) and return the task's version; raise SQLAlchemy's
        ``HistoryIntegrityError`` if a key is taken (nothing is written then)."""
        return PORTABLE

    async def recheckpoint(self, params: dict[str, Any]) -> int | Portable:
        """Write a re-checkpoint for the holder of the task's lease (the task row, its
        old children replaced by the new) and return the task's version; PORTABLE,
        with nothing written, if the portable body would refuse it (it then says
        why); raise SQLAlchemy's ``HistoryIntegrityError`` if a key is taken."""
        return PORTABLE

    async def cleanup(self, params: dict[str, Any]) -> int | Portable:
        """End a task for the holder of its lease (``p_owner``) as
        :meth:`SqlStore.cleanup_task <meshpoint.store.sqlstore.SqlStore.cleanup_task>`
        does, its last history record planned (``p_rec_*``); PORTABLE, with nothing
        written, if the portable body would refuse it or must read the history's head."""
        return PORTABLE

    async def resolve_one(self, params: Callable[[], dict[str, Any]],
                          lease_owner: str | None,
                          sealer: Sealer) -> Resolution | Portable | None:
        """Resolve one sub-task as :meth:`SqlStore.resolve_peer_sub_task` does: its
        :class:`Resolution` (its row decoded with ``sealer``), ``None`` if it was
        already resolved; raise UnknownSubTaskError for an unknown one. ``params()``
        builds the parameters, reading the clock: call it when the statement is about
        to run, so that a lease granted starts no earlier than it is."""
        return PORTABLE

    async def restore(self, params: dict[str, Any]) -> RestoreRows | Portable:
        """Read a task's row and its children as of one moment."""
        return PORTABLE

    async def statement(self, statement: Statement,
                        params: dict[str, Any]) -> list[Any] | Portable:
        """Run one named statement by itself, outside any transaction (a statement is
        atomic alone), and return its rows: :meth:`SqlStore.statement
        <meshpoint.store.sqlstore.SqlStore.statement>`, for parts built on the store."""
        return PORTABLE


#: The hooks of a store that runs its portable bodies only.
NO_FAST_PATHS = FastPaths()
