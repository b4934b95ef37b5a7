"""The ledger of paused tasks moved to the cloud (``sync --move-paused``; migration
0017), on the store's shared ``metadata``.

``meshpoint_sync_moves`` has one row per task and move, on either side:

* on the local SQLite: ``leaving`` while a move is under way (the task's rows are
  still there, held by the move's lease so no local instance resumes it), then
  ``moved`` once they were released, with where to (``destination``) and when;
* in the cloud: ``arrived``, written in the transaction that copied the task's rows,
  with the local database's sync source id. A rerun of a move that finds it there
  knows the copy committed, and only releases the local rows.

This module imports SQLAlchemy and the store only.
"""

from __future__ import annotations

from sqlalchemy import Column, Float, String, Table, Text

from meshpoint.store.schema import ID, TENANT, metadata

__all__ = ["sync_moves"]

sync_moves = Table(
    "meshpoint_sync_moves",
    metadata,
    Column("tenant_id", TENANT, primary_key=True),
    Column("logical_task_id", ID, primary_key=True),
    Column("move_id", String(36), primary_key=True),  # UUIDv7, made at the move's start
    Column("agent_name", ID, nullable=False),
    Column("state", String(16), nullable=False),  # leaving · moved (local) · arrived (cloud)
    Column("source_id", String(36)),  # the local database's sync source id
    Column("destination", Text),  # the cloud store, as shown (no password)
    Column("started_at", Float, nullable=False),
    Column("finished_at", Float),
)
