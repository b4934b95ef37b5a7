"""The checkpoint history: one immutable record per checkpoint of a task (docs/history.md).

Every checkpoint of a task, whatever its pause (peers, a human's approval, a
mid-turn checkpoint, a handoff), and the task's end (completed, failed, canceled,
expired) append one record to the task's history, in the same transaction as the
checkpoint itself. The live rows of a task go when it ends; its history stays until
its retention policy lets a purge remove it.

A record is a JSON document of schema version 1.0
(:class:`meshpoint.history.record.CheckpointRecord`, documented field by field), stored with:

* a **snapshot** of the task as checkpointed (its context, pending items and joins,
  and how many conversation events it had), so that a task whose live row fails
  verification can be restored from its history (:mod:`meshpoint.store.history_restore`);
* its **hash** in the task's chain and, with signing keys, an Ed25519 **signature**
  (:mod:`meshpoint.history.integrity`); the task's **head** (number of records, last hash,
  signed too) moves with each record, so a truncated tail is detected;
* **encrypted fields**, if configured: the security context always, and any field
  of the record the options name (:mod:`meshpoint.history.encryption`).

The store fills what it knows (ids, phase, pending and completed items, tokens and
their cost by model and by source, the state's hashes). An agent adds the rest
through the task's context: ``ctx.history["record"]`` is a partial record document
(``context_summary``, ``execution_state``, ``recovery``, ``metrics``,
``extensions``) merged into every record the task writes from then on, and
``ctx.history`` also sets ``agent_type``, ``iteration`` and ``retention_policy``.

This module is pure: it builds records (and holds the options that say how);
:mod:`meshpoint.history.verification` judges what is read back; :mod:`meshpoint.store.history_store`
reads and writes them.
"""

from __future__ import annotations

import functools
import hashlib
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import uuid_utils
from pydantic import BaseModel, TypeAdapter, ValidationError

from meshpoint._json import dump_bytes
from meshpoint.compression import DEFAULT_MAX_DECOMPRESSED_BYTES, check_inflatable, compress
from meshpoint.errors import InvalidArgumentError, KeyMissingError
from meshpoint.history.costs import TOKEN_KINDS, Spent, cost_section, spent, spent_by_source
from meshpoint.history.costs import Prices as Prices  # re-exported: HistoryOptions(prices=Prices())
from meshpoint.history.encryption import EncryptionKeys, check_families, is_envelope
from meshpoint.history.integrity import (
    GENESIS,
    SigningKeys,
    canonical,
    chain_hash,
    head_message,
)
from meshpoint.history.record import (
    DOCUMENT,
    CheckpointRecord,
    Compliance,
    ContextSummary,
    ExecutionState,
    Metadata,
    Metrics,
    Recovery,
)

logger = logging.getLogger("meshpoint.history")

#: The phases a record's ``execution_state.phase`` takes when the agent does not set
#: one: the pause it was written at, or how the task ended.
PAUSE_PHASES = ("waiting_peers", "input_required", "working", "handoff")
END_PHASES = ("completed", "failed", "canceled", "expired")
#: Sections of the record an agent may fill through ``ctx.history["record"]``.
AGENT_SECTIONS = ("execution_state", "context_summary", "metrics", "recovery", "extensions")
#: The fields of those sections that meshpoint fills and an agent may not set: what
#: restores (``recovery``), cost attribution (``metrics``) and the join (the
#: dependencies) rely on. An agent's value there would be taken as meshpoint's.
MESHPOINT_FIELDS: dict[str, frozenset[str]] = {
    "execution_state": frozenset(),
    "context_summary": frozenset({"external_dependencies"}),
    "metrics": frozenset({"tokens_consumed", "tools_invoked", "model_calls", "tokens",
                          "cost"}),
    "recovery": frozenset({"last_successful_state", "status", "context_sha256",
                           "snapshot_sha256", "session_event_count", "request_sha256"}),
    "extensions": frozenset(),
}


# -- options --------------------------------------------------------------------------


@dataclass(frozen=True)
class HistoryOptions:
    """How a store keeps the checkpoint history (``open_store(url, history=...)``).

    ``enabled``: write a record at every checkpoint and end (the default; off, the
    store writes and verifies nothing of it). ``signing``: the Ed25519 key ring that
    signs records and heads; with any key in it (a signer's private key, or only a
    verifier's public key), an unsigned record or head fails verification unless
    ``require_signatures=False`` opts out, and a store that requires signatures but
    holds no active private key writes no record (KeyMissingError): every verifier
    would reject it. ``encryption``: the AES-GCM key ring; with one, every column of
    the store that carries user content is encrypted (:mod:`meshpoint.store.sealing`:
    the live context, the conversation, calls, snapshots, the event log, LangGraph's
    rows) except the families ``encrypt_exclude`` names, and so are the record fields
    ``encrypt_fields`` names (dotted paths, e.g. ``recovery.continuation_prompt``; the
    security context is always).
    ``prices``: the price table of the cost attribution. ``retention``: the policy
    of chains whose task and agent set none. ``agent_retention``: policies by agent
    name, for a purge: the chains of an agent's tasks whose records carry no policy
    of their own (written before the agent had one) follow it. ``check_signatures``
    off: verification checks hashes, links and heads but not signatures (what
    ``meshpoint verify`` does when given no signing keys; leave it on for a store
    that runs tasks).
    """

    enabled: bool = True
    signing: SigningKeys = field(default_factory=SigningKeys)
    require_signatures: bool | None = None
    encryption: EncryptionKeys | None = None
    encrypt_fields: tuple[str, ...] = ()
    encrypt_exclude: frozenset[str] = frozenset()
    prices: Prices = field(default_factory=Prices)
    retention: str | None = None
    agent_retention: Mapping[str, str] = field(default_factory=dict)
    check_signatures: bool = True

    def __post_init__(self) -> None:
        if self.retention is not None:
            parse_retention(self.retention)
        for agent, policy in self.agent_retention.items():
            try:
                parse_retention(policy)
            except InvalidArgumentError as error:
                raise InvalidArgumentError(f"agent_retention[{agent!r}]: {error}") from None
        object.__setattr__(self, "encrypt_exclude", check_families(self.encrypt_exclude))
        for path in self.encrypt_fields:
            if path != "snapshot" and path.split(".", 1)[0] not in (
                    "execution_state", "context_summary", "metrics", "recovery",
                    "extensions"):
                raise InvalidArgumentError(
                    f"encrypt_fields: {path!r} is not a field an agent fills (a path "
                    "under execution_state, context_summary, metrics, recovery or "
                    "extensions, or 'snapshot')")
            if path == "recovery" or path.split(".")[:2] in (
                    ["recovery", name] for name in MESHPOINT_FIELDS["recovery"]):
                raise InvalidArgumentError(
                    f"encrypt_fields: {path!r} holds what a restore checks the task "
                    "against, which stays readable (encrypt recovery.continuation_prompt "
                    "or recovery.rollback_instructions instead)")
            if path in ("metrics", "metrics.tokens") or path.startswith("metrics.tokens."):
                raise InvalidArgumentError(
                    f"encrypt_fields: {path!r} holds the token counts, which stay "
                    "readable: the next record's iteration is counted from them (encrypt "
                    "metrics.cost or another field of metrics instead)")

    def retention_of(self, own: str | None, agent_name: str) -> str | None:
        """The policy a chain follows: ``hold`` if its records', its agent's now or
        the store's is a legal hold (a hold added later protects what was written
        before); else its records' own (the task's, or its agent's when they were
        written), else its agent's now, else the store's."""
        policies = (own, self.agent_retention.get(agent_name), self.retention)
        if "hold" in policies:
            return "hold"
        return next((p for p in policies if p), None)

    def seals(self, family: str) -> bool:
        """Whether the store encrypts ``family``'s columns (see ``encrypt_exclude``)."""
        return self.encryption is not None and family not in self.encrypt_exclude

    @property
    def signatures_required(self) -> bool:
        """Whether an unsigned record or head fails verification: whenever the ring
        holds a key to verify with, unless ``require_signatures`` says otherwise. (A
        forger who can write the tables can recompute the hash chain, which is public,
        but cannot sign it: with a key at hand, "unsigned" must mean "refused".)"""
        return self.signing.verifies if self.require_signatures is None \
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
    #: Whether the chain is signed (its head or that record): its next record must be.
    signed: bool = False
    #: The task's cost by model at that record (the next one's total adds to it), or
    #: None if it cannot be read (see :func:`meshpoint.history.costs.spent`).
    cost: Spent | None = None
    #: The task's cost by source at that record, or None if it holds none (see
    #: :func:`meshpoint.history.costs.spent_by_source`).
    cost_by_source: Spent | None = None


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
                           self.pruned_through, self.pruned_hash,
                           signed=self.head_signature is not None,
                           cost=spent(self.document),
                           cost_by_source=spent_by_source(self.document))


def check_can_sign(options: HistoryOptions, task_id: str, head: HistoryHead | None) -> None:
    """KeyMissingError unless the record written after ``head`` can be signed where
    it must be (a signed chain's next record; any record of a store that requires
    signatures): an unsigned one would fail every verifier holding the key, so none
    is written, and an instance with the active signing key continues the task."""
    if options.signing.signs:
        return
    if head is not None and head.signed:
        raise KeyMissingError(
            f"task {task_id!r}: its history is signed, and this store has no active "
            "signing key to sign its next record (history.signing.active): nothing was "
            "written; leave the task to an instance configured with the signing key")
    if options.signatures_required:
        raise KeyMissingError(
            f"task {task_id!r}: this store requires signed records (it holds keys to "
            "verify with) but has no active signing key to sign them "
            "(history.signing.active; require_signatures: false keeps an unsigned "
            "history): nothing was written")


def new_checkpoint_id() -> str:
    """A UUIDv7 (RFC 9562): time-ordered."""
    return str(uuid_utils.uuid7())


def plan_record(*, tenant_id: str, task_id: str, agent_name: str, status: str,
                phase: str | None, doc: Mapping[str, Any], context_sha256: str | None,
                session_event_count: int, head: HistoryHead | None, now: float,
                options: HistoryOptions, compress_threshold: int,
                snapshot_context: Mapping[str, Any] | None,
                max_inflate: int = DEFAULT_MAX_DECOMPRESSED_BYTES) -> PlannedRecord:
    """Build, hash and sign the record of one checkpoint (or end) of a task.

    ``doc`` is the checkpoint document (:meth:`TaskExecutionContext.checkpoint_delta`),
    ``snapshot_context`` the context as the live row stores it (its security context
    already encrypted), or None for an end, which stores no snapshot; a snapshot that
    would be compressed past ``max_inflate`` bytes (the store's
    ``max_decompressed_bytes``: it could not be read back) is refused. Raises
    InvalidArgumentError for agent fields that are not canonical JSON, KeyMissingError
    for a key the options need and do not have (a record that must be signed and no
    active signing key: :func:`check_can_sign`). No I/O.
    """
    check_can_sign(options, task_id, head)
    annotations = doc.get("history") or {}
    agent_record = check_annotations(annotations)
    checkpoint_id = new_checkpoint_id()
    seq = 1 if head is None else head.seq + 1
    parent_hash = GENESIS if head is None else head.hash
    pruned_through = 0 if head is None else head.pruned_through
    pruned_hash = GENESIS if head is None else head.pruned_hash
    agent_type = str(annotations.get("agent_type") or "general")
    iteration = annotations.get("iteration", 1)
    # The task's own policy (or its agent's, which the runtime puts there); the
    # store's default is not stamped in: a purge applies the default it has then.
    retention = annotations.get("retention_policy")

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
        if "snapshot" in options.encrypt_fields or options.seals("snapshots"):
            snapshot_doc = encryption_keys(options).encrypt(
                snapshot_doc, tenant=tenant_id,
                aad={"task": task_id, "record": checkpoint_id, "field": "snapshot"})
        snapshot_raw = dump_bytes(snapshot_doc)  # names a value JSON cannot hold
        snapshot_sha = hashlib.sha256(snapshot_raw).hexdigest()
        snapshot = snapshot_raw
    tokens_now = doc.get("token_usage") or {}
    document = DOCUMENT[CheckpointRecord](
        metadata=DOCUMENT[Metadata](
            checkpoint_id=checkpoint_id, task_id=task_id, tenant_id=tenant_id,
            agent_id=agent_name, agent_type=agent_type, iteration=iteration, seq=seq,
            timestamp=datetime.fromtimestamp(now, UTC).isoformat()),
        execution_state=DOCUMENT[ExecutionState](
            phase=phase or status,
            completed_items=[{"id": call, "kind": "call"} for call in done],
            pending_items=pending, current_focus=current),
        context_summary=DOCUMENT[ContextSummary](
            external_dependencies=sorted(
                {str(p["name"]) for p in pending if p["kind"] == "peer" and p["name"]})),
        metrics=DOCUMENT[Metrics](**_metrics(doc, tokens_now, head, options.prices)),
        recovery=DOCUMENT[Recovery](
            last_successful_state=None if head is None else head.checkpoint_id,
            status=status, context_sha256=context_sha256, snapshot_sha256=snapshot_sha,
            session_event_count=session_event_count, request_sha256=request_sha256(doc)),
        compliance=DOCUMENT[Compliance](
            parent_hash=parent_hash, event_log_ref=f"agent_events:{task_id}",
            retention_policy=retention))
    for section, values in agent_record.items():
        document[section] = {**document[section], **values}
    # A task's end keeps its answer or failure reason (extensions.ending): the
    # conversation's content, sealed as the conversation is.
    ending = ("extensions.ending",) if options.seals("conversation") else ()
    for path in (*options.encrypt_fields, *ending):
        if path != "snapshot":
            _encrypt_path(document, path, encryption_keys(options), tenant_id, task_id,
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
            check_inflatable(len(snapshot), max_inflate, f"the snapshot of task {task_id!r}")
            snapshot, encoding = compress(snapshot), "zlib"
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


def encryption_keys(options: HistoryOptions) -> EncryptionKeys:
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


def check_annotations(annotations: Any) -> dict[str, Any]:
    """Check what a task's ``ctx.history`` gives its records (``record``: a partial
    record, each section checked by :func:`agent_part`; ``iteration``;
    ``retention_policy``) and return its ``record`` ({} if none);
    InvalidArgumentError naming the first thing wrong."""
    if not isinstance(annotations, dict):
        raise InvalidArgumentError(f"ctx.history must be a dict, got "
                                   f"{type(annotations).__name__}")
    agent_record = annotations.get("record") or {}
    if not isinstance(agent_record, dict) or set(agent_record) - set(AGENT_SECTIONS):
        raise InvalidArgumentError(
            f"ctx.history['record'] must be a dict of the sections {AGENT_SECTIONS}, got "
            f"{sorted(agent_record) if isinstance(agent_record, dict) else agent_record!r}")
    for section, values in agent_record.items():
        agent_part(section, values)
    iteration = annotations.get("iteration", 1)
    if type(iteration) is not int or iteration < 1:
        raise InvalidArgumentError(f"ctx.history['iteration'] must be an int >= 1, got "
                                   f"{iteration!r}")
    retention = annotations.get("retention_policy")
    if retention is not None:
        parse_retention(str(retention))
    return agent_record


def sound_annotations(annotations: Any, where: str) -> dict[str, Any]:
    """``annotations`` (a task's ``ctx.history``) as far as :func:`check_annotations`
    takes them: whole, or without the agent's record part, or nothing; what is left
    out is logged. For the records a task must be able to write whatever its context
    holds (its end, a rewind), where refusing would leave the task unable to end."""
    candidates = [annotations]
    if isinstance(annotations, dict):
        candidates.append({k: v for k, v in annotations.items() if k != "record"})
    for candidate in candidates:
        try:
            check_annotations(candidate)
        except InvalidArgumentError as error:
            logger.warning("%s: its record is written without what ctx.history sets: %s",
                           where, error)
            continue
        return dict(candidate)
    return {}


_SECTION_MODELS: dict[str, type[BaseModel]] = {
    "execution_state": ExecutionState, "context_summary": ContextSummary,
    "metrics": Metrics, "recovery": Recovery}


def agent_part(section: str, values: Any) -> dict[str, Any]:
    """``values``, an agent's part of a record ``section``, checked: a dict that sets
    none of :data:`MESHPOINT_FIELDS` and whose fields have the record's types (so
    that every read of the record can decode it); InvalidArgumentError naming the
    field otherwise."""
    where = f"the record's {section}"
    if not isinstance(values, dict):
        raise InvalidArgumentError(f"{where} must be a dict, got {type(values).__name__}")
    taken = sorted(MESHPOINT_FIELDS[section] & set(values))
    if taken:
        raise InvalidArgumentError(
            f"{where}: {', '.join(taken)} {'is' if len(taken) == 1 else 'are'} filled by "
            "meshpoint and cannot be set by an agent (docs/history.md, The record)")
    for name, value in values.items():
        check = _field_check(section, name)
        if check is None:
            continue  # a field of the agent's own: any JSON value
        try:
            check.validate_python(value, strict=True)
        except ValidationError as error:
            raise InvalidArgumentError(
                f"{where}.{name}: {error.errors()[0]['msg']} (got {value!r:.80})") from None
    return values


@functools.cache
def _field_check(section: str, name: str) -> TypeAdapter[Any] | None:
    """The type check of a field of the record's ``section`` (None: not one of the
    schema's fields, or a section without them)."""
    model = _SECTION_MODELS.get(section)
    found = None if model is None else model.model_fields.get(name)
    return None if found is None or found.annotation is None \
        else TypeAdapter(found.annotation)


def request_digest(text: str) -> str:
    """The SHA-256 (hex) of a task's request text, as records carry it
    (``recovery.request_sha256``)."""
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def request_sha256(doc: Mapping[str, Any]) -> str | None:
    """The request hash a checkpoint document's context carries
    (``a2a_context["request_sha256"]``, set by the runtime), if it is one."""
    value = (doc.get("a2a_context") or {}).get("request_sha256")
    return value if isinstance(value, str) and len(value) == 64 else None


def _pending_item(sub_task_id: str, corr: Mapping[str, Any]) -> dict[str, Any]:
    approval = corr.get("approval")
    if isinstance(approval, dict):
        return {"id": sub_task_id, "kind": "approval", "name": approval.get("tool"),
                "function_call_id": corr.get("function_call_id")}
    return {"id": sub_task_id, "kind": "peer", "name": corr.get("peer_agent_name"),
            "function_call_id": corr.get("function_call_id")}


def _minus(now: Mapping[str, Any], before: Mapping[str, Any]) -> dict[str, int]:
    return {kind: int(now.get(kind, 0)) - int(before.get(kind, 0)) for kind in TOKEN_KINDS}


def _usage_delta(now: Mapping[str, Any], before: Mapping[str, Any]) -> dict[str, Any]:
    def nested(name: str) -> dict[str, dict[str, int]]:
        ours, theirs = now.get(name) or {}, before.get(name) or {}
        return {key: delta for key, counts in ours.items()
                if any(delta := _minus(counts, theirs.get(key) or {}))
                or key not in theirs}

    return {"totals": _minus(now.get("totals") or {}, before.get("totals") or {}),
            "by_model": nested("by_model"), "by_source": nested("by_source")}


def _metrics(doc: Mapping[str, Any], tokens_now: Mapping[str, Any],
             head: HistoryHead | None, prices: Prices) -> dict[str, Any]:
    total = {"totals": dict(tokens_now.get("totals") or {}),
             "by_model": dict(tokens_now.get("by_model") or {}),
             "by_source": dict(tokens_now.get("by_source") or {})}
    before = head.tokens if head is not None else {}
    iteration = _usage_delta(total, before)
    invocations = doc.get("parallel_tool_calls") or {}
    flags = doc.get("flags") or {}
    return {
        "tokens_consumed": iteration["totals"]["prompt_tokens"]
        + iteration["totals"]["completion_tokens"],
        "tools_invoked": sum(len((calls or {}).get("results") or {})
                             for calls in invocations.values()),
        "model_calls": int(flags.get("model_calls") or 0),
        "tokens": {"iteration": iteration, "total": total},
        "cost": cost_section(prices, total, iteration,
                             {} if head is None else head.cost, before,
                             {} if head is None else head.cost_by_source),
    }
