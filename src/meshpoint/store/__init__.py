"""The checkpoint store: where paused tasks live while no instance holds them.

Open one from a URL::

    async with open_store("sqlite:///meshpoint.db") as store:
        await store.checkpoint_task(ctx, "coordinator")

``sqlite:///path`` (or ``sqlite:///:memory:``) is the embedded default;
``postgresql+asyncpg://user@host/db`` scales out. Both run the same operations
(:mod:`meshpoint.store.sqlstore`); what a dialect does differently lives in its own
module (:mod:`meshpoint.store.sqlite`, :mod:`meshpoint.store.postgres`), imported
only when a URL of that dialect is opened. The runtime sees the contract,
:class:`~meshpoint.store.base.Store`.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Generator
from pathlib import Path
from typing import Any

from sqlalchemy.engine import URL

from meshpoint.compression import DEFAULT_MAX_DECOMPRESSED_BYTES
from meshpoint.errors import ConfigurationError, SchemaError
from meshpoint.history.planning import HistoryOptions
from meshpoint.store.base import TIMEOUT_RESULT, Store
from meshpoint.store.checks import check_id
from meshpoint.store.engine import (
    MIGRATION_LOCK_TIMEOUT_S,
    Database,
    check_schema,
    migrate,
    parse_url,
)
from meshpoint.store.results import (
    CheckpointReceipt,
    Lease,
    PausedTaskSummary,
    Resolution,
    RestoredTask,
    StoreStats,
    SubTask,
)
from meshpoint.store.sqlstore import SqlStore
from meshpoint.tls import TlsConfig

__all__ = [
    "TIMEOUT_RESULT",
    "CheckpointReceipt",
    "Lease",
    "PausedTaskSummary",
    "Resolution",
    "RestoredTask",
    "SqlStore",
    "Store",
    "StoreStats",
    "SubTask",
    "open_database",
    "open_store",
]


def open_database(url: str | URL, *, busy_timeout_s: float = 30.0, schema: str | None = None,
                  pool_size: int = 5, tls: TlsConfig | None = None) -> Database:
    """The connection pool of the database at ``url``, of its dialect's kind."""
    parsed = parse_url(url)
    if parsed.get_backend_name() == "sqlite":
        from meshpoint.store.sqlite import open_sqlite

        if tls is not None:
            raise ConfigurationError("store.tls is for PostgreSQL: a SQLite store is a "
                                     "local file, reached without a network")
        return open_sqlite(parsed, busy_timeout_s=busy_timeout_s, schema=schema,
                           pool_size=pool_size)
    from meshpoint.store.postgres import open_postgres

    return open_postgres(parsed, busy_timeout_s=busy_timeout_s, schema=schema,
                         pool_size=pool_size, tls=tls)


def _check_sqlite_file_exists(url: str | URL) -> None:
    """Without ``migrate``, the schema must be there already: a SQLite URL that names
    no file is a mistyped path, refused before SQLite would create the file (and
    its directories)."""
    from meshpoint.store.sqlite import is_memory

    parsed = parse_url(url)
    if parsed.get_backend_name() != "sqlite" or is_memory(parsed):
        return
    path = Path(str(parsed.database)).expanduser()  # not None: is_memory said so
    if not path.exists():
        raise SchemaError(
            f"there is no SQLite database at {path} (from the store URL); nothing was "
            "created. Check the path, or create the database with `meshpoint migrate` "
            "(open_store(migrate=True) from Python)")


class StoreOpener:
    """What :func:`open_store` returns: ``await`` it, or use it as ``async with``."""

    def __init__(self, url: str | URL, **options: Any) -> None:
        self._url = url
        self._options = options
        self._store: SqlStore | None = None

    async def _open(self) -> SqlStore:
        opts = self._options
        check_id("tenant_id", opts["tenant_id"], max_len=64)
        if opts["pool_size"] < 1:
            raise ConfigurationError(f"pool_size must be at least 1, got {opts['pool_size']}")
        if opts["max_decompressed_bytes"] < 1:
            raise ConfigurationError("max_decompressed_bytes must be at least 1, got "
                                     f"{opts['max_decompressed_bytes']}")
        if not opts["migration_lock_timeout_s"] > 0:
            raise ConfigurationError("migration_lock_timeout_s must be positive, got "
                                     f"{opts['migration_lock_timeout_s']}")
        if not opts["migrate"]:
            _check_sqlite_file_exists(self._url)
        db = open_database(self._url, busy_timeout_s=opts["busy_timeout_s"],
                           schema=opts["schema"], pool_size=opts["pool_size"],
                           tls=opts["tls"])
        try:
            if opts["migrate"]:
                await migrate(db, lock_timeout_s=opts["migration_lock_timeout_s"])
            else:
                await check_schema(db)
            # A role of one tenant (PostgreSQL, migration 0012) runs no other's store.
            await db.check_tenant(opts["tenant_id"])
            return SqlStore(db, tenant_id=opts["tenant_id"], clock=opts["clock"],
                            compress_threshold_bytes=opts["compress_threshold_bytes"],
                            fast_paths=opts["fast_paths"], history=opts["history"],
                            max_decompressed_bytes=opts["max_decompressed_bytes"])
        except BaseException:
            await db.dispose()
            raise

    def __await__(self) -> Generator[Any, None, SqlStore]:
        return self._open().__await__()

    async def __aenter__(self) -> SqlStore:
        self._store = await self._open()
        return self._store

    async def __aexit__(self, *_exc: object) -> None:
        if self._store is not None:
            await self._store.close()


def open_store(url: str | URL, *, tenant_id: str = "default", migrate: bool = True,
               schema: str | None = None, clock: Callable[[], float] = time.time,
               busy_timeout_s: float = 30.0, pool_size: int = 5,
               compress_threshold_bytes: int = 16_384, fast_paths: bool = True,
               history: HistoryOptions | None = None,
               tls: TlsConfig | None = None,
               migration_lock_timeout_s: float = MIGRATION_LOCK_TIMEOUT_S,
               max_decompressed_bytes: int = DEFAULT_MAX_DECOMPRESSED_BYTES) -> StoreOpener:
    """Open the checkpoint store at ``url`` for ``tenant_id``.

    ``migrate`` brings the schema up to date first (under an advisory lock on
    PostgreSQL, so instances may start together, waited for
    ``migration_lock_timeout_s`` at most: then
    :class:`~meshpoint.errors.MigrationLockError` names the session holding it; a
    schema already up to date takes no lock); with ``migrate=False`` an
    out-of-date schema raises :class:`~meshpoint.errors.SchemaError`, and so does a
    SQLite path that names no file (which is then not created).
    On PostgreSQL, a role that row-level security would not let act as
    ``tenant_id`` (a tenant's own role, mapped to another: ``meshpoint migrate
    --tenant-role``) is refused with :class:`~meshpoint.errors.TenantRoleError`.
    ``schema`` selects a PostgreSQL schema (``search_path``). ``clock`` returns
    epoch seconds and drives deadlines and leases; hosts sharing a database need
    synchronised clocks. ``busy_timeout_s`` bounds how long a write waits for a
    lock (SQLite) or a connection attempt takes (PostgreSQL). Contexts larger than
    ``compress_threshold_bytes`` are stored zlib-compressed, and no stored blob is
    inflated past ``max_decompressed_bytes`` (a context or history snapshot that
    would be is refused: :class:`~meshpoint.errors.DecompressionLimitError` on read,
    InvalidArgumentError on write). ``fast_paths=False``
    runs every operation's portable body, even where the dialect has a faster one
    (:mod:`meshpoint.store.hooks`): slower, and meant for tests and benchmarks.
    ``history`` says how the checkpoint history is kept (signing and encryption
    keys, prices, retention; :class:`~meshpoint.history.planning.HistoryOptions`): by default
    a hash-chained, unsigned record of every checkpoint. ``tls`` requires TLS to
    PostgreSQL (:class:`~meshpoint.tls.TlsConfig`: a CA, a client certificate, what is
    verified); a URL may say it in libpq's words instead (``?sslmode=verify-full&
    sslrootcert=ca.pem``). With either, a server offering no TLS, or whose
    certificate does not verify, is refused with :class:`~meshpoint.errors.TlsError`.
    """
    return StoreOpener(url, tenant_id=tenant_id, migrate=migrate, schema=schema, clock=clock,
                       busy_timeout_s=busy_timeout_s, pool_size=pool_size,
                       compress_threshold_bytes=compress_threshold_bytes,
                       fast_paths=fast_paths, history=history, tls=tls,
                       migration_lock_timeout_s=migration_lock_timeout_s,
                       max_decompressed_bytes=max_decompressed_bytes)


def __getattr__(name: str) -> Any:
    """``PeerSubTask``, :class:`SubTask`'s former name: still importable, with a warning."""
    if name == "PeerSubTask":
        warnings.warn("meshpoint.store.PeerSubTask was renamed SubTask; import that",
                      DeprecationWarning, stacklevel=2)
        return SubTask
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
