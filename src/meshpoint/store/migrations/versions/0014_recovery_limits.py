"""Recovery limits and each agent's circuit breaker (docs/runtime.md, "Recovery
limits, the circuit breaker and alerts").

``agent_paused_tasks.recoveries`` counts the take-overs of a task in a row (recovery
took its lease after its holder died; a checkpoint of progress resets it), so that
past ``max_recoveries`` the task is blocked instead of retried forever. The new table
``agent_breakers`` holds each agent's circuit breaker, shared by all its instances;
on PostgreSQL it gets the row-level security every tenant table has (0009, 0012).

Revision ID: 0014
Revises: 0013
Create Date: 2026-11-26
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None

POLICY = "meshpoint_tenant"
_BY_ROLE = "tenant_id = (SELECT meshpoint_tenant(current_user))"


def upgrade() -> None:
    with op.batch_alter_table("agent_paused_tasks") as batch:
        batch.add_column(sa.Column("recoveries", sa.Integer(), nullable=False,
                                   server_default=sa.text("0")))
    op.create_table(
        "agent_breakers",
        sa.Column("tenant_id", sa.String(64), nullable=False),
        sa.Column("agent_name", sa.String(255), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("failures", sa.Integer(), nullable=False),
        sa.Column("window_started_at", sa.Float()),
        sa.Column("opened_until", sa.Float()),
        sa.Column("trial_owner", sa.String(255)),
        sa.Column("trial_until", sa.Float()),
        sa.Column("updated_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("tenant_id", "agent_name"),
    )
    if op.get_bind().dialect.name == "postgresql":
        op.execute("ALTER TABLE agent_breakers ENABLE ROW LEVEL SECURITY")
        op.execute("ALTER TABLE agent_breakers FORCE ROW LEVEL SECURITY")
        op.execute(f"CREATE POLICY {POLICY} ON agent_breakers USING ({_BY_ROLE}) "
                   f"WITH CHECK ({_BY_ROLE})")


def downgrade() -> None:
    op.drop_table("agent_breakers")
    with op.batch_alter_table("agent_paused_tasks") as batch:
        batch.drop_column("recoveries")
