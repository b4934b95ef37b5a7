"""The LangGraph saver's tables, on the store's shared ``metadata``.

They are registered with the store (:data:`meshpoint.store.integrations.INTEGRATIONS`),
which loads this module whenever it loads :mod:`meshpoint.store.schema`: the database
grants, row-level security, ``meshpoint migrate`` and the migration test see every
table of ``metadata``, these included. They are created by the store's migration chain
(``store/migrations/versions/0010_langgraph_saver.py``). This module and
:mod:`~meshpoint.integrations.langgraph.queries` import SQLAlchemy and the store only,
never LangGraph, so the store works, and ``make sql`` renders, without it installed.
"""

from __future__ import annotations

from sqlalchemy import Boolean, Column, Float, Index, Integer, LargeBinary, String, Table, Text

from meshpoint.store.schema import ID, TENANT, JSONDoc, JSONText, metadata

__all__ = ["LG_BLOB", "LG_CHECKPOINT", "LG_METADATA", "LG_WRITE", "graph_blobs",
           "graph_checkpoints", "graph_writes"]

#: LangGraph's checkpoints (migration
#: 0010): one row per checkpoint of a thread and namespace. The row holds the
#: checkpoint without its channel values, and its metadata, as written (``data``,
#: verified against ``digest`` before it is read); ``metadata`` repeats the metadata
#: as JSON for ``list(filter=...)`` only, and ``blobs`` names the version of each
#: channel that has a value, which ``agent_langgraph_blobs`` holds.
graph_checkpoints = Table(
    "agent_langgraph_checkpoints",
    metadata,
    Column("tenant_id", TENANT, primary_key=True),
    Column("thread_id", ID, primary_key=True),
    Column("checkpoint_ns", ID, primary_key=True),  # "" for the root graph
    Column("checkpoint_id", ID, primary_key=True),  # sorts by time (UUIDv6)
    Column("parent_checkpoint_id", ID),
    # The parent a loop step continues; NULL for an input, a fork, an update and a
    # root. Unique (the index below): a checkpoint is continued by one loop step, so
    # a superseded writer's step is refused instead of forking the chain.
    Column("continues", ID),
    Column("run_id", ID),  # the metadata's run_id, for delete_for_runs
    # Kept by prune only because a delta channel of a kept checkpoint replays its
    # writes: never listed nor read, only walked by get_delta_channel_history.
    Column("hidden", Boolean, nullable=False),
    Column("blobs", JSONText, nullable=False),  # {channel: version} of stored values
    Column("metadata", JSONDoc, nullable=False),
    Column("data", LargeBinary, nullable=False),
    Column("digest", String(64), nullable=False),
    Column("created_at", Float, nullable=False),
    Index("ix_agent_langgraph_checkpoints_continues", "thread_id", "tenant_id",
          "checkpoint_ns", "continues", unique=True),
    Index("ix_agent_langgraph_checkpoints_run", "run_id", "tenant_id"),
)

#: The values of LangGraph channels, one row per channel version (shared by every
#: checkpoint at that version). A list that grew since a version this process wrote
#: or read is stored as the items it gained (``base_version`` names that version); a
#: chain of such deltas starts at a whole value (``root_version``) and is cut by a
#: whole value again as it grows (see the saver), so a value is read in one range
#: scan of its chain.
graph_blobs = Table(
    "agent_langgraph_blobs",
    metadata,
    Column("tenant_id", TENANT, primary_key=True),
    Column("thread_id", ID, primary_key=True),
    Column("checkpoint_ns", ID, primary_key=True),
    Column("channel", ID, primary_key=True),
    Column("version", ID, primary_key=True),
    Column("base_version", ID),  # NULL: a whole value; else the version it extends
    Column("root_version", ID, nullable=False),  # the whole value its chain starts at
    Column("depth", Integer, nullable=False),  # deltas since the root (0 for a root)
    Column("items", Integer, nullable=False),  # list items in this row (0 if no list)
    Column("data", LargeBinary, nullable=False),
    Column("digest", String(64), nullable=False),
    Index("ix_agent_langgraph_blobs_root", "thread_id", "tenant_id", "checkpoint_ns",
          "channel", "root_version"),
)

#: Writes of LangGraph tasks (``put_writes``), pending on the checkpoint they follow.
graph_writes = Table(
    "agent_langgraph_writes",
    metadata,
    Column("tenant_id", TENANT, primary_key=True),
    Column("thread_id", ID, primary_key=True),
    Column("checkpoint_ns", ID, primary_key=True),
    Column("checkpoint_id", ID, primary_key=True),
    Column("task_id", ID, primary_key=True),
    Column("idx", Integer, primary_key=True),
    Column("channel", ID, nullable=False),
    Column("task_path", Text, nullable=False),
    Column("data", LargeBinary, nullable=False),
    Column("digest", String(64), nullable=False),
)

# The sealed columns of the ``langgraph`` encryption family (:mod:`meshpoint.store.sealing`),
# as a ciphertext's associated data names them.
LG_CHECKPOINT = "agent_langgraph_checkpoints.data"
LG_METADATA = "agent_langgraph_checkpoints.metadata"
LG_BLOB = "agent_langgraph_blobs.data"
LG_WRITE = "agent_langgraph_writes.data"
