"""Migrating an empty database yields exactly the table definitions of schema.py."""

from __future__ import annotations

from typing import Any

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import Connection, inspect

from meshpoint.errors import SchemaError
from meshpoint.store import open_store
from meshpoint.store.engine import (
    current_revision,
    downgrade,
    head_revision,
    migrate,
    open_database,
    parse_url,
)
from meshpoint.store.schema import metadata


def _include(obj: Any, name: str | None, kind: str, reflected: bool, compare_to: Any) -> bool:
    # Alembic's own bookkeeping table is not part of meshpoint's schema.
    return not (kind == "table" and name == "alembic_version")


def _diff(conn: Connection) -> list[Any]:
    context = MigrationContext.configure(conn, opts={
        "compare_type": True, "include_object": _include,
        "compare_server_default": True})
    diff = compare_metadata(context, metadata)
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
        assert tables == {*metadata.tables, "alembic_version"}
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
    db = open_database(parse_url(url), busy_timeout_s=5, schema=options.get("schema"),
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
