"""The checkpoint store's contract: what the runtime sees of a store.

:class:`~meshpoint.store.sqlstore.SqlStore` (SQLite and PostgreSQL) implements it; the
runtime is written against :class:`Store` only, as it is against
:class:`~meshpoint.broker.base.Broker` for messages.

Every operation is one transaction: it commits whole or changes nothing. Ids
(task, sub-task, invocation, call, owner) are caller-chosen strings of 1-255
characters, unique per tenant, and a store never sees another tenant's rows. Two
rules hold for every operation:

* **An id the tenant does not have** (never stored, already cleaned up, or another
  tenant's) raises a :class:`~meshpoint.errors.NotFoundError` subclass:
  :class:`~meshpoint.errors.UnknownTaskError`,
  :class:`~meshpoint.errors.UnknownSubTaskError`,
  :class:`~meshpoint.errors.UnknownInvocationError` or
  :class:`~meshpoint.errors.UnknownCallError`.
* **``None`` (or ``False``)** means the id is known and there was nothing to do:
  the sub-task was already resolved (a duplicate or late answer), or the lease is
  someone else's.

Malformed arguments raise :class:`~meshpoint.errors.InvalidArgumentError` before
any I/O; a write that would break an invariant raises a
:class:`~meshpoint.errors.ConflictError`; a row that does not decode raises
:class:`~meshpoint.errors.CorruptCheckpointError` and is never used.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from sqlalchemy import Connection

from meshpoint.context import TaskExecutionContext
from meshpoint.store.results import (
    Blocked,
    CheckpointReceipt,
    Lease,
    PausedTaskSummary,
    Resolution,
    RestoredTask,
    StoreStats,
    SubTask,
)
from meshpoint.store.schema import TASK_STATUSES

if TYPE_CHECKING:
    from meshpoint.history import HistoryOptions
    from meshpoint.history.record import CheckpointRecord
    from meshpoint.history.verification import ChainReport
    from meshpoint.store.breakers import Breakers, RecoveryLimits

__all__ = ["TASK_STATUSES", "TIMEOUT_RESULT", "Store", "Transactional", "VerifiedHistory"]

R = TypeVar("R")

#: The result a sub-task resolved by its deadline carries.
TIMEOUT_RESULT: dict[str, Any] = {"status": "timeout",
                                  "error": "the peer did not answer before the deadline"}


class Transactional(Protocol):
    """What a part built on a store (the event log, say) needs of it:
    its tenant, and transactions of that tenant in which to run named statements of
    its own (:meth:`SqlStore.transaction <meshpoint.store.sqlstore.SqlStore.transaction>`)."""

    tenant_id: str

    async def transaction(self, body: Callable[[Connection], R], *, write: bool = False,
                          doing: str = "running a transaction", short: bool = False) -> R:
        """Run ``body(connection)`` in one transaction of this tenant, return its result."""
        ...


class VerifiedHistory(Protocol):
    """What a reconstruction (:mod:`meshpoint.events.reconstruction`) reads of a store's
    checkpoint history (:class:`~meshpoint.store.history_store.HistoryStore`)."""

    @property
    def options(self) -> HistoryOptions:
        """How the history is kept and verified (keys, signatures required or not)."""
        ...

    async def last_verified(self, task_id: str) -> tuple[ChainReport, CheckpointRecord | None]:
        """The walk of the task's chain, and its newest record that verified with
        every record before it (None if none did)."""
        ...


class Store(Transactional, Protocol):
    """The checkpoint store of one tenant (see the module docstring for the rules
    every operation follows). Its transactions (:class:`Transactional`) serve the
    parts built on it, its :attr:`history` a task's reconstruction."""

    tenant_id: str
    #: The tenant's checkpoint history.
    history: VerifiedHistory
    #: The agents' circuit breakers, shared by every instance (docs/runtime.md,
    #: "Recovery limits, the circuit breaker and alerts").
    breakers: Breakers
    #: Recovery's counted take-overs (``take_over_task``) and an operator's take of a
    #: task (``take_task_by_hand``): :class:`~meshpoint.store.breakers.RecoveryLimits`.
    recovery: RecoveryLimits

    # -- checkpoint ---------------------------------------------------------------------

    async def checkpoint_task(self, ctx: TaskExecutionContext, agent_name: str, *,
                              status: str = "waiting_peers", default_timeout_s: float = 600.0,
                              expires_at: float | None = None,
                              lease_owner: str | None = None, holder: str | None = None,
                              hold_lease_s: float = 30.0) -> CheckpointReceipt:
        """Persist a paused task: the task row, its pending peer sub-tasks (each with
        a ``timeout_deadline``), its parallel invocations, and the conversation
        events appended since the previous checkpoint.

        A first checkpoint inserts the task (:class:`~meshpoint.errors.
        CheckpointConflictError` if it or a sub-task id is already stored,
        :class:`~meshpoint.errors.TaskEndedError` if the task already ended and is
        still remembered, see :meth:`forget_ended_tasks`); a stored
        task is checkpointed again only by the holder of its resume lease
        (``lease_owner``), once its join completed, and the write releases the
        lease (UnknownTaskError if it is not stored, LeaseNotHeldError if the lease
        is another's). A task never changes agent: ``agent_name`` is written by the
        first checkpoint, and a later one for another agent raises WrongAgentError.
        Each sub-task times out after its correlation data's
        ``timeout_s``, or ``default_timeout_s``. On success
        ``ctx.session_events_persisted`` is advanced.

        A *mid-turn* checkpoint (status ``working``; docs/runtime.md, "Mid-turn
        checkpoints") is taken by a task that keeps running: ``holder`` keeps the lease for
        ``hold_lease_s`` (a first checkpoint stores the task leased to ``holder``; a
        resumed task's holder is its ``lease_owner``). Its current invocation may
        have calls still to make. If the holder dies, the lease expires and
        :meth:`resumable_tasks` lists the task.
        """
        ...

    # -- resolving sub-tasks ------------------------------------------------------------

    async def resolve_peer_sub_task(self, sub_task_id: str, result: Any, *,
                                    resolved_by: str = "answer", lease_owner: str | None = None,
                                    lease_ttl_s: float = 30.0,
                                    agent_name: str | None = None) -> Resolution | None:
        """Claim a sub-task **and** record its result (any JSON value) at once.

        Returns the :class:`Resolution` for the first call, ``None`` for every later
        one (a duplicate answer, or an answer that lost to its timeout);
        UnknownSubTaskError for an unknown id; with ``agent_name``, WrongAgentError
        for a sub-task of another agent's task (an answer sent to the wrong agent's
        subject), nothing written. If this resolution completes the join the task
        becomes ``resuming``; with ``lease_owner`` the same transaction gives that
        owner the resume lease for ``lease_ttl_s``, if nobody holds it.
        """
        ...

    async def claim_peer_sub_task(self, sub_task_id: str) -> SubTask | None:
        """Claim a sub-task without a result (the first of two steps): the sub-task
        for the first caller, ``None`` once it is claimed or resolved;
        UnknownSubTaskError for an unknown id.

        The claimed call counts towards its join only once
        :meth:`record_parallel_result` records its result, and its deadline still
        runs; prefer :meth:`resolve_peer_sub_task`, which does both at once.
        """
        ...

    async def record_parallel_result(self, task_id: str, invocation_id: str,
                                     function_call_id: str, result: Any, *,
                                     lease_owner: str | None = None,
                                     lease_ttl_s: float = 30.0) -> Resolution | None:
        """Record the result of a call claimed with :meth:`claim_peer_sub_task` and
        count it on its join, as :meth:`resolve_peer_sub_task` does.

        ``None`` if the call was resolved meanwhile (its deadline passed before the
        result was recorded, or the result was already recorded). UnknownTaskError
        or UnknownCallError for an unknown task or call; CheckpointConflictError for
        a call that was never claimed.
        """
        ...

    async def sweep_expired_timeouts(self, agent_name: str, limit: int = 100, *,
                                     lease_owner: str | None = None,
                                     lease_ttl_s: float = 30.0) -> list[Resolution]:
        """Resolve up to ``limit`` of ``agent_name``'s open sub-tasks whose deadline
        passed with :data:`TIMEOUT_RESULT`, one :class:`Resolution` each; a join
        completed makes its task ``resuming`` (leased to ``lease_owner`` if given and
        free). A task whose rows are corrupt is quarantined, not allowed to stop the
        sweep."""
        ...

    async def check_announcements(self, agent_name: str, limit: int = 100) -> list[SubTask]:
        """Take up to ``limit`` of ``agent_name``'s pending sub-tasks whose
        announcement check is due (a deadline of ``announce_check_s`` in the
        correlation data, earlier than the timeout, passed with no word from the
        peer): each one's deadline becomes its timeout's, and they are returned, for
        their requests to be published again. Each is returned once."""
        ...

    async def reset_timeout_deadline(self, sub_task_id: str, *, timeout_s: float | None = None,
                                     peer_task_id: str | None = None) -> float | None:
        """Restart a pending sub-task's deadline at now + its timeout (a status update
        from the peer), claiming nothing. ``timeout_s`` replaces the timeout;
        ``peer_task_id`` records the peer's own task id for a later cancel. Returns
        the new deadline, ``None`` if the sub-task is no longer pending;
        UnknownSubTaskError for an unknown id."""
        ...

    # -- leases -------------------------------------------------------------------------

    async def take_resume_lease(self, task_id: str, owner: str, ttl_s: float, *,
                                statuses: Sequence[str] = ("resuming",),
                                agent_name: str | None = None) -> Lease | None:
        """Take the right to resume a task for ``ttl_s`` seconds, if its status is in
        ``statuses`` and its lease is free, expired, or already ``owner``'s; the
        status becomes ``resuming``. ``None`` otherwise; UnknownTaskError for an
        unknown task; with ``agent_name``, WrongAgentError for another agent's task
        (nothing written). Taking is re-entrant for the same ``owner``, so an owner names
        one resume attempt, not an instance that may resume a task twice at once."""
        ...

    async def renew_resume_lease(self, task_id: str, owner: str, ttl_s: float) -> Lease | None:
        """Extend ``owner``'s lease to now + ``ttl_s``; ``None`` if it no longer holds
        it; UnknownTaskError for an unknown task."""
        ...

    async def release_resume_lease(self, task_id: str, owner: str) -> bool:
        """Give the lease up so any instance may take it now; ``False`` if ``owner``
        does not hold it; UnknownTaskError for an unknown task."""
        ...

    # -- recovery limits and the breaker (docs/runtime.md, "Recovery limits, ...") -----

    async def block_task(self, task_id: str, *, lease_owner: str, reason: str) -> Blocked:
        """Mark the task ``blocked`` for an operator and release its lease, for the
        holder of the lease, with a history record of phase ``blocked`` saying
        ``reason`` (with the history on). Nothing is resumed from it until an operator
        resumes it (:meth:`take_task_by_hand`); its caller is told by the runtime, from
        the returned addressing. LeaseNotHeldError unless ``lease_owner`` holds it."""
        ...

    # -- reads --------------------------------------------------------------------------

    async def restore_task(self, task_id: str, *, lease_owner: str | None = None,
                           verify: bool = True) -> RestoredTask:
        """Read a paused task back as a live context, with its conversation, pending
        sub-tasks and every known result. UnknownTaskError for an unknown task; with
        ``lease_owner``, LeaseNotHeldError unless that owner holds the lease.

        With the checkpoint history on, the task is verified against it first
        (:mod:`meshpoint.store.history_restore`): restored from its history if its live row
        fails, rewound to its last verified checkpoint by the lease holder if its
        last record fails, or blocked (TaskBlockedError) if its chain is broken; a
        read without a lease raises HistoryIntegrityError instead. ``verify=False`` checks
        the live row's own checksum only (to end a task whatever its history)."""
        ...

    async def check_signing_key(self, task_id: str) -> None:
        """KeyMissingError if a restore of the task under a lease would raise it: its
        history is signed (or this store requires signatures) and this store has no
        active signing key. For an instance to leave such a task to one that holds
        the key before it takes the task's lease (which would make it ``resuming``).
        UnknownTaskError for an unknown task."""
        ...

    async def restart_task(self, ctx: TaskExecutionContext, agent_name: str, *,
                           lease_owner: str, reason: str) -> None:
        """Make ``ctx`` (a fresh context) the live state of its task, for the holder of
        its lease: its conversation, joins and items replaced, the task ``resuming``
        under that lease, and the history told why (a ``restarted`` record, an
        ``integrity_restarted`` event). For a task that cannot be resumed from its
        checkpoint (:mod:`meshpoint.events.reconstruction`). LeaseNotHeldError unless
        ``lease_owner`` holds the lease."""
        ...

    async def begin_iteration(self, ctx: TaskExecutionContext, agent_name: str, *,
                              lease_owner: str, handoff: dict[str, Any]) -> None:
        """Start a handoff's next iteration (docs/handoff.md): make ``ctx``, a fresh
        context, the live state of its task for the holder of its lease, as
        :meth:`restart_task` does, with a record of phase ``iteration`` whose
        ``extensions.handoff_received`` is ``handoff`` (the handoff record it read)
        and an ``agent_handoff_received`` event, in one transaction.
        LeaseNotHeldError unless ``lease_owner`` holds the lease."""
        ...

    async def get_peer_sub_task(self, sub_task_id: str) -> SubTask:
        """One sub-task, without claiming it; UnknownSubTaskError for an unknown id."""
        ...

    async def get_peer_sub_tasks_for_task(self, task_id: str) -> list[SubTask]:
        """Every sub-task of a paused task, pending and resolved (to cancel its peers,
        say); UnknownTaskError for an unknown task."""
        ...

    async def get_parallel_results(self, task_id: str,
                                   invocation_id: str) -> list[tuple[str, Any]]:
        """``(function_call_id, result)`` of an invocation's finished calls, in the
        model's call order; UnknownTaskError or UnknownInvocationError for an unknown
        task or invocation."""
        ...

    # -- ending a task, and operators ---------------------------------------------------

    async def cleanup_task(self, task_id: str, *, lease_owner: str | None = None,
                           outcome: str = "completed",
                           ctx: TaskExecutionContext | None = None,
                           agent_name: str | None = None) -> None:
        """Delete every live row of a task (it completed, failed, was canceled or
        expired: ``outcome``), and remember that it ended, so that a late copy of its
        request cannot store it again. With the checkpoint history on, the same
        transaction appends the task's last record (its final state from ``ctx``, if
        given) and marks its history ended. UnknownTaskError for an unknown task; with
        ``lease_owner``, only that lease holder may do it (LeaseNotHeldError
        otherwise). ``agent_name``, the task's agent if the caller knows it, lets a
        lease holder's end be one statement on PostgreSQL (a wrong one only costs
        that)."""
        ...

    async def task_known(self, task_id: str, agent_name: str) -> bool:
        """Whether ``agent_name``'s task ``task_id`` is paused, or ended recently
        enough to be remembered (see :meth:`forget_ended_tasks`): how an answer whose
        sub-task is gone is told a late one from one no task of the tenant waited
        for."""
        ...

    async def forget_ended_tasks(self, agent_name: str, *, older_than_s: float) -> int:
        """Forget ``agent_name``'s tasks that ended more than ``older_than_s`` ago
        (once no copy of their requests can come back); returns how many. Until then
        a first checkpoint of such a task raises TaskEndedError."""
        ...

    async def resumable_tasks(self, agent_name: str, *, limit: int = 100) -> list[str]:
        """Ids of ``agent_name``'s tasks whose join completed, or that were
        checkpointed mid-turn, and that nobody is resuming: no lease was granted, or
        its holder let it expire (it crashed). Recovery takes their leases with
        :meth:`take_resume_lease` (``statuses=("resuming", "working")``)."""
        ...

    async def expired_tasks(self, agent_name: str, *, older_than_s: float,
                            limit: int = 100) -> list[str]:
        """Ids of ``agent_name``'s tasks last checkpointed strictly more than
        ``older_than_s`` ago that nobody holds a lease on, oldest first: recovery
        fails them (the agent's ``recovery.timeout``)."""
        ...

    async def list_paused_tasks(self, *, agent_name: str | None = None,
                                status: str | None = None,
                                limit: int = 100) -> list[PausedTaskSummary]:
        """Paused tasks, oldest checkpoint first, with their open sub-tasks and next
        deadline."""
        ...

    async def tasks_page(self, *, after: str = "", prefix: str = "",
                         agent_name: str | None = None, status: str | None = None,
                         limit: int = 50) -> list[PausedTaskSummary]:
        """One page of paused tasks in id order: those after ``after`` (the last id of
        the page before; ``""`` for the first page) whose id starts with ``prefix``,
        optionally of one agent and one status, at most ``limit``, each with its open
        sub-tasks (``next_deadline`` is not read: None). Keyset paging on the primary
        key, so a page costs the same however many tasks there are."""
        ...

    async def next_deadlines(self, *, agent_name: str | None = None,
                             limit: int = 10) -> list[SubTask]:
        """The open sub-tasks that expire soonest."""
        ...

    async def stats(self, *, expire_after_s: float = 0.0) -> StoreStats:
        """Paused tasks by ``(agent_name, status)``, open and expired sub-tasks, the
        oldest checkpoint and the next deadline; and the recovery counts (see
        :class:`~meshpoint.store.results.StoreStats`), a task counting as expired when
        last checkpointed strictly more than ``expire_after_s`` ago (0: never)."""
        ...

    async def live_row_counts(self) -> dict[str, int]:
        """Rows of every live table, across tenants: all zero once every task has
        ended (the check that nothing was left behind)."""
        ...

    async def close(self) -> None:
        """Release the store's connections."""
        ...
