"""Migrating an empty database yields exactly the table definitions of schema.py."""

from __future__ import annotations

import contextlib
import random
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from typing import Any

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import Connection, inspect, select, text

from meshpoint.errors import SchemaError, StoreError
from meshpoint.events.log import EventStore
from meshpoint.history.planning import DISABLED
from meshpoint.store import SqlStore, open_database, open_store
from meshpoint.store.engine import current_revision, downgrade, head_revision, migrate
from meshpoint.store.schema import ended_tasks, metadata, roles_metadata, session_events
from tests.integration.test_store import fan_out


@contextlib.asynccontextmanager
async def ledger_lent(store: SqlStore) -> AsyncIterator[None]:
    """Lend a schema older than 0006 the ledger of ended tasks that a first checkpoint
    of this version consults, for the block: the tests write with this version into
    an older schema, and 0006 adds only that table, so the schema is as it was after."""
    await store.run(lambda conn: ended_tasks.create(conn), write=True)
    try:
        yield
    finally:
        await store.run(lambda conn: ended_tasks.drop(conn), write=True)


def _include(obj: Any, name: str | None, kind: str, reflected: bool, compare_to: Any) -> bool:
    # Alembic's own bookkeeping table is not part of meshpoint's schema.
    return not (kind == "table" and name == "alembic_version")


def _lz4_available(conn: Connection) -> bool:
    """Whether this PostgreSQL server can compress with lz4 (14+, built with it)."""
    try:
        with conn.begin_nested():
            conn.exec_driver_sql("CREATE TEMP TABLE lz4_probe (x text COMPRESSION lz4)")
        return True
    except Exception:
        return False


def _diff(conn: Connection) -> list[Any]:
    context = MigrationContext.configure(conn, opts={
        "compare_type": True, "include_object": _include,
        "compare_server_default": True})
    # PostgreSQL's mapping of roles to tenants (0012) is there and only there.
    target = [metadata, roles_metadata] if conn.dialect.name == "postgresql" else metadata
    diff = compare_metadata(context, target)  # type: ignore[arg-type]
    # Indexes declared for PostgreSQL only (ddl_if) are expected to be absent elsewhere.
    pg_only = {ix.name for table in metadata.tables.values() for ix in table.indexes
               if ix._ddl_if is not None and ix._ddl_if.dialect == "postgresql"}
    if conn.dialect.name != "postgresql":
        diff = [d for d in diff if not (d[0] == "add_index" and d[1].name in pg_only)]
    return diff


async def test_migrations_produce_exactly_the_table_definitions(
        empty_database: tuple[str, dict[str, Any]]) -> None:
    url, options = empty_database
    store = await open_store(url, **options)
    try:
        assert await store.run(_diff) == []
        tables = await store.run(lambda c: set(inspect(c).get_table_names()))
        roles = set(roles_metadata.tables) if await store.run(
            lambda c: c.dialect.name) == "postgresql" else set()
        assert tables == {*metadata.tables, *roles, "alembic_version"}
        for table in metadata.tables.values():
            assert table.c.tenant_id.primary_key, f"{table.name} is not keyed by tenant"
    finally:
        await store.close()


async def test_an_unmigrated_database_is_refused_with_the_fix(
        empty_database: tuple[str, dict[str, Any]]) -> None:
    url, options = empty_database
    with pytest.raises(SchemaError, match="meshpoint migrate"):
        await open_store(url, migrate=False, **options)
    store = await open_store(url, **options)  # migrate=True by default
    await store.close()
    store = await open_store(url, migrate=False, **options)
    await store.close()


async def test_migrating_twice_and_down_and_up_again(
        empty_database: tuple[str, dict[str, Any]]) -> None:
    url, options = empty_database
    db = open_database(url, busy_timeout_s=5, schema=options.get("schema"),
                       pool_size=1)
    try:
        await migrate(db)
        await migrate(db)
        await downgrade(db, "base")
        left = await db.run(lambda c: set(inspect(c).get_table_names()), write=False)
        assert left <= {"alembic_version"}
        assert await current_revision(db) is None
        await migrate(db)
        assert await db.run(_diff, write=False) == []
        assert await current_revision(db) == head_revision()
    finally:
        await db.dispose()


async def test_0002_turns_event_rows_into_batches_and_back(
        empty_database: tuple[str, dict[str, Any]]) -> None:
    """Conversations written one row per event (0001) restore after the upgrade, and
    the downgrade splits batches back into one row per event."""
    url, options = empty_database
    db = open_database(url, busy_timeout_s=5, schema=options.get("schema"),
                       pool_size=1)
    store = SqlStore(db, tenant_id="default", history=DISABLED)  # older than 0008
    try:
        await migrate(db)
        await store.checkpoint_task(fan_out("t1", peers=1), "agent")  # 2 events, one row
        await store.resolve_peer_sub_task("t1/sub-0", "x", lease_owner="i-1")
        ctx = (await store.restore_task("t1", lease_owner="i-1")).context
        for n in range(3):
            ctx.append_session_event({"role": "tool", "n": n})
        ctx.current_invocation_id = "inv-2"
        ctx.register_peer_sub_task("t1/sub-1", {"peer_agent_name": "peer-0"})
        await store.checkpoint_task(ctx, "agent", lease_owner="i-1")  # 3 more, one row
        expected = (await store.restore_task("t1")).context.to_checkpoint_dict()

        def event_rows(conn: Connection) -> list[tuple[int, Any]]:
            return [(row.seq, row.data) for row in conn.execute(
                select(session_events.c.seq, session_events.c.data)
                .order_by(session_events.c.seq))]

        assert [(seq, len(data)) for seq, data in await store.run(event_rows)] == \
            [(0, 2), (2, 3)]
        await downgrade(db, "0001")
        rows = await store.run(event_rows)
        assert [seq for seq, _ in rows] == [0, 1, 2, 3, 4]
        assert [data for _, data in rows] == expected["session_events"]
        await migrate(db)
        assert [(seq, len(data)) for seq, data in await store.run(event_rows)] == \
            [(n, 1) for n in range(5)]
        assert (await store.restore_task("t1")).context.to_checkpoint_dict() == expected
    finally:
        await store.close()



@pytest.mark.postgres
@pytest.mark.parametrize("backend", ["postgres"])  # SQLite does not compress values
async def test_0003_compresses_large_columns_with_lz4_on_postgresql(
        empty_database: tuple[str, dict[str, Any]]) -> None:
    """New values of the large columns are lz4-compressed (where the server can);
    values written before and after the switch restore alike; the downgrade puts
    the server's default back."""
    url, options = empty_database
    db = open_database(url, busy_timeout_s=5, schema=options.get("schema"),
                       pool_size=1)
    store = SqlStore(db, tenant_id="default", history=DISABLED)  # older than 0008

    def compression(conn: Connection) -> dict[str, str]:
        return {row.name: row.method for row in conn.exec_driver_sql(
            "SELECT attrelid::regclass::text || '.' || attname AS name, "
            "attcompression::text AS method FROM pg_attribute "
            "WHERE attrelid = 'agent_session_events'::regclass AND attname = 'data'")}

    def big(task_id: str) -> Any:
        ctx = fan_out(task_id, peers=1)
        for n in range(20):  # ~10 KB of conversation: compressed, not stored inline
            ctx.append_session_event({"role": "user", "n": n, "text": f"words {n} " * 60})
        return ctx

    try:
        await migrate(db, "0002")
        async with ledger_lent(store):
            await store.checkpoint_task(big("before"), "agent")
        await migrate(db)
        expected = "l" if await store.run(_lz4_available, write=True) else ""
        assert await store.run(compression) == {"agent_session_events.data": expected}
        await store.checkpoint_task(big("after"), "agent")
        for task_id in ("before", "after"):
            restored = (await store.restore_task(task_id)).context
            assert restored.session_events[-1]["text"] == "words 19 " * 60
        await downgrade(db, "0002")
        assert await store.run(compression) == {"agent_session_events.data": ""}
        assert len((await store.restore_task("after")).context.session_events) == 22
    finally:
        await store.close()


async def test_0005_keeps_stored_values_readable_both_ways(
        empty_database: tuple[str, dict[str, Any]]) -> None:
    """Values stored before 0005 read back after it: on SQLite a bare number (stored
    as a number under the JSON column's NUMERIC affinity, unreadable until now)
    becomes its text; on PostgreSQL JSONB's form of a value is kept. The downgrade
    gives the columns their old types back, the values with them."""
    url, options = empty_database
    db = open_database(url, busy_timeout_s=5, schema=options.get("schema"), pool_size=1)
    store = SqlStore(db, tenant_id="default", history=DISABLED)  # older than 0008

    def store_raw(value: str) -> Callable[[Connection], None]:
        def body(conn: Connection) -> None:
            conn.exec_driver_sql(
                "UPDATE agent_peer_sub_tasks SET status = 'resolved', resolved_by = 'answer', "
                f"result = {value} WHERE sub_task_id = 't1/sub-0'")
        return body

    try:
        await migrate(db, "0004")
        async with ledger_lent(store):
            await store.checkpoint_task(fan_out("t1", peers=2), "agent")
        sqlite = db.dialect == "sqlite"
        await store.run(store_raw("7.5" if sqlite else "'1e16'::jsonb"), write=True)
        await migrate(db)
        want = 7.5 if sqlite else 10**16  # JSONB had stored 1e16 as an integer
        assert (await store.get_peer_sub_task("t1/sub-0")).result == want
        await store.resolve_peer_sub_task("t1/sub-1", 1.0)
        assert repr((await store.get_peer_sub_task("t1/sub-1")).result) == "1.0"
        await downgrade(db, "0004")

        def kinds(conn: Connection) -> list[str]:
            typeof = "typeof" if sqlite else "pg_typeof"
            return [str(row[0]) for row in conn.exec_driver_sql(
                f"SELECT {typeof}(result) FROM agent_peer_sub_tasks ORDER BY sub_task_id")]

        # As an older version stored them: SQLite's NUMERIC affinity takes the numbers
        # back (1.0 as the integer 1, the defect 0005 mends).
        assert await store.run(kinds) == (["real", "integer"] if sqlite else ["jsonb"] * 2)
    finally:
        await store.close()


@pytest.mark.postgres
@pytest.mark.parametrize("backend", ["postgres"])  # SQLite's TEXT takes any JSON back
async def test_0005_down_refuses_a_value_jsonb_cannot_store_and_says_why(
        empty_database: tuple[str, dict[str, Any]]) -> None:
    url, options = empty_database
    db = open_database(url, busy_timeout_s=5, schema=options.get("schema"), pool_size=1)
    store = SqlStore(db, tenant_id="default", history=DISABLED)  # older than 0008
    try:
        await migrate(db)
        await store.checkpoint_task(fan_out("t1", peers=1), "agent")
        await store.resolve_peer_sub_task("t1/sub-0", {"text": "a\x00b"})
        with pytest.raises(StoreError, match=r"jsonb cannot store"):
            await downgrade(db, "0004")
        assert await current_revision(db) == head_revision()  # nothing changed
        assert (await store.get_peer_sub_task("t1/sub-0")).result == {"text": "a\x00b"}
    finally:
        await store.close()


@pytest.mark.postgres
@pytest.mark.parametrize("backend", ["postgres"])  # SQLite has no GIN index nor compression
async def test_0011_indexes_records_by_path_and_compresses_them_with_lz4(
        empty_database: tuple[str, dict[str, Any]]) -> None:
    """The history's GIN index uses jsonb_path_ops and still answers a containment
    query on the documents, before and after the switch; the record's columns are
    lz4-compressed where the server can; the heads' index by agent is gone; the
    downgrade puts jsonb_ops, the server's default compression and that index back."""
    url, options = empty_database
    db = open_database(url, busy_timeout_s=5, schema=options.get("schema"), pool_size=1)
    store = SqlStore(db, tenant_id="default")

    def layout(conn: Connection) -> tuple[str, set[str]]:
        opclass = conn.exec_driver_sql(
            "SELECT opc.opcname FROM pg_index i JOIN pg_opclass opc "
            "ON opc.oid = i.indclass[0] "
            "WHERE i.indexrelid = 'ix_agent_checkpoints_data'::regclass").scalar()
        methods = {str(row[0]) for row in conn.exec_driver_sql(
            "SELECT attcompression::text FROM pg_attribute WHERE attrelid = "
            "'agent_checkpoints'::regclass AND attname IN ('data', 'snapshot')")}
        return str(opclass), methods

    query = ("SELECT logical_task_id FROM agent_checkpoints WHERE data @> "
             """'{"context_summary": {"external_dependencies": ["peer-1"]}}'::jsonb""")

    def waiting_on_peer_1(conn: Connection) -> list[str]:
        """The records waiting on peer-1, found through the GIN index (a sequential
        scan made too dear for a table of three rows, and the plan checked)."""
        conn.exec_driver_sql("SET LOCAL enable_seqscan = off")
        plan = "\n".join(row[0] for row in conn.exec_driver_sql("EXPLAIN " + query))
        assert "Index Scan on ix_agent_checkpoints_data" in plan, plan
        return sorted(row[0] for row in conn.exec_driver_sql(query))

    def heads_indexes(conn: Connection) -> set[str]:
        return {ix["name"] for ix in inspect(conn).get_indexes("agent_checkpoint_heads")}

    try:
        await migrate(db, "0010")
        assert (await store.run(layout))[0] == "jsonb_ops"
        assert await store.run(heads_indexes) == {"ix_agent_checkpoint_heads_agent"}
        await store.checkpoint_task(fan_out("before", peers=2), "agent")
        await store.checkpoint_task(fan_out("alone", peers=1), "agent")  # peer-0 only
        await migrate(db)
        lz4 = "l" if await store.run(_lz4_available, write=True) else ""
        assert await store.run(layout) == ("jsonb_path_ops", {lz4})
        assert await store.run(heads_indexes) == set()
        await store.checkpoint_task(fan_out("after", peers=2), "agent")
        assert await store.run(waiting_on_peer_1) == ["after", "before"]
        assert (await store.history.get_latest_checkpoint("before")) is not None
        await downgrade(db, "0010")
        assert await store.run(layout) == ("jsonb_ops", {""})
        assert await store.run(heads_indexes) == {"ix_agent_checkpoint_heads_agent"}
        assert await store.run(waiting_on_peer_1) == ["after", "before"]
    finally:
        await store.close()


async def test_0013_keeps_each_events_time_as_the_api_returned_it(
        empty_database: tuple[str, dict[str, Any]]) -> None:
    """Events written as float seconds (before 0013) read back after it at the
    microsecond the API returned for them (their seconds, rounded), now exact; the
    log's indexes are on the new column; the downgrade gives float seconds back."""
    url, options = empty_database
    db = open_database(url, busy_timeout_s=5, schema=options.get("schema"), pool_size=1)
    store = SqlStore(db, tenant_id="default")
    rng = random.Random(13)
    seconds = [1795000000.1234564, 1795000000.1234566, 1795000001.0, 1795000001.9999996,
               *(rng.uniform(1.6e9, 1.9e9) for _ in range(300))]

    def insert(conn: Connection) -> None:
        for n, at in enumerate(seconds):
            conn.execute(text(
                "INSERT INTO agent_events (tenant_id, event_id, agent_name, "
                "logical_task_id, event_type, created_at) VALUES ('default', :id, 'a', "
                "'t', 'step_start', :at)"), {"id": f"e{n}", "at": at})

    def indexes(conn: Connection) -> dict[str, list[str]]:
        return {ix["name"]: list(ix["column_names"])
                for ix in inspect(conn).get_indexes("agent_events")}

    try:
        await migrate(db, "0012")
        await store.run(insert, write=True)
        await migrate(db)
        events = await EventStore(store).get_events(thread_id="t")
        assert {e.event_id: e.timestamp for e in events} == {  # what 0012's API returned
            f"e{n}": datetime.fromtimestamp(at, UTC) for n, at in enumerate(seconds)}
        exact = {e.event_id: e.timestamp_us for e in events}
        assert [exact[f"e{n}"] for n in range(4)] == [
            1795000000123456, 1795000000123457, 1795000001000000, 1795000002000000]
        assert [e.timestamp_us for e in events] == sorted(exact.values())
        assert await store.run(indexes) == {
            "ix_agent_events_task": ["tenant_id", "logical_task_id", "created_at_us"],
            "ix_agent_events_agent": ["tenant_id", "agent_name", "created_at_us"]}
        await downgrade(db, "0012")
        back = await store.run(lambda conn: {row[0]: row[1] for row in conn.execute(text(
            "SELECT event_id, created_at FROM agent_events"))})
        assert {i: datetime.fromtimestamp(at, UTC) for i, at in back.items()} == {
            e.event_id: e.timestamp for e in events}
    finally:
        await store.close()
