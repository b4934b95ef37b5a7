"""SQLite, the embedded default: how a transaction runs on it, and how its
write-ahead log is kept short.

SQLite runs on the standard library's sqlite3 driver. The whole transaction runs
on a worker thread: one thread hop per operation, where aiosqlite hops threads for
every cursor call. A short transaction runs on the caller's thread instead when
the lock it needs is free (see :class:`SqliteDatabase`). What each of these choices
measured is in docs/store.md, *Performance*.

SQLite must also be correct across processes on one host. Each connection uses
WAL (readers never block the writer), a busy timeout (a writer waits for the lock
instead of failing), and ``BEGIN IMMEDIATE`` for write transactions so the write
lock is taken up front: two processes can never both read a sub-task as pending
and then both claim it, and a transaction never fails half-way when it upgrades
from reading to writing.

SQLite has no fast paths of its own (:mod:`meshpoint.store.hooks`): the portable
bodies are what it runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy import Connection, Engine, create_engine, event, exc
from sqlalchemy.engine import URL
from sqlalchemy.pool import QueuePool, StaticPool

from meshpoint import _json
from meshpoint.errors import ConfigurationError
from meshpoint.store import sa_internals as sa
from meshpoint.store.engine import Database

R = TypeVar("R")
#: Key of the execution option that selects SQLite's BEGIN mode.
SQLITE_BEGIN = "meshpoint_sqlite_begin"
#: Size a WAL file started over is cut back to (SQLite's ``journal_size_limit``).
WAL_SIZE_LIMIT_BYTES = 64 << 20
#: Address space SQLite may map for reads (not memory it allocates).
SQLITE_MMAP_BYTES = 1 << 30


def is_memory(url: URL) -> bool:
    return url.database in (None, "", ":memory:")


def open_sqlite(url: URL, *, busy_timeout_s: float, schema: str | None,
                pool_size: int) -> SqliteDatabase:
    """The database at ``url`` (already :func:`~meshpoint.store.engine.parse_url`-ed)."""
    if schema is not None:
        raise ConfigurationError("schema= is a PostgreSQL option; SQLite has one schema")
    json_codec: dict[str, Any] = {"json_serializer": _json.dumps,
                                  "json_deserializer": _json.loads}
    memory = is_memory(url)
    if memory:
        # One shared connection, or every checkout would see an empty database.
        engine = create_engine(url, poolclass=StaticPool,
                               connect_args={"check_same_thread": False}, **json_codec)
    else:
        path = Path(url.database or "").expanduser()
        path.parent.mkdir(parents=True, exist_ok=True)
        url = url.set(database=str(path))
        engine = create_engine(
            url, poolclass=QueuePool, pool_size=pool_size, max_overflow=0,
            connect_args={"timeout": busy_timeout_s, "check_same_thread": False},
            **json_codec)
    _install_hooks(engine, memory=memory, busy_timeout_s=busy_timeout_s)
    if memory:
        return SqliteDatabase(engine, workers=1)
    # One connection that never waits: SQLite's busy timeout 0, and a pool that
    # refuses at once rather than queue a second thread behind its user.
    inline = create_engine(
        url, poolclass=QueuePool, pool_size=1, max_overflow=0, pool_timeout=0,
        connect_args={"timeout": 0, "check_same_thread": False}, **json_codec)
    _install_hooks(inline, memory=False, busy_timeout_s=0)
    return SqliteDatabase(engine, workers=pool_size, inline=inline,
                          wal_checkpointer=WalCheckpointer(str(url.database)))


class SqliteDatabase(Database):
    """SQLite through sqlite3; each transaction runs whole on a worker thread, or,
    if it is short and nobody holds the lock it needs, on the caller's thread.

    The hop to a worker thread and back is much of a short transaction's time and
    most of its jitter (docs/store.md, *Performance*). So a ``short`` transaction of a
    file database first tries an *inline* connection whose busy timeout is zero:
    if the write lock (or that connection) is taken, SQLite says so at once and the
    transaction runs on a worker thread instead, where it waits for the lock as
    usual. The event loop is thus never blocked waiting for another process; it is
    busy for the transaction's own work (reading a page not yet in the OS cache
    included), as with any short computation. The inline connection never runs a
    WAL checkpoint inside a commit, and while the checkpointer's :class:`WriteGate`
    is closed for a checkpoint, write transactions go to a worker thread and wait there.

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
        # The inline connection stays checked out: a checkout and return per
        # transaction outweighed an empty transaction (docs/store.md, *Performance*).
        # The lock says whether a thread is using it (never waited for).
        self._inline_conn: Connection | None = None
        self._inline_busy = threading.Lock()
        # Write transactions of this process pass the checkpointer's gate, so that it
        # can hold them back for a checkpoint (see WalCheckpointer).
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
            return False, None  # a checkpoint is under way: the worker thread waits for it
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
                   one_statement: bool, short: bool, tenant: str | None) -> R:
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
    """Lets one process's SQLite write transactions and its :class:`WalCheckpointer`
    take turns.

    A checkpoint runs with the write lock held. Back-to-back writes of one process
    leave gaps of microseconds between a commit and the next BEGIN, which SQLite's
    busy handler, polling every few milliseconds, rarely hits: the log grew without
    bound on a loaded machine. So the checkpointer *closes* the gate: write
    transactions not yet begun wait for it to open again (the inline path hands
    them to a worker thread, which waits here), those already running finish, and
    the checkpointer then competes for the lock only with other processes' writers.
    Each of those holds it for one transaction, and once the checkpointer has it
    their busy timeouts queue them behind it. Read transactions never pass the gate.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._writers = 0  # write transactions of this process under way
        self._closed = False
        #: Write transactions that have passed the gate (the checkpointer skips a
        #: pass when none has since its last).
        self.writes = 0
        #: Write transactions waiting for the gate to open (for tests and stats).
        self.held = 0

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
            self.writes += 1
            if not self._writers:
                self._cond.notify_all()

    @contextmanager
    def writer(self) -> Iterator[None]:
        """Hold a write transaction while the gate is closed, then count it in."""
        with self._cond:
            self.held += 1
            try:
                self._cond.wait_for(lambda: not self._closed)
            finally:
                self.held -= 1
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


class WalSync:
    """Flushes the write-ahead log to disk before a checkpoint takes the write lock.

    With ``synchronous=NORMAL`` commits do not sync: the log's new frames are in the
    page cache, and the checkpoint's first step syncs them, with the lock held, so
    writers waited for the flush of everything written since the last pass (a 10-step
    turn's p99 on SQLite tripled). Synced here first, the checkpoint's own sync has
    only what was written since. The file is opened once, read-only, and kept open:
    closing a descriptor of a file releases every POSIX lock this process holds on
    it (SQLite keeps its locks on the database and ``-shm`` files, not the log), and
    it is opened again when the log was deleted and made anew."""

    def __init__(self, path: str) -> None:
        self._path = os.path.abspath(path)
        self._fd: int | None = None
        self._inode = -1
        self.syncs = 0  # flushes made (for tests)

    def sync(self) -> None:
        try:
            inode = os.stat(self._path).st_ino
            if inode != self._inode:
                self.close()
                self._fd, self._inode = os.open(self._path, os.O_RDONLY), inode
            assert self._fd is not None
            os.fsync(self._fd)
            self.syncs += 1
        except OSError:
            pass  # no log yet, or gone: SQLite's own sync does it

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


class WalCheckpointer:
    """Copies SQLite's write-ahead log into the database file off the write path,
    with the write lock held, and so keeps the log short.

    Every checkpoint of a file database runs here: connections turn SQLite's
    automatic checkpoint off (it ran inside whichever commit filled the log, and
    that commit paid for the copy: docs/store.md, *Performance*). Every
    ``interval_s``, if this process wrote since its last pass, this thread flushes
    the log (:class:`WalSync`), closes
    the :class:`WriteGate`, takes the write lock on one connection of its own
    (``BEGIN IMMEDIATE``) and copies the log on another (a PASSIVE checkpoint),
    then lets writers go. Several processes may each run one; they take turns at
    the lock. sqlite3 releases the GIL while it copies, so the event loop runs on.

    Why the write lock. SQLite before 3.51.3 has the *WAL-reset bug*
    (https://sqlite.org/wal.html#walresetbug): a checkpoint that runs while another
    connection commits the transaction that starts the log over may record frames
    as copied that were not, and the database file is then corrupt. Copying while
    writers commit is what a PASSIVE checkpoint does; this one ran several times a
    second in every process of a mesh, and a 300-task run killing processes on one
    file once read "database disk image is malformed". With the lock held no
    commit runs during any checkpoint, whichever SQLite Python links.

    It also keeps the log short. With no write during the copy, the copy takes
    every frame that no older reader still reads, and the next writer then starts
    the log over from its beginning (SQLite does so only when every frame is
    copied; a PASSIVE checkpoint among steady writes never copied them all, and
    the log grew by every write). Connections cut a log file that was started over
    back to :data:`WAL_SIZE_LIMIT_BYTES`.
    """

    def __init__(self, path: str, *, interval_s: float = 0.25, lock_timeout_s: float = 0.2,
                 idle_pass_s: float = 5.0) -> None:
        self._path = path
        self._interval_s = interval_s
        self._lock_timeout_s = lock_timeout_s
        # Other processes' frames are copied by their own checkpointers; a pass is
        # still made now and then without writes of this one, for a process that
        # wrote and exited while others only read.
        self._idle_pass_s = idle_pass_s
        self._stop = threading.Event()
        self.passes = 0  # passes made, whatever they did (for tests and stats)
        self.checkpoints = 0  # checkpoints run with the write lock held
        self.copied_all = 0  # of those, the ones that copied every frame of the log
        self.gate = WriteGate()  # passed by the write transactions of this process
        self.wal = WalSync(f"{path}-wal")
        self._thread = threading.Thread(target=self._run, name="meshpoint-wal-checkpoint",
                                        daemon=True)
        self._thread.start()

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self._path, timeout=self._lock_timeout_s,
                               isolation_level=None, check_same_thread=False)
        conn.execute("PRAGMA wal_autocheckpoint=0")
        return conn

    def _run(self) -> None:
        # Short waits: a lock that cannot be had soon (a long write transaction of
        # this process, another process's writer) is tried again on the next pass
        # rather than holding writers back behind it.
        lock, copier = self._connect(), self._connect()
        seen, last = -1, time.monotonic()
        try:
            while not self._stop.wait(self._interval_s):
                writes = self.gate.writes
                if writes != seen or time.monotonic() - last >= self._idle_pass_s:
                    with contextlib.suppress(sqlite3.Error):  # busy or locked: next time
                        if self._pass(lock, copier):
                            seen, last = writes, time.monotonic()
                self.passes += 1
        finally:
            lock.close()
            copier.close()
            self.wal.close()

    def _pass(self, lock: sqlite3.Connection, copier: sqlite3.Connection) -> bool:
        """One checkpoint with the write lock held; False if this process's writes
        under way did not finish soon (tried again next pass)."""
        self.wal.sync()
        with self.gate.closed(timeout_s=0.1) as idle:
            if not idle:
                return False
            lock.execute("BEGIN IMMEDIATE")
            try:
                _busy, frames, copied = copier.execute(
                    "PRAGMA wal_checkpoint(PASSIVE)").fetchone()
            finally:
                lock.execute("ROLLBACK")
        self.checkpoints += 1
        self.copied_all += frames == copied
        return True

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def _install_hooks(engine: Engine, *, memory: bool, busy_timeout_s: float) -> None:
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
            cursor.execute("PRAGMA wal_autocheckpoint=0")  # the WalCheckpointer's job
            cursor.execute(f"PRAGMA journal_size_limit={WAL_SIZE_LIMIT_BYTES}")
            # Reads through the OS page cache, shared by every connection and process,
            # instead of each connection's own small cache, which a large database
            # turned into page-sized read() calls for every restore.
            cursor.execute(f"PRAGMA mmap_size={SQLITE_MMAP_BYTES}")
        cursor.execute(f"PRAGMA busy_timeout={int(busy_timeout_s * 1000)}")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        # On the driver's connection, not SQLAlchemy's execution path (measured in
        # docs/store.md, *Performance*).
        # The mode: set per transaction in the connection's info (the inline
        # connection, held across transactions), or by the engine's options.
        mode = conn.info.pop(SQLITE_BEGIN, None) \
            or conn.get_execution_options().get(SQLITE_BEGIN, "DEFERRED")
        statement = f"BEGIN {mode}"
        try:
            sa.dbapi_connection(conn).execute(statement)
        except sqlite3.Error as error:  # raised as SQLAlchemy would raise it
            raise sa.wrapped(statement, (), error, conn.dialect) from error
