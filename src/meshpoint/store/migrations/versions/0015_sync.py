"""Local-to-cloud sync (docs/sync.md): the source id of a local database, the cloud's
cursor per source and source table, and the rows a sync did not apply.

``meshpoint_sync_sources`` names a local SQLite database as a sync source;
``meshpoint_sync_cursors`` holds, in the cloud, the last source row applied per
source and table, written in the transaction of the batch it ends;
``meshpoint_sync_conflicts`` the rows kept aside (conflicts, quarantined chains).
Both databases get all three; on PostgreSQL each gets the row-level security every
tenant table has (0009, 0012).

Revision ID: 0015
Revises: 0014
Create Date: 2026-11-27
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None

POLICY = "meshpoint_tenant"
_BY_ROLE = "tenant_id = (SELECT meshpoint_tenant(current_user))"
#: JSON kept as written: ``json`` on PostgreSQL, its text on SQLite (0005).
_TEXT_JSON = sa.JSON(none_as_null=True).with_variant(sa.Text(), "sqlite")
TABLES = ("meshpoint_sync_sources", "meshpoint_sync_cursors", "meshpoint_sync_conflicts")


def upgrade() -> None:
    op.create_table(
        "meshpoint_sync_sources",
        sa.Column("tenant_id", sa.String(64), nullable=False),
        sa.Column("source_id", sa.String(36), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("tenant_id"),
    )
    op.create_table(
        "meshpoint_sync_cursors",
        sa.Column("tenant_id", sa.String(64), nullable=False),
        sa.Column("source_id", sa.String(36), nullable=False),
        sa.Column("table_name", sa.String(64), nullable=False),
        sa.Column("position", sa.BigInteger(), nullable=False),
        sa.Column("position_key", sa.Text(), nullable=False),
        sa.Column("rows_applied", sa.BigInteger(), nullable=False),
        sa.Column("updated_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("tenant_id", "source_id", "table_name"),
    )
    op.create_table(
        "meshpoint_sync_conflicts",
        sa.Column("tenant_id", sa.String(64), nullable=False),
        sa.Column("source_id", sa.String(36), nullable=False),
        sa.Column("table_name", sa.String(64), nullable=False),
        sa.Column("row_key", sa.String(255), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("local_row", _TEXT_JSON),
        sa.Column("cloud_row", _TEXT_JSON),
        sa.Column("detected_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("tenant_id", "source_id", "table_name", "row_key", "kind"),
    )
    if op.get_bind().dialect.name == "postgresql":
        for table in TABLES:
            op.execute(f"ALTER TABLE {table} ENABLE ROW LEVEL SECURITY")
            op.execute(f"ALTER TABLE {table} FORCE ROW LEVEL SECURITY")
            op.execute(f"CREATE POLICY {POLICY} ON {table} USING ({_BY_ROLE}) "
                       f"WITH CHECK ({_BY_ROLE})")


def downgrade() -> None:
    for table in reversed(TABLES):
        op.drop_table(table)
