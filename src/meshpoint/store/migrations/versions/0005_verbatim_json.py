"""The caller's JSON is stored as written: TEXT on SQLite, ``json`` on PostgreSQL.

SQLite: a column declared ``JSON`` has NUMERIC affinity, which stores the text of a
bare number as a number. A sub-task result of ``1``, ``2.5``, ``0`` or ``-3`` then
read back as something that is not JSON text (the store refused it as corrupt, and
on the two-step path the claim committed while every record of the result
failed); ``1.0`` read back as the integer 1, and an integer past 63 bits lost
digits. Every JSON column becomes TEXT (``schema.SqliteJSON``). SQLite cannot
change a column's type in place, so each table is rebuilt and its rows copied: a
number stored by an earlier version becomes its text (a float with more than 15
significant digits is rounded to 15 on the way, as SQLite writes it).

PostgreSQL: JSONB normalises what it stores. ``1e16`` came back as an integer,
``1e300`` as 301 digits that no 64-bit JSON reader (orjson among them) takes back,
so such a float anywhere in a result, an event or correlation data made its task
unrestorable; and object keys came back reordered. The live tables' columns of
the caller's JSON become ``json``, which keeps the text; values already stored keep
JSONB's form of them. ``agent_checkpoints.data`` stays JSONB, for its GIN index.
The type change resets a column's compression, so the columns of 0003 get lz4 again.
Going down, a value holding ``\u0000`` (which json stores and jsonb cannot) stops the
downgrade with an error that says so; nothing is changed then.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-23
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from alembic import op

from meshpoint.store.migrations.pg_compression import set_compression

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

#: SQLite: table -> its JSON columns, each with whether it may be NULL.
SQLITE_COLUMNS = {
    "agent_peer_sub_tasks": (("correlation_data", False), ("result", True)),
    "agent_parallel_invocations": (("call_order", False), ("results", False)),
    "agent_session_events": (("data", False),),
    "agent_checkpoints": (("data", False),),
    "agent_events": (("input_data", True), ("output_data", True), ("state_snapshot", True)),
}
#: PostgreSQL: the live tables' columns of the caller's JSON.
POSTGRES_COLUMNS = {
    "agent_peer_sub_tasks": ("correlation_data", "result"),
    "agent_parallel_invocations": ("call_order", "results"),
    "agent_session_events": ("data",),
}
#: The columns 0003 compresses with lz4 among those (the type change resets them).
COMPRESSED = {
    "agent_peer_sub_tasks": ("correlation_data", "result"),
    "agent_parallel_invocations": ("results",),
    "agent_session_events": ("data",),
}
#: The one partial index on the SQLite tables rebuilt, dropped and created again
#: around the rebuild so that its predicate is kept word for word.
_DEADLINE_INDEX = ("ix_agent_peer_sub_tasks_deadline", "agent_peer_sub_tasks",
                   ["agent_name", "tenant_id", "timeout_deadline"],
                   "status IN ('pending', 'claimed')")


def _sqlite(new: Any, old: Any) -> None:
    name, table, columns, predicate = _DEADLINE_INDEX
    op.drop_index(name, table_name=table)
    for table_name, json_columns in SQLITE_COLUMNS.items():
        with op.batch_alter_table(table_name, recreate="always") as batch:
            for column, nullable in json_columns:
                batch.alter_column(column, type_=new, existing_type=old,
                                   existing_nullable=nullable)
    op.create_index(name, table, columns, sqlite_where=sa.text(predicate))


def _postgres(new: str) -> None:
    for table, columns in POSTGRES_COLUMNS.items():
        alter = f"ALTER TABLE {table} " + ", ".join(
            f"ALTER COLUMN {column} TYPE {new} USING {column}::{new}" for column in columns)
        # Down to jsonb, a value holding \u0000 (json keeps it) cannot be converted:
        # say so rather than leave PostgreSQL's bare escape error (22P05).
        op.execute(f"""
            DO $$
            BEGIN
                EXECUTE '{alter}';
            EXCEPTION WHEN untranslatable_character THEN
                RAISE EXCEPTION 'meshpoint: cannot change % to %: a stored value holds '
                                '\\u0000, which jsonb cannot store; end or change the tasks '
                                'that hold it, then migrate down again', '{table}', '{new}';
            END
            $$""")
    set_compression(COMPRESSED, "lz4")


def upgrade() -> None:
    if op.get_bind().dialect.name == "sqlite":
        _sqlite(sa.Text(), sa.JSON())
    else:
        _postgres("json")


def downgrade() -> None:
    if op.get_bind().dialect.name == "sqlite":
        _sqlite(sa.JSON(), sa.Text())
    else:
        _postgres("jsonb")
