"""A ledger of ended tasks: a late copy of a task's request cannot store it again.

An instance acknowledges a task's request right after the task's first checkpoint
(and its peer requests). If it dies in between, the broker delivers the request
again after its ack wait; by then the task may have been answered and its rows
deleted, and the copy started it again from its first turn: its peers were asked
twice (the caller, deduplicated by the broker, still saw one answer). The chaos test
met it. ``cleanup_task`` now records the task here, in its transaction, and a first
checkpoint of a task recorded here writes nothing (``TaskEndedError``). Each agent's
instances forget their ended tasks once no copy of a request can come back.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-24
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "agent_ended_tasks",
        sa.Column("tenant_id", sa.String(64), primary_key=True),
        sa.Column("logical_task_id", sa.String(255), primary_key=True),
        sa.Column("agent_name", sa.String(255), nullable=False),
        sa.Column("ended_at", sa.Float, nullable=False),
    )
    op.create_index("ix_agent_ended_tasks_agent", "agent_ended_tasks",
                    ["agent_name", "tenant_id", "ended_at"])


def downgrade() -> None:
    op.drop_index("ix_agent_ended_tasks_agent", table_name="agent_ended_tasks")
    op.drop_table("agent_ended_tasks")
