"""Paused tasks moved to the cloud (docs/sync.md, *Moving a paused task*): the
ledger ``meshpoint_sync_moves``, on both databases, with the row-level security
every tenant table has on PostgreSQL (0009, 0012).

Revision ID: 0017
Revises: 0016
Create Date: 2026-11-27
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None

POLICY = "meshpoint_tenant"
_BY_ROLE = "tenant_id = (SELECT meshpoint_tenant(current_user))"
TABLE = "meshpoint_sync_moves"


def upgrade() -> None:
    op.create_table(
        TABLE,
        sa.Column("tenant_id", sa.String(64), nullable=False),
        sa.Column("logical_task_id", sa.String(255), nullable=False),
        sa.Column("move_id", sa.String(36), nullable=False),
        sa.Column("agent_name", sa.String(255), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("source_id", sa.String(36)),
        sa.Column("destination", sa.Text()),
        sa.Column("started_at", sa.Float(), nullable=False),
        sa.Column("finished_at", sa.Float()),
        sa.PrimaryKeyConstraint("tenant_id", "logical_task_id", "move_id"),
    )
    if op.get_bind().dialect.name == "postgresql":
        op.execute(f"ALTER TABLE {TABLE} ENABLE ROW LEVEL SECURITY")
        op.execute(f"ALTER TABLE {TABLE} FORCE ROW LEVEL SECURITY")
        op.execute(f"CREATE POLICY {POLICY} ON {TABLE} USING ({_BY_ROLE}) "
                   f"WITH CHECK ({_BY_ROLE})")


def downgrade() -> None:
    op.drop_table(TABLE)
