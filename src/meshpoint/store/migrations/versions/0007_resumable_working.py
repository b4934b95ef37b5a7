"""Mid-turn checkpoints: a task checkpointed ``working`` (its lease held) is found by
recovery when its lease expires, as a ``resuming`` one is.

The partial index recovery reads (``ix_agent_paused_tasks_resuming``) covered the
``resuming`` tasks only; it now covers ``working`` ones too, and recovery's query
repeats its predicate word for word so that both databases use it.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-24
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

_NAME, _TABLE = "ix_agent_paused_tasks_resuming", "agent_paused_tasks"


def _index(predicate: str) -> None:
    op.drop_index(_NAME, table_name=_TABLE)
    op.create_index(_NAME, _TABLE, ["agent_name", "lease_expires_at"],
                    postgresql_where=sa.text(predicate), sqlite_where=sa.text(predicate))


def upgrade() -> None:
    _index("status IN ('resuming', 'working')")


def downgrade() -> None:
    _index("status = 'resuming'")
