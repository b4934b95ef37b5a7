"""The tables of the LangGraph saver (issue 16 §3, ``meshpoint.integrations.langgraph``).

``agent_langgraph_checkpoints`` (one row per checkpoint of a thread and namespace),
``agent_langgraph_blobs`` (one row per channel version: a whole value, or the items
a list gained since another version) and ``agent_langgraph_writes`` (the writes of
tasks pending on a checkpoint). Every table is keyed by ``tenant_id`` first and, on
PostgreSQL, gets row-level security enabled and forced with migration 0009's policy.
A unique index on ``(thread, namespace, continues)`` makes a loop step that would
fork a thread's chain fail (see ``integrations/langgraph/tables.py``). Secondary indexes lead
with the thread or the run, never ``tenant_id`` (migration 0004 says why).

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-24
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None

TABLES = ("agent_langgraph_checkpoints", "agent_langgraph_blobs", "agent_langgraph_writes")
# Migration 0009's policy, word for word.
_TENANT = "tenant_id = nullif(current_setting('meshpoint.tenant_id', true), '')"
POLICY = "meshpoint_tenant"

#: JSON kept as written: ``json`` on PostgreSQL, its text on SQLite (0005).
_TEXT_JSON = sa.JSON(none_as_null=True).with_variant(sa.Text(), "sqlite")
#: A document queried by content: JSONB on PostgreSQL, its text on SQLite (0008).
_DOC = sa.JSON(none_as_null=True).with_variant(
    postgresql.JSONB(none_as_null=True), "postgresql").with_variant(sa.Text(), "sqlite")


def _id(name: str, *, primary_key: bool = False, nullable: bool = True) -> sa.Column[str]:
    return sa.Column(name, sa.String(255), primary_key=primary_key,
                     nullable=nullable and not primary_key)


def upgrade() -> None:
    op.create_table(
        "agent_langgraph_checkpoints",
        sa.Column("tenant_id", sa.String(64), primary_key=True),
        _id("thread_id", primary_key=True),
        _id("checkpoint_ns", primary_key=True),
        _id("checkpoint_id", primary_key=True),
        _id("parent_checkpoint_id"),
        _id("continues"),
        _id("run_id"),
        sa.Column("hidden", sa.Boolean, nullable=False),
        sa.Column("blobs", _TEXT_JSON, nullable=False),
        sa.Column("metadata", _DOC, nullable=False),
        sa.Column("data", sa.LargeBinary, nullable=False),
        sa.Column("digest", sa.String(64), nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
    )
    op.create_index("ix_agent_langgraph_checkpoints_continues", "agent_langgraph_checkpoints",
                    ["thread_id", "tenant_id", "checkpoint_ns", "continues"], unique=True)
    op.create_index("ix_agent_langgraph_checkpoints_run", "agent_langgraph_checkpoints",
                    ["run_id", "tenant_id"])
    op.create_table(
        "agent_langgraph_blobs",
        sa.Column("tenant_id", sa.String(64), primary_key=True),
        _id("thread_id", primary_key=True),
        _id("checkpoint_ns", primary_key=True),
        _id("channel", primary_key=True),
        _id("version", primary_key=True),
        _id("base_version"),
        _id("root_version", nullable=False),
        sa.Column("depth", sa.Integer, nullable=False),
        sa.Column("items", sa.Integer, nullable=False),
        sa.Column("data", sa.LargeBinary, nullable=False),
        sa.Column("digest", sa.String(64), nullable=False),
    )
    op.create_index("ix_agent_langgraph_blobs_root", "agent_langgraph_blobs",
                    ["thread_id", "tenant_id", "checkpoint_ns", "channel", "root_version"])
    op.create_table(
        "agent_langgraph_writes",
        sa.Column("tenant_id", sa.String(64), primary_key=True),
        _id("thread_id", primary_key=True),
        _id("checkpoint_ns", primary_key=True),
        _id("checkpoint_id", primary_key=True),
        _id("task_id", primary_key=True),
        sa.Column("idx", sa.Integer, primary_key=True),
        _id("channel", nullable=False),
        sa.Column("task_path", sa.Text, nullable=False),
        sa.Column("data", sa.LargeBinary, nullable=False),
        sa.Column("digest", sa.String(64), nullable=False),
    )
    if op.get_bind().dialect.name == "postgresql":
        for table in TABLES:
            op.execute(f"ALTER TABLE {table} ENABLE ROW LEVEL SECURITY")
            op.execute(f"ALTER TABLE {table} FORCE ROW LEVEL SECURITY")
            op.execute(f"CREATE POLICY {POLICY} ON {table} USING ({_TENANT}) "
                       f"WITH CHECK ({_TENANT})")


def downgrade() -> None:
    for table in reversed(TABLES):
        op.drop_table(table)  # its policy goes with it
