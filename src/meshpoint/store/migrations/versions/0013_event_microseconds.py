"""An event's time is integer microseconds: one exact value, stored and returned.

``agent_events.created_at`` held float seconds (``time.time()``, to about a tenth of a
microsecond), and the API returned it rounded to the microsecond (a ``datetime``), so
an event's own timestamp was not a bound it fell on: ``since=e.timestamp`` missed
``e``, and ``until=e.timestamp`` included it, in 30-50 % of cases. The column becomes
``created_at_us``, integer microseconds since the epoch, which the API returns
exactly. Existing rows keep the value the API returned for them: their seconds,
rounded to the microsecond. The two indexes that end in the time are rebuilt on the
new column. The downgrade gives back float seconds (``created_at_us / 1e6``).

On PostgreSQL the update rewrites every row of ``agent_events`` inside the
migration's transaction, which holds the table's lock meanwhile (docs/store.md,
*Migration 0013*); on SQLite the table is rebuilt (Alembic's batch mode).

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-26
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None

INDEXES = {"ix_agent_events_task": ("tenant_id", "logical_task_id"),
           "ix_agent_events_agent": ("tenant_id", "agent_name")}


def _swap(old: str, new: str, new_type: sa.types.TypeEngine[Any], fill: str) -> None:
    """Replace the time column ``old`` with ``new``, filled by the SQL ``fill``, and
    rebuild the indexes on it."""
    for name in INDEXES:
        op.drop_index(name, table_name="agent_events")
    with op.batch_alter_table("agent_events") as batch:
        batch.add_column(sa.Column(new, new_type, nullable=True))
    op.execute(f"UPDATE agent_events SET {new} = {fill}")
    with op.batch_alter_table("agent_events") as batch:
        batch.alter_column(new, existing_type=new_type, nullable=False)
        batch.drop_column(old)
    for name, columns in INDEXES.items():
        op.create_index(name, "agent_events", [*columns, new])


def upgrade() -> None:
    # Seconds to the microsecond as the API returned them (Python's fromtimestamp):
    # the whole seconds, and the fraction rounded on its own. Rounding seconds * 1e6
    # would not do: a double near 1.8e15 is a multiple of 0.25, so a fraction of a
    # microsecond from .375 up would round up where Python rounded down. (PostgreSQL
    # casts a float to an integer by rounding, SQLite by truncating: floor() there.)
    whole = ("floor(created_at)" if op.get_bind().dialect.name == "postgresql"
             else "CAST(created_at AS INTEGER)")
    _swap("created_at", "created_at_us", sa.BigInteger(),
          f"CAST({whole} AS BIGINT) * 1000000 "
          f"+ CAST(round((created_at - {whole}) * 1000000) AS BIGINT)")


def downgrade() -> None:
    _swap("created_at_us", "created_at", sa.Float(), "created_at_us / 1000000.0")
