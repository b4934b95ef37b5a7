"""The runtime's option groups: how instances run (:class:`RuntimeOptions`), and when
an agent's tasks are checkpointed, recovered and handed off (:class:`CheckpointPolicy`,
:class:`RecoveryPolicy`, :class:`HandoffPolicy`).

Each is one type that both the Python API and the mesh config file use (the file's
``runtime:`` section and an agent's ``checkpoint:`` and ``checkpoint.recovery:``):
its constraints are written once, on its fields (:mod:`meshpoint._validation`). A
bad value built from Python raises :class:`~meshpoint.errors.InvalidArgumentError`
naming the argument; one in the file is told with its key's path.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator
from pydantic.dataclasses import dataclass

from meshpoint._validation import OPTIONS, AtLeastOne, Name, Seconds, checked

Strategy = Literal["event", "interval", "hybrid"]


@checked
@dataclass(frozen=True, config=OPTIONS)
class CheckpointPolicy:
    """When a running turn is checkpointed, besides its pauses (an agent's
    ``checkpoint:`` section). ``event`` checkpoints at pauses only; ``interval`` and
    ``hybrid`` also before every ``interval``-th model call; ``after_tools`` after a
    model call that asks for tools and after each local tool call, so that neither
    is made again after a crash; ``before_llm`` before each model call."""

    strategy: Strategy = "event"
    #: Model calls between checkpoints, with strategy interval or hybrid.
    interval: Annotated[int, Field(ge=0)] = 0
    after_tools: bool = False
    before_llm: bool = False

    @model_validator(mode="after")
    def _interval_of_a_strategy(self) -> CheckpointPolicy:
        if self.strategy != "event" and self.interval == 0:
            raise ValueError(f"checkpoint strategy {self.strategy!r} needs an interval > 0 "
                             "(model calls between checkpoints)")
        return self

    @property
    def mid_turn(self) -> bool:
        """Whether a running turn is ever checkpointed."""
        return self.after_tools or self.before_llm or self.strategy != "event"

    def before_model_call(self, made: int) -> bool:
        """Whether to checkpoint before a task's model call, ``made`` calls made."""
        if self.before_llm:
            return True
        return self.strategy != "event" and made > 0 and made % self.interval == 0


@checked
@dataclass(frozen=True, config=OPTIONS)
class RecoveryPolicy:
    """What recovery does with an agent's stored tasks (an agent's
    ``checkpoint.recovery:`` section).

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
    restarted at once in a fresh context from its reconstruction
    (:mod:`meshpoint.events.reconstruction`), its caller told; off (the default), it waits
    blocked for an operator.

    ``max_recoveries``: how many take-overs in a row (its holder died each time, with
    no progress checkpointed between) a task gets; the next one marks it ``blocked``
    for an operator instead, its caller told and an alert raised (0: no limit).
    ``breaker_failures`` within ``breaker_window_s`` failed resumes of the agent's tasks
    open the agent's circuit breaker, kept in the store and shared by every instance:
    no instance resumes the agent's tasks for ``breaker_cooldown_s``, then exactly one
    is let through (half-open), whose success closes it and whose failure opens it again
    (``breaker_failures: 0``: no breaker). docs/runtime.md, "Recovery limits, the circuit
    breaker and alerts", says what a failed resume is.
    """

    auto_resume: bool = True
    auto_resume_hitl: bool = False
    #: Seconds without a checkpoint after which a task fails (0: never).
    timeout_s: Annotated[float, Field(ge=0, allow_inf_nan=False)] = 86_400.0
    #: Restart a task blocked by its history from its reconstruction.
    reconstruct: bool = False
    #: Take-overs in a row before a task is blocked (0: no limit).
    max_recoveries: Annotated[int, Field(ge=0)] = 3
    #: Failed resumes within the window that open the breaker (0: no breaker).
    breaker_failures: Annotated[int, Field(ge=0)] = 5
    #: The window failed resumes are counted in.
    breaker_window_s: Annotated[float, Field(gt=0, allow_inf_nan=False)] = 60.0
    #: How long an open breaker keeps the agent's tasks paused before one is tried.
    breaker_cooldown_s: Annotated[float, Field(gt=0, allow_inf_nan=False)] = 30.0


@checked
@dataclass(frozen=True, config=OPTIONS)
class AlertOptions:
    """Where an instance's alerts go besides its agent's alert subject and the event
    log (the config file's ``alerts:`` section, for every agent of the mesh):
    ``webhook``, an http(s) URL each alert is POSTed to as JSON, in the background,
    tried ``webhook_attempts`` times (exponential back-off) with ``webhook_timeout_s``
    per try."""

    webhook: Annotated[str | None, Field(pattern=r"^https?://\S+$")] = None
    webhook_timeout_s: Annotated[float, Field(gt=0, allow_inf_nan=False)] = 5.0
    webhook_attempts: Annotated[int, Field(ge=1, le=20)] = 5


@checked
@dataclass(frozen=True, config=OPTIONS)
class Phase:
    """A phase of an agent's work (an item of its ``handoff.phases``): when the model
    says it is complete (the ``complete_phase`` tool), the task hands off to a fresh
    iteration of the next phase, run by that phase's ``agent`` (this agent if None),
    told the phase's ``instruction``."""

    name: Name
    agent: Name | None = None
    instruction: str = ""


#: A threshold of a handoff trigger: a fraction in (0, 1].
Fraction = Annotated[float, Field(gt=0, le=1, allow_inf_nan=False)]
Continuation = Literal["deterministic", "model"]


@checked
@dataclass(frozen=True, config=OPTIONS)
class HandoffPolicy:
    """When a task's iteration ends and a fresh-context one carries it on (an agent's
    ``handoff:`` section; docs/handoff.md). Each trigger is off when set to None:

    ``context_utilization``: hand off before a model call whose prompt would fill more
    than this fraction of the model's context window (the last call's reported prompt
    tokens plus what the conversation gained since, over the model's
    ``context_window``). ``budget_tokens``: the task's token budget, all iterations
    together; past ``budget_warning`` of it the task hands off and the next iteration
    is told what is left; at the whole of it the task is blocked and its caller told.
    ``consecutive_errors``: model errors are retried (each checkpointed, phase
    ``error``) instead of failing the task; more than this many in a row hand off with
    the errors in the continuation prompt. ``explicit``: the model is offered a
    ``handoff(reason)`` tool. ``max_iterations``: a task that would start one more
    iteration than this is blocked instead (an alert, never a loop without end).
    ``continuation``: the continuation prompt is built from the checkpoint
    (``deterministic``) or written by the agent's model (``model``, a call whose answer
    is checkpointed before the handoff, so a crash does not repeat it)."""

    context_utilization: Fraction | None = 0.70
    budget_tokens: Annotated[int, Field(ge=1)] | None = None
    budget_warning: Fraction = 0.80
    consecutive_errors: AtLeastOne | None = 3
    explicit: bool = True
    max_iterations: AtLeastOne = 10
    continuation: Continuation = "deterministic"
    #: The built-in tool's name, if ``explicit``.
    tool_name: Name = "handoff"
    #: The phases of the work, in order (the phase-complete trigger); the first is
    #: where a task starts.
    phases: tuple[Phase, ...] = ()
    #: The built-in tool the model ends a phase with, if there are phases.
    phase_tool_name: Name = "complete_phase"

    @model_validator(mode="after")
    def _distinct_phases(self) -> HandoffPolicy:
        names = [phase.name for phase in self.phases]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"phase names {twice} are used twice")
        if self.phases and self.phase_tool_name == self.tool_name:
            raise ValueError("phase_tool_name and tool_name must differ")
        return self


@checked
@dataclass(frozen=True, config=OPTIONS)
class RuntimeOptions:
    """How instances talk to the broker and the store (the config file's ``runtime:``
    section, whose namespace is the file's). Defaults suit production; tests and the
    demo shorten the intervals."""

    namespace: Name = "meshpoint"
    #: How long a resuming instance owns a task before another may take it over.
    lease_ttl_s: Seconds = 30.0
    #: How often the database sweeper looks for expired peer deadlines.
    sweep_interval_s: Seconds = 1.0
    #: How often an instance looks for tasks whose resume lease expired.
    recovery_interval_s: Seconds = 2.0
    #: Ack wait of requests (a task's inbound message) and of answers.
    request_ack_wait_s: Seconds = 60.0
    response_ack_wait_s: Seconds = 30.0
    #: How long after a pause a peer's request that got no word back is published
    #: again, once, in case its instance died between the checkpoint and the publish
    #: (the broker drops the copy of a request it has: it must be well inside the
    #: broker's dedupe window, or no copy is sent).
    announce_check_s: Seconds = 30.0
    max_deliver: AtLeastOne = 5
    #: Deliveries one instance handles at once per queue.
    max_in_flight: AtLeastOne = 16
    #: The largest message an instance sends or accepts (at least 1 KiB).
    max_message_bytes: Annotated[int, Field(ge=1024)] = 1 << 20

    @property
    def ended_task_memory_s(self) -> float:
        """How long the store remembers that a task ended: twice the longest a copy of
        its request can still be delivered (every delivery's ack wait). A copy that
        comes later than that would start the task again."""
        return 2 * self.request_ack_wait_s * self.max_deliver


__all__ = ["AlertOptions", "CheckpointPolicy", "Continuation", "Fraction", "HandoffPolicy",
           "Phase", "RecoveryPolicy", "RuntimeOptions", "Strategy"]
