"""Typed, immutable values the checkpoint store's operations return: a sub-task, a
resolution, a lease, a checkpoint's receipt, a restored task, listings and stats."""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any

from meshpoint.context import TaskExecutionContext


@dataclass(frozen=True, slots=True)
class SubTask:
    """One outstanding (or resolved) item of a paused task's join: a call to a peer
    agent, or a tool call waiting for a human's approval.

    ``correlation_data`` is what the caller registered with
    :meth:`TaskExecutionContext.register_peer_sub_task`, completed with the keys
    meshpoint reads (``invocation_id``, ``function_call_id``, ...).
    ``timeout_deadline`` is an epoch time in seconds; every sub-task has one.
    """

    sub_task_id: str
    task_id: str
    agent_name: str
    invocation_id: str
    function_call_id: str
    peer_agent_name: str | None
    peer_task_id: str | None
    correlation_data: dict[str, Any]
    timeout_deadline: float
    status: str
    resolved_by: str | None = None
    result: Any = None


@dataclass(frozen=True, slots=True)
class Resolution:
    """The outcome of resolving one sub-task (by its answer or by its timeout).

    ``completed``/``total`` count the finished calls of the sub-task's invocation
    (the task's one join) after this resolution. ``join_complete`` is true for
    exactly one resolution per join: the one that finished it, which also moved the
    task to ``resuming``. ``lease_owner`` is set if that resolution asked for the
    resume lease *and got it*: a lease someone else holds (a canceler, say) is
    never taken away, and then ``lease_owner`` is None.
    """

    sub_task: SubTask
    completed: int
    total: int
    lease_owner: str | None = None

    @property
    def join_complete(self) -> bool:
        return self.completed == self.total


@dataclass(frozen=True, slots=True)
class Lease:
    """A held resume lease: ``owner`` may run the task until ``expires_at``."""

    task_id: str
    owner: str
    expires_at: float
    version: int
    #: Take-overs of the task in a row, this one included (``take_over_task``).
    recoveries: int = 0
    #: Whether this take counted as a take-over (a holder's lease had expired).
    taken_over: bool = False
    #: The holder whose lease expired, if this take was a take-over.
    previous_owner: str | None = None


@dataclass(frozen=True, slots=True)
class CheckpointReceipt:
    """What one ``checkpoint_task`` wrote."""

    task_id: str
    version: int
    sub_task_deadlines: dict[str, float]
    events_appended: int
    context_bytes: int
    compressed: bool


@dataclass(frozen=True, slots=True)
class RestoredTask:
    """A paused task read back from the store.

    ``context`` has its pending sub-tasks in ``active_peer_sub_tasks`` and every
    known result (checkpoint-time and resolved since) in ``parallel_tool_calls``.
    """

    context: TaskExecutionContext
    agent_name: str
    status: str
    version: int
    owner: str | None
    lease_expires_at: float | None
    checkpointed_at: float
    expires_at: float | None


@dataclass(frozen=True, slots=True)
class PausedTaskSummary:
    """One row of the operators' listing of paused tasks."""

    task_id: str
    agent_name: str
    status: str
    owner: str | None
    lease_expires_at: float | None
    version: int
    checkpointed_at: float
    pending_sub_tasks: int
    next_deadline: float | None


@dataclass(frozen=True, slots=True)
class StoreStats:
    """Counts for operators: paused tasks by ``(agent_name, status)`` and deadlines.

    ``total`` paused tasks, each counted once in the first of these that matches
    (the recovery statistics): ``expired`` (last checkpointed longer ago than the
    expiry asked for), ``input_required``, ``working`` (running past a mid-turn
    checkpoint, or resuming); the rest wait on peers. Ages are in seconds since the
    last checkpoint.
    """

    paused_tasks: dict[tuple[str, str], int] = field(default_factory=dict)
    pending_sub_tasks: int = 0
    expired_sub_tasks: int = 0
    oldest_checkpointed_at: float | None = None
    next_deadline: float | None = None
    total: int = 0
    expired: int = 0
    input_required: int = 0
    working: int = 0
    oldest_age_s: float | None = None
    mean_age_s: float | None = None

    @property
    def total_paused(self) -> int:
        return sum(self.paused_tasks.values())


def __getattr__(name: str) -> Any:
    """``PeerSubTask``, :class:`SubTask`'s name while a sub-task was always a peer's
    call (approvals are sub-tasks too): still importable, with a warning."""
    if name == "PeerSubTask":
        warnings.warn("meshpoint.store.results.PeerSubTask was renamed SubTask; import that",
                      DeprecationWarning, stacklevel=2)
        return SubTask
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@dataclass(frozen=True, slots=True)
class Blocked:
    """A task ``block_task`` marked blocked: its agent, why, and its addressing (to
    tell its caller; empty if its live row no longer decodes)."""

    task_id: str
    agent_name: str
    reason: str
    a2a_context: dict[str, Any]


@dataclass(frozen=True, slots=True)
class BreakerState:
    """An agent's circuit breaker as the store keeps it (``agent_breakers``): ``state``
    ``closed`` (``failures`` failed resumes counted since ``window_started_at``),
    ``open`` (until ``opened_until``) or ``half_open`` (one trial, ``trial_owner``'s,
    until ``trial_until``)."""

    state: str
    failures: int
    window_started_at: float | None
    opened_until: float | None
    trial_owner: str | None
    trial_until: float | None
