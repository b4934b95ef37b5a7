"""The pause boundary (docs/runtime.md): a turn ended with items outstanding.

1. the turn ended with its items registered in the context;
2. one transaction checkpoints the task, its items and the turn's join;
3. only then is each item announced by its kind (a peer's request is published),
   so no answer can arrive for an item no instance can find;
4. then the inbound message is acknowledged; 5. then the task leaves memory.

If the checkpoint fails, or the agent does not checkpoint, the task waits in
memory instead (:mod:`meshpoint.runtime.memory`) and its message stays
un-acknowledged. If the checkpoint is refused because the task is stored already,
another run of it is the live one; if because the task already ended, this run
came from a late copy of its request (the instance that paused it died before
acknowledging it) and is dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from meshpoint.context import TaskExecutionContext
from meshpoint.errors import (
    CheckpointConflictError,
    LeaseNotHeldError,
    StoreError,
    StoreUnavailableError,
    TaskEndedError,
    UnknownSubTaskError,
    UnknownTaskError,
)
from meshpoint.ops.tracing import PAUSED_SPAN, failed, traceparent
from meshpoint.runtime.calls import CallKinds
from meshpoint.runtime.memory import MemoryPath
from meshpoint.runtime.scope import Scope
from meshpoint.runtime.stats import InstanceStats
from meshpoint.runtime.tasks import Background, InHand, TaskRun

logger = logging.getLogger("meshpoint.runtime")


@dataclass(frozen=True)
class PauseBoundary:
    """Pauses the tasks of one instance. ``cancel_stored(task_id)`` cancels a stored
    task (for a cancel that reached the task during its boundary)."""

    scope: Scope
    checkpointing: bool
    kinds: CallKinds
    memory: MemoryPath
    in_hand: InHand
    stats: InstanceStats
    background: Background
    cancel_stored: Callable[[str], Awaitable[str]]
    #: The agent's history hook (Agent.annotate), run before each checkpoint.
    annotate: Callable[[TaskExecutionContext], None]

    async def pause(self, run: TaskRun, sub_task_ids: list[str],
                    go_on: Callable[[TaskRun], None]) -> None:
        """Pause ``run``, whose turn opened the items ``sub_task_ids``; a task that
        waits in memory continues by ``go_on(run)`` when its join completes."""
        ctx = run.ctx
        ctx.flags["paused_at"] = self.scope.clock()
        ctx.flags["paused_by"] = self.scope.instance_id
        if not self.checkpointing or not await self._checkpoint(run, sub_task_ids):
            await self.memory.wait(run, sub_task_ids, go_on)
            if run.maybe_stored:
                await self._end_announcement_checks(sub_task_ids)

    async def _end_announcement_checks(self, sub_task_ids: list[str]) -> None:
        """The checkpoint may have committed: its calls, asked at this instance's inbox,
        must not be published again by an announcement check (their answers come here,
        not to the stored rows). A status update's reset ends a check; best effort (a
        store still down leaves the row to its check)."""
        for sub_task_id in sub_task_ids:
            with contextlib.suppress(StoreError, UnknownSubTaskError):
                await self.scope.store.reset_timeout_deadline(sub_task_id)

    async def _checkpoint(self, run: TaskRun, sub_task_ids: list[str]) -> bool:
        """Steps 2-5; False if the task must wait in memory instead."""
        ctx = run.ctx
        started = time.perf_counter()
        status = self.kinds.pause_status([ctx.active_peer_sub_tasks[s] for s in sub_task_ids])
        self.annotate(ctx)
        with self.scope.tracing.checkpoint(ctx.task_id, "pause", status) as span:
            # The resumed turn links to this span, wherever it runs.
            if (paused_span := traceparent(span)) is not None:
                ctx.flags[PAUSED_SPAN] = paused_span
            # Shielded so that a write still in flight when this instance is killed is
            # counted once it commits (it commits either way: it runs in the database).
            write = asyncio.ensure_future(self.scope.store.checkpoint_task(
                ctx, self.scope.agent_name, status=status, lease_owner=run.lease_owner))
            write.add_done_callback(self._count_checkpoint)
            try:
                await asyncio.shield(write)
            except (CheckpointConflictError, LeaseNotHeldError, UnknownTaskError) as error:
                span.set_attribute("meshpoint.checkpoint.refused", type(error).__name__)
                await self._refused(run, error)
                return True
            except StoreError as error:
                logger.warning("%s: checkpoint of %s failed (%s); it waits in memory",
                               self.scope.instance_id, ctx.task_id, error)
                failed(span, error)
                run.maybe_stored = run.lease_owner is None and isinstance(
                    error, StoreUnavailableError)
                return False
        write_s = time.perf_counter() - started
        self.stats.checkpoint_ms.append(write_s * 1000)
        self.stats.note("paused", ctx.task_id, status=status, items=sub_task_ids,
                        write_s=write_s)
        try:
            await self.kinds.announce(ctx, sub_task_ids)
            for sub_task_id in sub_task_ids:
                corr = ctx.active_peer_sub_tasks.get(sub_task_id) or {}
                self.stats.log("protocol_handoff", ctx.task_id,
                               step=corr.get("peer_agent_name") or "approval",
                               output={"sub_task_id": sub_task_id, **corr})
        except Exception as error:
            # The checkpoint holds the items: each times out and the task goes on.
            logger.error("%s: items of task %s not announced (%s); they will time out",
                         self.scope.instance_id, ctx.task_id, error)
        if run.delivery is not None:
            await run.delivery.ack()
        self.in_hand.forget(run)
        if ctx.cancellation_event.is_set():
            # A cancel reached us during the boundary: apply it to the stored task.
            self.background.spawn(self._cancel_after_boundary(ctx.task_id))
        return True

    async def _refused(self, run: TaskRun, error: StoreError) -> None:
        """Another instance has this task: a redelivered request ran twice, or our
        lease expired and was taken over. Theirs is the live copy."""
        ctx = run.ctx
        logger.info("%s: dropping task %s: %s", self.scope.instance_id, ctx.task_id, error)
        self.stats.note("dropped", ctx.task_id)
        self.in_hand.forget(run)
        if isinstance(error, TaskEndedError):
            pass  # a late copy of the request of a task that ended: nothing to redo
        elif isinstance(error, CheckpointConflictError):
            if run.lease_owner is not None:
                # Refused (e.g. calls still open after a cancel): let it go.
                with contextlib.suppress(StoreError):
                    await self.scope.store.release_resume_lease(ctx.task_id, run.lease_owner)
            else:
                # Our request was redelivered: its first run checkpointed but may have
                # died before announcing. Announce the stored items again (the broker
                # drops, by its msg_id, the request of one announced before).
                await self._announce_stored(run)
        if run.delivery is not None:
            await run.delivery.ack()

    async def _announce_stored(self, run: TaskRun) -> None:
        try:
            stored = await self.scope.store.get_peer_sub_tasks_for_task(run.ctx.task_id)
        except StoreError:
            return  # the items still time out
        # The stored items, not this run's (its turn opened items of its own).
        stored_ctx = TaskExecutionContext(run.ctx.task_id, run.ctx.a2a_context)
        stored_ctx.active_peer_sub_tasks = {sub.sub_task_id: sub.correlation_data
                                            for sub in stored if sub.status == "pending"}
        await self.kinds.announce(stored_ctx, list(stored_ctx.active_peer_sub_tasks))

    async def _cancel_after_boundary(self, task_id: str) -> None:
        try:
            await self.cancel_stored(task_id)
        except StoreError as error:
            logger.warning("%s: cancel of %s failed: %s", self.scope.instance_id, task_id, error)

    def _count_checkpoint(self, write: asyncio.Future[Any]) -> None:
        if not write.cancelled() and write.exception() is None:
            self.stats.counts["checkpoints"] += 1
