"""Local-to-cloud sync (docs/sync.md), on a real SQLite file served by the embedded
runtime and a real PostgreSQL written as the runtime role under row-level security:
everything arrives, row by row, and every chain verifies in the cloud with its
signatures; a rerun changes nothing; a conflicting record or event and a tampered or
cut-off chain are kept aside, nothing in the cloud overwritten; a purge on the source
under the cursor is caught up; another tenant's rows stay unreadable."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import delete, insert, select, text, update
from sqlalchemy.engine import make_url

from meshpoint.history.encryption import is_envelope
from meshpoint.history.integrity import SigningKeys
from meshpoint.history.planning import HistoryOptions
from meshpoint.store import SqlStore, open_store
from meshpoint.store.postgres_tenancy import grant_runtime_role
from meshpoint.store.schema import checkpoint_heads, checkpoints, ended_tasks, events, metadata
from meshpoint.sync.push import Syncer
from meshpoint.sync.tables import sync_conflicts, sync_cursors, sync_sources
from tests.conftest import fresh_pg_schema, pg_drop_roles, pg_execute_async
from tests.integration.sync_local import TENANT, local_config, run_tasks, tenant_rows
from tests.integration.test_history_security import _decide, forge

pytestmark = [pytest.mark.postgres, pytest.mark.xdist_group("pg_roles")]


class Cloud:
    """A fresh schema migrated by its owner, a runtime role granted on it."""

    def __init__(self, owner_url: str, schema: str, role: str) -> None:
        self.owner_url, self.schema, self.role = owner_url, schema, role
        self.role_url = make_url(owner_url).set(username=role).render_as_string(
            hide_password=False)

    def open(self, tenant: str = TENANT, history: HistoryOptions | None = None) -> Any:
        """A store of ``tenant`` connected as the runtime role."""
        return open_store(self.role_url, schema=self.schema, tenant_id=tenant,
                          migrate=False, history=history)


@pytest.fixture
async def cloud(postgres_url: str) -> AsyncIterator[Cloud]:
    schema = await fresh_pg_schema()
    role = f"mp_sync_{uuid.uuid4().hex[:10]}"
    owner = await open_store(postgres_url, schema=schema)
    try:
        await grant_runtime_role(owner, role)
        yield Cloud(postgres_url, schema, role)
    finally:
        await owner.close()
        await pg_execute_async(f"DROP SCHEMA {schema} CASCADE")
        await pg_drop_roles(role)


@pytest.fixture(scope="module")
def ran(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A local deployment that ran four tasks (signed, encrypted history; event logs);
    each test copies its database. Returns (its folder, the public key's file)."""
    import asyncio

    where = tmp_path_factory.mktemp("local")
    config, public = local_config(where)
    asyncio.run(run_tasks(config, 4))
    return where, public


@pytest.fixture
async def local(ran: tuple[Path, Path], tmp_path: Path) -> AsyncIterator[SqlStore]:
    source = ran[0] / "local.db"
    copy = tmp_path / "local.db"
    copy.write_bytes(source.read_bytes())
    async with open_store(f"sqlite:///{copy}", tenant_id=TENANT, migrate=False) as store:
        yield store


def options(ran: tuple[Path, Path]) -> HistoryOptions:
    """The cloud's history options: the signing key's public half only."""
    return HistoryOptions(signing=SigningKeys.from_config({"k1": f"file:{ran[1]}"}, None))


async def everything(store: SqlStore) -> dict[str, list[Any]]:
    """Every row of every table the store's tenant sees (its tenant set first), for
    "nothing changed" comparisons."""
    def read(conn: Any) -> dict[str, list[Any]]:
        conn.execute(text("SELECT set_config('meshpoint.tenant_id', :t, true)"),
                     {"t": store.tenant_id})
        return {name: sorted(map(repr, conn.execute(select(table))))
                for name, table in metadata.tables.items()}

    return await store.run(read)


async def test_a_local_store_arrives_row_by_row_and_every_chain_verifies_in_the_cloud(
        local: SqlStore, cloud: Cloud, ran: tuple[Path, Path]) -> None:
    before = await tenant_rows(local)
    assert len(before["agent_checkpoint_heads"]) == 4 and before["agent_events"]
    async with cloud.open(history=options(ran)) as target:
        source, reports = await Syncer(local, target, batch=7).run()
        assert all(not (r.conflicts or r.quarantined or r.kept) for r in reports)
        assert sum(r.applied for r in reports) == sum(
            len(before[t]) for t in ("agent_checkpoints", "agent_events",
                                     "agent_ended_tasks"))
        # Row by row, hashes, signatures and ciphertexts included.
        assert await tenant_rows(target) == before
        for task_id in before["agent_checkpoint_heads"]:
            report = await target.history.verify_task(task_id)
            assert report.ok and report.signatures_checked, report
        # Encrypted fields travelled as ciphertext: no request text rests in clear
        # ("Trip N: ...": with its space, which no base64 or hex of a ciphertext holds).
        records = before["agent_checkpoints"].values()
        assert all("Trip " not in repr(r["data"]) for r in records)
        assert any(_holds_envelope(r["data"]) for r in records)
        logged = (await tenant_rows(target))["agent_events"].values()
        assert all("Trip " not in repr(r) for r in logged)
        assert any(_holds_envelope(r["input_data"]) for r in logged)

        # A rerun changes nothing, cursors and conflict log included.
        snapshot = await everything(target)
        _, again = await Syncer(local, target, batch=7).run()
        assert [(r.applied, r.identical, r.behind) for r in again] == [(0, 0, 0)] * 4
        assert await everything(target) == snapshot
        # The status: each cursor at its table's last row, nothing behind.
        status_source, statuses = await Syncer(local, target).status()
        assert status_source == source
        assert [(s.behind, s.rows_applied) for s in statuses] == [
            (0, len(before[t])) for t in ("agent_checkpoints", "agent_events",
                                          "agent_ended_tasks")] + [(0, 0)]  # no thread


def _holds_envelope(node: Any) -> bool:
    if is_envelope(node):
        return True
    if isinstance(node, dict):
        return any(_holds_envelope(v) for v in node.values())
    if isinstance(node, list):
        return any(_holds_envelope(v) for v in node)
    return False


async def test_a_conflicting_record_and_event_are_logged_with_both_versions_never_applied(
        local: SqlStore, cloud: Cloud, ran: tuple[Path, Path]) -> None:
    before = await tenant_rows(local)
    record = next(r for r in before["agent_checkpoints"].values() if r["seq"] == 1)
    event = next(iter(before["agent_events"].values()))
    async with cloud.open(history=options(ran)) as target:
        # The cloud already holds the record's id and the event's id with other content.
        theirs_record = {**record, "agent_type": "forged", "hash": "0" * 64}
        theirs_event = {**event, "event_type": "forged"}

        def plant(conn: Any) -> None:
            conn.execute(insert(checkpoints).values(theirs_record))
            conn.execute(insert(events).values(theirs_event))

        await target.transaction(plant, write=True)
        _, reports = await Syncer(local, target).run()
        by_table = {r.table: r for r in reports}
        assert by_table["agent_checkpoints"].conflicts == [record["checkpoint_id"]]
        assert by_table["agent_events"].conflicts == [event["event_id"]]
        after = await tenant_rows(target)
        # Nothing overwritten: the cloud's versions stand; the conflicting task's chain
        # was not applied (only the planted record), every other one was.
        assert after["agent_checkpoints"][record["checkpoint_id"]]["agent_type"] == "forged"
        assert after["agent_events"][event["event_id"]]["event_type"] == "forged"
        task = record["logical_task_id"]
        assert task not in after["agent_checkpoint_heads"]
        assert [r for r in after["agent_checkpoints"].values()
                if r["logical_task_id"] == task] == [theirs_record | {"tenant_id": TENANT}]
        assert set(after["agent_checkpoint_heads"]) == set(before["agent_checkpoint_heads"]) - {
            task}
        log = await target.transaction(lambda conn: list(conn.execute(
            select(sync_conflicts).order_by(sync_conflicts.c.table_name))))
        assert [(r.table_name, r.row_key, r.kind) for r in log] == [
            ("agent_checkpoints", record["checkpoint_id"], "conflict"),
            ("agent_events", event["event_id"], "conflict")]
        assert log[0].local_row["hash"] == record["hash"]
        assert log[0].cloud_row["hash"] == "0" * 64
        assert log[1].local_row["event_type"] == event["event_type"]
        assert log[1].cloud_row["event_type"] == "forged"
        # A rerun logs nothing twice.
        _, again = await Syncer(local, target).run()
        assert not any(r.conflicts for r in again)
        assert len(await target.transaction(lambda conn: list(
            conn.execute(select(sync_conflicts))))) == 2


async def test_a_tampered_cut_off_or_forged_local_chain_is_quarantined_nothing_applied(
        local: SqlStore, cloud: Cloud, ran: tuple[Path, Path]) -> None:
    before = await tenant_rows(local)
    tampered, cut, forged, *_ = sorted(before["agent_checkpoint_heads"])
    row = next(r for r in before["agent_checkpoints"].values()
               if r["logical_task_id"] == tampered and r["seq"] == 1)
    data = dict(row["data"])
    data["metadata"] = {**data["metadata"], "agent_type": "tampered"}

    def damage(conn: Any) -> None:
        conn.execute(update(checkpoints).where(
            checkpoints.c.checkpoint_id == row["checkpoint_id"]).values(data=data))
        # ``cut`` loses its last record: its signed head no longer matches.
        last = max(r["seq"] for r in before["agent_checkpoints"].values()
                   if r["logical_task_id"] == cut)
        conn.execute(delete(checkpoints).where(checkpoints.c.logical_task_id == cut,
                                               checkpoints.c.seq == last))

    await local.run(damage, write=True)
    # ``forged``: changed by someone who can write the file but holds no key, its
    # chain recomputed as the public format says and its signatures stripped.
    await forge(local, 1, _decide, task_id=forged)
    async with cloud.open(history=options(ran)) as target:
        _, reports = await Syncer(local, target).run()
        assert sorted(reports[0].quarantined) == sorted([tampered, cut, forged])
        after = await tenant_rows(target)
        for task in (tampered, cut, forged):
            assert task not in after["agent_checkpoint_heads"]
            assert not [r for r in after["agent_checkpoints"].values()
                        if r["logical_task_id"] == task]
        for task in after["agent_checkpoint_heads"]:
            assert (await target.history.verify_task(task)).ok
        log = await target.transaction(lambda conn: list(conn.execute(
            select(sync_conflicts).where(sync_conflicts.c.kind == "quarantine"))))
        reasons = {r.row_key: r.reason for r in log}
        assert "does not hash" in reasons[tampered]
        assert "head" in reasons[cut]
        assert "not signed" in reasons[forged]


async def test_a_purge_under_the_cursor_is_caught_up_not_skipped(
        local: SqlStore, cloud: Cloud, ran: tuple[Path, Path], tmp_path: Path) -> None:
    async with cloud.open(history=options(ran)) as target:
        await Syncer(local, target).run()
        # The source forgets every ended task, so SQLite hands the next ended task the
        # rowids the cursor already passed (rowid = max + 1, of an empty table: 1).
        await local.run(lambda conn: conn.execute(delete(ended_tasks)), write=True)
        url = str(local._db.engine.url.database)  # the test's own file
        await local.close()
        config = tmp_path / "again.yaml"
        config.write_text((ran[0] / "local.yaml").read_text().replace(
            str(ran[0] / "local.db"), url))
        await run_tasks(config, 2, start=100)
        async with open_store(f"sqlite:///{url}", tenant_id=TENANT, migrate=False) as again:
            _, statuses = await Syncer(again, target).status()
            assert statuses[2].rescan and statuses[2].behind == 2
            _, reports = await Syncer(again, target).run()
            assert reports[2].rescanned and reports[2].applied == 2
            now = await tenant_rows(again)
            after = await tenant_rows(target)
        # Every row the source has now is in the cloud; the purged ends stay there.
        for name in ("agent_checkpoints", "agent_checkpoint_heads", "agent_events"):
            assert after[name] == now[name]
        assert set(now["agent_ended_tasks"]) < set(after["agent_ended_tasks"])
        assert len(after["agent_ended_tasks"]) == 6


async def test_another_tenants_rows_are_unreadable_as_the_runtime_role(
        local: SqlStore, cloud: Cloud, ran: tuple[Path, Path]) -> None:
    async with cloud.open(history=options(ran)) as target:
        await Syncer(local, target).run()
    async with cloud.open("globex") as other:
        def peek(conn: Any, tenant: str | None) -> dict[str, int]:
            if tenant is not None:
                conn.execute(text("SELECT set_config('meshpoint.tenant_id', :t, true)"),
                             {"t": tenant})
            return {t.name: len(list(conn.execute(select(t.c.tenant_id))))
                    for t in (checkpoints, checkpoint_heads, events, ended_tasks,
                              sync_cursors, sync_conflicts)}

        seen = await other.run(lambda conn: peek(conn, "globex"))
        assert seen == dict.fromkeys(seen, 0)
        # Naming acme's rows outright as globex finds nothing; no tenant set, neither.
        named = await other.run(lambda conn: (conn.execute(text(
            "SELECT set_config('meshpoint.tenant_id', 'globex', true)")), conn.execute(
            text("SELECT count(*) FROM meshpoint_sync_cursors WHERE tenant_id = 'acme'"))
            .scalar())[1])
        assert named == 0
        assert set((await other.run(lambda conn: peek(conn, None))).values()) == {0}
        # The same role sees acme's cursors as acme: the rows are there.
        assert (await other.run(lambda conn: peek(conn, TENANT)))["meshpoint_sync_cursors"] == 3


async def test_a_dry_run_counts_what_is_behind_and_writes_nothing_on_either_side(
        local: SqlStore, cloud: Cloud, ran: tuple[Path, Path]) -> None:
    before = await tenant_rows(local)
    local_before = await local.run(lambda conn: sorted(map(repr, conn.execute(
        select(sync_sources)))))
    async with cloud.open(history=options(ran)) as target:
        source, reports = await Syncer(local, target).run(dry_run=True)
        assert source is None  # not even the source id was made
        assert [r.behind for r in reports] == [
            len(before[t]) for t in ("agent_checkpoints", "agent_events",
                                     "agent_ended_tasks")] + [0]  # no LangGraph thread
        assert all(r.applied == 0 for r in reports)
        assert all(not rows for rows in (await tenant_rows(target)).values())
        assert await target.transaction(lambda conn: list(conn.execute(
            select(sync_cursors)))) == []
    assert await local.run(lambda conn: sorted(map(repr, conn.execute(
        select(sync_sources))))) == local_before == []


async def test_two_syncs_of_one_file_at_once_apply_each_row_once(
        local: SqlStore, cloud: Cloud, ran: tuple[Path, Path]) -> None:
    """The cursor's lock and check make two passes over one source take turns: each
    row is applied by one of them, the other re-reads after the cursor moved."""
    before = await tenant_rows(local)
    async with cloud.open(history=options(ran)) as one, \
            cloud.open(history=options(ran)) as two:
        results = await asyncio.gather(Syncer(local, one, batch=3).run(),
                                       Syncer(local, two, batch=3).run())
        applied = [sum(r.applied for r in reports) for _, reports in results]
        assert sum(applied) == sum(len(before[t]) for t in (
            "agent_checkpoints", "agent_events", "agent_ended_tasks"))
        assert not any(r.conflicts or r.quarantined for _, reports in results
                       for r in reports)
        assert await tenant_rows(one) == before


async def test_a_record_id_the_cloud_holds_under_another_task_is_a_conflict_the_rest_applied(
        local: SqlStore, cloud: Cloud, ran: tuple[Path, Path]) -> None:
    """The batch's chains are inserted together, their records checked against the
    cloud's of the same tasks first: a record id the cloud holds under another task
    is found only by the insert, which fails; the batch then goes chain by chain,
    the clash is logged as a conflict and every other chain is applied, verified."""
    before = await tenant_rows(local)
    record = next(r for r in before["agent_checkpoints"].values() if r["seq"] == 1)
    theirs = {**record, "logical_task_id": "someone-elses-task", "hash": "0" * 64}
    async with cloud.open(history=options(ran)) as target:
        await target.transaction(lambda conn: conn.execute(insert(checkpoints).values(theirs)),
                                 write=True)
        _, reports = await Syncer(local, target).run()
        assert reports[0].conflicts == [record["checkpoint_id"]]
        assert not reports[0].quarantined
        after = await tenant_rows(target)
        task = record["logical_task_id"]
        assert after["agent_checkpoints"][record["checkpoint_id"]] == theirs | {
            "tenant_id": TENANT}
        assert set(after["agent_checkpoint_heads"]) == set(
            before["agent_checkpoint_heads"]) - {task}
        for other in after["agent_checkpoint_heads"]:
            assert after["agent_checkpoint_heads"][other] == before[
                "agent_checkpoint_heads"][other]
            report = await target.history.verify_task(other)
            assert report.ok and report.signatures_checked, report
        assert reports[0].applied == len([r for r in before["agent_checkpoints"].values()
                                          if r["logical_task_id"] != task])


async def test_a_follower_passes_as_soon_as_the_file_has_new_rows(
        local: SqlStore, cloud: Cloud, ran: tuple[Path, Path]) -> None:
    """Between passes the follower looks at the file (the largest rowid of each table),
    not at the clock alone: with ten minutes between passes, a row written after the
    first pass arrives at once, in a second pass, and the cloud store stays open."""
    from meshpoint.sync.follow import follow

    stop = asyncio.Event()
    passes: list[list[Any]] = []
    opened: list[int] = []

    def open_cloud() -> Any:
        opened.append(1)
        return cloud.open(history=options(ran))

    async def until(check: Any) -> None:
        for _ in range(600):
            if await check():
                return
            await asyncio.sleep(0.1)
        raise AssertionError("the follower did not pass")

    following = asyncio.create_task(follow(local, open_cloud, interval_s=600, stop=stop,
                                           on_pass=lambda _s, r: passes.append(r)))
    try:
        async def first() -> bool:
            return len(passes) == 1

        await until(first)
        event = next(iter((await tenant_rows(local))["agent_events"].values()))
        new = {**event, "event_id": str(uuid.uuid4())}
        await local.run(lambda conn: conn.execute(insert(events).values(new)), write=True)

        async def arrived() -> bool:
            async with cloud.open() as target:
                return new["event_id"] in (await tenant_rows(target))["agent_events"]

        await until(arrived)
    finally:
        stop.set()
        await asyncio.wait_for(following, 60)
    assert len(passes) == 2 and passes[1][1].applied == 1
    assert len(opened) == 1
