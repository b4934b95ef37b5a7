"""The sync carries the LangGraph saver's threads (docs/sync.md).

``meshpoint_sync_thread_changes`` holds, per thread, the sequence number of its last
change; on SQLite, triggers on the saver's three tables (0010) set it, at every
insert, update and delete, to one more than the largest (under SQLite's one write
lock, so its order is commit order). The saver's rows change in place (prune hides a
checkpoint, or deletes it), so a rowid cursor would miss them: the sync follows this
sequence instead. Threads already stored get a change each, so they travel too.
``meshpoint_sync_threads`` holds, in the cloud, the fingerprint of each thread as a
source last left it. Both get the row-level security every tenant table has on
PostgreSQL (0012's policy), where no trigger is made (the cloud is not a source).

Revision ID: 0016
Revises: 0015
Create Date: 2026-11-27
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None

POLICY = "meshpoint_tenant"
_BY_ROLE = "tenant_id = (SELECT meshpoint_tenant(current_user))"
TABLES = ("meshpoint_sync_thread_changes", "meshpoint_sync_threads")
SAVER = ("agent_langgraph_checkpoints", "agent_langgraph_blobs", "agent_langgraph_writes")
CHANGES = "meshpoint_sync_thread_changes"
#: The thread's change: one more than the largest sequence number, now (Unix seconds).
_CHANGE = (f"INSERT INTO {CHANGES} (tenant_id, thread_id, change_seq, changed_at) "
           f"VALUES ({{row}}.tenant_id, {{row}}.thread_id, "
           f"(SELECT coalesce(max(change_seq), 0) + 1 FROM {CHANGES}), "
           f"(julianday('now') - 2440587.5) * 86400.0) "
           f"ON CONFLICT (tenant_id, thread_id) DO UPDATE SET "
           f"change_seq = excluded.change_seq, changed_at = excluded.changed_at;")


def triggers() -> list[tuple[str, str]]:
    """(name, CREATE TRIGGER statement) of each SQLite trigger."""
    made = []
    for table in SAVER:
        for event, row in (("INSERT", "NEW"), ("UPDATE", "NEW"), ("DELETE", "OLD")):
            name = f"meshpoint_sync_{table.removeprefix('agent_langgraph_')}_{event.lower()}"
            made.append((name, f"CREATE TRIGGER {name} AFTER {event} ON {table} "
                               f"FOR EACH ROW BEGIN {_CHANGE.format(row=row)} END"))
    return made


def upgrade() -> None:
    op.create_table(
        CHANGES,
        sa.Column("tenant_id", sa.String(64), nullable=False),
        sa.Column("thread_id", sa.String(255), nullable=False),
        sa.Column("change_seq", sa.BigInteger(), nullable=False),
        sa.Column("changed_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("tenant_id", "thread_id"),
    )
    op.create_index("ix_meshpoint_sync_thread_changes_seq", CHANGES, ["change_seq"])
    op.create_table(
        "meshpoint_sync_threads",
        sa.Column("tenant_id", sa.String(64), nullable=False),
        sa.Column("source_id", sa.String(36), nullable=False),
        sa.Column("thread_id", sa.String(255), nullable=False),
        sa.Column("version", sa.String(255), nullable=False),
        sa.Column("fingerprint", sa.String(64), nullable=False),
        sa.Column("synced_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("tenant_id", "source_id", "thread_id"),
    )
    if op.get_bind().dialect.name == "postgresql":
        for table in TABLES:
            op.execute(f"ALTER TABLE {table} ENABLE ROW LEVEL SECURITY")
            op.execute(f"ALTER TABLE {table} FORCE ROW LEVEL SECURITY")
            op.execute(f"CREATE POLICY {POLICY} ON {table} USING ({_BY_ROLE}) "
                       f"WITH CHECK ({_BY_ROLE})")
        return
    threads = " UNION ".join(f"SELECT tenant_id, thread_id FROM {t}" for t in SAVER)
    op.execute(f"INSERT INTO {CHANGES} (tenant_id, thread_id, change_seq, changed_at) "
               f"SELECT tenant_id, thread_id, row_number() OVER (ORDER BY tenant_id, "
               f"thread_id), (julianday('now') - 2440587.5) * 86400.0 FROM ({threads})")
    for _, statement in triggers():
        op.execute(statement)


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        for name, _ in triggers():
            op.execute(f"DROP TRIGGER IF EXISTS {name}")
    op.drop_table("meshpoint_sync_threads")
    op.drop_index("ix_meshpoint_sync_thread_changes_seq", table_name=CHANGES)
    op.drop_table(CHANGES)
