"""What an agent is: its name, model, tools and peers, and how its instances run.

An :class:`Agent` is a definition, shared by all of its instances. Each peer is
offered to the model as one more tool (``ask_<peer>`` unless named otherwise); a
turn may call several peers at once (a fan-out) and mix them with local tools,
which return at once, unless a tool needs a human's approval
(``LocalTool(..., needs_approval=True)``): then the task pauses until a human
approves, edits or denies the call (:mod:`meshpoint.runtime.approvals`).
"""

from __future__ import annotations

import functools
import inspect
import logging
import math
import re
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError

from meshpoint._json import json_copy
from meshpoint.context import TaskExecutionContext
from meshpoint.errors import InvalidArgumentError
from meshpoint.history import check_annotations, parse_retention
from meshpoint.llm.base import Model, ToolSpec

logger = logging.getLogger("meshpoint.runtime")

_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")

ToolFunction = Callable[..., Any | Awaitable[Any]]
#: Whether a call needs approval, from its arguments.
ApprovalPredicate = Callable[[dict[str, Any]], bool]


def check_name(what: str, value: Any) -> str:
    """Agent, tool and namespace names become subject tokens: letters, digits, _ and -."""
    if type(value) is not str or not _NAME.match(value):
        raise InvalidArgumentError(
            f"{what} must be 1-64 letters, digits, '_' or '-', got {value!r}")
    return value


@dataclass(frozen=True)
class ToolCallInfo:
    """What a tool may know of the call it makes: pass a function of two parameters,
    ``fn(arguments, call)``, to get it.

    ``idempotency_key`` is the same every time this call runs, on any instance: a
    tool with side effects outside meshpoint can use it to make a repeated run (a
    turn re-run after a crash) change nothing.
    """

    task_id: str
    #: The model's id of the call.
    call_id: str

    @property
    def idempotency_key(self) -> str:
        return f"{self.task_id}/{self.call_id}"


@dataclass(frozen=True)
class LocalTool:
    """A function the model can call that returns at once (sync or async).

    It gets the call's arguments (a dict), and the :class:`ToolCallInfo` if it takes
    a second parameter, and returns any JSON value; an exception becomes an
    ``{"error": ...}`` result the model sees, not a failed task.

    ``needs_approval`` (True, or a predicate on the call's arguments) makes a call
    wait for a human's decision first: the task pauses as ``input_required`` for up
    to ``approval_timeout_s`` (then the call is denied, "timed out"), and the tool
    runs when the call is approved, with the arguments as the human left them,
    which must satisfy ``parameters`` (a JSON schema).
    """

    name: str
    description: str
    fn: ToolFunction
    parameters: dict[str, Any] = field(default_factory=lambda: {
        "type": "object", "properties": {"query": {"type": "string"}}})
    needs_approval: bool | ApprovalPredicate = False
    approval_timeout_s: float = 3600.0
    _takes_call: bool = field(init=False, repr=False, compare=False, default=False)

    def __post_init__(self) -> None:
        check_name("a tool name", self.name)
        if not callable(self.fn):
            raise InvalidArgumentError(f"tool {self.name!r}: fn must be callable")
        if not (type(self.needs_approval) is bool or callable(self.needs_approval)):
            raise InvalidArgumentError(
                f"tool {self.name!r}: needs_approval must be a bool or a function of the "
                f"call's arguments, got {self.needs_approval!r}")
        if not (type(self.approval_timeout_s) in (int, float)
                and 0 < self.approval_timeout_s < math.inf):
            raise InvalidArgumentError(
                f"tool {self.name!r}: approval_timeout_s must be a number > 0, "
                f"got {self.approval_timeout_s!r}")
        try:
            Draft202012Validator.check_schema(self.parameters)
        except SchemaError as error:
            raise InvalidArgumentError(
                f"tool {self.name!r}: parameters is not a valid JSON schema: "
                f"{error.message}") from None
        object.__setattr__(self, "_takes_call", _takes_second_argument(self.fn))

    @property
    def may_need_approval(self) -> bool:
        """Whether any call of this tool can wait for approval."""
        return self.needs_approval is not False

    def requires_approval(self, arguments: dict[str, Any]) -> bool:
        """Whether this call waits for a human. A predicate that fails says yes."""
        if type(self.needs_approval) is bool:
            return self.needs_approval
        try:
            return bool(self.needs_approval(arguments))
        except Exception:
            logger.exception("tool %r: its needs_approval predicate failed; the call "
                             "waits for approval", self.name)
            return True

    async def call(self, arguments: dict[str, Any], info: ToolCallInfo | None = None) -> Any:
        if self._takes_call:
            value = self.fn(arguments, info)
        else:
            value = self.fn(arguments)
        return await value if inspect.isawaitable(value) else value


def _takes_second_argument(fn: Callable[..., Any]) -> bool:
    try:
        parameters = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):  # a builtin without a signature
        return False
    positional = [p for p in parameters
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return len(positional) >= 2 or any(p.kind is p.VAR_POSITIONAL for p in parameters)


@dataclass(frozen=True)
class Peer:
    """Another agent this agent may call, and how long to wait for its answer.

    ``timeout_s`` runs from the checkpoint that records the call; every status
    update from the peer restarts it.
    """

    agent: str
    description: str = ""
    timeout_s: float = 600.0
    tool_name: str | None = None

    def __post_init__(self) -> None:
        check_name("a peer's agent name", self.agent)
        if self.tool_name is not None:
            check_name("a peer's tool name", self.tool_name)
        if not (type(self.timeout_s) in (int, float) and self.timeout_s > 0):
            raise InvalidArgumentError(
                f"peer {self.agent!r}: timeout_s must be a number > 0, got {self.timeout_s!r}")

    @property
    def tool(self) -> str:
        return self.tool_name or f"ask_{self.agent}"


Strategy = Literal["event", "interval", "hybrid"]


@dataclass(frozen=True)
class CheckpointPolicy:
    """When a running turn is checkpointed, besides its pauses (seed 004's
    ``checkpoint:`` section). ``event`` checkpoints at pauses only; ``interval`` and
    ``hybrid`` also before every ``interval``-th model call; ``after_tools`` after a
    model call that asks for tools and after each local tool call, so that neither
    is made again after a crash; ``before_llm`` before each model call."""

    strategy: Strategy = "event"
    interval: int = 0
    after_tools: bool = False
    before_llm: bool = False

    def __post_init__(self) -> None:
        if self.strategy not in ("event", "interval", "hybrid"):
            raise InvalidArgumentError(
                f"checkpoint strategy must be event, interval or hybrid, got {self.strategy!r}")
        if type(self.interval) is not int or self.interval < 0:
            raise InvalidArgumentError(
                f"checkpoint interval must be an int >= 0, got {self.interval!r}")
        if self.strategy != "event" and self.interval == 0:
            raise InvalidArgumentError(
                f"checkpoint strategy {self.strategy!r} needs an interval > 0 (model calls "
                "between checkpoints)")

    @property
    def mid_turn(self) -> bool:
        """Whether a running turn is ever checkpointed."""
        return self.after_tools or self.before_llm or self.strategy != "event"

    def before_model_call(self, made: int) -> bool:
        """Whether to checkpoint before a task's model call, ``made`` calls made."""
        if self.before_llm:
            return True
        return self.strategy != "event" and made > 0 and made % self.interval == 0


@dataclass(frozen=True)
class RecoveryPolicy:
    """What recovery does with an agent's stored tasks (seed 004's ``recovery:``).

    ``auto_resume``: a task whose instance died while running it (its lease expired:
    it was resuming, or running past a mid-turn checkpoint) is taken over and
    continued. ``auto_resume_hitl``: when an instance starts, the caller of every
    task waiting for a human is sent its ``input-required`` update again (they are
    never resumed without an answer). ``timeout_s``: a task last checkpointed
    strictly longer ago than this, and not running, fails: its caller is answered
    ``failed`` with the reason, its peers are canceled and its rows removed (0:
    never). The default, a day, is longer than every default deadline, so that a
    deadline (a peer's, an approval's) acts first. ``reconstruct``: a task whose
    history fails verification so that it cannot be resumed (it is blocked) is
    restarted at once in a fresh context from its reconstruction (seed 003:
    :mod:`meshpoint.reconstruction`), its caller told; off (the default), it waits
    blocked for an operator.
    """

    auto_resume: bool = True
    auto_resume_hitl: bool = False
    timeout_s: float = 86_400.0
    reconstruct: bool = False

    def __post_init__(self) -> None:
        if not (type(self.timeout_s) in (int, float) and 0 <= self.timeout_s < math.inf):
            raise InvalidArgumentError(
                f"recovery timeout_s must be a finite number >= 0 (0: never), got "
                f"{self.timeout_s!r}")


@dataclass(frozen=True)
class Agent:
    """An agent definition.

    ``stateless_checkpointing`` (seed 000's flag) chooses what happens when a turn
    calls peers. On (the default here; the seed's default was off): the task is
    checkpointed, its inbound message acknowledged and the task forgotten, and any
    instance continues it. Off: the task waits in the memory of its instance, whose
    peers answer to that instance's inbox (seed 002's path); nothing is written.
    """

    name: str
    model: Model
    description: str = ""
    tools: Sequence[LocalTool] = ()
    peers: Sequence[Peer] = ()
    stateless_checkpointing: bool = True
    system_prompt: str | None = None
    #: Model calls one task may make before it fails (a loop guard).
    max_turns: int = 25
    #: When a running turn is checkpointed besides its pauses (seed 004); by default
    #: never, so that a task that never pauses writes nothing.
    checkpoint: CheckpointPolicy = field(default_factory=lambda: CheckpointPolicy())
    #: What recovery does with this agent's stored tasks (seed 004).
    recovery: RecoveryPolicy = field(default_factory=lambda: RecoveryPolicy())
    #: What the checkpoint history records of this agent (seed 001): its kind
    #: (architecture, implementation, qa, documentation, or anything else).
    agent_type: str = "general"
    #: The retention policy of its tasks' records (``days:N``, ``last:N``, ``hold``);
    #: None: the store's.
    retention: str | None = None
    #: Called with a task's context before each of its checkpoints, to add to its
    #: history record what only the agent knows: set ``ctx.history["record"]`` to a
    #: partial record (``context_summary``, ``execution_state``, ``recovery``,
    #: ``metrics``, ``extensions``; see :mod:`meshpoint.history`). An error in it, or
    #: a record it sets that is not valid, is logged and the checkpoint goes on
    #: without what it set.
    history_hook: Callable[[TaskExecutionContext], None] | None = None
    #: Keep an event log of every step and protocol message of this agent's tasks
    #: (seed 003; :mod:`meshpoint.events`), written off the hot path.
    events: bool = False

    def __post_init__(self) -> None:
        check_name("an agent name", self.name)
        if not isinstance(self.model, Model):
            raise InvalidArgumentError(
                f"agent {self.name!r}: model must implement meshpoint.llm.Model "
                f"(a name and an async complete()), got {type(self.model).__name__}")
        object.__setattr__(self, "tools", tuple(self.tools))
        object.__setattr__(self, "peers", tuple(self.peers))
        names = [t.name for t in self.tools] + [p.tool for p in self.peers]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise InvalidArgumentError(f"agent {self.name!r}: tool names {twice} are used twice")
        if self.max_turns < 1:
            raise InvalidArgumentError(f"agent {self.name!r}: max_turns must be >= 1")
        if type(self.agent_type) is not str or not 0 < len(self.agent_type) <= 64:
            raise InvalidArgumentError(f"agent {self.name!r}: agent_type must be a str of "
                                       f"1 to 64 characters, got {self.agent_type!r}")
        if self.retention is not None:
            parse_retention(self.retention)
        if not isinstance(self.checkpoint, CheckpointPolicy):
            raise InvalidArgumentError(
                f"agent {self.name!r}: checkpoint must be a CheckpointPolicy, got "
                f"{self.checkpoint!r}")
        if self.checkpoint.mid_turn and not self.stateless_checkpointing:
            raise InvalidArgumentError(
                f"agent {self.name!r}: mid-turn checkpoints ({self.checkpoint}) need "
                "stateless_checkpointing")
        approving = [t.name for t in self.tools if t.may_need_approval]
        if approving and not self.stateless_checkpointing:
            raise InvalidArgumentError(
                f"agent {self.name!r}: tools {approving} need approval, which needs "
                "stateless_checkpointing: the human's answer may reach any instance, so "
                "the waiting task must be in the store")

    def history_annotations(self) -> dict[str, Any]:
        """What a new task's ``ctx.history`` starts with."""
        return {"agent_type": self.agent_type,
                **({"retention_policy": self.retention} if self.retention else {})}

    def annotate(self, ctx: TaskExecutionContext) -> None:
        """Run the history hook on ``ctx`` before a checkpoint (see ``history_hook``)."""
        if self.history_hook is None:
            return
        before = json_copy(ctx.history)
        try:
            self.history_hook(ctx)
            # What it set must make a record, or every checkpoint would fail on it.
            check_annotations(json_copy(ctx.history, "ctx.history"))
        except Exception:
            logger.exception("agent %s: its history hook failed on task %s; the "
                             "checkpoint goes on without what it set", self.name,
                             ctx.task_id)
            ctx.history = before

    @property
    def pauses(self) -> bool:
        """Whether a task of this agent is ever stored (it calls peers, has a tool that
        needs approval, or is checkpointed mid-turn): only then do its instances
        sweep and recover."""
        return (bool(self.peers) or any(t.may_need_approval for t in self.tools)
                or self.checkpoint.mid_turn)

    @functools.cached_property
    def tool_specs(self) -> list[ToolSpec]:
        """What the model is offered: local tools, then one tool per peer (built once;
        every model call of every task passes it)."""
        specs = [ToolSpec(t.name, t.description, t.parameters) for t in self.tools]
        specs += [ToolSpec(p.tool, p.description or f"Ask the {p.agent} agent.", kind="peer")
                  for p in self.peers]
        return specs

    def peer_for_tool(self, tool_name: str) -> Peer | None:
        return next((p for p in self.peers if p.tool == tool_name), None)

    def local_tool(self, tool_name: str) -> LocalTool | None:
        return next((t for t in self.tools if t.name == tool_name), None)


@dataclass(frozen=True)
class RuntimeOptions:
    """How instances talk to the broker and the store. Defaults suit production;
    tests and the demo shorten the intervals."""

    namespace: str = "meshpoint"
    #: How long a resuming instance owns a task before another may take it over.
    lease_ttl_s: float = 30.0
    #: How often the database sweeper looks for expired peer deadlines.
    sweep_interval_s: float = 1.0
    #: How often an instance looks for tasks whose resume lease expired.
    recovery_interval_s: float = 2.0
    #: Ack wait of requests (a task's inbound message) and of answers.
    request_ack_wait_s: float = 60.0
    response_ack_wait_s: float = 30.0
    max_deliver: int = 5
    #: Deliveries one instance handles at once per queue.
    max_in_flight: int = 16
    max_message_bytes: int = 1 << 20

    @property
    def ended_task_memory_s(self) -> float:
        """How long the store remembers that a task ended: twice the longest a copy of
        its request can still be delivered (every delivery's ack wait). A copy that
        comes later than that would start the task again."""
        return 2 * self.request_ack_wait_s * self.max_deliver

    def __post_init__(self) -> None:
        check_name("namespace", self.namespace)
        for name in ("lease_ttl_s", "sweep_interval_s", "recovery_interval_s",
                     "request_ack_wait_s", "response_ack_wait_s"):
            value = getattr(self, name)
            if not (type(value) in (int, float) and value > 0):
                raise InvalidArgumentError(f"{name} must be a number > 0, got {value!r}")
