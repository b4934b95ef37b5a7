"""Opening a store: URLs, drivers and unreachable databases give clear errors."""

from __future__ import annotations

import asyncio
import os
import sqlite3
import threading
from pathlib import Path

import pytest

from meshpoint import TaskExecutionContext
from meshpoint.errors import (
    ConfigurationError,
    InvalidArgumentError,
    SchemaError,
    StoreError,
    StoreUnavailableError,
)
from meshpoint.store import SqlStore, open_store
from meshpoint.store.sqlite import SqliteDatabase, WalCheckpointer, WalSync
from tests.integration.mesh import eventually


@pytest.mark.parametrize(("url", "match"), [
    ("mysql+aiomysql://root@localhost/test", "unsupported store URL scheme"),
    ("sqlite+pysqlcipher:///x.db", "unsupported store URL scheme"),
    ("not a url", "cannot parse store URL"),
])
async def test_unusable_urls_are_refused(url: str, match: str) -> None:
    with pytest.raises(ConfigurationError, match=match):
        await open_store(url)


async def test_schema_is_a_postgresql_option(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="PostgreSQL option"):
        await open_store(f"sqlite:///{tmp_path / 'x.db'}", schema="s")


async def test_a_tenant_id_is_checked(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgumentError, match="tenant_id"):
        await open_store(f"sqlite:///{tmp_path / 'x.db'}", tenant_id="")


async def test_without_migrate_a_missing_sqlite_file_is_refused_not_created(
        tmp_path: Path) -> None:
    """migrate=False (every command that only reads) says the schema is there: a
    path that names no file is a typo, refused before SQLite creates anything."""
    missing = tmp_path / "typo" / "x.db"
    with pytest.raises(SchemaError, match=f"no SQLite database at {missing}"):
        await open_store(f"sqlite:///{missing}", migrate=False)
    assert not (tmp_path / "typo").exists()
    async with open_store(f"sqlite:///{missing}"):  # migrate=True creates it
        pass
    async with open_store(f"sqlite:///{missing}", migrate=False):
        pass


async def test_an_unreachable_postgresql_is_reported(unused_tcp_port: int) -> None:
    with pytest.raises(StoreUnavailableError, match=r"could not be reached|unavailable"):
        await open_store(f"postgresql://postgres@127.0.0.1:{unused_tcp_port}/test",
                         busy_timeout_s=2)


async def test_plain_sqlite_urls_and_memory_databases_work(tmp_path: Path) -> None:
    # sqlite:// is the canonical form; the driver names earlier versions documented
    # (sqlite+aiosqlite://, sqlite+pysqlite://) still open the same database.
    for url in (f"sqlite:///{tmp_path / 'nested' / 'dir' / 'x.db'}",
                f"sqlite+aiosqlite:///{tmp_path / 'old.db'}",
                f"sqlite+pysqlite:///{tmp_path / 'older.db'}",
                "sqlite+aiosqlite:///:memory:", "sqlite://"):
        async with open_store(url) as store:
            ctx = TaskExecutionContext("t")
            ctx.current_invocation_id = "inv"
            ctx.register_peer_sub_task("s", {"peer_agent_name": "p"})
            await store.checkpoint_task(ctx, "agent")
            assert (await store.stats()).total_paused == 1


def _paused(task_id: str, messages: int = 0) -> TaskExecutionContext:
    """A task paused on one peer call, with ``messages`` new events of ~500 B (a
    first checkpoint of 20 writes about 70 KB of SQLite log)."""
    ctx = TaskExecutionContext(task_id)
    ctx.current_invocation_id = "inv"
    for _ in range(messages):
        ctx.append_session_event({"role": "user", "text": "words " * 80})
    ctx.register_peer_sub_task(f"{task_id}/sub", {"peer_agent_name": "peer"})
    return ctx


def _checkpointer(store: SqlStore) -> WalCheckpointer:
    db = store._db
    assert isinstance(db, SqliteDatabase) and db._wal_checkpointer is not None
    return db._wal_checkpointer


async def test_a_steady_stream_of_writes_keeps_the_sqlite_log_short(tmp_path: Path) -> None:
    """SQLite starts its write-ahead log over only when a writer begins with every
    frame copied, which a checkpoint among back-to-back writes never allowed: the log
    grew by every write (234 MB after 3,000 checkpoints). The checkpointer copies
    with the write lock held, so each pass copies every frame."""
    path = tmp_path / "steady.db"
    wal = Path(f"{path}-wal")
    writes = 3000  # ~70 KB of log each: 200 MB if the log is never started over
    async with open_store(f"sqlite:///{path}") as store:
        high = 0
        for n in range(writes):
            await store.checkpoint_task(_paused(f"steady-{n}", messages=20), "agent")
            if n % 100 == 0:
                high = max(high, wal.stat().st_size)
        checkpointer = _checkpointer(store)
        assert checkpointer.copied_all >= 2, (checkpointer.checkpoints, high)
        # At most what is written between two passes and during a pass's flush of
        # the log (on this 2-core machine, at ~115 MB/s of log, up to ~110 MB), with
        # room for a slower pass; 200 MB if the log were never started over.
        assert max(high, wal.stat().st_size) < 150 << 20, high
        assert (await store.stats()).total_paused == writes  # nothing lost on the way


async def test_no_checkpoint_runs_while_another_connection_writes(tmp_path: Path) -> None:
    """SQLite before 3.51.3 may corrupt a database when a checkpoint runs while
    another connection commits the transaction that starts the log over (the
    WAL-reset bug). So no connection of a store checkpoints inside a commit, and the
    checkpointer copies only with the write lock held: while another process's
    connection holds that lock, no checkpoint runs at all; once it lets go, one
    does."""
    path = tmp_path / "locked.db"
    async with open_store(f"sqlite:///{path}") as store:
        checkpointer = _checkpointer(store)
        db = store._db
        assert isinstance(db, SqliteDatabase)
        with db.engine.connect() as conn:  # the store's own connections
            assert conn.exec_driver_sql("PRAGMA wal_autocheckpoint").scalar() == 0
        await store.checkpoint_task(_paused("locked-0"), "agent")
        await eventually(lambda: checkpointer.checkpoints >= 1, what="a first checkpoint")
        writer = sqlite3.connect(path, isolation_level=None)
        try:
            writer.execute("BEGIN IMMEDIATE")  # another writer, holding the lock
            writer.execute("UPDATE agent_paused_tasks SET status = status")
            done, passes = checkpointer.checkpoints, checkpointer.passes
            # A write of this process counted as passing the gate (a real one would
            # wait for the lock): the checkpointer tries a pass each time from now on.
            assert checkpointer.gate.try_enter()
            checkpointer.gate.leave()
            await eventually(lambda: checkpointer.passes >= passes + 4,
                             what="four checkpointer passes")
            assert checkpointer.checkpoints == done  # none while the lock was held
        finally:
            writer.execute("COMMIT")
            writer.close()
        await store.checkpoint_task(_paused("locked-1"), "agent")
        await eventually(lambda: checkpointer.checkpoints > done,
                         what="a checkpoint once the writer let go")
        # The writer's commit and the store's write are both in the file.
        assert (await store.stats()).total_paused == 2


async def test_the_log_is_flushed_before_a_checkpoint_takes_the_lock(tmp_path: Path) -> None:
    """Each pass flushes the log's new frames to disk before it takes the write lock,
    so that the checkpoint's own sync, with writers held back, has little left. The
    flush follows a log deleted and made anew, and a missing log is no error."""
    path = tmp_path / "flushed.db"
    async with open_store(f"sqlite:///{path}") as store:
        checkpointer = _checkpointer(store)
        await store.checkpoint_task(_paused("flushed-0"), "agent")
        await eventually(lambda: checkpointer.checkpoints >= 1, what="a first checkpoint")
        assert checkpointer.wal.syncs >= checkpointer.checkpoints
    log = tmp_path / "other.db-wal"
    flush = WalSync(str(log))
    flush.sync()  # no log yet
    assert flush.syncs == 0
    log.write_bytes(b"frames")
    flush.sync()
    log.unlink()
    log.write_bytes(b"a new log")
    flush.sync()
    assert flush.syncs == 2
    assert os.fstat(flush._fd).st_ino == log.stat().st_ino  # the new log, not the old
    flush.close()


async def test_writes_wait_while_the_checkpointer_holds_the_gate(tmp_path: Path) -> None:
    """The WAL checkpointer closes the write gate for a checkpoint: a write of this
    process waits (on a worker thread, not the event loop) until it opens, a write
    under way is waited for, and reads pass."""
    async with open_store(f"sqlite:///{tmp_path / 'gate.db'}") as store:
        gate = _checkpointer(store).gate
        await store.checkpoint_task(_paused("gate-0"), "agent")
        with gate.closed(timeout_s=1) as idle:
            assert idle
            held = asyncio.ensure_future(store.checkpoint_task(_paused("gate-1"), "agent"))
            await eventually(lambda: gate.held == 1, what="the write held at the gate")
            assert not held.done()
            assert (await store.stats()).total_paused == 1  # a read passes
        await asyncio.wait_for(held, 5)
        assert (await store.stats()).total_paused == 2
        # A write under way (as the inline path counts one) is waited for ...
        assert gate.try_enter()
        leaving = threading.Timer(0.1, gate.leave)
        leaving.start()
        with gate.closed(timeout_s=5) as idle:
            assert idle and not leaving.is_alive()
        # ... up to the timeout: then the checkpoint is skipped rather than wait longer.
        assert gate.try_enter()
        with gate.closed(timeout_s=0.05) as idle:
            assert not idle
        gate.leave()


async def test_a_reader_pinning_the_log_holds_writes_back_no_longer(tmp_path: Path) -> None:
    """A checkpoint cannot copy the frames a reader still reads (a long read in
    another process), so the log is not started over while it reads: writes go on,
    each pass copies what it may, and once the reader is gone a pass copies every
    frame and the log is started over."""
    path = tmp_path / "pinned.db"
    async with open_store(f"sqlite:///{path}") as store:
        checkpointer = _checkpointer(store)
        await store.checkpoint_task(_paused("pinned-0"), "agent")
        await eventually(lambda: checkpointer.checkpoints >= 1, what="a first checkpoint")
        reader = sqlite3.connect(path)
        try:
            reader.execute("BEGIN")
            reader.execute("SELECT count(*) FROM agent_paused_tasks").fetchone()
            copied_all, done = checkpointer.copied_all, checkpointer.checkpoints
            more = iter(range(1, 4000))

            async def checkpointed() -> bool:  # writes go on meanwhile
                await store.checkpoint_task(_paused(f"pinned-{next(more)}", messages=20),
                                            "agent")
                return checkpointer.checkpoints >= done + 3

            await eventually(checkpointed, interval_s=0.01,
                             what="three checkpoints with the reader pinning the log")
            assert checkpointer.copied_all == copied_all
        finally:
            reader.close()

        async def copied() -> bool:  # writing on until a pass copies every frame
            await store.checkpoint_task(_paused(f"pinned-{next(more)}", messages=20), "agent")
            return checkpointer.copied_all > copied_all

        await eventually(copied, timeout_s=30, interval_s=0.01,
                         what="a pass copying every frame once the reader is gone")


@pytest.mark.postgres
@pytest.mark.parametrize("url", ["postgresql+asyncpg://postgres@127.0.0.1:{port}/test",
                                 "{postgres_url}_no_such_database"])
async def test_connection_failures_on_the_pause_boundary_are_store_errors(
        url: str, unused_tcp_port: int, postgres_url: str) -> None:
    """A first checkpoint and a resolution await asyncpg on a pooled connection of
    their own making; failing to connect must still be one of meshpoint's errors
    (unavailable, when nothing listens), never a driver exception."""
    from meshpoint.store import open_database

    target = url.format(port=unused_tcp_port, postgres_url=postgres_url)
    store = SqlStore(open_database(target, busy_timeout_s=2, pool_size=1),
                     tenant_id="default")
    ctx = TaskExecutionContext("t")
    ctx.current_invocation_id = "inv"
    ctx.register_peer_sub_task("t/sub", {"peer_agent_name": "peer"})
    expected = StoreUnavailableError if "{port}" in url else StoreError
    try:
        with pytest.raises(expected, match="checkpointing task 't'"):
            await store.checkpoint_task(ctx, "agent")
        with pytest.raises(expected, match="resolving sub-task 't/sub'"):
            await store.resolve_peer_sub_task("t/sub", "answer")
    finally:
        await store.close()
