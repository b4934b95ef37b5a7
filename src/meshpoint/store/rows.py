"""Pure helpers of the store: the join plan of a checkpoint, the rows statements
return, and decoding them back into records and contexts (the argument checks are
:mod:`meshpoint.store.checks`). No I/O happens here."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any, NamedTuple

from meshpoint import _json
from meshpoint.compression import check_inflatable, compress, inflate
from meshpoint.context import CheckpointDict, ParallelCalls, TaskExecutionContext
from meshpoint.errors import (
    CorruptCheckpointError,
    DecompressionLimitError,
    InvalidArgumentError,
    LeaseNotHeldError,
    UnknownTaskError,
)
from meshpoint.store.checks import check_id, check_timeout, is_id, is_timeout
from meshpoint.store.results import RestoredTask, SubTask
from meshpoint.store.sealing import (
    CLEAR,
    CONTEXT,
    CONVERSATION,
    CORRELATION,
    RESULT,
    RESULTS,
    Sealer,
)


class TaskRow(NamedTuple):
    """A row of ``agent_paused_tasks`` (see :mod:`meshpoint.store.schema`)."""

    tenant_id: str
    logical_task_id: str
    agent_name: str
    status: str
    current_invocation_id: str | None
    context: bytes
    context_encoding: str
    context_sha256: str
    session_event_count: int
    owner: str | None
    lease_expires_at: float | None
    version: int
    created_at: float
    checkpointed_at: float
    expires_at: float | None


class EventRow(NamedTuple):
    """A row of ``agent_session_events``: the events one checkpoint appended."""

    seq: int
    data: Any  # a JSON array of events (an object: one event, as before migration 0002)


class InvocationRow(NamedTuple):
    """The join of one turn, from ``agent_parallel_invocations``."""

    invocation_id: str
    call_order: Any  # a JSON array of function-call ids
    results: Any  # a JSON object: function-call id -> result known at checkpoint time


class SubTaskRow(NamedTuple):
    """A row of ``agent_peer_sub_tasks``, as :data:`~meshpoint.store.queries.SUB_COLUMNS`
    select it."""

    sub_task_id: str
    logical_task_id: str
    agent_name: str
    invocation_id: str
    function_call_id: str
    peer_agent_name: str | None
    peer_task_id: str | None
    correlation_data: Any  # a JSON object, unless the row is corrupt
    timeout_deadline: float
    status: str
    resolved_by: str | None
    result: Any


class RecordRow(NamedTuple):
    """A row of ``agent_checkpoints``, without its snapshot (read apart, when needed)."""

    tenant_id: str
    checkpoint_id: str
    logical_task_id: str
    seq: int
    data: Any  # the record document, unverified
    hash: str
    signature: str | None
    key_id: str | None


class HeadRow(NamedTuple):
    """A row of ``agent_checkpoint_heads``."""

    tenant_id: str
    logical_task_id: str
    agent_name: str
    records: int
    head_id: str
    head_hash: str
    signature: str | None
    key_id: str | None
    pruned_through: int
    pruned_hash: str
    outcome: str | None
    retention_policy: str | None
    updated_at: float


class RestoreRows(NamedTuple):
    """What a restore reads: the task's row (None if it is not stored), its children,
    and its history head with the record it names (None without history)."""

    task: TaskRow | None
    events: Sequence[EventRow]
    invocations: Sequence[InvocationRow]
    sub_tasks: Sequence[SubTaskRow]
    head: HeadRow | None = None
    latest: RecordRow | None = None


#: Keys of a sub-task's correlation data that must hold an id (the others may be None).
_REQUIRED_IDS = ("invocation_id", "function_call_id")


def plan_join(doc: CheckpointDict, status: str, default_timeout_s: float
              ) -> tuple[list[tuple[str, dict[str, Any], float]], dict[str, ParallelCalls]]:
    """Check that a checkpoint describes one join that can complete, and return
    ``(pending sub-tasks with their timeouts, invocations)``.

    A paused task waits on exactly one join: the calls of its current invocation.
    Each call without a result must have exactly one pending sub-task (or the task
    would wait forever), earlier invocations must be complete, and a task waiting
    on peers must wait on at least one. A task checkpointed mid-turn (``working``)
    may have calls of its current invocation still to make.
    """
    current = doc["current_invocation_id"]
    invocations = {inv: ParallelCalls.from_dict(calls, f"parallel_tool_calls[{inv!r}]")
                   for inv, calls in doc["parallel_tool_calls"].items()}
    subs: list[tuple[str, dict[str, Any], float]] = []
    waiting: set[str] = set()
    for sub_task_id, corr in doc["active_peer_sub_tasks"].items():
        check_id("sub_task_id", sub_task_id)
        corr.setdefault("invocation_id", current)
        corr.setdefault("function_call_id", sub_task_id)
        inv, call = corr["invocation_id"], corr["function_call_id"]
        # The names of the checks are formatted only when one fails.
        for key, value in (("invocation_id", inv), ("function_call_id", call),
                           ("peer_agent_name", corr.get("peer_agent_name")),
                           ("peer_task_id", corr.get("peer_task_id"))):
            if not is_id(value) and (value is not None or key in _REQUIRED_IDS):
                check_id(f"{key} of sub-task {sub_task_id!r}", value)
        if inv != current:
            raise InvalidArgumentError(
                f"sub-task {sub_task_id!r} belongs to invocation {inv!r}, but the task is "
                f"paused in invocation {current!r}: a paused task waits on one join, the "
                "calls of its current invocation")
        timeout_s = corr.get("timeout_s", default_timeout_s)
        if not is_timeout(timeout_s):
            check_timeout(f"timeout_s of sub-task {sub_task_id!r}", timeout_s)
        calls = invocations.setdefault(inv, ParallelCalls())
        if call not in calls.call_order:
            calls.call_order.append(call)
        if call in calls.results or call in waiting:
            raise InvalidArgumentError(
                f"call {call!r} of invocation {inv!r} already has a result or another "
                f"pending sub-task; sub-task {sub_task_id!r} could never count")
        waiting.add(call)
        subs.append((sub_task_id, corr, float(timeout_s)))
    for inv, calls in invocations.items():
        missing = set(calls.call_order) - set(calls.results) - (waiting if inv == current
                                                                else set())
        if missing and not (status == "working" and inv == current):  # still to be made
            raise InvalidArgumentError(
                f"calls {sorted(missing)} of invocation {inv!r} have neither a result nor a "
                "pending peer sub-task of the current invocation, so they could never finish")
    if status == "waiting_peers" and not subs:
        raise InvalidArgumentError(
            "a task checkpointed as waiting_peers must have at least one pending peer "
            "sub-task (register_peer_sub_task); use another status for other pauses")
    return subs, invocations


def sub_task(row: SubTaskRow, sealer: Sealer = CLEAR, *, strict: bool = False) -> SubTask:
    """A sub-task from its row, its correlation data and result opened (strictly for
    a restore, which uses them; else a value that cannot be opened reads as
    unreadable: see :mod:`meshpoint.store.sealing`)."""
    corr = sealer.open(row.correlation_data, CORRELATION, strict=strict,
                       task=row.logical_task_id, sub_task=row.sub_task_id)
    if type(corr) is not dict:
        raise CorruptCheckpointError(
            f"sub-task {row.sub_task_id!r} has correlation data of type "
            f"{type(corr).__name__}, not an object", task_id=row.logical_task_id)
    if row.peer_task_id is not None:
        corr = {**corr, "peer_task_id": row.peer_task_id}
    return SubTask(
        sub_task_id=row.sub_task_id, task_id=row.logical_task_id, agent_name=row.agent_name,
        invocation_id=row.invocation_id, function_call_id=row.function_call_id,
        peer_agent_name=row.peer_agent_name, peer_task_id=row.peer_task_id,
        # float(): PostgreSQL's one-statement restore carries the rows as JSON, in
        # which a whole-number deadline comes back as an int.
        correlation_data=corr, timeout_deadline=float(row.timeout_deadline),
        status=row.status, resolved_by=row.resolved_by,
        result=sealer.open(row.result, RESULT, strict=strict, sub_task=row.sub_task_id))


class EncodedContext(NamedTuple):
    """A context as its task row stores it (``context``, ``context_encoding``,
    ``context_sha256``)."""

    blob: bytes
    encoding: str
    sha256: str
    compressed: bool


def encode_context(context: dict[str, Any], sealer: Sealer, task_id: str,
                   compress_threshold: int, max_inflate: int) -> EncodedContext:
    """``context`` as stored: its JSON, zlib-compressed past ``compress_threshold``
    bytes (refused if it would inflate past ``max_inflate``: it could not be read
    back), then sealed if the store encrypts contexts (encoding ``sealed+json`` or
    ``sealed+zlib``). The checksum is of the stored bytes once sealed (a checksum of
    the plain text would let a reader of the database confirm a guess of it), of
    the JSON otherwise."""
    raw = _json.dump_bytes(context)
    compressed = len(raw) > compress_threshold
    if compressed:
        check_inflatable(len(raw), max_inflate, f"the context of task {task_id!r}")
    blob = compress(raw) if compressed else raw
    encoding = "zlib" if compressed else "json"
    if not sealer.seals("context"):
        return EncodedContext(blob, encoding, hashlib.sha256(raw).hexdigest(), compressed)
    blob = sealer.seal_bytes("context", blob, CONTEXT, task=task_id)
    return EncodedContext(blob, f"sealed+{encoding}", hashlib.sha256(blob).hexdigest(),
                          compressed)


def decode_context(task: TaskRow, sealer: Sealer = CLEAR, *,
                   max_inflate: int) -> dict[str, Any]:
    """Open, decompress (at most ``max_inflate`` bytes: DecompressionLimitError past
    it), verify and parse a paused task's context column."""
    task_id = task.logical_task_id
    try:
        raw = bytes(task.context)
        encoding = task.context_encoding
        if encoding.startswith("sealed+"):
            if hashlib.sha256(raw).hexdigest() != task.context_sha256:
                raise ValueError("its SHA-256 does not match the stored checksum")
            raw = sealer.open_bytes(raw, CONTEXT, task=task_id)
            encoding = encoding.removeprefix("sealed+")
        if encoding == "zlib":
            what = f"the context of task {task_id!r}"
            try:
                raw = inflate(raw, max_inflate, what, task_id=task_id)
            except DecompressionLimitError:
                raise  # says which task, and the limit
            except CorruptCheckpointError as error:
                raise ValueError(str(error).removeprefix(what + " ")) from None
        elif encoding != "json":
            raise ValueError(f"unknown context encoding {task.context_encoding!r}")
        if task.context_encoding in ("json", "zlib") and \
                hashlib.sha256(raw).hexdigest() != task.context_sha256:
            raise ValueError("its SHA-256 does not match the stored checksum")
        doc = _json.loads(raw)
        if type(doc) is not dict:
            raise ValueError("it is not a JSON object")
    except ValueError as error:
        raise CorruptCheckpointError(
            f"the stored context of task {task_id!r} is corrupt ({error}); it was not used. "
            "Restore the row from a backup or cancel the task", task_id=task_id) from None
    return doc


def join_events(task_id: str, event_rows: Sequence[EventRow],
                sealer: Sealer = CLEAR) -> list[Any]:
    """The conversation from its rows (``seq`` order): each holds the JSON array of
    the events one checkpoint appended, starting at event index ``seq``."""
    events: list[Any] = []
    for row in event_rows:
        data = sealer.open(row.data, CONVERSATION, task=task_id, seq=str(row.seq))
        # An object is one event, as rows were before migration 0002 (an instance of
        # the older version may still write them while a fleet is upgraded).
        batch = [data] if type(data) is dict else data
        if type(batch) is not list or row.seq != len(events):
            raise CorruptCheckpointError(
                f"task {task_id!r} has a conversation row at event {row.seq} that does not "
                f"continue the {len(events)} events before it (or is not a JSON array)",
                task_id=task_id)
        events.extend(batch)
    return events


def invocation_results(task_id: str, row: InvocationRow, sealer: Sealer = CLEAR
                       ) -> dict[str, Any]:
    """The results an invocation's row holds (strict: they are used)."""
    results = sealer.open(row.results, RESULTS, task=task_id, invocation=row.invocation_id)
    if type(results) is not dict:
        raise CorruptCheckpointError(
            f"invocation {row.invocation_id!r} of task {task_id!r} has results of type "
            f"{type(results).__name__}, not an object", task_id=task_id)
    return dict(results)


def restored(task_id: str, rows: RestoreRows, lease_owner: str | None,
             sealer: Sealer = CLEAR, *, max_inflate: int) -> RestoredTask:
    """A paused task as a live context, from the rows a restore read (every sealed
    value opened strictly; its context inflated to ``max_inflate`` bytes at most).
    Raises UnknownTaskError if the task is not stored and, with ``lease_owner``,
    LeaseNotHeldError unless that owner holds its resume lease."""
    task = rows.task
    if task is None:
        raise UnknownTaskError(task_id)
    if lease_owner is not None and task.owner != lease_owner:
        raise LeaseNotHeldError(task_id, lease_owner, task.status)
    doc = decode_context(task, sealer, max_inflate=max_inflate)
    sealer.open_context_fields(doc, task_id)
    events = join_events(task.logical_task_id, rows.events, sealer)
    if len(events) != task.session_event_count:
        raise CorruptCheckpointError(
            f"task {task.logical_task_id!r} should have {task.session_event_count} "
            f"conversation events but {len(events)} are stored", task_id=task.logical_task_id)
    parallel: dict[str, dict[str, Any]] = {
        row.invocation_id: {"call_order": row.call_order,
                            "results": invocation_results(task_id, row, sealer)}
        for row in rows.invocations}
    active: dict[str, dict[str, Any]] = {}
    for item in (sub_task(row, sealer, strict=True) for row in rows.sub_tasks):
        if item.status == "pending":
            active[item.sub_task_id] = item.correlation_data
        elif item.status == "resolved" and item.invocation_id in parallel:
            parallel[item.invocation_id]["results"][item.function_call_id] = item.result
    doc.update(active_peer_sub_tasks=active, parallel_tool_calls=parallel,
               session_events=events, session_events_persisted=len(events))
    try:
        # Every object in doc was decoded from the rows just now: adopted, not copied.
        context = TaskExecutionContext._from_owned_dict(doc)
    except InvalidArgumentError as error:
        raise CorruptCheckpointError(
            f"the stored context of task {task.logical_task_id!r} is malformed: {error}",
            task_id=task.logical_task_id) from None
    return RestoredTask(context=context, agent_name=task.agent_name, status=task.status,
                        version=task.version, owner=task.owner,
                        lease_expires_at=task.lease_expires_at,
                        checkpointed_at=task.checkpointed_at, expires_at=task.expires_at)
