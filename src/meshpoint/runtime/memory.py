"""The in-memory path (docs/runtime.md): a task that waits in its instance's memory.

Used when an agent does not checkpoint (``stateless_checkpointing=False``) and when
a checkpoint fails. The outstanding items are announced with this instance's inbox
as their reply subject, in-memory timers enforce their deadlines, and claims run
under the context's lock, so of an answer and a timeout racing on this instance
only the first resolves the item. When the join completes, the task goes on here.
Its inbound message stays un-acknowledged meanwhile (the keeper extends it), so
that a crash of this instance has it redelivered.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from meshpoint.runtime.calls import CallKinds
from meshpoint.runtime.stats import InstanceStats
from meshpoint.runtime.tasks import Background, InHand, TaskRun
from meshpoint.store.base import TIMEOUT_RESULT

logger = logging.getLogger("meshpoint.runtime")


@dataclass(frozen=True)
class MemoryPath:
    """Tasks waiting in one instance's memory. A task whose join completes goes on
    by the ``go_on`` its pause gave :meth:`wait` (the turn loop's)."""

    in_hand: InHand
    kinds: CallKinds
    stats: InstanceStats
    background: Background
    inbox: str

    async def wait(self, run: TaskRun, sub_task_ids: list[str],
                   go_on: Callable[[TaskRun], None]) -> None:
        """Keep ``run`` in memory until its items are resolved, then ``go_on(run)``;
        announce them."""
        ctx = run.ctx
        run.waiting, run.go_on = True, go_on
        self.stats.note("paused_in_memory", ctx.task_id)
        for sub_task_id in sub_task_ids:
            corr = ctx.active_peer_sub_tasks[sub_task_id]
            self.in_hand.memory_subs[sub_task_id] = ctx.task_id
            self.schedule_timeout(run, sub_task_id, corr["timeout_s"])
        await self.kinds.announce(ctx, sub_task_ids, inbox=self.inbox)

    def schedule_timeout(self, run: TaskRun, sub_task_id: str, timeout_s: float) -> None:
        old = run.timers.pop(sub_task_id, None)
        if old is not None:
            old.cancel()
        loop = asyncio.get_running_loop()
        run.timers[sub_task_id] = loop.call_later(
            timeout_s, lambda: self.background.spawn(self._timeout(run, sub_task_id)))

    def progress(self, run: TaskRun, sub_task_id: str, peer_task_id: str | None) -> None:
        """A status update for an item waited on in memory: its deadline restarts."""
        corr = run.ctx.active_peer_sub_tasks.get(sub_task_id)
        if corr is None:
            return
        if peer_task_id:
            corr["peer_task_id"] = peer_task_id
        self.schedule_timeout(run, sub_task_id, corr["timeout_s"])

    async def _timeout(self, run: TaskRun, sub_task_id: str) -> None:
        corr = run.ctx.active_peer_sub_tasks.get(sub_task_id)
        if self.resolve(run, sub_task_id, dict(TIMEOUT_RESULT)) and corr:
            self.stats.note("timeout", run.ctx.task_id)
            await self.kinds.withdraw(sub_task_id, corr)

    def resolve(self, run: TaskRun, sub_task_id: str, result: dict[str, Any]) -> bool:
        """Claim under the context's lock, record, and go on when the join is done.
        Returns False for a duplicate or late resolution."""
        ctx = run.ctx
        corr = ctx.claim_sub_task_completion(sub_task_id)
        if corr is None:
            self.stats.note("ignored_answer", sub_task_id)
            return False
        self.in_hand.memory_subs.pop(sub_task_id, None)
        handle = run.timers.pop(sub_task_id, None)
        if handle is not None:
            handle.cancel()
        completed, total = ctx.record_parallel_result(corr["invocation_id"],
                                                      corr["function_call_id"], result)
        if completed == total and run.waiting and run.go_on is not None:
            run.waiting, go_on, run.go_on = False, run.go_on, None
            go_on(run)
        return True
