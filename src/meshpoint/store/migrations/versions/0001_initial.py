"""The store's tables: paused tasks, peer sub-tasks, parallel invocations, session
events, checkpoint history and the event log (docs/store.md, "Tables").

Revision ID: 0001
Revises:
Create Date: 2026-11-21
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

ID = sa.String(255)
TENANT = sa.String(64)
JSONDoc = sa.JSON(none_as_null=True).with_variant(
    postgresql.JSONB(none_as_null=True), "postgresql"
)


def upgrade() -> None:
    op.create_table(
        "agent_paused_tasks",
        sa.Column("tenant_id", TENANT, nullable=False),
        sa.Column("logical_task_id", ID, nullable=False),
        sa.Column("agent_name", ID, nullable=False),
        sa.Column("status", sa.String(32), nullable=False),
        sa.Column("current_invocation_id", ID),
        sa.Column("context", sa.LargeBinary(), nullable=False),
        sa.Column("context_encoding", sa.String(16), nullable=False),
        sa.Column("context_sha256", sa.String(64), nullable=False),
        sa.Column("session_event_count", sa.Integer(), nullable=False),
        sa.Column("owner", ID),
        sa.Column("lease_expires_at", sa.Float()),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("checkpointed_at", sa.Float(), nullable=False),
        sa.Column("expires_at", sa.Float()),
        sa.PrimaryKeyConstraint("tenant_id", "logical_task_id"),
    )
    op.create_index("ix_agent_paused_tasks_agent_status", "agent_paused_tasks",
                    ["tenant_id", "agent_name", "status", "checkpointed_at"])
    op.create_index("ix_agent_paused_tasks_lease", "agent_paused_tasks",
                    ["tenant_id", "status", "lease_expires_at"])

    op.create_table(
        "agent_peer_sub_tasks",
        sa.Column("tenant_id", TENANT, nullable=False),
        sa.Column("sub_task_id", ID, nullable=False),
        sa.Column("logical_task_id", ID, nullable=False),
        sa.Column("agent_name", ID, nullable=False),
        sa.Column("invocation_id", ID, nullable=False),
        sa.Column("function_call_id", ID, nullable=False),
        sa.Column("peer_agent_name", ID),
        sa.Column("peer_task_id", ID),
        sa.Column("correlation_data", JSONDoc, nullable=False),
        sa.Column("timeout_s", sa.Float(), nullable=False),
        sa.Column("timeout_deadline", sa.Float(), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("resolved_by", sa.String(32)),
        sa.Column("result", JSONDoc),
        sa.Column("resolved_at", sa.Float()),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("tenant_id", "sub_task_id"),
    )
    op.create_index("ix_agent_peer_sub_tasks_task", "agent_peer_sub_tasks",
                    ["tenant_id", "logical_task_id", "invocation_id"])
    op.create_index("ix_agent_peer_sub_tasks_deadline", "agent_peer_sub_tasks",
                    ["tenant_id", "agent_name", "timeout_deadline"],
                    postgresql_where=sa.text("status IN ('pending', 'claimed')"),
                    sqlite_where=sa.text("status IN ('pending', 'claimed')"))

    op.create_table(
        "agent_parallel_invocations",
        sa.Column("tenant_id", TENANT, nullable=False),
        sa.Column("logical_task_id", ID, nullable=False),
        sa.Column("invocation_id", ID, nullable=False),
        sa.Column("total_expected", sa.Integer(), nullable=False),
        sa.Column("completed_count", sa.Integer(), nullable=False),
        sa.Column("call_order", JSONDoc, nullable=False),
        sa.Column("results", JSONDoc, nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("tenant_id", "logical_task_id", "invocation_id"),
    )

    op.create_table(
        "agent_session_events",
        sa.Column("tenant_id", TENANT, nullable=False),
        sa.Column("logical_task_id", ID, nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("data", JSONDoc, nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("tenant_id", "logical_task_id", "seq"),
    )

    op.create_table(
        "agent_checkpoints",
        sa.Column("tenant_id", TENANT, nullable=False),
        sa.Column("checkpoint_id", sa.String(36), nullable=False),
        sa.Column("logical_task_id", ID, nullable=False),
        sa.Column("agent_name", ID, nullable=False),
        sa.Column("agent_type", sa.String(64), nullable=False),
        sa.Column("iteration", sa.Integer(), nullable=False),
        sa.Column("phase", sa.String(32), nullable=False),
        sa.Column("parent_id", sa.String(36)),
        sa.Column("data", JSONDoc, nullable=False),
        sa.Column("hash", sa.String(64), nullable=False),
        sa.Column("signature", sa.Text()),
        sa.Column("retention_policy", sa.String(64)),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("tenant_id", "checkpoint_id"),
    )
    op.create_index("ix_agent_checkpoints_task", "agent_checkpoints",
                    ["tenant_id", "logical_task_id", "created_at"])
    op.create_index("ix_agent_checkpoints_agent", "agent_checkpoints",
                    ["tenant_id", "agent_name", "created_at"])
    if op.get_bind().dialect.name == "postgresql":
        # A GIN index answers JSONB containment queries on the history documents.
        op.create_index("ix_agent_checkpoints_data", "agent_checkpoints", ["data"],
                        postgresql_using="gin")

    op.create_table(
        "agent_events",
        sa.Column("tenant_id", TENANT, nullable=False),
        sa.Column("event_id", sa.String(36), nullable=False),
        sa.Column("agent_name", ID, nullable=False),
        sa.Column("logical_task_id", ID),
        sa.Column("event_type", sa.String(64), nullable=False),
        sa.Column("step_name", ID),
        sa.Column("input_data", JSONDoc),
        sa.Column("output_data", JSONDoc),
        sa.Column("state_snapshot", JSONDoc),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("tenant_id", "event_id"),
    )
    op.create_index("ix_agent_events_task", "agent_events",
                    ["tenant_id", "logical_task_id", "created_at"])
    op.create_index("ix_agent_events_agent", "agent_events",
                    ["tenant_id", "agent_name", "created_at"])


def downgrade() -> None:
    for table in ("agent_events", "agent_checkpoints", "agent_session_events",
                  "agent_parallel_invocations", "agent_peer_sub_tasks", "agent_paused_tasks"):
        op.drop_table(table)
