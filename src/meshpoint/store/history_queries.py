"""The named statements of the checkpoint history (``agent_checkpoints`` and
``agent_checkpoint_heads``; see :mod:`meshpoint.history.planning`).

A record is written in the transaction of the checkpoint it records: the portable
body runs :data:`INSERT_RECORD` and then :data:`INSERT_HEAD` (a task's first record)
or :data:`ADVANCE_HEAD`, a compare-and-set on the previous head's hash that refuses
a writer whose idea of the chain is stale. PostgreSQL's one-statement checkpoints
(:mod:`meshpoint.store.postgres`) chain the same inserts as CTEs, built from
:func:`insert_record` and :func:`insert_head`. Every parameter of a record is
prefixed ``p_rec_``; ``p_history`` says whether there is one.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    Boolean,
    Float,
    Integer,
    String,
    and_,
    bindparam,
    delete,
    insert,
    or_,
    select,
    update,
)
from sqlalchemy.sql.dml import Insert

from meshpoint.store.queries import agent, any_agent, limit, now, task, tenant
from meshpoint.store.rows import HeadRow, RecordRow
from meshpoint.store.schema import checkpoint_heads, checkpoints
from meshpoint.store.statement import Statement

C, H = checkpoints, checkpoint_heads

#: Whether the checkpoint writes a record (the store's history is enabled).
has_record = bindparam("p_history", type_=Boolean)
seq = bindparam("p_rec_seq", type_=Integer)
record_hash = bindparam("p_rec_hash", type_=String)
parent_hash = bindparam("p_rec_parent_hash", type_=String)
#: Where the chain the record continues starts (a purge moves it): its head was
#: signed with these, so a head a purge moved meanwhile is not the record's parent.
pruned_through = bindparam("p_rec_pruned_through", type_=Integer)
pruned_hash = bindparam("p_rec_pruned_hash", type_=String)

HEAD_KEY = and_(H.c.tenant_id == tenant, H.c.logical_task_id == task)
#: A task's head is the new record's parent: it ends at the record before, with the
#: hash the record names, and its chain starts where it did when the record was planned.
_PARENT = (H.c.records == seq - 1, H.c.head_hash == parent_hash,
           H.c.pruned_through == pruned_through, H.c.pruned_hash == pruned_hash)
OF_TASK = and_(C.c.logical_task_id == task, C.c.tenant_id == tenant)
RECORD_COLUMNS = (C.c.tenant_id, C.c.checkpoint_id, C.c.logical_task_id, C.c.seq, C.c.data,
                  C.c.hash, C.c.signature, C.c.key_id)
#: A record's columns outside its hash, each a copy of what its document says: a chain
#: walk reads them to check them (:class:`meshpoint.history.verification.RecordColumns`).
COPIED_COLUMNS = (C.c.agent_name, C.c.agent_type, C.c.iteration, C.c.phase, C.c.parent_id,
                  C.c.retention_policy, C.c.created_at)
HEAD_COLUMNS = (H.c.tenant_id, H.c.logical_task_id, H.c.agent_name, H.c.records, H.c.head_id,
                H.c.head_hash, H.c.signature, H.c.key_id, H.c.pruned_through, H.c.pruned_hash,
                H.c.outcome, H.c.retention_policy, H.c.updated_at)

_RECORD: dict[str, Any] = {  # column -> its value
    "tenant_id": tenant, "checkpoint_id": bindparam("p_rec_id", type_=String),
    "logical_task_id": task, "seq": seq, "agent_name": agent,
    "agent_type": bindparam("p_rec_agent_type", type_=String),
    "iteration": bindparam("p_rec_iteration", type_=Integer),
    "phase": bindparam("p_rec_phase", type_=String),
    "parent_id": bindparam("p_rec_parent_id", type_=String),
    "data": bindparam("p_rec_data", type_=C.c.data.type),
    "snapshot": bindparam("p_rec_snapshot", type_=C.c.snapshot.type),
    "snapshot_encoding": bindparam("p_rec_snapshot_encoding", type_=String),
    "hash": record_hash, "signature": bindparam("p_rec_signature", type_=String),
    "key_id": bindparam("p_rec_key_id", type_=String),
    "retention_policy": bindparam("p_rec_retention", type_=String), "created_at": now}
_HEAD: dict[str, Any] = {
    "tenant_id": tenant, "logical_task_id": task, "agent_name": agent, "records": seq,
    "head_id": bindparam("p_rec_id", type_=String), "head_hash": record_hash,
    "signature": bindparam("p_rec_head_signature", type_=String),
    "key_id": bindparam("p_rec_head_key_id", type_=String),
    "outcome": bindparam("p_rec_outcome", type_=String),
    "retention_policy": bindparam("p_rec_retention", type_=String), "updated_at": now}


def insert_record(*where: Any) -> Insert:
    """The record's row, under ``where`` (and only if there is one)."""
    return insert(C).from_select(list(_RECORD),
                                 select(*_RECORD.values()).where(has_record, *where))


def insert_head(*where: Any) -> Insert:
    """A task's head at its first record, under ``where``."""
    return insert(H).from_select(list(_HEAD),
                                 select(*_HEAD.values()).where(has_record, seq == 1, *where))


def head_is_parent() -> Any:
    """The stored head is the record's parent: its first record finds none, a later
    one finds the head it chains to (what ADVANCE_HEAD sets, a snapshot's view)."""
    stored = select(H.c.head_hash).where(HEAD_KEY, *_PARENT)
    return ~has_record | and_(seq == 1, ~select(H.c.records).where(HEAD_KEY).exists()) \
        | stored.exists()


def advance_head() -> Any:
    """The head moved to the new record, if it still is the record's parent. Its
    agent, outcome and policy become the new record's, so that each says what the
    chain's last record says (a chain walk checks that they do)."""
    return (update(H)
            .where(HEAD_KEY, has_record, seq > 1, *_PARENT)
            .values({name: value for name, value in _HEAD.items()
                     if name not in ("tenant_id", "logical_task_id")}))


INSERT_RECORD = Statement(
    "insert_record", "Inserts a history record of the task's checkpoint or end.",
    insert_record())
INSERT_HEAD = Statement(
    "insert_head", "Inserts a task's history head with its first record.", insert_head())
ADVANCE_HEAD = Statement(
    "advance_head", "Moves a task's history head to its new record if the head is the "
    "record's parent (a compare-and-set on the previous hash and where the chain "
    "starts).", advance_head())

# -- reads ----------------------------------------------------------------------------

GET_HEAD = Statement(
    "get_head", "Reads a task's history head.", select(*HEAD_COLUMNS).where(HEAD_KEY),
    row=HeadRow)
GET_RECORD = Statement(
    "get_record", "Reads one history record by its checkpoint id.",
    select(*RECORD_COLUMNS).where(C.c.tenant_id == tenant,
                                  C.c.checkpoint_id == bindparam("p_rec_id", type_=String)),
    row=RecordRow)
GET_RECORD_AT = Statement(
    "get_record_at", "Reads the record at one position of a task's chain.",
    select(*RECORD_COLUMNS).where(OF_TASK, C.c.seq == seq), row=RecordRow)
GET_SNAPSHOT = Statement(
    "get_snapshot", "Reads the snapshot stored with a history record.",
    select(C.c.snapshot, C.c.snapshot_encoding).where(
        C.c.tenant_id == tenant, C.c.checkpoint_id == bindparam("p_rec_id", type_=String)))
GET_CHAIN = Statement(
    "get_chain", "Reads a task's history records, oldest first, with their snapshots and "
    "the columns that copy what their documents say (a chain walk checks them).",
    select(*RECORD_COLUMNS, C.c.snapshot, C.c.snapshot_encoding, *COPIED_COLUMNS)
    .where(OF_TASK).order_by(C.c.seq))
GET_HISTORY = Statement(
    "get_history", "Reads a task's newest history records, newest first.",
    select(*RECORD_COLUMNS).where(OF_TASK).order_by(C.c.seq.desc()).limit(limit),
    row=RecordRow)
GET_BY_AGENT = Statement(
    "get_records_by_agent", "Reads an agent's history records written in a time range, "
    "oldest first.",
    select(*RECORD_COLUMNS).where(
        C.c.agent_name == agent, C.c.tenant_id == tenant,
        C.c.created_at >= bindparam("p_since", type_=Float),
        C.c.created_at < bindparam("p_until", type_=Float))
    .order_by(C.c.created_at, C.c.checkpoint_id).limit(limit), row=RecordRow)
LIST_HEADS = Statement(
    "list_heads", "Lists the tenant's history heads by task id, after a task id (paging).",
    select(*HEAD_COLUMNS).where(H.c.tenant_id == tenant,
                                H.c.logical_task_id > bindparam("p_after", type_=String))
    .order_by(H.c.logical_task_id).limit(limit), row=HeadRow)

LIST_ENDED = Statement(
    "list_ended", "Lists the tenant's ended tasks (a head with an outcome), of agent p_agent "
    "unless p_any_agent, the latest ended first.",
    select(*HEAD_COLUMNS).where(H.c.tenant_id == tenant, H.c.outcome.is_not(None),
                                or_(any_agent, H.c.agent_name == agent))
    .order_by(H.c.updated_at.desc(), H.c.logical_task_id).limit(limit), row=HeadRow)

LIST_HEADLESS = Statement(
    "list_headless", "Lists the tenant's tasks that have history records but no head "
    "(a head deleted: verify reports them), after a task id (paging).",
    select(C.c.logical_task_id).distinct().where(
        C.c.tenant_id == tenant, C.c.logical_task_id > bindparam("p_after", type_=String),
        ~select(H.c.records).where(H.c.tenant_id == C.c.tenant_id,
                                   H.c.logical_task_id == C.c.logical_task_id).exists())
    .order_by(C.c.logical_task_id).limit(limit))

# -- retention ----------------------------------------------------------------------------

DELETE_RECORDS_THROUGH = Statement(
    "delete_records_through", "Deletes a task's records up to and including p_through "
    "(a purge: the oldest records).",
    delete(C).where(OF_TASK, C.c.seq <= bindparam("p_through", type_=Integer)))
PRUNE_HEAD = Statement(
    "prune_head", "Moves where a task's chain starts after a purge, re-signed, if the head "
    "is still as the purge read it.",
    update(H).where(HEAD_KEY, H.c.records == bindparam("p_records", type_=Integer),
                    H.c.pruned_through == bindparam("p_old_through", type_=Integer))
    .values(pruned_through=bindparam("p_through", type_=Integer),
            pruned_hash=bindparam("p_pruned_hash", type_=String),
            signature=bindparam("p_head_signature", type_=String),
            key_id=bindparam("p_head_key_id", type_=String), updated_at=now))
DELETE_HEAD = Statement(
    "delete_head", "Deletes a task's head once a purge removed its every record, if it is "
    "still as the purge read it.",
    delete(H).where(HEAD_KEY, H.c.records == bindparam("p_records", type_=Integer)))
