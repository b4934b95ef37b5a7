"""A history record costs less to write (issue 15 §6).

Every checkpoint inserts a record of about 2 KB into ``agent_checkpoints``: its
document (JSONB, ~1.9 KB as text) and its snapshot (~1 KB). Timed inside the
server (EXPLAIN ANALYZE of the one-statement first checkpoint, ``bench_history``),
that insert took 0.21 ms of the statement's 0.54, most of what the history adds to a
pause inside the server:

* the GIN index on ``data`` (``jsonb_ops``) stored an entry for every key and every
  value of the document, about a hundred. ``jsonb_path_ops`` stores one hash per
  path to a value, and answers containment of values (``@>``) and the ``@?``/``@@``
  path queries; not key-existence (``?``), which no query of meshpoint's uses, nor
  containment of an empty object or array. With it the insert took 0.13-0.17 ms;
* the row is past PostgreSQL's 2 KB threshold, so both columns were compressed
  with pglz; lz4 (0003's choice for the live rows) stores them in about as much
  space (2,224 bytes a row against 2,112); with both the insert took 0.11 ms.

The index is rebuilt inside the migration's transaction, with both history tables
locked: on a large history, checkpoints and restores wait for it (docs/store.md,
*Migration 0011*). Values already stored keep their compression; servers that
cannot use lz4 keep pglz (with a NOTICE, as in 0003). SQLite has neither.

On both databases the index of the heads by agent (``ix_agent_checkpoint_heads_agent``)
goes: no query reads it, and since it held ``updated_at`` every record moved the
head's entry in it (on SQLite one page of the 25 a first checkpoint writes; on
PostgreSQL it kept the head's update from being HOT).

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-24
"""

from __future__ import annotations

from typing import Any

from alembic import op

from meshpoint.store.migrations.pg_compression import set_compression

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None

COLUMNS = {"agent_checkpoints": ("data", "snapshot")}
INDEX = "ix_agent_checkpoints_data"


def _gin(opclass: str | None) -> None:
    op.drop_index(INDEX, table_name="agent_checkpoints")
    ops: dict[str, Any] = {"postgresql_ops": {"data": opclass}} if opclass else {}
    op.create_index(INDEX, "agent_checkpoints", ["data"], postgresql_using="gin", **ops)


HEADS_INDEX = "ix_agent_checkpoint_heads_agent"


def upgrade() -> None:
    op.drop_index(HEADS_INDEX, table_name="agent_checkpoint_heads")
    if op.get_bind().dialect.name == "postgresql":
        _gin("jsonb_path_ops")
        set_compression(COLUMNS, "lz4")


def downgrade() -> None:
    op.create_index(HEADS_INDEX, "agent_checkpoint_heads",
                    ["agent_name", "tenant_id", "updated_at"])
    if op.get_bind().dialect.name == "postgresql":
        _gin(None)
        set_compression(COLUMNS, "default")
