"""Opening a store: URLs, drivers and unreachable databases give clear errors."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import threading
from collections.abc import Iterator
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
from meshpoint.store.sqlite import WAL_RESTART_FRAMES, SqliteDatabase, WalCheckpointer
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
    frame copied, which back-to-back writes never allow: without the checkpointer's
    RESTART the log grew by every write (234 MB after 3,000 checkpoints)."""
    path = tmp_path / "steady.db"
    wal = Path(f"{path}-wal")
    writes = 3000  # ~70 KB of log each: 200 MB if the log is never started over
    async with open_store(f"sqlite:///{path}") as store:
        for n in range(writes):
            await store.checkpoint_task(_paused(f"steady-{n}", messages=20), "agent")
        size = wal.stat().st_size
        assert _checkpointer(store).restarts >= 2, size
        # At most the threshold plus what is written during one checkpointer pass (on
        # this 2-core machine about 20 MB), with room for a slower or faster one.
        assert size < 6 * WAL_RESTART_FRAMES * 4096, size
        assert (await store.stats()).total_paused == writes  # nothing lost on the way


async def test_writes_wait_while_the_checkpointer_holds_the_gate(tmp_path: Path) -> None:
    """The WAL checkpointer closes the write gate for a RESTART: a write of this
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
        # ... up to the timeout: then the RESTART is skipped rather than wait longer.
        assert gate.try_enter()
        with gate.closed(timeout_s=0.05) as idle:
            assert not idle
        gate.leave()


async def test_a_reader_pinning_the_log_does_not_hold_writes_back(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A RESTART waits for every reader still using the log. While one pins it (a long
    read in another process), the checkpointer must leave the write gate open
    rather than hold this process's writes back at every pass; once the reader is
    gone, the log is started over again."""
    path = tmp_path / "pinned.db"
    async with open_store(f"sqlite:///{path}") as store:
        checkpointer = _checkpointer(store)
        closings = 0
        real_closed = checkpointer.gate.closed

        @contextlib.contextmanager
        def counted(timeout_s: float) -> Iterator[bool]:
            nonlocal closings
            closings += 1
            with real_closed(timeout_s) as idle:
                yield idle

        monkeypatch.setattr(checkpointer.gate, "closed", counted)
        await store.checkpoint_task(_paused("pinned-0"), "agent")
        reader = sqlite3.connect(path)
        try:
            reader.execute("BEGIN")
            reader.execute("SELECT count(*) FROM agent_paused_tasks").fetchone()
            for n in range(1, 400):  # ~28 MB of log, past the 16 MB threshold
                await store.checkpoint_task(_paused(f"pinned-{n}", messages=20), "agent")
            passes = checkpointer.passes
            await eventually(lambda: checkpointer.passes >= passes + 3,
                             what="three checkpointer passes with the log past it")
            assert closings == 0 and checkpointer.restarts == 0
        finally:
            reader.close()
        more = iter(range(400, 2000))

        async def restarted() -> bool:  # writing on until the log is started over
            await store.checkpoint_task(_paused(f"pinned-{next(more)}", messages=20), "agent")
            return checkpointer.restarts >= 1

        await eventually(restarted, timeout_s=30, interval_s=0.001,
                         what="a RESTART once the reader is gone")
        assert closings >= 1


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
