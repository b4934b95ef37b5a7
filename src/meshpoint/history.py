"""The checkpoint history: one immutable record per checkpoint of a task (seed 001).

Every checkpoint of a task, whatever its pause (peers, a human's approval, a
mid-turn checkpoint, a handoff), and the task's end (completed, failed, canceled,
expired) append one record to the task's history, in the same transaction as the
checkpoint itself. The live rows of a task go when it ends; its history stays until
its retention policy lets a purge remove it.

A record is a JSON document of schema version 1.0 (:class:`CheckpointRecord`,
documented field by field), stored with:

* a **snapshot** of the task as checkpointed (its context, pending items and joins,
  and how many conversation events it had), so that a task whose live row fails
  verification can be restored from its history (:mod:`meshpoint.store.verified`);
* its **hash** in the task's chain and, with signing keys, an Ed25519 **signature**
  (:mod:`meshpoint.integrity`); the task's **head** (number of records, last hash,
  signed too) moves with each record, so a truncated tail is detected;
* **encrypted fields**, if configured: the security context always, and any field
  of the record the options name (:mod:`meshpoint.encryption`).

The store fills what it knows (ids, phase, pending and completed items, tokens and
their cost by model and by source, the state's hashes). An agent adds the rest
through the task's context: ``ctx.history["record"]`` is a partial record document
(``context_summary``, ``execution_state``, ``recovery``, ``metrics``,
``extensions``) merged into every record the task writes from then on, and
``ctx.history`` also sets ``agent_type``, ``iteration`` and ``retention_policy``.

This module is pure: it builds and verifies records; :mod:`meshpoint.store.history`
reads and writes them.
"""

from __future__ import annotations

import hashlib
import math
import uuid
import zlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

import orjson
import uuid_utils
from pydantic import BaseModel, ConfigDict, Field

from meshpoint._json import dump_bytes
from meshpoint.encryption import EncryptionKeys, is_envelope
from meshpoint.errors import InvalidArgumentError, KeyMissingError
from meshpoint.integrity import (
    GENESIS,
    SigningKeys,
    canonical,
    chain_hash,
    hashes_equal,
    head_message,
)

SCHEMA_VERSION: Literal["1.0"] = "1.0"
#: The phases a record's ``execution_state.phase`` takes when the agent does not set
#: one: the pause it was written at, or how the task ended.
PAUSE_PHASES = ("waiting_peers", "input_required", "working", "handoff")
END_PHASES = ("completed", "failed", "canceled", "expired")
#: Sections of the record an agent may fill through ``ctx.history["record"]``.
AGENT_SECTIONS = ("execution_state", "context_summary", "metrics", "recovery", "extensions")
_TOKEN_KINDS = ("prompt_tokens", "completion_tokens", "cached_tokens")


# -- the record, field by field ---------------------------------------------------------


class _Section(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True)


class Metadata(_Section):
    """Who and what the record is about."""

    checkpoint_id: str
    """A UUIDv7: unique, and sorting by it sorts records by time."""
    task_id: str
    """The logical task id the record belongs to."""
    tenant_id: str
    """The tenant that owns the task (part of the hash: a record moved to another
    tenant fails verification)."""
    agent_id: str
    """The agent that checkpointed (its name)."""
    agent_type: str
    """What kind of agent it is (seed 001: architecture, implementation, qa,
    documentation; meshpoint's default is ``general``)."""
    iteration: int
    """The loop iteration: 1 until a handoff starts a fresh-context iteration."""
    seq: int
    """The record's position in the task's chain, from 1."""
    timestamp: str
    """When the record was written, ISO 8601 with time zone (UTC)."""


class Item(_Section):
    """A work item: a call the task made or waits on."""

    id: str
    """The sub-task id (pending items) or function-call id (completed ones)."""
    kind: str
    """``peer``, ``approval`` or ``call``, or an agent's own kind."""
    name: str | None = None
    """The peer agent, or the tool waiting for approval."""


class ExecutionState(_Section):
    """Where the task stood."""

    phase: str
    """The pause the record was written at (``waiting_peers``, ``input_required``,
    ``working``, ``handoff``) or how the task ended (``completed``, ``failed``,
    ``canceled``, ``expired``), unless the agent names its own (seed 001:
    planning, implementing, testing, reviewing, complete)."""
    completed_items: list[Any] = Field(default_factory=list)
    """Calls of the current turn that finished."""
    pending_items: list[Any] = Field(default_factory=list)
    """Items the task waits on: peer calls and approvals."""
    blocked_items: list[Any] = Field(default_factory=list)
    """Items with blockers (filled by the agent)."""
    current_focus: str | None = None
    """The turn (invocation) the task is in, or the agent's own focus."""


class ContextSummary(_Section):
    """What the agent decided and assumed (filled by the agent; meshpoint lists the
    peers the task depends on)."""

    key_decisions: list[Any] = Field(default_factory=list)
    assumptions: list[Any] = Field(default_factory=list)
    constraints: list[Any] = Field(default_factory=list)
    external_dependencies: list[Any] = Field(default_factory=list)
    """The peer agents the task waits on."""


class Metrics(_Section):
    """What the iteration consumed."""

    tokens_consumed: int
    """Tokens (prompt + completion) since the previous record."""
    tools_invoked: int
    """Calls the task completed in all (tools and peers)."""
    model_calls: int
    """Model calls of the task in all."""
    tokens: dict[str, Any]
    """``{"iteration": ..., "total": ...}``, each ``{"totals", "by_model",
    "by_source"}`` of token counts: by the model that spent them, and by what spent
    them (the agent itself, or a peer, whose tokens come back with its answer)."""
    cost: dict[str, Any]
    """``{"currency", "iteration", "total", "by_model": {model: {"iteration",
    "total"}}}`` from the price table of :class:`Prices`, amounts as decimal strings
    (``"0.00036"``); models without a price count 0 and are listed in
    ``unpriced``."""
    files_modified: list[Any] = Field(default_factory=list)
    tests_status: dict[str, Any] | None = None


class Recovery(_Section):
    """How to resume from here."""

    last_successful_state: str | None
    """The parent record's checkpoint id (None for a task's first record)."""
    rollback_instructions: str = ""
    continuation_prompt: str = ""
    """Filled by the agent (and by a handoff): the prompt to resume the work with."""
    status: str
    """The live status the task was checkpointed in, or its outcome."""
    context_sha256: str | None
    """SHA-256 of the task's context as stored in its live row: the restore checks
    the live row against it."""
    snapshot_sha256: str | None
    """SHA-256 of the snapshot stored with the record (the state to restore from)."""
    session_event_count: int
    """How many conversation events the task had."""


class Compliance(_Section):
    """Integrity and retention."""

    parent_hash: str
    """The hash of the parent record (empty for a task's first record)."""
    event_log_ref: str | None = None
    """Where the task's events are (``agent_events`` by task id)."""
    retention_policy: str | None = None
    """``days:N``, ``last:N`` or ``hold`` (see :func:`parse_retention`); None keeps
    the record until the default policy says otherwise."""
    hash: str | None = None
    """SHA-256 of the parent hash and the record's canonical JSON (filled on read)."""
    signature: str | None = None
    """Ed25519 signature of the hash, base64 (filled on read)."""
    key_id: str | None = None
    """The signing key's id (filled on read)."""


class CheckpointRecord(BaseModel):
    """One record of a task's checkpoint history, schema version 1.0 (seed 001)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    schema_version: Literal["1.0"] = SCHEMA_VERSION
    metadata: Metadata
    execution_state: ExecutionState
    context_summary: ContextSummary
    metrics: Metrics
    recovery: Recovery
    compliance: Compliance
    extensions: dict[str, Any] = Field(default_factory=dict)
    """Anything else the agent records."""


# -- options --------------------------------------------------------------------------


@dataclass(frozen=True)
class Prices:
    """Prices per million tokens, by model: ``{model: {"prompt_tokens": p,
    "completion_tokens": c, "cached_tokens": k}}`` (cached tokens are also counted in
    prompt tokens; their price replaces the prompt price for them)."""

    per_million: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    currency: str = "USD"

    def __post_init__(self) -> None:
        for model, prices in self.per_million.items():
            for kind, price in prices.items():
                if kind not in _TOKEN_KINDS:
                    raise InvalidArgumentError(f"price of {model!r}: {kind!r} is not one of "
                                               f"{_TOKEN_KINDS}")
                if type(price) not in (int, float) or not 0 <= price < math.inf:
                    raise InvalidArgumentError(f"price of {model!r} {kind}: a number >= 0, "
                                               f"got {price!r}")

    def cost(self, model: str, counts: Mapping[str, int]) -> float | None:
        """The cost of ``counts`` on ``model``, or None if it has no price."""
        prices = self.per_million.get(model)
        if prices is None:
            return None
        cached = counts.get("cached_tokens", 0)
        total = ((counts.get("prompt_tokens", 0) - cached) * prices.get("prompt_tokens", 0.0)
                 + cached * prices.get("cached_tokens", prices.get("prompt_tokens", 0.0))
                 + counts.get("completion_tokens", 0) * prices.get("completion_tokens", 0.0))
        return total / 1_000_000


@dataclass(frozen=True)
class HistoryOptions:
    """How a store keeps the checkpoint history (``open_store(url, history=...)``).

    ``enabled``: write a record at every checkpoint and end (the default; off, the
    store writes and verifies nothing of it). ``signing``: the Ed25519 key ring that
    signs records and heads; with a key configured, unsigned records fail
    verification unless ``require_signatures=False``. ``encryption``: the AES-GCM
    key ring; with one, the security context is always encrypted, and so are the
    record fields ``encrypt_fields`` names (dotted paths, e.g.
    ``recovery.continuation_prompt``; ``snapshot`` encrypts the whole snapshot).
    ``prices``: the price table of the cost attribution. ``retention``: the policy
    of records whose task and agent set none.
    """

    enabled: bool = True
    signing: SigningKeys = field(default_factory=SigningKeys)
    require_signatures: bool | None = None
    encryption: EncryptionKeys | None = None
    encrypt_fields: tuple[str, ...] = ()
    prices: Prices = field(default_factory=Prices)
    retention: str | None = None

    def __post_init__(self) -> None:
        if self.retention is not None:
            parse_retention(self.retention)
        for path in self.encrypt_fields:
            if path != "snapshot" and path.split(".", 1)[0] not in (
                    "execution_state", "context_summary", "metrics", "recovery",
                    "extensions"):
                raise InvalidArgumentError(
                    f"encrypt_fields: {path!r} is not a field an agent fills (a path "
                    "under execution_state, context_summary, metrics, recovery or "
                    "extensions, or 'snapshot')")

    @property
    def signatures_required(self) -> bool:
        return self.signing.signs if self.require_signatures is None \
            else self.require_signatures


DISABLED = HistoryOptions(enabled=False)


def parse_retention(policy: str) -> tuple[str, int]:
    """``("days", N)``, ``("last", N)`` or ``("hold", 0)`` from a policy string;
    InvalidArgumentError naming the forms otherwise."""
    kind, _, amount = policy.partition(":")
    if kind == "hold" and not amount:
        return "hold", 0
    if kind in ("days", "last") and amount.isdigit() and int(amount) > 0:
        return kind, int(amount)
    raise InvalidArgumentError(f"retention policy {policy!r}: use days:N (keep N days), "
                               "last:N (keep the last N records) or hold (legal hold)")


# -- the chain's head -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class HistoryHead:
    """The last record of a task's chain, as its writer knows it: the parent of the
    next record."""

    checkpoint_id: str
    hash: str
    seq: int
    #: The task's token counts at that record (the next one's iteration is the rest).
    tokens: Mapping[str, Any]
    #: Where a purge left the chain starting (signed with the head).
    pruned_through: int = 0
    pruned_hash: str = GENESIS


# -- writing a record -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PlannedRecord:
    """A record ready to insert, and the task's head after it."""

    checkpoint_id: str
    seq: int
    phase: str
    agent_type: str
    iteration: int
    parent_id: str | None
    parent_hash: str
    document: dict[str, Any]
    snapshot: bytes | None
    snapshot_encoding: str | None
    hash: str
    signature: str | None
    key_id: str | None
    retention_policy: str | None
    head_signature: str | None
    head_key_id: str | None
    created_at: float
    pruned_through: int = 0
    pruned_hash: str = GENESIS

    def head(self, tokens: Mapping[str, Any]) -> HistoryHead:
        return HistoryHead(self.checkpoint_id, self.hash, self.seq, tokens,
                           self.pruned_through, self.pruned_hash)


def new_checkpoint_id() -> str:
    """A UUIDv7 (RFC 9562): time-ordered."""
    return str(uuid_utils.uuid7())


def plan_record(*, tenant_id: str, task_id: str, agent_name: str, status: str,
                phase: str | None, doc: Mapping[str, Any], context_sha256: str | None,
                session_event_count: int, head: HistoryHead | None, now: float,
                options: HistoryOptions, compress_threshold: int,
                snapshot_context: Mapping[str, Any] | None) -> PlannedRecord:
    """Build, hash and sign the record of one checkpoint (or end) of a task.

    ``doc`` is the checkpoint document (:meth:`TaskExecutionContext.checkpoint_delta`),
    ``snapshot_context`` the context as the live row stores it (its security context
    already encrypted), or None for an end, which stores no snapshot. Raises
    InvalidArgumentError for agent fields that are not canonical JSON, KeyMissingError
    for a key the options need and do not have. No I/O.
    """
    annotations = doc.get("history") or {}
    agent_record = annotations.get("record") or {}
    if not isinstance(agent_record, dict) or set(agent_record) - set(AGENT_SECTIONS):
        raise InvalidArgumentError(
            f"ctx.history['record'] must be a dict of the sections {AGENT_SECTIONS}, got "
            f"{sorted(agent_record) if isinstance(agent_record, dict) else agent_record!r}")
    checkpoint_id = new_checkpoint_id()
    seq = 1 if head is None else head.seq + 1
    parent_hash = GENESIS if head is None else head.hash
    pruned_through = 0 if head is None else head.pruned_through
    pruned_hash = GENESIS if head is None else head.pruned_hash
    agent_type = str(annotations.get("agent_type") or "general")
    iteration = annotations.get("iteration", 1)
    if type(iteration) is not int or iteration < 1:
        raise InvalidArgumentError(f"ctx.history['iteration'] must be an int >= 1, got "
                                   f"{iteration!r}")
    retention = annotations.get("retention_policy") or options.retention
    if retention is not None:
        parse_retention(str(retention))

    subs: Mapping[str, Any] = doc.get("active_peer_sub_tasks") or {}
    invocations: Mapping[str, Any] = doc.get("parallel_tool_calls") or {}
    current = doc.get("current_invocation_id")
    pending = [_pending_item(sub_id, corr) for sub_id, corr in subs.items()]
    done = (invocations.get(current) or {}).get("results") or {} if current else {}
    snapshot = snapshot_raw = None
    snapshot_sha = None
    if snapshot_context is not None:
        snapshot_doc: Any = {"context": snapshot_context, "active_peer_sub_tasks": subs,
                             "parallel_tool_calls": invocations,
                             "session_event_count": session_event_count}
        if "snapshot" in options.encrypt_fields:
            snapshot_doc = _encryption(options).encrypt(
                snapshot_doc, tenant=tenant_id,
                aad={"task": task_id, "record": checkpoint_id, "field": "snapshot"})
        snapshot_raw = dump_bytes(snapshot_doc)  # names a value JSON cannot hold
        snapshot_sha = hashlib.sha256(snapshot_raw).hexdigest()
        snapshot = snapshot_raw
    tokens_now = doc.get("token_usage") or {}
    document: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "metadata": {
            "checkpoint_id": checkpoint_id, "task_id": task_id, "tenant_id": tenant_id,
            "agent_id": agent_name, "agent_type": agent_type, "iteration": iteration,
            "seq": seq, "timestamp": datetime.fromtimestamp(now, UTC).isoformat()},
        "execution_state": {
            "phase": phase or status, "completed_items": [
                {"id": call, "kind": "call"} for call in done],
            "pending_items": pending, "blocked_items": [], "current_focus": current},
        "context_summary": {
            "key_decisions": [], "assumptions": [], "constraints": [],
            "external_dependencies": sorted({str(p["name"]) for p in pending
                                             if p["kind"] == "peer" and p["name"]})},
        "metrics": _metrics(doc, tokens_now, head, options.prices),
        "recovery": {
            "last_successful_state": None if head is None else head.checkpoint_id,
            "rollback_instructions": "", "continuation_prompt": "", "status": status,
            "context_sha256": context_sha256, "snapshot_sha256": snapshot_sha,
            "session_event_count": session_event_count},
        "compliance": {"parent_hash": parent_hash, "event_log_ref": f"agent_events:{task_id}",
                       "retention_policy": retention},
        "extensions": {},
    }
    for section, values in agent_record.items():
        if not isinstance(values, dict):
            raise InvalidArgumentError(f"ctx.history['record'][{section!r}] must be a dict")
        document[section] = {**document[section], **values}
    for path in options.encrypt_fields:
        if path != "snapshot":
            _encrypt_path(document, path, _encryption(options), tenant_id, task_id,
                          checkpoint_id)
    digest = chain_hash(parent_hash, canonical(document))
    signature = key_id = head_signature = head_key_id = None
    if options.signing.signs:
        key_id, signature = options.signing.sign(bytes.fromhex(digest))
        head_key_id, head_signature = options.signing.sign(head_message(
            tenant_id, task_id, seq, digest, pruned_through, pruned_hash))
    encoding = None
    if snapshot is not None:
        encoding = "json"
        if len(snapshot) > compress_threshold:
            snapshot, encoding = zlib.compress(snapshot, 1), "zlib"
    return PlannedRecord(
        checkpoint_id=checkpoint_id, seq=seq,
        phase=str(document["execution_state"].get("phase") or status)[:32],
        agent_type=agent_type[:64], iteration=iteration,
        parent_id=None if head is None else head.checkpoint_id, parent_hash=parent_hash,
        document=document, snapshot=snapshot, snapshot_encoding=encoding, hash=digest,
        signature=signature, key_id=key_id,
        retention_policy=None if retention is None else str(retention)[:64],
        head_signature=head_signature, head_key_id=head_key_id, created_at=now,
        pruned_through=pruned_through, pruned_hash=pruned_hash)


#: The fields of a stored context (its live row, and every snapshot) that are
#: encrypted whenever the store has an encryption key ring: the platform's trust
#: token, and what the agent gives the history (which may hold any field the options
#: name for encryption).
SEALED_CONTEXT_FIELDS = ("security_context", "history")


def seal_context(keys: EncryptionKeys, context: dict[str, Any], tenant_id: str,
                 task_id: str) -> None:
    """Encrypt :data:`SEALED_CONTEXT_FIELDS` of a stored context in place, each bound
    to its tenant, task and field."""
    for name in SEALED_CONTEXT_FIELDS:
        if name in context and not is_envelope(context[name]):
            context[name] = keys.encrypt(context[name], tenant=tenant_id,
                                         aad={"task": task_id, "field": name})


def open_context(options: HistoryOptions, context: dict[str, Any], tenant_id: str,
                 task_id: str) -> None:
    """Decrypt what :func:`seal_context` encrypted, in place (KeyMissingError without
    the key ring or the key; IntegrityError if tampered with or moved)."""
    for name in SEALED_CONTEXT_FIELDS:
        value = context.get(name)
        if is_envelope(value):
            if options.encryption is None:
                raise KeyMissingError(f"task {task_id!r}: its {name} is stored encrypted "
                                      "and this store has no encryption key ring "
                                      "(history.encryption)")
            context[name] = options.encryption.decrypt(
                value, tenant=tenant_id, aad={"task": task_id, "field": name})


def _encryption(options: HistoryOptions) -> EncryptionKeys:
    if options.encryption is None:
        raise KeyMissingError("the history is configured to encrypt fields but has no "
                              "encryption key ring (history.encryption)")
    return options.encryption


def _encrypt_path(document: dict[str, Any], path: str, keys: EncryptionKeys, tenant: str,
                  task: str, record: str) -> None:
    *parents, last = path.split(".")
    node: Any = document
    for name in parents:
        node = node.get(name) if isinstance(node, dict) else None
    if isinstance(node, dict) and last in node and not is_envelope(node[last]):
        node[last] = keys.encrypt(node[last], tenant=tenant,
                                  aad={"task": task, "record": record, "field": path})


def _pending_item(sub_task_id: str, corr: Mapping[str, Any]) -> dict[str, Any]:
    approval = corr.get("approval")
    if isinstance(approval, dict):
        return {"id": sub_task_id, "kind": "approval", "name": approval.get("tool"),
                "function_call_id": corr.get("function_call_id")}
    return {"id": sub_task_id, "kind": "peer", "name": corr.get("peer_agent_name"),
            "function_call_id": corr.get("function_call_id")}


def _minus(now: Mapping[str, Any], before: Mapping[str, Any]) -> dict[str, int]:
    return {kind: int(now.get(kind, 0)) - int(before.get(kind, 0)) for kind in _TOKEN_KINDS}


def _usage_delta(now: Mapping[str, Any], before: Mapping[str, Any]) -> dict[str, Any]:
    def nested(name: str) -> dict[str, dict[str, int]]:
        ours, theirs = now.get(name) or {}, before.get(name) or {}
        return {key: delta for key, counts in ours.items()
                if any(delta := _minus(counts, theirs.get(key) or {}))
                or key not in theirs}

    return {"totals": _minus(now.get("totals") or {}, before.get("totals") or {}),
            "by_model": nested("by_model"), "by_source": nested("by_source")}


def amount(value: float) -> str:
    """A cost as a decimal string, to the nano-unit (``"0.00036"``): exact to read
    in an audit, and no float in the record (see :func:`meshpoint.integrity.canonical`)."""
    text = f"{value:.9f}".rstrip("0").rstrip(".")
    return "0" if text in ("", "-0") else text


def _metrics(doc: Mapping[str, Any], tokens_now: Mapping[str, Any],
             head: HistoryHead | None, prices: Prices) -> dict[str, Any]:
    total = {"totals": dict(tokens_now.get("totals") or {}),
             "by_model": dict(tokens_now.get("by_model") or {}),
             "by_source": dict(tokens_now.get("by_source") or {})}
    iteration = _usage_delta(total, head.tokens if head is not None else {})
    cost_by_model: dict[str, dict[str, float]] = {}
    unpriced = []
    for model, counts in total["by_model"].items():
        whole = prices.cost(model, counts)
        if whole is None:
            unpriced.append(model)
            continue
        part = prices.cost(model, iteration["by_model"].get(model) or {}) or 0.0
        cost_by_model[model] = {"iteration": part, "total": whole}
    invocations = doc.get("parallel_tool_calls") or {}
    flags = doc.get("flags") or {}
    return {
        "tokens_consumed": iteration["totals"]["prompt_tokens"]
        + iteration["totals"]["completion_tokens"],
        "tools_invoked": sum(len((calls or {}).get("results") or {})
                             for calls in invocations.values()),
        "model_calls": int(flags.get("model_calls") or 0),
        "tokens": {"iteration": iteration, "total": total},
        "cost": {"currency": prices.currency,
                 "iteration": amount(sum(c["iteration"] for c in cost_by_model.values())),
                 "total": amount(sum(c["total"] for c in cost_by_model.values())),
                 "by_model": {model: {k: amount(v) for k, v in c.items()}
                              for model, c in cost_by_model.items()},
                 "unpriced": sorted(unpriced)},
        "files_modified": [], "tests_status": None,
    }


# -- verifying --------------------------------------------------------------------------


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


def verify_record(record: StoredRecord, options: HistoryOptions, *,
                  parent_hash: str | None = None) -> str | None:
    """None if ``record`` is intact (its content hashes to its hash, which its
    signature signs, and it says it is the record it is stored as); else why not.
    ``parent_hash``: the hash the record must name as its parent, if known."""
    doc = record.document
    try:
        meta = doc["metadata"]
        named_parent = doc["compliance"]["parent_hash"]
        claims = (meta["checkpoint_id"], meta["task_id"], meta["tenant_id"], meta["seq"])
    except (TypeError, KeyError):
        return "the record is not a history document (metadata or compliance missing)"
    if claims != (record.checkpoint_id, record.task_id, record.tenant_id, record.seq):
        return (f"the record says it is {claims[0]} (task {claims[1]!r}, tenant "
                f"{claims[2]!r}, record {claims[3]}) but is stored as {record.checkpoint_id} "
                f"(task {record.task_id!r}, tenant {record.tenant_id!r}, record {record.seq})")
    if parent_hash is not None and not hashes_equal(str(named_parent), parent_hash):
        return "it does not name the previous record's hash as its parent"
    try:
        digest = chain_hash(str(named_parent), canonical(doc))
    except InvalidArgumentError as error:
        return str(error)
    if not hashes_equal(digest, record.hash):
        return "its content does not hash to its stored hash (changed after it was written)"
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
    first problem, and ``kind`` says what it was: ``corrupt`` (a record's content or
    signature does not verify, the records before it do) or ``broken`` (a record is
    missing, out of order or another's, or the tail is cut off: the head does not
    match). ``last_good_seq`` is the last record that verified with everything before
    it (0 if none)."""

    task_id: str
    records: int
    ok: bool
    kind: Literal["ok", "corrupt", "broken"] = "ok"
    first_bad_seq: int | None = None
    first_bad_id: str | None = None
    reason: str | None = None
    last_good_seq: int = 0


def verify_chain(task_id: str, records: Sequence[StoredRecord], head: StoredHead | None,
                 options: HistoryOptions) -> ChainReport:
    """Walk a task's records (in ``seq`` order) against its head (see ChainReport)."""
    expected_seq = 1 if head is None else head.pruned_through + 1
    parent = GENESIS if head is None else head.pruned_hash
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
    return ChainReport(task_id, len(records), True, last_good_seq=last_good)


def decrypted(document: Mapping[str, Any], options: HistoryOptions, *, tenant_id: str,
              task_id: str, checkpoint_id: str) -> dict[str, Any]:
    """``document`` with its encrypted fields decrypted (KeyMissingError if a key is
    not held); call it only on a verified record."""
    out: dict[str, Any] = orjson.loads(orjson.dumps(document))
    for path in options.encrypt_fields:
        if path == "snapshot":
            continue
        *parents, last = path.split(".")
        node: Any = out
        for name in parents:
            node = node.get(name) if isinstance(node, dict) else None
        if isinstance(node, dict) and is_envelope(node.get(last)):
            node[last] = _encryption(options).decrypt(
                node[last], tenant=tenant_id,
                aad={"task": task_id, "record": checkpoint_id, "field": path})
    return out


def record_model(record: StoredRecord, options: HistoryOptions) -> CheckpointRecord:
    """The pydantic model of a verified record, encrypted fields decrypted, its hash,
    signature and key id filled in."""
    document = decrypted(record.document, options, tenant_id=record.tenant_id,
                         task_id=record.task_id, checkpoint_id=record.checkpoint_id)
    document["compliance"] = {**document["compliance"], "hash": record.hash,
                              "signature": record.signature, "key_id": record.key_id}
    return CheckpointRecord.model_validate(document)


def ids_in_order(ids: Iterable[str]) -> list[str]:
    """UUIDv7 ids sorted by time."""
    return sorted(ids, key=lambda i: uuid.UUID(i).bytes)
