"""The checkpoint history becomes a hash chain per task (docs/history.md, "Integrity").

``agent_checkpoints`` existed with no API, so no deployment holds rows in it; it is
recreated with each record's position in its task's chain (``seq``, unique per
task, so two writers cannot both append the same record), the snapshot to restore
from, and the signing key's id. ``agent_checkpoint_heads`` is new: the last record
of each task's chain, signed, which is what detects a cut-off tail. Secondary
indexes lead with the column their own queries test, as migration 0004 explains.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-24
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


#: The record document: JSONB on PostgreSQL (GIN-indexed), its text on SQLite (0005).
_DOC = sa.JSON(none_as_null=True).with_variant(
    postgresql.JSONB(none_as_null=True), "postgresql").with_variant(sa.Text(), "sqlite")


def _checkpoints(new: bool) -> None:
    columns: list[sa.schema.SchemaItem] = [
        sa.Column("tenant_id", sa.String(64), primary_key=True),
        sa.Column("checkpoint_id", sa.String(36), primary_key=True),
        sa.Column("logical_task_id", sa.String(255), nullable=False),
        *([sa.Column("seq", sa.Integer, nullable=False)] if new else []),
        sa.Column("agent_name", sa.String(255), nullable=False),
        sa.Column("agent_type", sa.String(64), nullable=False),
        sa.Column("iteration", sa.Integer, nullable=False),
        sa.Column("phase", sa.String(32), nullable=False),
        sa.Column("parent_id", sa.String(36)),
        sa.Column("data", _DOC, nullable=False),
        *([sa.Column("snapshot", sa.LargeBinary)] if new else []),
        *([sa.Column("snapshot_encoding", sa.String(8))] if new else []),
        sa.Column("hash", sa.String(64), nullable=False),
        sa.Column("signature", sa.Text),
        *([sa.Column("key_id", sa.String(64))] if new else []),
        sa.Column("retention_policy", sa.String(64)),
        sa.Column("created_at", sa.Float, nullable=False),
    ]
    op.create_table("agent_checkpoints", *columns)
    if new:
        op.create_index("ix_agent_checkpoints_task", "agent_checkpoints",
                        ["logical_task_id", "tenant_id", "seq"], unique=True)
        op.create_index("ix_agent_checkpoints_agent", "agent_checkpoints",
                        ["agent_name", "tenant_id", "created_at"])
    else:
        op.create_index("ix_agent_checkpoints_task", "agent_checkpoints",
                        ["tenant_id", "logical_task_id", "created_at"])
        op.create_index("ix_agent_checkpoints_agent", "agent_checkpoints",
                        ["tenant_id", "agent_name", "created_at"])
    if op.get_bind().dialect.name == "postgresql":
        op.create_index("ix_agent_checkpoints_data", "agent_checkpoints", ["data"],
                        postgresql_using="gin")


def upgrade() -> None:
    op.drop_table("agent_checkpoints")
    _checkpoints(new=True)
    op.create_table(
        "agent_checkpoint_heads",
        sa.Column("tenant_id", sa.String(64), primary_key=True),
        sa.Column("logical_task_id", sa.String(255), primary_key=True),
        sa.Column("agent_name", sa.String(255), nullable=False),
        sa.Column("records", sa.Integer, nullable=False),
        sa.Column("head_id", sa.String(36), nullable=False),
        sa.Column("head_hash", sa.String(64), nullable=False),
        sa.Column("signature", sa.Text),
        sa.Column("key_id", sa.String(64)),
        sa.Column("pruned_through", sa.Integer, nullable=False, server_default=sa.text("0")),
        sa.Column("pruned_hash", sa.String(64), nullable=False, server_default=sa.text("''")),
        sa.Column("outcome", sa.String(32)),
        sa.Column("retention_policy", sa.String(64)),
        sa.Column("updated_at", sa.Float, nullable=False),
    )
    op.create_index("ix_agent_checkpoint_heads_agent", "agent_checkpoint_heads",
                    ["agent_name", "tenant_id", "updated_at"])


def downgrade() -> None:
    op.drop_table("agent_checkpoint_heads")
    op.drop_table("agent_checkpoints")
    _checkpoints(new=False)
