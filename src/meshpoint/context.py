"""The execution state of one task, and how it becomes a checkpoint.

A :class:`TaskExecutionContext` is everything an agent instance holds in memory
for a task while it runs (docs/store.md, "The context and the checkpoint"): the A2A
context, the response built so far, artifacts, token usage, the peer sub-tasks it
waits on and the parallel tool calls of the current turn. At a pause boundary the store persists
``to_checkpoint_dict()``; any instance rebuilds the task with
``from_checkpoint_dict()``.

Two rules shape this module:

* **Sub-task state lives in the context**. ``register_peer_sub_task``
  and ``claim_sub_task_completion`` run under the context's lock, so of an answer
  and a timeout racing on one instance only the first claim gets the data.
* **A checkpoint shares nothing with the live object.** The dict is a validated
  deep copy, and so is the context rebuilt from one; mutating either side later
  never leaks into the other. The lock, the cancellation event, the event loop,
  the original broker message and transient streaming state are never persisted.
"""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass, field
from typing import Any, TypedDict

from meshpoint._json import json_copy
from meshpoint._validation import check_text
from meshpoint.errors import InvalidArgumentError

#: Version of the dict layout produced by :meth:`TaskExecutionContext.to_checkpoint_dict`.
CHECKPOINT_FORMAT = 1

#: Keys of the correlation data a peer sub-task carries that meshpoint itself reads.
#: Every other key is the caller's and is stored as given.
CORRELATION_KEYS = ("invocation_id", "function_call_id", "peer_agent_name", "peer_task_id",
                    "timeout_s")

_TOKEN_FIELDS = ("prompt_tokens", "completion_tokens", "cached_tokens")


class TokenUsageDict(TypedDict):
    """:class:`TokenUsage` in a checkpoint. Each count is a dict of ``prompt_tokens``,
    ``completion_tokens`` and ``cached_tokens``."""

    totals: dict[str, int]
    """The task's tokens in all."""
    by_model: dict[str, dict[str, int]]
    """The same, by the model that spent them."""
    by_source: dict[str, dict[str, int]]
    """The same, by what spent them: the agent itself, or a peer (its tokens come back
    with its answer)."""


class ParallelCallsDict(TypedDict):
    """:class:`ParallelCalls` in a checkpoint."""

    call_order: list[str]
    """The turn's function-call ids, in the order the model issued them."""
    results: dict[str, Any]
    """Function-call id -> the result of each call finished so far (any JSON value)."""


class CheckpointDict(TypedDict):
    """What a checkpoint persists of a task (:meth:`TaskExecutionContext.to_checkpoint_dict`),
    field by field. Every value is JSON; the dict shares no object with the context."""

    format: int
    """The layout's version, :data:`CHECKPOINT_FORMAT`."""
    task_id: str
    """The logical task id, unique per tenant: the primary key of a paused task."""
    a2a_context: dict[str, Any]
    """The A2A addressing of the task: its request id, the subjects to answer and
    report progress to, the context id, its caller."""
    current_invocation_id: str | None
    """The turn that paused: its calls are the join the task waits on."""
    response_buffer: str
    """Text the agent produced in earlier turns, to prefix its answer with."""
    produced_artifacts: list[dict[str, Any]]
    """A2A artifacts produced so far (the task's own, and its peers')."""
    artifact_signals_to_return: list[dict[str, Any]]
    """References to artifacts to include in the answer."""
    flags: dict[str, Any]
    """The agent's flags (meshpoint keeps ``model_calls``, ``paused_at`` and
    ``paused_by`` here)."""
    security_context: dict[str, Any]
    """The platform's trust token, propagated to peers."""
    token_usage: TokenUsageDict
    """The task's token usage."""
    history: dict[str, Any]
    """What the task's checkpoint history records beyond what the store knows (see
    :mod:`meshpoint.history.planning`): ``agent_type``, ``iteration``, ``retention_policy``,
    and ``record``, a partial record document the agent fills (a summary, items,
    a continuation prompt) that each history record includes."""
    active_peer_sub_tasks: dict[str, dict[str, Any]]
    """Sub-task id -> the correlation data of every item still outstanding (a peer
    call: its peer, query, reply subjects, ``invocation_id``, ``function_call_id``,
    ``timeout_s``)."""
    parallel_tool_calls: dict[str, ParallelCallsDict]
    """Invocation id -> the calls of that turn."""
    session_events: list[dict[str, Any]]
    """The conversation (:meth:`TaskExecutionContext.checkpoint_delta`: only the
    events not yet stored)."""
    session_events_persisted: int
    """How many events of the conversation are stored: a checkpoint appends those
    past this index."""


def _zero_counts() -> dict[str, int]:
    return dict.fromkeys(_TOKEN_FIELDS, 0)


@dataclass
class TokenUsage:
    """Token counters of a task: totals, and breakdowns by model and by source.

    ``source`` says what spent the tokens (``"agent"``, a tool name, a peer name),
    so a paused-and-resumed task still attributes its cost correctly.
    """

    totals: dict[str, int] = field(default_factory=_zero_counts)
    by_model: dict[str, dict[str, int]] = field(default_factory=dict)
    by_source: dict[str, dict[str, int]] = field(default_factory=dict)

    def record(self, *, model: str, source: str, prompt_tokens: int = 0,
               completion_tokens: int = 0, cached_tokens: int = 0) -> None:
        """Add one model call's usage to the totals and both breakdowns."""
        amounts = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                   "cached_tokens": cached_tokens}
        for name, amount in amounts.items():
            if type(amount) is not int or amount < 0:
                raise InvalidArgumentError(f"{name} must be a non-negative int, got {amount!r}")
        if cached_tokens > prompt_tokens:
            raise InvalidArgumentError(
                f"cached_tokens ({cached_tokens}) are part of the prompt: they cannot "
                f"exceed prompt_tokens ({prompt_tokens})")
        for counts in (self.totals, self.by_model.setdefault(model, _zero_counts()),
                       self.by_source.setdefault(source, _zero_counts())):
            for name, amount in amounts.items():
                counts[name] = counts.get(name, 0) + amount

    def to_dict(self) -> TokenUsageDict:
        """A deep copy in the checkpoint layout."""
        return {"totals": dict(self.totals),
                "by_model": {k: dict(v) for k, v in self.by_model.items()},
                "by_source": {k: dict(v) for k, v in self.by_source.items()}}

    @classmethod
    def from_dict(cls, data: Any) -> TokenUsage:
        """Rebuild from :meth:`to_dict` output, checking its shape."""
        data = _expect(data, dict, "token_usage")
        return cls(totals=dict(_expect(data.get("totals", {}), dict, "token_usage.totals")),
                   by_model=_nested_counts(data.get("by_model", {}), "token_usage.by_model"),
                   by_source=_nested_counts(data.get("by_source", {}), "token_usage.by_source"))


@dataclass
class ParallelCalls:
    """The tool calls of one turn (invocation) that must all finish before it resumes.

    ``call_order`` is the function-call ids in the order the model issued them;
    ``results`` maps a function-call id to its result as calls finish, in any
    order. Results are handed back to the model in ``call_order``, never in
    arrival order.
    """

    call_order: list[str] = field(default_factory=list)
    results: dict[str, Any] = field(default_factory=dict)

    @property
    def total(self) -> int:
        return len(self.call_order)

    @property
    def completed(self) -> int:
        return len(self.results)

    def ordered_results(self) -> list[tuple[str, Any]]:
        """``(function_call_id, result)`` pairs in call order, finished calls only."""
        return [(call, self.results[call]) for call in self.call_order if call in self.results]

    def to_dict(self) -> ParallelCallsDict:
        return {"call_order": list(self.call_order), "results": json_copy(self.results)}

    @classmethod
    def from_dict(cls, data: Any, where: str) -> ParallelCalls:
        """Rebuild from :meth:`to_dict` output, checking its shape. Takes ownership of
        ``data``'s values: callers pass a dict they have already copied."""
        data = _expect(data, dict, where)
        order = _expect(data.get("call_order", []), list, f"{where}.call_order")
        if not all(type(call) is str for call in order):
            raise InvalidArgumentError(f"{where}.call_order must hold function-call id strings")
        if len(set(order)) != len(order):
            raise InvalidArgumentError(f"{where}.call_order lists a function-call id twice")
        results = _expect(data.get("results", {}), dict, f"{where}.results")
        strays = sorted(set(results) - set(order))
        if strays:
            raise InvalidArgumentError(
                f"{where}.results has results for calls {strays} that are not in its call_order")
        return cls(call_order=list(order), results=dict(results))


class TaskExecutionContext:
    """In-memory state of one task on one agent instance.

    Persisted fields (see :meth:`to_checkpoint_dict`):

    ``task_id``
        The logical task id, unique per tenant; the primary key of a paused task.
    ``a2a_context``
        The A2A addressing of the task: session id, user id, the caller to answer.
    ``current_invocation_id``
        The turn that paused; its parallel calls are the join to wait for.
    ``response_buffer``
        Text the agent produced in earlier turns and will prefix its answer with.
    ``produced_artifacts`` / ``artifact_signals_to_return``
        Artifacts produced so far, and artifact references to include in the answer.
    ``flags`` / ``security_context``
        Agent flags, and the platform trust token propagated to peers.
    ``token_usage``
        A :class:`TokenUsage`.
    ``history``
        What the checkpoint history records beyond the store's own knowledge
        (:mod:`meshpoint.history.planning`).
    ``active_peer_sub_tasks``
        ``sub_task_id`` → correlation data of every peer call still outstanding.
    ``parallel_tool_calls``
        ``invocation_id`` → :class:`ParallelCalls`.
    ``session_events`` / ``session_events_persisted``
        The conversation, and how many of its events are already stored: a
        checkpoint appends only the events past that index.

    Never persisted: ``history_head`` (the task's last history record, which the
    store reads with the task and moves at each checkpoint), ``lock``,
    ``cancellation_event``, ``event_loop``,
    ``original_message`` (the broker delivery, acknowledged at the checkpoint)
    and the streaming state (``streaming_buffer``, ``first_text_seen_in_turn``,
    ``need_spacing_before_next_text``), which restart empty on every instance.
    """

    def __init__(self, task_id: str, a2a_context: dict[str, Any] | None = None) -> None:
        self.task_id = check_text("task_id", task_id)
        self.a2a_context: dict[str, Any] = dict(a2a_context or {})
        self.current_invocation_id: str | None = None
        self.response_buffer = ""
        self.produced_artifacts: list[dict[str, Any]] = []
        self.artifact_signals_to_return: list[dict[str, Any]] = []
        self.flags: dict[str, Any] = {}
        self.security_context: dict[str, Any] = {}
        self.token_usage = TokenUsage()
        self.history: dict[str, Any] = {}
        self.active_peer_sub_tasks: dict[str, dict[str, Any]] = {}
        self.parallel_tool_calls: dict[str, ParallelCalls] = {}
        self.session_events: list[dict[str, Any]] = []
        self.session_events_persisted = 0
        # Transient: recreated on every instance, never stored.
        self.history_head: Any = None  # a meshpoint.history.planning.HistoryHead, set by the store
        # A threading lock, not an asyncio one: the critical sections never await, and
        # tool code running in worker threads may register sub-tasks too.
        self.lock = threading.Lock()
        self.cancellation_event = asyncio.Event()
        self.event_loop: asyncio.AbstractEventLoop | None = None
        self.original_message: Any = None
        self.streaming_buffer = ""
        self.first_text_seen_in_turn = False
        self.need_spacing_before_next_text = False

    def __repr__(self) -> str:
        return (f"TaskExecutionContext(task_id={self.task_id!r}, "
                f"invocation={self.current_invocation_id!r}, "
                f"pending_sub_tasks={len(self.active_peer_sub_tasks)})")

    # -- peer sub-tasks -----------------------------------------------------------

    def register_peer_sub_task(self, sub_task_id: str, correlation_data: dict[str, Any]) -> None:
        """Record an outstanding peer call, keyed by its correlation id.

        ``correlation_data`` is stored as a copy. ``invocation_id`` defaults to the
        current invocation and ``function_call_id`` to ``sub_task_id``; the call is
        appended to that invocation's :class:`ParallelCalls` if it is not listed yet.
        """
        check_text("sub_task_id", sub_task_id)
        data = json_copy(_expect(correlation_data, dict, "correlation_data"), "correlation_data")
        data.setdefault("invocation_id", self.current_invocation_id)
        data.setdefault("function_call_id", sub_task_id)
        invocation_id = data["invocation_id"]
        if type(invocation_id) is not str or not invocation_id:
            raise InvalidArgumentError(
                "correlation_data has no invocation_id and the context has no "
                "current_invocation_id: set one so the sub-task joins a turn"
            )
        with self.lock:
            if sub_task_id in self.active_peer_sub_tasks:
                raise InvalidArgumentError(f"sub-task {sub_task_id!r} is already registered")
            calls = self.parallel_tool_calls.setdefault(invocation_id, ParallelCalls())
            if data["function_call_id"] not in calls.call_order:
                calls.call_order.append(data["function_call_id"])
            self.active_peer_sub_tasks[sub_task_id] = data

    def claim_sub_task_completion(self, sub_task_id: str) -> dict[str, Any] | None:
        """Atomically take a sub-task's correlation data: the first caller gets it,
        every later caller (a duplicate answer, a timeout that lost) gets None."""
        with self.lock:
            return self.active_peer_sub_tasks.pop(sub_task_id, None)

    def begin_parallel_calls(self, invocation_id: str, call_ids: list[str]) -> None:
        """Declare the calls a turn made, in the model's order, local tools included."""
        with self.lock:
            calls = self.parallel_tool_calls.setdefault(invocation_id, ParallelCalls())
            for call in call_ids:
                if call not in calls.call_order:
                    calls.call_order.append(call)

    def record_parallel_result(self, invocation_id: str, function_call_id: str,
                               result: Any) -> tuple[int, int]:
        """Store one call's result in memory; returns ``(completed, total)``."""
        value = json_copy(result, f"result of {function_call_id!r}")
        with self.lock:
            calls = self.parallel_tool_calls.get(invocation_id)
            if calls is None or function_call_id not in calls.call_order:
                raise InvalidArgumentError(
                    f"call {function_call_id!r} is not part of invocation {invocation_id!r}"
                )
            calls.results.setdefault(function_call_id, value)
            return calls.completed, calls.total

    # -- conversation and usage ---------------------------------------------------

    def append_session_event(self, event: dict[str, Any]) -> None:
        """Append one conversation event (a message, a tool call, a tool result)."""
        self.session_events.append(json_copy(_expect(event, dict, "event"), "event"))

    def record_token_usage(self, *, model: str, source: str, prompt_tokens: int = 0,
                           completion_tokens: int = 0, cached_tokens: int = 0) -> None:
        """Add a model call's token usage (see :meth:`TokenUsage.record`)."""
        with self.lock:
            self.token_usage.record(model=model, source=source, prompt_tokens=prompt_tokens,
                                    completion_tokens=completion_tokens,
                                    cached_tokens=cached_tokens)

    # -- checkpointing --------------------------------------------------------------

    def to_checkpoint_dict(self) -> CheckpointDict:
        """A deep, JSON-only copy of everything a checkpoint persists.

        Taken under the lock so a concurrent register or claim is either wholly in
        it or wholly out. Raises :class:`~meshpoint.errors.ContextSerializationError`
        naming the first value that is not JSON.
        """
        return self._snapshot(new_events_only=False)

    def checkpoint_delta(self) -> CheckpointDict:
        """What a checkpoint writes: :meth:`to_checkpoint_dict`, except that
        ``session_events`` holds only the events past ``session_events_persisted``.

        The events already stored are neither copied nor checked again, so a pause
        of a long conversation costs what its new events cost, not what the whole
        conversation does. Raises :class:`~meshpoint.errors.InvalidArgumentError` if
        ``session_events_persisted`` is not an index into the conversation.
        """
        return self._snapshot(new_events_only=True)

    def _snapshot(self, *, new_events_only: bool) -> CheckpointDict:
        with self.lock:
            events = self.session_events
            persisted = self.session_events_persisted
            if new_events_only:
                if type(persisted) is not int or not 0 <= persisted <= len(events):
                    raise InvalidArgumentError(
                        f"session_events_persisted is {persisted!r} but the context holds "
                        f"{len(events)} events: the conversation may only grow between "
                        "checkpoints")
                events = events[persisted:]
            raw: CheckpointDict = {
                "format": CHECKPOINT_FORMAT,
                "task_id": self.task_id,
                "a2a_context": self.a2a_context,
                "current_invocation_id": self.current_invocation_id,
                "response_buffer": self.response_buffer,
                "produced_artifacts": self.produced_artifacts,
                "artifact_signals_to_return": self.artifact_signals_to_return,
                "flags": self.flags,
                "security_context": self.security_context,
                "token_usage": self.token_usage.to_dict(),
                "history": self.history,
                "active_peer_sub_tasks": self.active_peer_sub_tasks,
                "parallel_tool_calls": {inv: calls.to_dict()
                                        for inv, calls in self.parallel_tool_calls.items()},
                "session_events": events,
                "session_events_persisted": persisted,
            }
            return json_copy(raw, "context")  # type: ignore[no-any-return]

    @classmethod
    def from_checkpoint_dict(cls, data: CheckpointDict | dict[str, Any]) -> TaskExecutionContext:
        """Rebuild a context from :meth:`to_checkpoint_dict` output.

        The new context has a fresh lock and cancellation event, no event loop and
        empty streaming state; it shares no object with ``data``. A malformed dict
        raises :class:`~meshpoint.errors.InvalidArgumentError` naming the bad key.
        """
        data = _expect(data, dict, "checkpoint")
        if data.get("format", CHECKPOINT_FORMAT) != CHECKPOINT_FORMAT:
            raise InvalidArgumentError(
                f"checkpoint format {data.get('format')!r} is not supported "
                f"(this meshpoint reads format {CHECKPOINT_FORMAT})"
            )
        return cls._from_owned_dict(json_copy(data, "checkpoint"))

    @classmethod
    def _from_owned_dict(cls, data: CheckpointDict | dict[str, Any]) -> TaskExecutionContext:
        """:meth:`from_checkpoint_dict` for a dict of JSON types that nobody else holds
        (the store's, just decoded from its rows): adopted as it is, not copied."""
        ctx = cls(_expect(data.get("task_id"), str, "task_id"),
                  _expect(data.get("a2a_context", {}), dict, "a2a_context"))
        invocation = data.get("current_invocation_id")
        if invocation is not None and type(invocation) is not str:
            raise InvalidArgumentError("checkpoint.current_invocation_id must be a str or null")
        ctx.current_invocation_id = invocation
        ctx.response_buffer = _expect(data.get("response_buffer", ""), str, "response_buffer")
        ctx.produced_artifacts = _expect(data.get("produced_artifacts", []), list,
                                         "produced_artifacts")
        ctx.artifact_signals_to_return = _expect(data.get("artifact_signals_to_return", []),
                                                 list, "artifact_signals_to_return")
        ctx.flags = _expect(data.get("flags", {}), dict, "flags")
        ctx.security_context = _expect(data.get("security_context", {}), dict,
                                       "security_context")
        ctx.token_usage = TokenUsage.from_dict(data.get("token_usage", {}))
        ctx.history = _expect(data.get("history", {}), dict, "history")
        subs = _expect(data.get("active_peer_sub_tasks", {}), dict, "active_peer_sub_tasks")
        for sub_task_id, corr in subs.items():
            _expect(corr, dict, f"active_peer_sub_tasks[{sub_task_id!r}]")
        ctx.active_peer_sub_tasks = subs
        calls = _expect(data.get("parallel_tool_calls", {}), dict, "parallel_tool_calls")
        ctx.parallel_tool_calls = {
            inv: ParallelCalls.from_dict(value, f"parallel_tool_calls[{inv!r}]")
            for inv, value in calls.items()
        }
        events = _expect(data.get("session_events", []), list, "session_events")
        for index, event in enumerate(events):
            _expect(event, dict, f"session_events[{index}]")
        ctx.session_events = events
        persisted = data.get("session_events_persisted", 0)
        if type(persisted) is not int or not 0 <= persisted <= len(events):
            raise InvalidArgumentError(
                f"checkpoint.session_events_persisted must be an int in 0..{len(events)}, "
                f"got {persisted!r}"
            )
        ctx.session_events_persisted = persisted
        return ctx


def _expect(value: Any, kind: type, where: str) -> Any:
    if type(value) is not kind:
        raise InvalidArgumentError(
            f"{where} must be a {kind.__name__}, got {type(value).__name__}"
        )
    return value


def _nested_counts(value: Any, where: str) -> dict[str, dict[str, int]]:
    value = _expect(value, dict, where)
    return {key: dict(_expect(counts, dict, f"{where}[{key!r}]")) for key, counts in value.items()}
