"""Secondary indexes lead with a column that lookups by key never constrain.

On a PostgreSQL table that has never been analyzed (a fresh database, or a server
with autovacuum off) the planner guesses that ``tenant_id = $1`` keeps 0.5 % of
the rows. Every secondary index began with ``tenant_id``, so for a statement by
primary key that also tests ``status`` it costed a scan of, say, the deadline
index on the tenant alone exactly like the primary key, and sometimes chose it:
one resolution read 1,398 pages and took 59 ms instead of 0.1 ms. Each index now
leads with the column its own queries test for equality (the agent, or the task),
which a statement by sub-task or task key never does, so only the primary key
matches it. The indexes serve their queries exactly as before (all their leading
columns are equalities).

The paused tasks' two secondary indexes (by agent and status, by lease) become one
partial index of the tasks recovery may resume (``status = 'resuming'``), which is
the one query that used them: listings scan the tenant's tasks either way. A task
that pauses is not in it, so a checkpoint's task row updates no secondary index
(on SQLite, one page fewer of the ~17 each first checkpoint writes). It has no
``tenant_id`` column, which PostgreSQL would scan it by for a statement by key.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-21
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

_OPEN = "status IN ('pending', 'claimed')"
_RESUMING = "status = 'resuming'"


def _recreate(name: str, table: str, columns: list[str], where: str | None = None) -> None:
    op.drop_index(name, table_name=table)
    predicate = None if where is None else sa.text(where)
    op.create_index(name, table, columns, postgresql_where=predicate,
                    sqlite_where=predicate)


def upgrade() -> None:
    op.drop_index("ix_agent_paused_tasks_lease", table_name="agent_paused_tasks")
    op.drop_index("ix_agent_paused_tasks_agent_status", table_name="agent_paused_tasks")
    op.create_index("ix_agent_paused_tasks_resuming", "agent_paused_tasks",
                    ["agent_name", "lease_expires_at"],
                    postgresql_where=sa.text(_RESUMING), sqlite_where=sa.text(_RESUMING))
    _recreate("ix_agent_peer_sub_tasks_task", "agent_peer_sub_tasks",
              ["logical_task_id", "tenant_id", "invocation_id"])
    _recreate("ix_agent_peer_sub_tasks_deadline", "agent_peer_sub_tasks",
              ["agent_name", "tenant_id", "timeout_deadline"], _OPEN)


def downgrade() -> None:
    _recreate("ix_agent_peer_sub_tasks_deadline", "agent_peer_sub_tasks",
              ["tenant_id", "agent_name", "timeout_deadline"], _OPEN)
    _recreate("ix_agent_peer_sub_tasks_task", "agent_peer_sub_tasks",
              ["tenant_id", "logical_task_id", "invocation_id"])
    op.drop_index("ix_agent_paused_tasks_resuming", table_name="agent_paused_tasks")
    op.create_index("ix_agent_paused_tasks_agent_status", "agent_paused_tasks",
                    ["tenant_id", "agent_name", "status", "checkpointed_at"])
    op.create_index("ix_agent_paused_tasks_lease", "agent_paused_tasks",
                    ["tenant_id", "status", "lease_expires_at"])
