"""Mid-turn checkpoints (docs/runtime.md): a long turn survives a crash without making
again the calls it finished.

A turn of many model and tool calls may be checkpointed, status ``working``, at the
points its agent's :class:`~meshpoint.runtime.agent.CheckpointPolicy` names: after
each local tool call and each approved tool's run (``after_tools``), before each model
call (``before_llm``), and before every ``interval``-th model call (strategy
``interval`` or ``hybrid``). The first such checkpoint stores the task with this
instance holding its lease and then acknowledges its request: from then on the store,
not the broker, keeps the task, and the keeper renews the lease. If the instance dies,
recovery takes the task over when the lease expires and continues it from its last
checkpoint: the model calls and tool calls completed before it are not made again.
With the defaults (strategy ``event``, nothing else on) a task is checkpointed only
when it pauses, and a task that never pauses writes nothing (docs/store.md,
"Guarantees and how they are proven")."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from meshpoint.context import TaskExecutionContext
from meshpoint.errors import (
    CheckpointConflictError,
    LeaseNotHeldError,
    StoreError,
    StoreUnavailableError,
    UnknownTaskError,
)
from meshpoint.runtime.calls import SETTLED
from meshpoint.runtime.scope import Scope
from meshpoint.runtime.stats import InstanceStats
from meshpoint.runtime.tasks import InHand, LeaseOwners, TaskRun

logger = logging.getLogger("meshpoint.runtime")

@dataclass(frozen=True)
class MidTurn:
    """Writes the mid-turn checkpoints of one instance's tasks."""

    scope: Scope
    owners: LeaseOwners
    in_hand: InHand
    stats: InstanceStats
    #: The agent's history hook (Agent.annotate), run before each checkpoint.
    annotate: Callable[[TaskExecutionContext], None]

    async def checkpoint(self, run: TaskRun, *, phase: str | None = None) -> bool:
        """Checkpoint ``run`` as ``working``, keeping its lease (taking one at its first
        checkpoint, then acknowledging its request). False when the run must stop:
        another run of the task is the live one (it was taken over, or a copy of its
        request is running it). A store that fails leaves the run going as before.
        ``phase`` names the record's phase (``error``: a model error retried, its text
        in ``extensions.error``), and writes it even if nothing else is new."""
        ctx = run.ctx
        mark = (len(ctx.session_events),
                sum(c.completed for c in ctx.parallel_tool_calls.values()),
                len(ctx.flags.get(SETTLED) or ()))
        if mark == run.checkpointed_at and phase is None:
            return True  # nothing new since the last one
        first = run.lease_owner is None
        owner = self.owners.next() if run.lease_owner is None else run.lease_owner
        self.annotate(ctx)
        saved = ctx.history
        if phase is not None:
            record = dict(saved.get("record") or {})
            record["execution_state"] = {**(record.get("execution_state") or {}),
                                         "phase": phase}
            if ctx.flags.get("last_error"):
                record["extensions"] = {**(record.get("extensions") or {}),
                                        "error": ctx.flags["last_error"]}
            ctx.history = {**saved, "record": record}
        try:
            return await self._write(run, first, owner, mark)
        finally:
            ctx.history = saved

    async def _write(self, run: TaskRun, first: bool, owner: str,
                     mark: tuple[int, int, int]) -> bool:
        ctx = run.ctx
        try:
            with self.scope.tracing.checkpoint(ctx.task_id, "mid_turn", "working"):
                await self.scope.store.checkpoint_task(
                    ctx, self.scope.agent_name, status="working",
                    lease_owner=None if first else owner, holder=owner,
                    hold_lease_s=self.scope.lease_ttl_s)
        except (CheckpointConflictError, LeaseNotHeldError, UnknownTaskError) as error:
            logger.info("%s: dropping task %s: %s", self.scope.instance_id, ctx.task_id, error)
            self.stats.note("dropped", ctx.task_id)
            run.lost = True
            self.in_hand.forget(run)
            if first and run.delivery is not None:
                await run.delivery.ack()  # the live run is another copy of this request
            return False
        except StoreError as error:
            logger.warning("%s: mid-turn checkpoint of %s failed (%s); going on",
                           self.scope.instance_id, ctx.task_id, error)
            run.maybe_stored = run.maybe_stored or (first and isinstance(
                error, StoreUnavailableError))
            return True
        run.checkpointed_at = mark
        self.stats.counts["mid_turn_checkpoints"] += 1
        if first:
            run.lease_owner = owner
            if run.delivery is not None:
                await run.delivery.ack()
                run.delivery = None
        return True
