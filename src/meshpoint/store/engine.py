"""Databases for the store: which URL means which backend, and how one
transaction runs on it.

The store writes every operation once, as a synchronous SQLAlchemy Core function
of a :class:`~sqlalchemy.Connection`; a :class:`Database` runs that function as
one transaction without blocking the event loop:

* **PostgreSQL** (asyncpg) runs it through ``AsyncConnection.run_sync``: the
  function's statements await the network through SQLAlchemy's greenlet bridge.
  The one-statement calls of the pause boundary (a first checkpoint, a
  resolution, a restore) skip the bridge: they await asyncpg on a pooled
  connection (:meth:`AsyncDatabase.native`), which stays out of the pool between
  them while nobody waits for it.
* **SQLite** (the standard library's sqlite3) runs the whole transaction on a
  worker thread: one thread hop per operation. (aiosqlite hops threads for every
  cursor call, several per statement; measured here, a one-statement transaction
  cost 1.15 ms through it, most of the SQLite budget.) A short transaction runs
  on the caller's thread instead when the lock it needs is free (see
  :class:`ThreadedDatabase`).

SQLite must also be correct across processes on one host. Each connection uses
WAL (readers never block the writer), a busy timeout (a writer waits for the
lock instead of failing), and ``BEGIN IMMEDIATE`` for write
transactions so the write lock is taken up front: two processes can never both
read a sub-task as pending and then both claim it, and a transaction never fails
half-way when it upgrades from reading to writing. PostgreSQL runs migrations
under an advisory lock so many instances can start at once.

Driver errors are translated into :mod:`meshpoint.errors` by :func:`translate`.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import re
import sqlite3
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, Engine, event, exc
from sqlalchemy import create_engine as create_sync_engine
from sqlalchemy.engine import URL, make_url
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.pool import PoolProxiedConnection, QueuePool, StaticPool

from meshpoint import _json
from meshpoint.errors import (
    ConfigurationError,
    CorruptCheckpointError,
    MeshpointError,
    SchemaError,
    StoreError,
    StoreUnavailableError,
)

R = TypeVar("R")
MIGRATIONS_DIR = Path(__file__).parent / "migrations"
#: Key of the execution option that selects SQLite's BEGIN mode.
SQLITE_BEGIN = "meshpoint_sqlite_begin"
_PG_MIGRATION_LOCK = 0x6D657368  # "mesh": the advisory lock id migrations take
#: Log size (4 KiB pages) at which a commit checkpoints SQLite's WAL itself: only if
#: the :class:`WalCheckpointer` thread has fallen behind (SQLite's default is 1,000).
WAL_AUTOCHECKPOINT_PAGES = 16_384
#: Frames (pages) in SQLite's WAL past which the :class:`WalCheckpointer` makes the
#: next writer start the log over (16 MiB of 4 KiB pages).
WAL_RESTART_FRAMES = 4_096
#: Size a restarted WAL file is cut back to (SQLite's ``journal_size_limit``).
WAL_SIZE_LIMIT_BYTES = 64 << 20
#: Address space SQLite may map for reads (not memory it allocates).
SQLITE_MMAP_BYTES = 1 << 30


def parse_url(url: str | URL) -> URL:
    """Normalise a store URL to the driver meshpoint uses, or raise ConfigurationError."""
    try:
        parsed = make_url(url)
    except exc.ArgumentError as error:
        raise ConfigurationError(
            f"cannot parse store URL {url!r}: {error}. Use sqlite+aiosqlite:///path.db, "
            "sqlite+aiosqlite:///:memory: or postgresql+asyncpg://user@host/db"
        ) from None
    backend, _, driver = parsed.drivername.partition("+")
    if backend == "sqlite" and driver in ("", "aiosqlite", "pysqlite"):
        return parsed.set(drivername="sqlite+pysqlite")
    if backend in ("postgresql", "postgres") and driver in ("", "asyncpg"):
        if importlib.util.find_spec("asyncpg") is None:
            raise ConfigurationError(
                "PostgreSQL needs the asyncpg driver: pip install 'meshpoint[postgres]'"
            )
        return parsed.set(drivername="postgresql+asyncpg")
    raise ConfigurationError(
        f"unsupported store URL scheme {parsed.drivername!r}: meshpoint runs on "
        "sqlite+aiosqlite:// (or sqlite://) and postgresql+asyncpg://"
    )


def is_memory_sqlite(url: URL) -> bool:
    return url.get_backend_name() == "sqlite" and url.database in (None, "", ":memory:")


class Database:
    """A connection pool, and the way to run one transaction on it."""

    dialect: str
    closed = False

    async def run(self, body: Callable[[Connection], R], *, write: bool,
                  one_statement: bool = False, short: bool = False) -> R:
        """Run ``body`` in one transaction: committed if it returns, rolled back if
        it raises. ``write`` transactions take SQLite's write lock up front; the
        others see one consistent snapshot of the database.

        ``one_statement`` promises that ``body`` writes with a single statement and
        otherwise only reads (to explain a refusal). PostgreSQL then runs it without
        BEGIN and COMMIT: a statement is atomic by itself, and the two round trips
        were most of a short write's time. SQLite ignores it (its write lock must be
        taken up front either way).

        ``short`` promises that ``body`` touches a few rows by key (a checkpoint, a
        resolution, a restore): SQLite may then run it on the event loop's thread
        (see :class:`ThreadedDatabase`). PostgreSQL ignores it."""
        if self.closed:
            raise StoreError("the store is closed; open a new one with open_store()")
        return await self._run(body, write, one_statement, short)

    async def _run(self, body: Callable[[Connection], R], write: bool,
                   one_statement: bool, short: bool) -> R:
        raise NotImplementedError

    async def dispose(self) -> None:
        self.closed = True


class AsyncDatabase(Database):
    """PostgreSQL through asyncpg; ``body`` runs on SQLAlchemy's greenlet bridge.

    Reads run REPEATABLE READ, READ ONLY: several SELECTs see one snapshot, never
    half of a concurrent checkpoint or cleanup. The pause-boundary statements (a
    first checkpoint, a resolution, a restore) are one statement each and run
    natively (:meth:`native`).
    """

    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine
        self.dialect = engine.dialect.name
        self._reader = engine.execution_options(isolation_level="REPEATABLE READ",
                                                postgresql_readonly=True)
        self._autocommit = engine.execution_options(isolation_level="AUTOCOMMIT")
        # A connection kept out of the pool between native statements (see native()),
        # and how many callers are waiting for the pool (then nothing is kept).
        self._parked: PoolProxiedConnection | None = None
        self._waiting = 0

    @contextlib.asynccontextmanager
    async def _pool_wait(self) -> AsyncIterator[None]:
        """Count a caller waiting for a pooled connection, after returning the parked
        one to the pool: a caller must never wait for a connection that sits idle."""
        self._waiting += 1
        try:
            self._return_parked()
            yield
        finally:
            self._waiting -= 1

    @contextlib.asynccontextmanager
    async def native(self) -> AsyncIterator[PoolProxiedConnection]:
        """A pooled connection whose asyncpg connection the caller awaits directly
        (with :meth:`~meshpoint.store.lean.Lean.fetch`), outside any transaction:
        each statement commits by itself, so only one-statement writes, and reads
        that explain them, belong here.

        Afterwards the connection is discarded if a statement lost it, was cancelled
        mid-way, or failed in a way that is not the server's verdict on the
        statement. Otherwise one connection is kept out of the pool for the next
        native statement, unless someone waits for the pool: a checkout from
        SQLAlchemy's pool and the return to it cost 60-75 µs of CPU per statement
        here (the greenlet bridge, the pool's bookkeeping), a third of a
        resolution's client time. The others go back to the pool."""
        if self.closed:
            raise StoreError("the store is closed; open a new one with open_store()")
        proxied, self._parked = self._parked, None
        if proxied is None:
            dialect = self.engine.dialect
            try:
                async with self._pool_wait():
                    proxied = await self.engine.raw_connection()
            except dialect.loaded_dbapi.Error as error:
                # Connecting failed (the server is down, starting or stopping): raised
                # as SQLAlchemy raises it from Engine.connect(), for translate().
                raise exc.DBAPIError.instance(
                    None, None, error, dialect.loaded_dbapi.Error,
                    connection_invalidated=dialect.is_disconnect(error, None, None),
                    dialect=dialect) from error
        try:
            yield proxied
        except BaseException as error:
            if isinstance(error, exc.DBAPIError):
                lost = error.connection_invalidated
            elif isinstance(error, MeshpointError):  # the body refused, after a statement
                lost = proxied.driver_connection is None \
                    or proxied.driver_connection.is_closed()
            else:  # the socket, a cancellation mid-statement, a bug
                lost = True
            if lost:
                proxied.invalidate(error)  # terminated at once, never reused
            else:
                proxied.close()
            raise
        if self._parked is None and self._waiting == 0 and not self.closed:
            self._parked = proxied
        else:
            proxied.close()

    async def _run(self, body: Callable[[Connection], R], write: bool,
                   one_statement: bool, short: bool) -> R:
        engine = self._autocommit if write and one_statement else \
            self.engine if write else self._reader
        async with contextlib.AsyncExitStack() as stack:
            # The connection's own context manager closes it, and finishes closing
            # even if this task is cancelled meanwhile; the wait counts the checkout.
            async with self._pool_wait():
                conn = await stack.enter_async_context(engine.connect())
            if write and one_statement:
                return await conn.run_sync(body)
            async with conn.begin():
                return await conn.run_sync(body)

    def _return_parked(self) -> None:
        if self._parked is not None:
            parked, self._parked = self._parked, None
            parked.close()

    async def dispose(self) -> None:
        await super().dispose()
        self._return_parked()
        await self.engine.dispose()


class ThreadedDatabase(Database):
    """SQLite through sqlite3; each transaction runs whole on a worker thread, or,
    if it is short and nobody holds the lock it needs, on the caller's thread.

    The hop to a worker thread and back cost 0.06-0.18 ms and most of the jitter of
    a checkpoint that takes 0.2 ms of SQLite's time. So a ``short`` transaction of a
    file database first tries an *inline* connection whose busy timeout is zero:
    if the write lock (or that connection) is taken, SQLite says so at once and the
    transaction runs on a worker thread instead, where it waits for the lock as
    usual. The event loop is thus never blocked waiting for another process; it is
    busy for the transaction's own work (reading a page not yet in the OS cache
    included), as with any short computation. The inline connection never runs a
    WAL checkpoint inside a commit, and while the checkpointer's :class:`WriteGate`
    is closed for a RESTART, write transactions go to a worker thread and wait there.

    Cancelling the awaiting task does not interrupt a transaction already on its
    thread: it commits or rolls back as if nobody had cancelled.
    """

    def __init__(self, engine: Engine, *, workers: int,
                 wal_checkpointer: WalCheckpointer | None = None,
                 inline: Engine | None = None) -> None:
        self.engine = engine
        self.dialect = engine.dialect.name
        self._writer = engine.execution_options(**{SQLITE_BEGIN: "IMMEDIATE"})
        self._threads = ThreadPoolExecutor(workers, thread_name_prefix="meshpoint-sqlite")
        self._wal_checkpointer = wal_checkpointer
        self._inline = inline
        # The inline connection stays checked out: a pool checkout, a Connection and
        # a pool return per transaction cost 20 µs of an empty transaction's 31.
        # The lock says whether a thread is using it (never waited for).
        self._inline_conn: Connection | None = None
        self._inline_busy = threading.Lock()
        # Write transactions of this process pass the checkpointer's gate, so that it
        # can hold them back for a RESTART (see WalCheckpointer).
        self._gate = WriteGate() if wal_checkpointer is None else wal_checkpointer.gate

    def _transaction(self, body: Callable[[Connection], R], write: bool) -> R:
        if not write:
            with self.engine.begin() as conn:
                return body(conn)
        with self._gate.writer(), self._writer.begin() as conn:
            return body(conn)

    def _try_inline(self, body: Callable[[Connection], R], write: bool) -> tuple[bool, R | None]:
        """Run ``body`` on the inline connection: ``(True, result)``, or ``(False,
        None)`` with nothing done if the lock or the connection was taken."""
        if not self._inline_busy.acquire(blocking=False):
            return False, None  # another thread is using the inline connection
        if write and not self._gate.try_enter():
            self._inline_busy.release()
            return False, None  # a RESTART is due: the worker thread waits for it
        try:
            conn = self._inline_conn
            if conn is None or conn.closed or conn.invalidated:
                assert self._inline is not None
                conn = self._inline_conn = self._inline.connect()
            conn.info[SQLITE_BEGIN] = "IMMEDIATE" if write else "DEFERRED"
            with conn.begin():
                return True, body(conn)
        except exc.OperationalError as error:
            if "locked" in str(error.orig) or "busy" in str(error.orig):
                return False, None  # rolled back; the worker thread waits for the lock
            raise
        finally:
            if write:
                self._gate.leave()
            self._inline_busy.release()

    async def _run(self, body: Callable[[Connection], R], write: bool,
                   one_statement: bool, short: bool) -> R:
        if short and self._inline is not None:
            done, result = self._try_inline(body, write)
            if done:
                return result  # type: ignore[return-value]
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._threads, self._transaction, body, write)

    async def dispose(self) -> None:
        await super().dispose()
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, self._threads.shutdown)
        if self._wal_checkpointer is not None:
            await loop.run_in_executor(None, self._wal_checkpointer.stop)
        self.engine.dispose()
        if self._inline is not None:
            with self._inline_busy:
                if self._inline_conn is not None:
                    self._inline_conn.close()
            self._inline.dispose()


class WriteGate:
    """Lets one process's SQLite write transactions and its :class:`WalCheckpointer`'s
    RESTART take turns.

    A RESTART must find no writer at all. Back-to-back writes of one process leave
    it gaps of microseconds between a commit and the next BEGIN, which SQLite's busy
    handler, polling every few milliseconds, rarely hits: on a loaded CI machine
    3,000 checkpoints in a row let one RESTART in and the log grew to 98 MB. So the
    checkpointer *closes* the gate: write transactions not yet begun wait for it to
    open again (the inline path hands them to a worker thread, which waits here),
    those already running finish, and the RESTART then competes only with other
    processes' writers. Each of those holds SQLite's lock for one transaction, and
    once the RESTART has the lock their busy timeouts queue them behind it.
    Read transactions never pass the gate: a RESTART lets new readers in.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._writers = 0  # write transactions of this process under way
        self._closed = False

    def try_enter(self) -> bool:
        """Count a write transaction in if the gate is open; never waits."""
        with self._cond:
            if self._closed:
                return False
            self._writers += 1
            return True

    def leave(self) -> None:
        """Count out a write transaction that :meth:`try_enter` let in."""
        with self._cond:
            self._writers -= 1
            if not self._writers:
                self._cond.notify_all()

    @contextmanager
    def writer(self) -> Iterator[None]:
        """Hold a write transaction while the gate is closed, then count it in."""
        with self._cond:
            self._cond.wait_for(lambda: not self._closed)
            self._writers += 1
        try:
            yield
        finally:
            self.leave()

    @contextmanager
    def closed(self, timeout_s: float) -> Iterator[bool]:
        """Keep new write transactions out for the block. It is given True once the
        ones under way have finished, or False if they took over ``timeout_s`` (a
        long sweep, say): the block should then not wait for the write lock."""
        try:
            with self._cond:
                self._closed = True
                idle = self._cond.wait_for(lambda: not self._writers, timeout_s)
            yield idle
        finally:
            with self._cond:
                self._closed = False
                self._cond.notify_all()


class WalCheckpointer:
    """Copies SQLite's write-ahead log into the database file off the write path,
    and keeps the log short.

    SQLite's automatic checkpoint runs inside whichever commit fills the log past
    1,000 pages, so one write in ~150 checkpoints paid 5-6 ms for it: that was the
    p99. Connections therefore raise the automatic threshold to a safety net
    (:data:`WAL_AUTOCHECKPOINT_PAGES`), and this thread runs a PASSIVE checkpoint,
    which never waits for readers or writers, every ``interval_s`` on a connection
    of its own. sqlite3 releases the GIL while it copies, so the event loop runs on.
    Several processes may each run one: SQLite lets one checkpoint run at a time.

    A PASSIVE checkpoint copies the log but never rewinds it: SQLite starts the log
    over only when a writer begins while every frame is already copied, which a
    steady stream of writes never allows (the writes made during the copy are always
    left). Measured: 3,000 checkpoints in a row grew the log to 234 MB, and every
    read and commit slowed as the log's index grew (a commit p50 0.16 → 0.48 ms).
    So when the log holds ``restart_frames`` frames or more after a PASSIVE pass
    that copied them all (none is pinned by a reader, which a RESTART would wait
    for), this thread runs a RESTART checkpoint behind a closed :class:`WriteGate`: it
    waits for this process's writers to finish (other processes' for the write
    lock), copies the few frames written since the PASSIVE pass, and makes the next
    writer start the log over. Writers wait for it that long. Connections cut a
    restarted log file back to :data:`WAL_SIZE_LIMIT_BYTES`.
    """

    def __init__(self, path: str, *, interval_s: float = 0.25,
                 restart_frames: int = WAL_RESTART_FRAMES) -> None:
        self._path = path
        self._interval_s = interval_s
        self._restart_frames = restart_frames
        self._stop = threading.Event()
        self.restarts = 0  # RESTART checkpoints that completed (for tests and stats)
        self.gate = WriteGate()  # passed by the write transactions of this process
        self._thread = threading.Thread(target=self._run, name="meshpoint-wal-checkpoint",
                                        daemon=True)
        self._thread.start()

    def _run(self) -> None:
        # Short waits: a RESTART that cannot start soon (a long write transaction of
        # this process, another process's writer or reader) is tried again on the
        # next pass rather than holding writers back behind it.
        conn = sqlite3.connect(self._path, timeout=0.2, isolation_level=None,
                               check_same_thread=False)
        try:
            while not self._stop.wait(self._interval_s):
                with contextlib.suppress(sqlite3.Error):  # busy or locked: next time
                    _busy, frames, copied = conn.execute(
                        "PRAGMA wal_checkpoint(PASSIVE)").fetchone()
                    # Frames left uncopied mean a reader still uses them: a RESTART
                    # would wait for it with writers held back, so not this pass.
                    if frames >= self._restart_frames and copied == frames:
                        with self.gate.closed(timeout_s=0.1) as idle:
                            if not idle:
                                continue
                            busy, _frames, _copied = conn.execute(
                                "PRAGMA wal_checkpoint(RESTART)").fetchone()
                        self.restarts += not busy
        finally:
            conn.close()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def open_database(url: URL, *, busy_timeout_s: float, schema: str | None,
                  pool_size: int) -> Database:
    """Create the pool for ``url`` (already :func:`parse_url`-ed) with its hooks."""
    json_codec: dict[str, Any] = {"json_serializer": _json.dumps,
                                  "json_deserializer": _json.loads}
    if url.get_backend_name() == "sqlite":
        if schema is not None:
            raise ConfigurationError("schema= is a PostgreSQL option; SQLite has one schema")
        memory = is_memory_sqlite(url)
        if memory:
            # One shared connection, or every checkout would see an empty database.
            engine = create_sync_engine(url, poolclass=StaticPool,
                                        connect_args={"check_same_thread": False},
                                        **json_codec)
        else:
            path = Path(url.database or "").expanduser()
            path.parent.mkdir(parents=True, exist_ok=True)
            url = url.set(database=str(path))
            engine = create_sync_engine(
                url, poolclass=QueuePool, pool_size=pool_size, max_overflow=0,
                connect_args={"timeout": busy_timeout_s, "check_same_thread": False},
                **json_codec)
        _install_sqlite_hooks(engine, memory=memory, busy_timeout_s=busy_timeout_s)
        if memory:
            return ThreadedDatabase(engine, workers=1)
        # One connection that never waits: SQLite's busy timeout 0, and a pool that
        # refuses at once rather than queue a second thread behind its user.
        inline = create_sync_engine(
            url, poolclass=QueuePool, pool_size=1, max_overflow=0, pool_timeout=0,
            connect_args={"timeout": 0, "check_same_thread": False}, **json_codec)
        # It never copies the WAL into the database inside a commit either: that is
        # the checkpointer thread's job (and the worker connections' safety net).
        _install_sqlite_hooks(inline, memory=False, busy_timeout_s=0, autocheckpoint_pages=0)
        return ThreadedDatabase(engine, workers=pool_size, inline=inline,
                                wal_checkpointer=WalCheckpointer(str(url.database)))
    connect_args: dict[str, Any] = {"timeout": busy_timeout_s}
    if schema is not None:
        connect_args["server_settings"] = {"search_path": schema}
    return AsyncDatabase(create_async_engine(
        url, pool_size=pool_size, max_overflow=0, connect_args=connect_args,
        **json_codec))


def _install_sqlite_hooks(engine: Engine, *, memory: bool, busy_timeout_s: float,
                          autocheckpoint_pages: int = WAL_AUTOCHECKPOINT_PAGES) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # Take BEGIN away from pysqlite's legacy transaction control: we emit our own.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        if not memory:
            cursor.execute("PRAGMA journal_mode=WAL")
            # NORMAL in WAL mode: a commit survives a crash of any process; only a
            # power loss may drop the last transactions (never corrupts the file).
            cursor.execute("PRAGMA synchronous=NORMAL")
            cursor.execute(f"PRAGMA wal_autocheckpoint={autocheckpoint_pages}")
            cursor.execute(f"PRAGMA journal_size_limit={WAL_SIZE_LIMIT_BYTES}")
            # Reads through the OS page cache, shared by every connection and process,
            # instead of each connection's own 2 MB cache: with 100,000 paused tasks the
            # default cache turned a restore into page-sized read() calls.
            cursor.execute(f"PRAGMA mmap_size={SQLITE_MMAP_BYTES}")
        cursor.execute(f"PRAGMA busy_timeout={int(busy_timeout_s * 1000)}")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        # On the driver's connection: through SQLAlchemy's execution path this one
        # statement was a fifth of an inline checkpoint's time.
        # The mode: set per transaction in the connection's info (the inline
        # connection, held across transactions), or by the engine's options.
        mode = conn.info.pop(SQLITE_BEGIN, None) \
            or conn.get_execution_options().get(SQLITE_BEGIN, "DEFERRED")
        statement = f"BEGIN {mode}"
        dbapi_connection = conn.connection.dbapi_connection
        assert dbapi_connection is not None
        try:
            dbapi_connection.execute(statement)
        except sqlite3.Error as error:  # raised as SQLAlchemy would raise it
            raise exc.DBAPIError.instance(statement, (), error, sqlite3.Error,
                                          dialect=conn.dialect) from error


# -- migrations -----------------------------------------------------------------------

def alembic_config() -> Config:
    """An Alembic config pointing at meshpoint's migrations (no ini file needed)."""
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    return config


def head_revision() -> str:
    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    assert head is not None, "meshpoint ships at least one migration"
    return head


def _run_alembic(sync_conn: Connection, direction: str, revision: str) -> None:
    from alembic import command

    if sync_conn.dialect.name == "postgresql":
        sync_conn.exec_driver_sql(f"SELECT pg_advisory_xact_lock({_PG_MIGRATION_LOCK})")
        if direction == "upgrade":
            _create_selected_schema(sync_conn)
    config = alembic_config()
    config.attributes["connection"] = sync_conn
    getattr(command, direction)(config, revision)


def _create_selected_schema(sync_conn: Connection) -> None:
    """Create the schema ``schema=`` selected (the search_path) if it does not exist
    yet, so a fresh database needs no manual step."""
    if sync_conn.exec_driver_sql("SELECT current_schema()").scalar() is not None:
        return
    path = str(sync_conn.exec_driver_sql("SHOW search_path").scalar() or "")
    if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,62}", path):
        sync_conn.exec_driver_sql(f'CREATE SCHEMA IF NOT EXISTS "{path}"')


def _current_revision(sync_conn: Connection) -> str | None:
    return MigrationContext.configure(sync_conn).get_current_revision()


async def migrate(db: Database, revision: str = "head") -> None:
    """Bring the database's schema up to ``revision`` (default: the newest)."""
    with translate(f"migrating the schema to {revision}"):
        await db.run(lambda conn: _run_alembic(conn, "upgrade", revision), write=True)


async def downgrade(db: Database, revision: str) -> None:
    """Take the schema down to ``revision`` (``"base"`` drops every meshpoint table)."""
    with translate(f"downgrading the schema to {revision}"):
        await db.run(lambda conn: _run_alembic(conn, "downgrade", revision), write=True)


async def current_revision(db: Database) -> str | None:
    """The Alembic revision the database is at (None for an empty database)."""
    with translate("reading the schema version"):
        return await db.run(_current_revision, write=False)


async def check_schema(db: Database) -> None:
    """Raise SchemaError unless the database is at this meshpoint's head revision."""
    current = await current_revision(db)
    head = head_revision()
    if current != head:
        raise SchemaError(
            f"the database schema is at revision {current or 'none (empty database)'} but "
            f"this meshpoint needs {head}: run `meshpoint migrate` or open the store "
            "with migrate=True"
        )


# -- error translation ----------------------------------------------------------------

_UNAVAILABLE_MARKERS = ("database is locked", "connection refused", "could not connect",
                        "connection was closed", "connection is closed", "unable to open",
                        "the database system is", "terminating connection",
                        "cannot connect", "connect call failed")
_SCHEMA_MARKERS = ("no such table", "undefinedtable")


def is_retryable(error: BaseException) -> bool:
    """A PostgreSQL deadlock or serialization failure: the whole transaction may be retried."""
    return getattr(getattr(error, "orig", None), "sqlstate", None) in ("40P01", "40001")


@contextmanager
def translate(doing: str) -> Iterator[None]:
    """Turn driver errors raised while ``doing`` into meshpoint errors."""
    try:
        yield
    except MeshpointError:
        raise
    except (TimeoutError, OSError) as error:
        raise StoreUnavailableError(
            f"the database could not be reached while {doing}: {error}. Is it running, "
            "and is the store URL right?"
        ) from error
    except exc.DBAPIError as error:
        message = str(error.orig if error.orig is not None else error).lower()
        if error.connection_invalidated or any(m in message for m in _UNAVAILABLE_MARKERS):
            raise StoreUnavailableError(
                f"the database was unavailable while {doing}: {error.orig}. For SQLite, "
                "another process held the write lock past the busy timeout"
            ) from error
        if any(m in message for m in _SCHEMA_MARKERS) or (
                "relation" in message and "does not exist" in message):
            raise SchemaError(
                f"the schema is missing a table while {doing}: {error.orig}. Run "
                "`meshpoint migrate` or open the store with migrate=True"
            ) from error
        raise StoreError(f"the database failed while {doing}: {error.orig}") from error
    except exc.SQLAlchemyError as error:
        orig = getattr(error, "orig", None)
        if isinstance(orig, MeshpointError):
            raise orig from None  # a bind processor (meshpoint's JSON encoder) refused
        raise StoreError(f"the store failed while {doing}: {error}") from error
    except json.JSONDecodeError as error:
        # A JSON column that no longer parses (SQLite stores JSON as text). Other
        # ValueErrors are bugs, not corruption, and propagate as they are.
        raise CorruptCheckpointError(
            f"a stored row does not decode while {doing}: {error}; it was not used"
        ) from error
