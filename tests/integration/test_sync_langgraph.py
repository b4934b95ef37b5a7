"""The sync carries the LangGraph saver's threads (docs/sync.md), from a real SQLite
file to a real PostgreSQL written as the runtime role: every row arrives as the file
has it (ciphertext as ciphertext) and a saver in the cloud reads the same state; a
rerun changes nothing; a checkpoint pruned or hidden in place travels; a thread
written on both sides goes to the newest version, the other kept in the conflict log;
a sync without a key to check signatures with is refused unless unsigned."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("langgraph")

from langchain_core.messages import HumanMessage
from sqlalchemy import select

from meshpoint.history.encryption import EncryptionKeys, is_envelope
from meshpoint.history.planning import HistoryOptions
from meshpoint.integrations.langgraph import MeshpointSaver
from meshpoint.integrations.langgraph.tables import graph_blobs, graph_checkpoints, graph_writes
from meshpoint.store import SqlStore, open_database, open_store
from meshpoint.store.engine import downgrade, migrate
from meshpoint.sync.push import Syncer, UnsignedSyncError
from meshpoint.sync.queries import LIST_CONFLICTS
from meshpoint.sync.tables import sync_cursors, sync_sources
from meshpoint.sync.threads import THREADS
from tests.integration import test_sync
from tests.integration.sync_local import TENANT
from tests.integration.test_langgraph_saver import _log_graph, chat_graph, config

pytestmark = [pytest.mark.postgres, pytest.mark.xdist_group("pg_roles")]
cloud = test_sync.cloud
Cloud = test_sync.Cloud
GRAPH = (graph_checkpoints, graph_blobs, graph_writes)


@pytest.fixture
def keys() -> EncryptionKeys:
    return EncryptionKeys.generate(TENANT)


@pytest.fixture
async def local(tmp_path: Path, keys: EncryptionKeys) -> AsyncIterator[SqlStore]:
    """A SQLite file migrated to head, its saver's rows sealed with ``keys``."""
    async with open_store(f"sqlite:///{tmp_path / 'local.db'}", tenant_id=TENANT) as store:
        yield store.with_history(HistoryOptions(encryption=keys))


async def graph_rows(store: SqlStore) -> dict[str, dict[Any, dict[str, Any]]]:
    """The tenant's rows of the saver's tables, by key, column by column."""
    def read(conn: Any) -> dict[str, dict[Any, dict[str, Any]]]:
        out = {}
        for table in GRAPH:
            keys = [c.name for c in table.primary_key.columns]
            rows = conn.execute(select(table).where(table.c.tenant_id == store.tenant_id))
            out[table.name] = {tuple(r._mapping[k] for k in keys): {
                k: bytes(v) if isinstance(v, memoryview) else v
                for k, v in r._asdict().items()} for r in rows}
        return out

    return await store.transaction(read)


def threads_report(reports: list[Any]) -> Any:
    return next(r for r in reports if r.table == THREADS)


async def push(local: SqlStore, target: SqlStore) -> Any:
    _, reports = await Syncer(local, target, batch=2, unsigned=True).run()
    assert all(not (r.conflicts or r.quarantined) for r in reports if r.table != THREADS)
    return threads_report(reports)


async def say(saver: MeshpointSaver, thread: str, *texts: str) -> None:
    graph = chat_graph().compile(checkpointer=saver)
    for said in texts:
        await graph.ainvoke({"messages": [HumanMessage(content=said)]}, config(thread))


async def test_threads_arrive_as_ciphertext_pruned_and_hidden_ones_too_a_rerun_changes_nothing(
        local: SqlStore, cloud: Cloud, keys: EncryptionKeys) -> None:
    saver = MeshpointSaver(local)
    await say(saver, "chat", "secret-alpha", "secret-beta", "secret-gamma")
    log = _log_graph().compile(checkpointer=saver)
    for step in range(11):  # a delta channel: prune keeps ancestors, hidden
        await log.ainvoke({"log": [f"secret-input {step}"]}, config("log"))
    for n in range(3):
        await say(saver, f"more-{n}", f"secret-{n}")
    async with cloud.open() as plain:
        target = plain.with_history(HistoryOptions(encryption=keys))
        report = await push(local, target)
        assert (report.applied, report.identical, report.conflicts) == (5, 0, [])
        before = await graph_rows(local)
        assert await graph_rows(target) == before  # row by row, bytes and digests too
        # Ciphertext travelled as ciphertext: no text in clear, envelopes in the cloud.
        rows = [r for table in before.values() for r in table.values()]
        assert all(b"secret" not in r["data"] for r in rows)
        assert all(is_envelope(r["metadata"]) for r in before[graph_checkpoints.name].values())
        # A saver in the cloud (with the tenant's keys) reads the same state.
        theirs = MeshpointSaver(target)
        for thread in ("chat", "log", "more-2"):
            assert (await chat_graph().compile(checkpointer=theirs).aget_state(
                config(thread))).values == (await chat_graph().compile(
                    checkpointer=saver).aget_state(config(thread))).values

        # A rerun changes nothing, cursors and conflict log included.
        snapshot = await test_sync.everything(target)
        again = await push(local, target)
        assert (again.behind, again.applied, again.identical) == (0, 0, 0)
        assert await test_sync.everything(target) == snapshot

        # Prune in place: ancestors hidden (the delta channel replays them), the rest
        # deleted. Rows changed, none added: the change sequence carries them.
        await saver.aprune(["log"], strategy="keep_latest")
        pruned = await graph_rows(local)
        hidden = [r for r in pruned[graph_checkpoints.name].values() if r["hidden"]]
        assert hidden and len(pruned[graph_checkpoints.name]) < len(
            before[graph_checkpoints.name])
        report = await push(local, target)
        assert (report.behind, report.applied, report.conflicts) == (1, 1, [])
        assert await graph_rows(target) == pruned
        listed = [t async for t in theirs.alist(config("log"))]
        assert len(listed) == 1
        assert (await _log_graph().compile(checkpointer=theirs).aget_state(
            config("log"))).values == (await log.aget_state(config("log"))).values
        _, statuses = await Syncer(local, target).status()
        assert [(s.behind, s.rescan) for s in statuses if s.table == THREADS] == [(0, False)]


async def test_a_thread_written_on_both_sides_goes_to_the_newest_the_other_kept(
        local: SqlStore, cloud: Cloud, keys: EncryptionKeys) -> None:
    saver = MeshpointSaver(local)
    await say(saver, "won-here", "first")
    await say(saver, "won-there", "first")
    await say(saver, "only-here", "first")
    async with cloud.open() as plain:
        target = plain.with_history(HistoryOptions(encryption=keys))
        await push(local, target)
        theirs = MeshpointSaver(target)
        # "won-here": the cloud goes on, then the file, later (a newer checkpoint id).
        await say(theirs, "won-here", "in the cloud")
        cloud_version = await graph_rows(target)
        await say(saver, "won-here", "on the file", "and again")
        # "won-there": the file goes on, then the cloud, later.
        await say(saver, "won-there", "on the file")
        await say(theirs, "won-there", "in the cloud", "and again")
        there = (await graph_rows(target))
        # "only-here": only the file goes on: no conflict, just applied.
        await say(saver, "only-here", "on the file")
        _, reports = await Syncer(local, target, unsigned=True).run()
        report = threads_report(reports)  # applied: the file's won and only-here
        assert report.applied == 2 and len(report.conflicts) == 2, report

        def of(rows: dict[str, Any], thread: str) -> dict[str, Any]:
            return {name: {k: v for k, v in table.items() if k[1] == thread}
                    for name, table in rows.items()}

        mine, now = await graph_rows(local), await graph_rows(target)
        assert of(now, "won-here") == of(mine, "won-here")
        assert of(now, "won-there") == of(there, "won-there") != of(mine, "won-there")
        assert of(now, "only-here") == of(mine, "only-here")
        log = await target.transaction(lambda conn: LIST_CONFLICTS.rows(
            conn, {"p_tenant": TENANT}))
        assert sorted((r.table_name, r.kind, r.row_key.split("@")[0]) for r in log) == [
            (THREADS, "conflict", "won-here"), (THREADS, "conflict", "won-there")]
        by_thread = {r.row_key.split("@")[0]: r for r in log}
        here = by_thread["won-here"]
        assert "the source's" in here.reason and "replaced the cloud's" in here.reason
        # The loser, whole, is in the log: the cloud's checkpoints of "won-here".
        kept = {r["checkpoint_id"] for r in
                here.cloud_row["rows"][graph_checkpoints.name]}
        assert kept == {k[3] for k in cloud_version[graph_checkpoints.name]
                        if k[1] == "won-here"}
        assert "cloud's" in by_thread["won-there"].reason and "stays" in \
            by_thread["won-there"].reason
        assert {r["checkpoint_id"] for r in by_thread["won-there"].local_row["rows"][
            graph_checkpoints.name]} == {k[3] for k in mine[graph_checkpoints.name]
                                        if k[1] == "won-there"}
        # The cloud's winner reads back with the cloud's saver.
        state = await chat_graph().compile(checkpointer=theirs).aget_state(
            config("won-here"))
        assert [m.content for m in state.values["messages"]
                if isinstance(m, HumanMessage)] == ["first", "on the file", "and again"]
        # A rerun changes nothing and logs nothing twice.
        snapshot = await test_sync.everything(target)
        again = threads_report((await Syncer(local, target, unsigned=True).run())[1])
        assert (again.applied, again.conflicts) == (0, [])
        assert await test_sync.everything(target) == snapshot
        # The file goes on with the thread it lost: newer now, it wins, the cloud's
        # version kept in its turn.
        await say(saver, "won-there", "later on the file")
        last = threads_report((await Syncer(local, target, unsigned=True).run())[1])
        assert (last.applied, len(last.conflicts)) == (1, 1)
        assert of(await graph_rows(target), "won-there") == of(
            await graph_rows(local), "won-there")


async def test_a_sync_without_a_key_to_check_signatures_with_is_refused_unless_unsigned(
        local: SqlStore, cloud: Cloud) -> None:
    await say(MeshpointSaver(local), "t", "hello")
    async with cloud.open() as target:
        with pytest.raises(UnsignedSyncError, match="--unsigned"):
            await Syncer(local, target).run()
        # Refused before anything was written, on either side.
        assert await target.transaction(lambda conn: list(conn.execute(
            select(sync_cursors)))) == []
        assert await local.run(lambda conn: list(conn.execute(select(sync_sources)))) == []
        # With a key (a public half is enough) or unsigned, it goes.
        report = await push(local, target)
        assert report.applied == 1


async def test_threads_stored_before_the_change_sequence_existed_travel_too(
        tmp_path: Path, cloud: Cloud) -> None:
    """A file whose threads were written before migration 0016: the migration gives
    each a change, so they travel."""
    url = f"sqlite:///{tmp_path / 'old.db'}"
    async with open_store(url, tenant_id=TENANT) as store:
        await say(MeshpointSaver(store), "old", "before")
        await say(MeshpointSaver(store), "older", "before")
    db = open_database(url, busy_timeout_s=5)
    try:
        await downgrade(db, "0015")  # as it was: the saver's rows, no change sequence
        await migrate(db)
    finally:
        await db.dispose()
    async with open_store(url, tenant_id=TENANT, migrate=False) as store, \
            cloud.open() as target:
        report = await push(store, target)
        assert (report.behind, report.applied) == (2, 2)
        assert await graph_rows(target) == await graph_rows(store)
        # In clear (metadata as JSONB in the cloud), the cloud's copy is still what
        # this file left there: the next step is applied, no conflict.
        await say(MeshpointSaver(store), "old", "after")
        report = await push(store, target)
        assert (report.applied, report.conflicts) == (1, [])
        assert await graph_rows(target) == await graph_rows(store)


async def test_a_thread_whose_bytes_were_changed_in_the_file_is_quarantined_not_applied(
        local: SqlStore, cloud: Cloud, keys: EncryptionKeys) -> None:
    """The fingerprint is made of digests, not bytes: a row changed without its digest
    would otherwise pass as identical, or arrive where the cloud's saver refuses it."""
    saver = MeshpointSaver(local)
    await say(saver, "synced", "first")
    await say(saver, "fine", "first")

    def flip(thread: str) -> Any:
        def change(conn: Any) -> None:
            row = conn.execute(select(graph_blobs).where(
                graph_blobs.c.thread_id == thread).limit(1)).one()
            data = bytes(row.data)
            conn.execute(graph_blobs.update().where(
                graph_blobs.c.thread_id == thread, graph_blobs.c.version == row.version,
                graph_blobs.c.channel == row.channel).values(
                    data=data[:-1] + bytes([data[-1] ^ 1])))
        return change

    async with cloud.open() as plain:
        target = plain.with_history(HistoryOptions(encryption=keys))
        await push(local, target)
        before = await graph_rows(target)
        await local.run(flip("synced"), write=True)  # changed after it travelled
        await say(saver, "new", "never synced")
        await local.run(flip("new"), write=True)  # changed before it ever travelled
        await say(saver, "fine", "second")
        report = await push(local, target)
        assert (report.applied, sorted(k.split("@")[0] for k in report.quarantined)) == (
            1, ["new", "synced"]), report
        after = await graph_rows(target)
        for table in GRAPH:  # the cloud's "synced" as it was, no row of "new"
            assert {k: v for k, v in after[table.name].items() if k[1] == "synced"} == {
                k: v for k, v in before[table.name].items() if k[1] == "synced"}
            assert not [k for k in after[table.name] if k[1] == "new"]
        log = await target.transaction(lambda conn: LIST_CONFLICTS.rows(
            conn, {"p_tenant": TENANT}))
        assert sorted((r.kind, r.row_key.split("@")[0]) for r in log) == [
            ("quarantine", "new"), ("quarantine", "synced")]
        assert all("agent_langgraph_blobs" in r.reason and "digest" in r.reason
                   for r in log)
        again = await push(local, target)  # a rerun logs nothing twice
        assert (again.applied, again.quarantined) == (0, [])


async def test_an_older_copy_of_the_file_put_back_never_rolls_the_cloud_back(
        local: SqlStore, cloud: Cloud, tmp_path: Path) -> None:
    """The cloud holds what this source last left there, but the file's thread is
    older (a backup restored, or old rows written back by someone without a key): the
    cloud's newer version stays, the file's in the conflict log, reported."""
    import sqlite3

    saver = MeshpointSaver(local)
    await say(saver, "t", "first")
    async with cloud.open() as target:
        await push(local, target)
        backup = sqlite3.connect(tmp_path / "old.db")
        with sqlite3.connect(tmp_path / "local.db") as live:
            live.backup(backup)
        backup.close()
        await say(saver, "t", "second")
        assert (await push(local, target)).applied == 1
        newer = await graph_rows(target)
        async with open_store(f"sqlite:///{tmp_path / 'old.db'}", tenant_id=TENANT,
                              migrate=False) as old:
            report = await push(old, target)
            assert (report.applied, len(report.conflicts)) == (0, 1), report
            assert await graph_rows(target) == newer
            log = await target.transaction(lambda conn: LIST_CONFLICTS.rows(
                conn, {"p_tenant": TENANT}))
            assert [r.kind for r in log] == ["conflict"]
            assert "went back" in log[0].reason and "stays" in log[0].reason
            assert log[0].local_row["version"] < log[0].cloud_row["version"]
        # The live file goes on: newer than the cloud's, it is applied, no conflict.
        await say(saver, "t", "third")
        report = await push(local, target)
        assert (report.applied, report.conflicts) == (1, [])
        assert await graph_rows(target) == await graph_rows(local)


async def test_a_checkpoint_dated_ahead_of_the_clock_is_quarantined_not_a_version_that_wins(
        local: SqlStore, cloud: Cloud) -> None:
    """A thread's version is its newest checkpoint id, a time-ordered UUID. One dated
    in the future (forged by someone who can write the file, its digest recomputed as
    the public format says) would win every later comparison: it is quarantined,
    nothing of the thread applied, and so is an id that is not a time-ordered UUID."""
    from meshpoint.integrations.langgraph.rows import digest

    saver = MeshpointSaver(local)
    await say(saver, "t", "first")
    await say(saver, "u", "first")
    async with cloud.open() as target:
        await push(local, target)
        before = await graph_rows(target)

        def forge(thread: str, new_id: str) -> Any:
            def write(conn: Any) -> None:
                row = conn.execute(select(graph_checkpoints).where(
                    graph_checkpoints.c.thread_id == thread).order_by(
                    graph_checkpoints.c.checkpoint_id.desc()).limit(1)).one()._asdict()
                row.update(checkpoint_id=new_id, parent_checkpoint_id=row["checkpoint_id"],
                           continues=row["checkpoint_id"],
                           digest=digest(b"checkpoint", (row["checkpoint_ns"], new_id),
                                         bytes(row["data"])))
                conn.execute(graph_checkpoints.insert().values(**row))
            return write

        await local.run(forge("t", "ffffffff-ffff-6fff-8fff-ffffffffffff"), write=True)
        await local.run(forge("u", "zz-not-a-uuid"), write=True)
        report = await push(local, target)
        assert (report.applied, sorted(k.split("@")[0] for k in report.quarantined)) == (
            0, ["t", "u"]), report
        assert await graph_rows(target) == before
        log = await target.transaction(lambda conn: LIST_CONFLICTS.rows(
            conn, {"p_tenant": TENANT}))
        reasons = {r.row_key.split("@")[0]: r.reason for r in log}
        assert "ahead of this sync's clock" in reasons["t"], reasons
        assert "not a time-ordered UUID" in reasons["u"], reasons
