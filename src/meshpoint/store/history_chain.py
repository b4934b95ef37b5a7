"""The checkpoint history's chain in the store: the functions a transaction calls to
write a record, read a task's chain and head, and append a task's last record.

They run inside the caller's transaction (a checkpoint's, a cleanup's, a restore's):
:class:`~meshpoint.store.sqlstore.SqlStore`, :class:`~meshpoint.store.history_store.HistoryStore`
and :class:`~meshpoint.store.history_restore.VerifiedRestore` share them. The statements
are :mod:`meshpoint.store.history_queries`'; the record is planned by
:mod:`meshpoint.history.planning`.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

from sqlalchemy import Connection, exc

from meshpoint.errors import CheckpointConflictError
from meshpoint.history.costs import spent, spent_by_source
from meshpoint.history.planning import (
    HistoryHead,
    HistoryOptions,
    PlannedRecord,
    plan_record,
    sound_annotations,
)
from meshpoint.history.verification import (
    HeadColumns,
    RecordColumns,
    StoredHead,
    StoredRecord,
    said_policy,
)
from meshpoint.store import history_queries as hq
from meshpoint.store.engine import is_unique_violation
from meshpoint.store.rows import HeadRow, RecordRow

#: The parameters of a checkpoint that writes no record.
NO_RECORD: dict[str, Any] = {
    "p_history": False, "p_rec_id": None, "p_rec_seq": 0, "p_rec_agent_type": None,
    "p_rec_iteration": None, "p_rec_phase": None, "p_rec_parent_id": None,
    "p_rec_parent_hash": None, "p_rec_data": None, "p_rec_snapshot": None,
    "p_rec_snapshot_encoding": None, "p_rec_hash": None, "p_rec_signature": None,
    "p_rec_key_id": None, "p_rec_retention": None, "p_rec_head_signature": None,
    "p_rec_head_key_id": None, "p_rec_outcome": None, "p_rec_pruned_through": 0,
    "p_rec_pruned_hash": ""}


def record_params(planned: PlannedRecord | None, *, outcome: str | None = None
                  ) -> dict[str, Any]:
    """The ``p_rec_*`` parameters of ``planned`` (:data:`NO_RECORD` for None)."""
    if planned is None:
        return NO_RECORD
    return {
        "p_history": True, "p_rec_id": planned.checkpoint_id, "p_rec_seq": planned.seq,
        "p_rec_agent_type": planned.agent_type, "p_rec_iteration": planned.iteration,
        "p_rec_phase": planned.phase, "p_rec_parent_id": planned.parent_id,
        "p_rec_parent_hash": planned.parent_hash, "p_rec_data": planned.document,
        "p_rec_snapshot": planned.snapshot,
        "p_rec_snapshot_encoding": planned.snapshot_encoding, "p_rec_hash": planned.hash,
        "p_rec_signature": planned.signature, "p_rec_key_id": planned.key_id,
        "p_rec_retention": planned.retention_policy,
        "p_rec_head_signature": planned.head_signature,
        "p_rec_head_key_id": planned.head_key_id, "p_rec_outcome": outcome,
        "p_rec_pruned_through": planned.pruned_through,
        "p_rec_pruned_hash": planned.pruned_hash}


def write_record(conn: Connection, params: dict[str, Any]) -> None:
    """Insert the record of ``params`` and move the task's head to it (portable body),
    inside the caller's transaction. CheckpointConflictError if the head is not the
    record's parent: another writer appended first, or this one's view is stale."""
    if not params["p_history"]:
        return
    hq.INSERT_RECORD.rowcount(conn, params)
    if params["p_rec_seq"] == 1:
        hq.INSERT_HEAD.rowcount(conn, params)
    elif not hq.ADVANCE_HEAD.rowcount(conn, params):
        raise HeadMovedError(
            f"the history of task {params['p_task']!r} no longer ends at record "
            f"{params['p_rec_seq'] - 1} ({params['p_rec_parent_id']}) as it did when "
            "the record was planned: another writer appended to it, or a purge moved "
            "where it starts; restore the task and checkpoint it again")


class HeadMovedError(CheckpointConflictError):
    """A record's parent is no longer its chain's head (see :func:`write_record`):
    planned again on the head as stored now, the record may be written."""


@contextmanager
def seq_taken_as_moved(task_id: str) -> Iterator[None]:
    """A task's end whose record's seq is taken (its chain moved on since its
    context was restored) raises HeadMovedError, on either dialect and path, not the
    unique key's own message."""
    try:
        yield
    except exc.IntegrityError as error:
        if not is_unique_violation(error):
            raise
        raise HeadMovedError(
            f"the history of task {task_id!r} moved on since its context was restored "
            "(its end record's seq is taken): the end was not written; restore the "
            "task and end it again") from None


def stored_record(row: RecordRow) -> StoredRecord:
    return StoredRecord(tenant_id=row.tenant_id, checkpoint_id=row.checkpoint_id,
                        task_id=row.logical_task_id, seq=row.seq, document=row.data,
                        hash=row.hash, signature=row.signature, key_id=row.key_id)


def read_chain(conn: Connection, keys: dict[str, Any]
               ) -> tuple[list[StoredRecord], HeadRow | None]:
    """A task's records, oldest first, each with its snapshot and the columns that
    copy its document, and its head."""
    records = [whole_record(row._asdict()) for row in hq.GET_CHAIN.rows(conn, keys)]
    return records, hq.GET_HEAD.first(conn, keys)


def whole_record(row: Mapping[str, Any]) -> StoredRecord:
    """A record row of ``agent_checkpoints`` with its snapshot and the columns that copy
    its document (the store's, or one a sync brings), as :func:`verify_chain` takes it."""
    snapshot = row["snapshot"]
    return replace(stored_record(RecordRow(*(row[k] for k in RecordRow._fields))),
                   snapshot=None if snapshot is None else bytes(snapshot),
                   snapshot_encoding=row["snapshot_encoding"],
                   columns=RecordColumns(
                       agent_name=row["agent_name"], agent_type=row["agent_type"],
                       iteration=row["iteration"], phase=row["phase"],
                       parent_id=row["parent_id"], retention_policy=row["retention_policy"],
                       created_at=row["created_at"]))


def stored_head(row: HeadRow) -> StoredHead:
    return StoredHead(tenant_id=row.tenant_id, task_id=row.logical_task_id,
                      records=row.records, head_id=row.head_id, head_hash=row.head_hash,
                      signature=row.signature, key_id=row.key_id,
                      pruned_through=row.pruned_through, pruned_hash=row.pruned_hash,
                      columns=HeadColumns(agent_name=row.agent_name, outcome=row.outcome,
                                          retention_policy=row.retention_policy))


def head_of(record: StoredRecord, head: HeadRow | None = None) -> HistoryHead:
    """The head a writer continues from, given the task's (verified) last record and
    its head row (where a purge left the chain starting)."""
    try:
        tokens = record.document["metrics"]["tokens"]["total"]
    except (KeyError, TypeError):
        tokens = {}
    return HistoryHead(record.checkpoint_id, record.hash, record.seq,
                       tokens if isinstance(tokens, dict) else {},
                       0 if head is None else head.pruned_through,
                       "" if head is None else head.pruned_hash,
                       signed=record.signature is not None
                       or (head is not None and head.signature is not None),
                       cost=spent(record.document) if isinstance(record.document, dict)
                       else None,
                       cost_by_source=spent_by_source(record.document)
                       if isinstance(record.document, dict) else None)


def stored_last(conn: Connection, keys: dict[str, Any]
                ) -> tuple[HeadRow | None, StoredRecord | None]:
    """A task's head row and the record it names (None for either that is not
    stored), read in the caller's transaction; neither is verified."""
    head = hq.GET_HEAD.first(conn, keys)
    last = None if head is None else hq.GET_RECORD_AT.first(
        conn, {**keys, "p_rec_seq": head.records})
    return head, None if last is None else stored_record(last)


def stored_head_of(conn: Connection, keys: dict[str, Any]) -> HistoryHead | None:
    """The head a writer continues the task's chain from, as stored (its head row and
    the record it names), read in the caller's transaction; None without a history
    (or with a head whose record is gone: ``verify`` reports that)."""
    head, last = stored_last(conn, keys)
    return None if last is None else head_of(last, head)


def finalize(conn: Connection, keys: dict[str, Any], *, agent_name: str, outcome: str,
             final: Mapping[str, Any] | None, head: HistoryHead | None, now: float,
             options: HistoryOptions) -> None:
    """Append a task's last record, with its ``outcome``, inside the transaction that
    deletes its live rows: chained to ``head`` (what its context knows), or else to
    the stored head, read here. ``final`` is its last checkpoint document, if its
    context was at hand; without it the record keeps the task's retention policy."""
    doc = None
    if head is None:
        head_row, last = stored_last(conn, keys)
        if head_row is None:
            return  # the task was checkpointed without a history
        if last is None:
            return  # its chain is broken; verify reports it, and the task ends anyway
        head = head_of(last, head_row)
        if final is None:
            # The policy its last record carries (hashed), not the head's column: a
            # policy written into a column would otherwise be signed into the end.
            doc = {"history": {"retention_policy": said_policy(last.document)}}
    with seq_taken_as_moved(keys["p_task"]):
        write_record(conn, end_record(keys, agent_name=agent_name, outcome=outcome,
                                      final=final, head=head, now=now, options=options,
                                      doc=doc))


def end_record(keys: dict[str, Any], *, agent_name: str, outcome: str,
               final: Mapping[str, Any] | None, head: HistoryHead, now: float,
               options: HistoryOptions, doc: dict[str, Any] | None = None
               ) -> dict[str, Any]:
    """The parameters of a task's last record (see :func:`finalize`), chained to
    ``head``: ``keys`` with the agent, the clock's reading and the ``p_rec_*`` ones.
    Its document is ``doc``, or else ``final``."""
    if doc is None:
        doc = dict(final) if final is not None else {}
        if "history" in doc:  # the end is written whatever the context holds
            doc["history"] = sound_annotations(doc["history"], f"the end of task "
                                               f"{keys['p_task']!r}")
    planned = plan_record(
        tenant_id=keys["p_tenant"], task_id=keys["p_task"], agent_name=agent_name,
        status=outcome, phase=outcome, doc=doc, context_sha256=None,
        session_event_count=0 if final is None else
        final["session_events_persisted"] + len(final["session_events"]),
        head=head, now=now, options=options, compress_threshold=1 << 30,
        snapshot_context=None)
    return {**keys, "p_agent": agent_name, "p_now": now,
            **record_params(planned, outcome=outcome)}
