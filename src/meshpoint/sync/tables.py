"""The sync's tables, on the store's shared ``metadata`` (migration 0015).

They are registered with the store (:data:`meshpoint.store.integrations.INTEGRATIONS`),
so grants, row-level security, ``meshpoint migrate`` and the migration test cover
them as the store's own. Both databases get all three; each side uses its own:

* ``meshpoint_sync_sources`` (on the local SQLite): the id of this database as a
  sync source, made at its first sync. The cloud keys its cursors by it, so a
  replaced file (whose row ids start again) is a new source, never a stale cursor.
* ``meshpoint_sync_cursors`` (in the cloud): per source and source table, the last
  source row applied, written in the transaction of the batch it ends.
* ``meshpoint_sync_conflicts`` (in the cloud): rows that were not applied, and why:
  a ``conflict`` (the cloud holds another row under the same key: both versions
  kept), a ``quarantine`` (a chain that would not verify) or a ``kept`` (a task's
  end that the cloud holds otherwise: it stays).

Migration 0016 adds the two that carry the LangGraph saver's threads:

* ``meshpoint_sync_thread_changes`` (on the local SQLite): per thread, the sequence
  number of its last change. SQLite triggers on the saver's three tables (migration
  0016) set it to one more than the largest, under the write lock, at every insert,
  update (a checkpoint hidden by prune) and delete: its order is commit order, and a
  thread changed again moves past the cursor. It is the threads' cursor, since their
  rows are not append-only (a rowid cursor would miss a change in place).
* ``meshpoint_sync_threads`` (in the cloud): per source and thread, the fingerprint of
  the thread as this source last left it in the cloud. A cloud thread that no longer
  has it was written by someone else since: written on both sides.

This module imports SQLAlchemy and the store only.
"""

from __future__ import annotations

from sqlalchemy import BigInteger, Column, Float, Index, String, Table, Text

from meshpoint.store.schema import ID, TENANT, JSONText, metadata

__all__ = ["sync_conflicts", "sync_cursors", "sync_sources", "sync_thread_changes",
           "sync_threads"]

sync_sources = Table(
    "meshpoint_sync_sources",
    metadata,
    Column("tenant_id", TENANT, primary_key=True),
    Column("source_id", String(36), nullable=False),  # UUIDv7, made at the first sync
    Column("created_at", Float, nullable=False),
)

sync_cursors = Table(
    "meshpoint_sync_cursors",
    metadata,
    Column("tenant_id", TENANT, primary_key=True),
    Column("source_id", String(36), primary_key=True),
    Column("table_name", String(64), primary_key=True),
    # The source row last applied: its SQLite rowid (commit order: see
    # meshpoint.sync.sources) and its primary key, to notice that a purge removed it.
    Column("position", BigInteger, nullable=False),
    Column("position_key", Text, nullable=False),
    Column("rows_applied", BigInteger, nullable=False),
    Column("updated_at", Float, nullable=False),
)

sync_conflicts = Table(
    "meshpoint_sync_conflicts",
    metadata,
    Column("tenant_id", TENANT, primary_key=True),
    Column("source_id", String(36), primary_key=True),
    Column("table_name", String(64), primary_key=True),
    Column("row_key", ID, primary_key=True),  # the row's key; a task's, for a chain
    Column("kind", String(16), primary_key=True),  # conflict · quarantine · kept
    Column("reason", Text, nullable=False),
    Column("local_row", JSONText),  # the source's version, as JSON (bytes as base64)
    Column("cloud_row", JSONText),  # the cloud's version, if it has one
    Column("detected_at", Float, nullable=False),
)

sync_thread_changes = Table(
    "meshpoint_sync_thread_changes",
    metadata,
    Column("tenant_id", TENANT, primary_key=True),
    Column("thread_id", ID, primary_key=True),
    # One more than the largest when the thread last changed (the triggers of 0016).
    Column("change_seq", BigInteger, nullable=False),
    Column("changed_at", Float, nullable=False),
    Index("ix_meshpoint_sync_thread_changes_seq", "change_seq"),
)

sync_threads = Table(
    "meshpoint_sync_threads",
    metadata,
    Column("tenant_id", TENANT, primary_key=True),
    Column("source_id", String(36), primary_key=True),
    Column("thread_id", ID, primary_key=True),
    Column("version", ID, nullable=False),  # the thread's newest checkpoint id
    Column("fingerprint", String(64), nullable=False),  # of its rows (sync.threads)
    Column("synced_at", Float, nullable=False),
)
