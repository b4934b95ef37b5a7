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
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Annotated, Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError
from pydantic import Field
from pydantic.dataclasses import dataclass as pydantic_dataclass

from meshpoint._json import json_copy
from meshpoint._validation import (
    OPTIONS,
    AtLeastOne,
    FiniteSeconds,
    Name,
    Seconds,
    check,
    check_name,
    check_output_key,
    checked,
)
from meshpoint.context import TaskExecutionContext
from meshpoint.errors import InvalidArgumentError
from meshpoint.history.planning import check_annotations, parse_retention
from meshpoint.llm.base import Model, ToolSpec
from meshpoint.runtime.options import (
    CheckpointPolicy,
    HandoffPolicy,
    Phase,
    RecoveryPolicy,
    RuntimeOptions,
)

if TYPE_CHECKING:
    from meshpoint.runtime.stages import Workflow

logger = logging.getLogger("meshpoint.runtime")

#: What an agent's records in the checkpoint history say it is.
AgentType = Annotated[str, Field(min_length=1, max_length=64)]

ToolFunction = Callable[..., Any | Awaitable[Any]]
#: What the model is told of the built-in handoff tool.
HANDOFF_TOOL_DESCRIPTION = (
    "Hand this task to a fresh context: call it when your context is getting long or "
    "muddled, or a phase of the work is done. The next iteration starts from a summary "
    "of what was accomplished and what remains, not from this conversation.")
#: What the model is told of the built-in tool that ends a phase.
PHASE_TOOL_DESCRIPTION = (
    "Say that the current phase of the work is complete, with a summary of what it "
    "produced: the next phase starts in a fresh context from that summary.")
#: Whether a call needs approval, from its arguments.
ApprovalPredicate = Callable[[dict[str, Any]], bool]


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
        check(FiniteSeconds, f"tool {self.name!r}: approval_timeout_s",
              self.approval_timeout_s)
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


@checked
@pydantic_dataclass(frozen=True, config=OPTIONS)
class Peer:
    """Another agent this agent may call (an item of an agent's ``peers:`` in the
    config file), and how long to wait for its answer.

    ``timeout_s`` runs from the checkpoint that records the call; every status
    update from the peer restarts it.
    """

    agent: Name
    description: str = ""
    #: Seconds to wait for the answer, counted from the checkpoint (status updates
    #: restart it).
    timeout_s: Seconds = 600.0
    #: The tool the model calls to ask it (default ``ask_<agent>``).
    tool_name: Name | None = None

    @property
    def tool(self) -> str:
        return self.tool_name or f"ask_{self.agent}"


@dataclass(frozen=True)
class Agent:
    """An agent definition.

    ``stateless_checkpointing`` chooses what happens when a turn calls peers. On
    (the default; docs/runtime.md, "Deliberate changes from the original design"):
    the task is checkpointed, its inbound message acknowledged and the task
    forgotten, and any instance continues it. Off: the task waits in the memory of
    its instance, whose peers answer to that instance's inbox (docs/runtime.md,
    "Where each path lives"); nothing is written.
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
    #: When a running turn is checkpointed besides its pauses (docs/runtime.md,
    #: "Mid-turn checkpoints"); by default never, so that a task that never pauses
    #: writes nothing.
    checkpoint: CheckpointPolicy = field(default_factory=lambda: CheckpointPolicy())
    #: What recovery does with this agent's stored tasks (docs/runtime.md,
    #: "Recovery and statistics").
    recovery: RecoveryPolicy = field(default_factory=lambda: RecoveryPolicy())
    #: What the checkpoint history records of this agent (docs/history.md): its kind
    #: (architecture, implementation, qa, documentation, or anything else).
    agent_type: str = "general"
    #: The retention policy of its tasks' records (``days:N``, ``last:N``, ``hold``);
    #: None: the store's.
    retention: str | None = None
    #: Called with a task's context before each of its checkpoints, to add to its
    #: history record what only the agent knows: set ``ctx.history["record"]`` to a
    #: partial record (``context_summary``, ``execution_state``, ``recovery``,
    #: ``metrics``, ``extensions``; see :mod:`meshpoint.history.planning`). An error
    #: in it, or a record it sets that is not valid, is logged and the checkpoint
    #: goes on without what it set.
    history_hook: Callable[[TaskExecutionContext], None] | None = None
    #: Keep an event log of every step and protocol message of this agent's tasks
    #: (docs/events.md; :mod:`meshpoint.events.log`), written off the hot path.
    events: bool = False
    #: When a task's iteration hands off to a fresh-context one (docs/handoff.md);
    #: None (the default): never, the conversation grows until ``max_turns``.
    handoff: HandoffPolicy | None = None
    #: Where a workflow that calls this agent stores its answer (ADK's name; default:
    #: the agent's name; docs/workflows.md).
    output_key: str | None = None
    #: A workflow agent's stages (set by SequentialAgent, ParallelAgent and LoopAgent,
    #: :mod:`meshpoint.runtime.workflows`); None: the agent's model plans its turns.
    workflow: Workflow | None = None

    def __post_init__(self) -> None:
        check_name("an agent name", self.name)
        if self.output_key is not None:
            check_output_key(f"agent {self.name!r}: output_key", self.output_key)
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
        check(AtLeastOne, f"agent {self.name!r}: max_turns", self.max_turns)
        check(AgentType, f"agent {self.name!r}: agent_type", self.agent_type)
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
        if self.handoff is not None:
            if not isinstance(self.handoff, HandoffPolicy):
                raise InvalidArgumentError(
                    f"agent {self.name!r}: handoff must be a HandoffPolicy, got "
                    f"{self.handoff!r}")
            if not self.stateless_checkpointing:
                raise InvalidArgumentError(
                    f"agent {self.name!r}: handoff needs stateless_checkpointing: the next "
                    "iteration starts on any instance, from the store")
            for builtin, used in ((self.handoff.tool_name, self.handoff.explicit),
                                  (self.handoff.phase_tool_name, bool(self.handoff.phases))):
                if used and builtin in names:
                    raise InvalidArgumentError(
                        f"agent {self.name!r}: the built-in tool {builtin!r} of its "
                        "handoff has the name of one of its tools (rename it in handoff:)")
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
                or self.checkpoint.mid_turn or self.handoff is not None)

    @functools.cached_property
    def tool_specs(self) -> list[ToolSpec]:
        """What the model is offered: local tools, then one tool per peer (built once;
        every model call of every task passes it)."""
        specs = [ToolSpec(t.name, t.description, t.parameters) for t in self.tools]
        specs += [ToolSpec(p.tool, p.description or f"Ask the {p.agent} agent.", kind="peer")
                  for p in self.peers]
        if self.handoff is not None and self.handoff.explicit:
            specs.append(ToolSpec(self.handoff.tool_name, HANDOFF_TOOL_DESCRIPTION, {
                "type": "object", "properties": {"reason": {"type": "string"}},
                "required": ["reason"]}, kind="handoff"))
        if self.handoff is not None and self.handoff.phases:
            specs.append(ToolSpec(self.handoff.phase_tool_name, PHASE_TOOL_DESCRIPTION, {
                "type": "object", "properties": {"summary": {"type": "string"}},
                "required": ["summary"]}, kind="phase"))
        return specs

    def peer_for_tool(self, tool_name: str) -> Peer | None:
        return next((p for p in self.peers if p.tool == tool_name), None)

    def local_tool(self, tool_name: str) -> LocalTool | None:
        return next((t for t in self.tools if t.name == tool_name), None)


__all__ = ["Agent", "AgentType", "ApprovalPredicate", "CheckpointPolicy", "HandoffPolicy",
           "LocalTool", "Peer", "Phase",
           "RecoveryPolicy", "RuntimeOptions", "ToolCallInfo", "ToolFunction", "check_name"]
