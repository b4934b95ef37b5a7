"""Verifying what the store reads of the checkpoint history (docs/history.md, "Integrity").

A record read back is trusted only once :func:`verify_record` found that its content
hashes to its stored hash (after its parent's), that its signature holds, and that it
is the record it is stored as (its id, task, tenant and position are part of what is
hashed). :func:`verify_chain` walks a task's records against its signed head, which is
what catches a record missing or out of place and a cut-off tail, and checks every
column stored beside the hash against what the hashed document says
(:class:`RecordColumns`, :class:`HeadColumns`): a column is what the store selects and
sorts by, and one that says something else than the record (a retention policy, the
time it was written) is named, never believed. Only then is a record decrypted and
decoded (:func:`record_model`). No I/O here: the store reads, these functions judge.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

import orjson
from pydantic import BaseModel

from meshpoint._json import Undecodable
from meshpoint.compression import DEFAULT_MAX_DECOMPRESSED_BYTES, inflate
from meshpoint.errors import CorruptCheckpointError, InvalidArgumentError, KeyMissingError
from meshpoint.history.encryption import is_envelope
from meshpoint.history.integrity import GENESIS, canonical, chain_hash, hashes_equal, head_message
from meshpoint.history.planning import END_PHASES, HistoryOptions
from meshpoint.history.record import CheckpointRecord

#: What a record says about itself, in the order a mismatch names it.
_CLAIMS = ("checkpoint", "task", "tenant", "record")


#: How far a record's ``created_at`` column may be from the time its document says
#: it was written (the document's ISO 8601 time has microseconds; the column, the
#: same instant as a float).
_CLOCK_SLACK_S = 0.001


@dataclass(frozen=True, slots=True)
class RecordColumns:
    """The columns of a record's row that are not hashed: what the store selects by
    (``agent_name`` and ``created_at`` for a read by agent) and what an operator's SQL
    reads. Each is a copy of something the hashed document says, and must say the
    same (:func:`column_problem`)."""

    agent_name: str
    agent_type: str
    iteration: int
    phase: str
    parent_id: str | None
    retention_policy: str | None
    created_at: float


@dataclass(frozen=True, slots=True)
class HeadColumns:
    """The columns of a task's head that its signature does not cover: copies of what
    the chain's last record says (whose agent, how it ended, its retention policy)."""

    agent_name: str
    outcome: str | None
    retention_policy: str | None


@dataclass(frozen=True, slots=True)
class StoredRecord:
    """A record as read from the store, before it is trusted."""

    tenant_id: str
    checkpoint_id: str
    task_id: str
    seq: int
    document: Any
    hash: str
    signature: str | None
    key_id: str | None
    snapshot: bytes | None = None
    snapshot_encoding: str | None = None
    #: Its other columns, when they were read (a chain walk reads them).
    columns: RecordColumns | None = None


@dataclass(frozen=True, slots=True)
class StoredHead:
    """A task's head as read from the store."""

    tenant_id: str
    task_id: str
    records: int
    head_id: str | None
    head_hash: str
    signature: str | None
    key_id: str | None
    pruned_through: int = 0
    pruned_hash: str = GENESIS
    columns: HeadColumns | None = None


def verify_record(record: StoredRecord, options: HistoryOptions, *,
                  parent_hash: str | None = None) -> str | None:
    """None if ``record`` is intact (its content hashes to its hash, which its
    signature signs, and it says it is the record it is stored as); else why not.
    ``parent_hash``: the hash the record must name as its parent, if known."""
    doc = record.document
    if isinstance(doc, Undecodable):
        return f"its document is not JSON ({doc.error})"
    try:
        meta = doc["metadata"]
        named_parent = doc["compliance"]["parent_hash"]
        claims = (meta["checkpoint_id"], meta["task_id"], meta["tenant_id"], meta["seq"])
    except (TypeError, KeyError):
        return "the record is not a history document (metadata or compliance missing)"
    stored = (record.checkpoint_id, record.task_id, record.tenant_id, record.seq)
    # Each claim must be the stored value, of its type (a seq of "1", 1.0 or True is
    # not record 1); only what differs is named, each value as it is.
    differing = [(f"{name} {claim!r}", f"{name} {value!r}") for name, claim, value
                 in zip(_CLAIMS, claims, stored, strict=True)
                 if type(claim) is not type(value) or claim != value]
    if differing:
        said, where = zip(*differing, strict=True)
        return (f"the record says it is {', '.join(said)} but is stored as "
                f"{', '.join(where)} (record {record.seq}, {record.checkpoint_id})")
    if parent_hash is not None and not hashes_equal(str(named_parent), parent_hash):
        return "it does not name the previous record's hash as its parent"
    try:
        digest = chain_hash(str(named_parent), canonical(doc))
    except InvalidArgumentError as error:
        return str(error)
    if not hashes_equal(digest, record.hash):
        return "its content does not hash to its stored hash (changed after it was written)"
    if not options.check_signatures:
        return None
    if record.signature is not None:
        why = options.signing.verify(str(record.key_id), bytes.fromhex(record.hash),
                                     record.signature)
        if why is not None:
            return why
    elif options.signatures_required:
        return "it is not signed, and this store requires signatures"
    return None


def verify_head(head: StoredHead, options: HistoryOptions) -> str | None:
    """None if the head's signature holds (or none is required), else why not."""
    if not options.check_signatures:
        return None
    if head.signature is not None:
        return options.signing.verify(
            str(head.key_id), head_message(head.tenant_id, head.task_id, head.records,
                                           head.head_hash, head.pruned_through,
                                           head.pruned_hash), head.signature)
    if options.signatures_required:
        return "the task's head is not signed, and this store requires signatures"
    return None


@dataclass(frozen=True, slots=True)
class ChainReport:
    """What walking a task's chain found.

    ``ok``: every record verified and links to its parent, and the chain ends where
    its head says. Otherwise ``first_bad_seq``/``first_bad_id`` and ``reason`` name the
    first problem, and ``kind`` says what it was: ``corrupt`` (a record's content,
    signature or one of its columns does not verify, the records before it do) or
    ``broken`` (a record is missing, out of order or another's, or the tail is cut
    off: the head does not match, or a column of the head says what the chain does
    not). ``last_good_seq`` is the last record that verified with everything before
    it (0 if none). ``signatures_checked``: the chain verified and every record's
    signature and its head's were checked (False when signatures were not checked,
    or some were absent and ``require_signatures=False`` let that pass)."""

    task_id: str
    records: int
    ok: bool
    kind: Literal["ok", "corrupt", "broken"] = "ok"
    first_bad_seq: int | None = None
    first_bad_id: str | None = None
    reason: str | None = None
    last_good_seq: int = 0
    signatures_checked: bool = False


def snapshot_problem(record: StoredRecord, *,
                     max_inflate: int = DEFAULT_MAX_DECOMPRESSED_BYTES) -> str | None:
    """Why the snapshot stored with ``record`` (read with it: ``record.snapshot``)
    is not the one its verified document names by hash, or None. A record that names
    none (an end, an append) has none to check."""
    return checked_snapshot(record, max_inflate=max_inflate)[1]


def checked_snapshot(record: StoredRecord, *,
                     max_inflate: int = DEFAULT_MAX_DECOMPRESSED_BYTES
                     ) -> tuple[bytes | None, str | None]:
    """``(the snapshot's JSON bytes, None)`` if it is the one ``record`` names by
    hash; ``(None, why not)`` otherwise; ``(None, None)`` if the record names none.
    A compressed snapshot is inflated to ``max_inflate`` bytes at most, before
    its hash can be checked: one past it is refused."""
    expected = ((record.document.get("recovery") or {}).get("snapshot_sha256")
                if isinstance(record.document, dict) else None)
    if expected is None:
        return None, None
    if record.snapshot is None:
        return None, "its snapshot is missing"
    raw = bytes(record.snapshot)
    if record.snapshot_encoding == "zlib":
        try:
            raw = inflate(raw, max_inflate, f"its snapshot ({record.checkpoint_id})",
                          task_id=record.task_id)
        except CorruptCheckpointError as error:
            return None, f"{error} (changed after it was written)"
    if not hashes_equal(hashlib.sha256(raw).hexdigest(), str(expected)):
        return None, ("its snapshot does not hash to what the record says (changed "
                      "after it was written)")
    return raw, None


def verify_chain(task_id: str, records: Sequence[StoredRecord], head: StoredHead | None,
                 options: HistoryOptions, *, snapshots: bool = False,
                 columns: bool = True,
                 max_inflate: int = DEFAULT_MAX_DECOMPRESSED_BYTES,
                 after: tuple[int, str] | None = None) -> ChainReport:
    """Walk a task's records (in ``seq`` order) against its head (see ChainReport);
    with ``snapshots`` (the records were read with their snapshots), each record's
    snapshot is checked against the hash its document names too (inflated to
    ``max_inflate`` bytes at most). With ``columns``, the columns read with the
    records and the head are checked against what the documents say (a restore,
    which uses none of them, walks without). ``after`` (a seq and its record's hash,
    already verified: a sync extending a chain the cloud holds) makes ``records``
    the chain's records after that one only."""
    expected_seq = 1 if head is None else head.pruned_through + 1
    parent = GENESIS if head is None else head.pruned_hash
    if after is not None:
        expected_seq, parent = after[0] + 1, after[1]
    last_good = expected_seq - 1

    def bad(kind: Literal["corrupt", "broken"], record: StoredRecord | None,
            reason: str) -> ChainReport:
        return ChainReport(task_id, len(records), False, kind,
                           None if record is None else record.seq,
                           None if record is None else record.checkpoint_id, reason, last_good)

    for record in records:
        if record.seq != expected_seq:
            return bad("broken", record, f"record {expected_seq} is missing (the next "
                       f"stored is record {record.seq})" if record.seq > expected_seq
                       else f"record {record.seq} is out of place (expected {expected_seq})")
        why = verify_record(record, options)
        if why is None and snapshots:
            why = snapshot_problem(record, max_inflate=max_inflate)
        if why is None and columns and record.columns is not None:
            why = column_problem(record.document, record.columns)
        if why is not None:
            kind: Literal["corrupt", "broken"] = (
                "broken" if why.startswith("the record says it is") else "corrupt")
            return bad(kind, record, why)
        named = str(record.document["compliance"]["parent_hash"])
        if not hashes_equal(named, parent):
            return bad("broken", record, f"it does not link to record {expected_seq - 1}: "
                       "the chain was reordered, or a record was replaced")
        parent = record.hash
        last_good = record.seq
        expected_seq += 1
    if head is None:
        if records:
            return bad("broken", None, "the task has records but no head")
        return ChainReport(task_id, 0, True)
    why = verify_head(head, options)
    if why is not None:
        return bad("broken", None, f"its head: {why}")
    if head.records != last_good or not hashes_equal(head.head_hash, parent):
        return bad("broken", None, f"the head says {head.records} records ending in "
                   f"{head.head_hash[:12]}, the chain has {last_good} ending in "
                   f"{parent[:12] or '(nothing)'}: its tail was cut off or replaced")
    if columns and records:
        why = head_column_problem(head, records[-1])
        if why is not None:
            return bad("broken", None, f"its head: {why}")
    checked = (options.check_signatures and head.signature is not None
               and all(r.signature is not None for r in records))
    return ChainReport(task_id, len(records), True, last_good_seq=last_good,
                       signatures_checked=checked)


def said_policy(document: Any) -> str | None:
    """The retention policy a record's (hashed) document carries, if any."""
    try:
        policy = document["compliance"].get("retention_policy")
    except (KeyError, TypeError, AttributeError):
        return None
    return policy if isinstance(policy, str) else None


def said_outcome(document: Any) -> str | None:
    """How the task ended, if a record's (hashed) document says it ended: its
    ``recovery.status`` is an end (a field only meshpoint fills)."""
    try:
        status = document["recovery"]["status"]
    except (KeyError, TypeError):
        return None
    return status if status in END_PHASES else None


def said_agent(document: Any) -> str | None:
    """The agent a record's (hashed) document says wrote it."""
    try:
        agent = document["metadata"]["agent_id"]
    except (KeyError, TypeError):
        return None
    return agent if isinstance(agent, str) else None


def written_at(document: Any) -> float | None:
    """When a record says it was written (its ``metadata.timestamp``, hashed), as
    epoch seconds; None if it does not say so readably."""
    try:
        return datetime.fromisoformat(document["metadata"]["timestamp"]).timestamp()
    except (KeyError, TypeError, ValueError):
        return None


def column_problem(document: Any, columns: RecordColumns) -> str | None:
    """Why a record's unhashed columns do not say what its (verified) document says,
    or None. Each is named with both values: the column was changed after the record
    was written, and whatever selected or decided by it was misled."""
    try:
        meta, recovery = document["metadata"], document["recovery"]
        state = document.get("execution_state")
        phase = state.get("phase") if isinstance(state, dict) else None
        policy = document["compliance"].get("retention_policy")
        said: dict[str, Any] = {
            "agent_name": meta["agent_id"], "agent_type": str(meta["agent_type"])[:64],
            "iteration": meta["iteration"],
            "parent_id": recovery["last_successful_state"],
            "retention_policy": None if policy is None else str(policy)[:64]}
        if phase is None or isinstance(phase, str):  # an encrypted phase is not copied
            said["phase"] = str(phase or recovery["status"])[:32]
    except (KeyError, TypeError, AttributeError):
        return "its metadata, recovery or compliance section cannot be read"
    for name, value in said.items():
        stored = getattr(columns, name)
        if stored != value:
            return (f"its {name} column says {stored!r} but the record says {value!r} "
                    "(the column was changed after the record was written)")
    when = written_at(document)
    if when is None:
        return "its metadata.timestamp is not an ISO 8601 time"
    if abs(columns.created_at - when) > _CLOCK_SLACK_S:
        return (f"its created_at column says {_iso(columns.created_at)} but the record "
                f"says it was written at {meta['timestamp']} (the column was changed "
                "after the record was written)")
    return None


def head_column_problem(head: StoredHead, last: StoredRecord) -> str | None:
    """Why the head's unsigned columns do not say what the chain's last (verified)
    record says, or None: the record it names, its agent, how the chain ended (a
    record whose status is an end) and its retention policy."""
    if head.head_id != last.checkpoint_id:
        return (f"its head_id column says {head.head_id!r} but its last record is "
                f"{last.checkpoint_id!r}")
    if head.columns is None:
        return None
    policy = said_policy(last.document)
    said = {"agent_name": said_agent(last.document), "outcome": said_outcome(last.document),
            "retention_policy": None if policy is None else policy[:64]}
    for name, value in said.items():
        stored = getattr(head.columns, name)
        if stored != value:
            return (f"its {name} column says {stored!r} but the chain's last record "
                    f"(record {last.seq}) says {value!r} (the column was changed)")
    return None


def _iso(epoch: float) -> str:
    try:
        return datetime.fromtimestamp(epoch, UTC).isoformat()
    except (OverflowError, OSError, ValueError):
        return repr(epoch)


def decrypted(document: Mapping[str, Any], options: HistoryOptions, *, tenant_id: str,
              task_id: str, checkpoint_id: str,
              keep_unreadable: bool = False) -> dict[str, Any]:
    """``document`` with every encrypted field it holds decrypted, whether or not the
    options still name it (a record keeps the fields that were encrypted when it was
    written); KeyMissingError if there is no key ring or it lacks a key, unless
    ``keep_unreadable``, which leaves such a field as its envelope. Call it only on a
    verified record."""
    out: dict[str, Any] = orjson.loads(orjson.dumps(document))

    def walk(node: dict[str, Any], prefix: str) -> None:
        for name, value in node.items():
            path = f"{prefix}{name}"
            if is_envelope(value):
                try:
                    if options.encryption is None:
                        raise KeyMissingError(
                            f"record {checkpoint_id} of task {task_id!r} holds the encrypted "
                            f"field {path!r}, and this store has no encryption key ring "
                            "(history.encryption)")
                    node[name] = options.encryption.decrypt(
                        value, tenant=tenant_id,
                        aad={"task": task_id, "record": checkpoint_id, "field": path})
                except KeyMissingError:
                    if not keep_unreadable:
                        raise
            elif isinstance(value, dict):
                walk(value, f"{path}.")

    walk(out, "")
    return out


def record_model(record: StoredRecord, options: HistoryOptions, *,
                 keep_unreadable: bool = False) -> CheckpointRecord:
    """The pydantic model of a verified record, encrypted fields decrypted, its hash,
    signature and key id filled in. A field whose key is not held raises
    KeyMissingError; with ``keep_unreadable`` it stays its envelope (``{"$encrypted":
    ...}``) and the section holding it is built unvalidated (what a crypto-shredded
    record still tells: its metadata, metrics and cost, unless those were encrypted)."""
    document = decrypted(record.document, options, tenant_id=record.tenant_id,
                         task_id=record.task_id, checkpoint_id=record.checkpoint_id,
                         keep_unreadable=keep_unreadable)
    document["compliance"] = {**document["compliance"], "hash": record.hash,
                              "signature": record.signature, "key_id": record.key_id}
    if not (keep_unreadable and holds_envelope(document)):
        return CheckpointRecord.model_validate(document)
    sections: dict[str, Any] = {}
    for name, spec in CheckpointRecord.model_fields.items():
        if name not in document:
            continue
        value, kind = document[name], spec.annotation
        # A section encrypted whole stays its envelope (a dict), as any field does.
        if isinstance(kind, type) and issubclass(kind, BaseModel) and isinstance(value, dict) \
                and not is_envelope(value):
            sections[name] = (kind.model_construct(**value) if holds_envelope(value)
                              else kind.model_validate(value))
        else:
            sections[name] = value
    return CheckpointRecord.model_construct(**sections)


def holds_envelope(node: Any) -> bool:
    """Whether ``node`` is, or holds in its dicts, an encrypted field's envelope."""
    if is_envelope(node):
        return True
    return isinstance(node, dict) and any(holds_envelope(v) for v in node.values())
