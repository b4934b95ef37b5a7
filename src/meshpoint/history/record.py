"""The record of the checkpoint history, schema version 1.0, field by field
(docs/history.md, "The record (schema 1.0)").

What a record holds and who fills it is described in :mod:`meshpoint.history.planning`; these
pydantic models are the record's schema, written once: a record's document is built
from them (:data:`DOCUMENT`, filled by :func:`meshpoint.history.planning.plan_record`) and a
verified record is read back as them (:func:`meshpoint.history.verification.record_model`).
A record is stored as its JSON document without ``compliance.hash``, ``signature``
and ``key_id``, which are its columns (the hash covers the rest).
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable, Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

SCHEMA_VERSION: Literal["1.0"] = "1.0"


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
    """What kind of agent it is (for example architecture, implementation, qa,
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
    ``canceled``, ``expired``), unless the agent names its own (for example
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
    "total"}}}`` from the price table of :class:`~meshpoint.history.costs.Prices`, amounts as
    exact decimal strings (``"0.00036"``, never rounded); a total is the previous
    record's plus this iteration (:mod:`meshpoint.history.costs`); models without a price count
    0 and are listed in ``unpriced``."""
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
    request_sha256: str | None = None
    """SHA-256 (hex) of the task's request as its agent received it (the UTF-8 of the
    request message's text), from ``ctx.a2a_context["request_sha256"]``, which the
    runtime sets: what a reconstruction checks the request it reads from the event
    log against (the log is not signed; this record is). None when unknown."""


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
    """One record of a task's checkpoint history, schema version 1.0."""

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


# -- a record's document, built from these models ------------------------------------------

#: The fields of the models that a record's document leaves out: its columns,
#: filled on read (the hash covers the rest).
FILLED_ON_READ: Mapping[type[BaseModel], frozenset[str]] = {
    Compliance: frozenset({"hash", "signature", "key_id"})}

_UNSET: Any = object()


def document_builder(model: type[BaseModel]) -> Callable[..., dict[str, Any]]:
    """A function that builds ``model``'s part of a record's document from keyword
    arguments: the model's fields in its order, its defaults for those left out (made
    anew where the model makes them anew). A name the model lacks, or a required
    field left out, is a TypeError: the schema is the model's, written once.

    It is generated once from the model, as :mod:`dataclasses` generates an
    ``__init__``: a record is written at every checkpoint, and ``model_construct`` +
    ``model_dump`` cost several times the dict it builds (docs/benchmarks.md, "The
    record from its model")."""
    params, items, scope = [], [], {"_UNSET": _UNSET}
    for name, spec in model.model_fields.items():
        if name in FILLED_ON_READ.get(model, ()):
            continue
        value = name
        if spec.is_required():
            params.append(name)
        elif spec.default_factory is not None or not isinstance(
                spec.default, str | int | float | bool | None):
            scope[f"_make_{name}"] = spec.default_factory or functools.partial(
                copy.deepcopy, spec.default)
            params.append(f"{name}=_UNSET")
            value = f"_make_{name}() if {name} is _UNSET else {name}"
        else:
            scope[f"_default_{name}"] = spec.default
            params.append(f"{name}=_default_{name}")
        items.append(f"{name!r}: {value}")
    function = f"{model.__name__.lower()}_document"
    exec(f"def {function}(*, {', '.join(params)}):\n    return {{{', '.join(items)}}}",
         scope)
    return scope[function]  # type: ignore[no-any-return]


#: The builders of a record's document and its sections, by the model that defines
#: each (:func:`meshpoint.history.plan_record` fills them).
DOCUMENT: Mapping[type[BaseModel], Callable[..., dict[str, Any]]] = {
    model: document_builder(model) for model in (
        CheckpointRecord, Metadata, ExecutionState, ContextSummary, Metrics, Recovery,
        Compliance)}
