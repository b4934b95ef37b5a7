"""PostgreSQL: compress the large JSON and context columns with lz4 instead of pglz.

PostgreSQL compresses any value past about 2 KB before storing it, with pglz by
default. A first checkpoint's conversation (20 messages of ~500 B) spent 0.3 ms
of its 0.6 ms of statement time in pglz; lz4 (PostgreSQL 14+) compresses it
about three times faster, storing ~5.7 KB instead of ~3.2 KB. Values already
stored keep their compression; new ones use lz4. Servers older than 14, or built
without lz4, keep pglz (the migration says so with a NOTICE). SQLite stores
these columns uncompressed either way: nothing to do there.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-21
"""

from __future__ import annotations

from meshpoint.store.migrations.pg_compression import set_compression

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

#: The columns a checkpoint or a resolution writes values of kilobytes into.
COLUMNS = {
    "agent_session_events": ("data",),
    "agent_paused_tasks": ("context",),
    "agent_peer_sub_tasks": ("correlation_data", "result"),
    "agent_parallel_invocations": ("results",),
}


def upgrade() -> None:
    set_compression(COLUMNS, "lz4")


def downgrade() -> None:
    set_compression(COLUMNS, "default")  # the server's default_toast_compression, as before
