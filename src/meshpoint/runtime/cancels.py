"""Cancel, wherever the task is: in this instance's memory, stored, or running
elsewhere.

A cancel reaches any instance. A task in its memory is canceled there (a running
turn stops at its next step). A stored task is canceled under its lease: its rows
are deleted first, so that no answer, sweep or recovery can revive it; then its
outstanding items are withdrawn and its caller is answered ``canceled``. A task
running on another instance is told by a broadcast to every instance of the agent.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass
from typing import Protocol

from meshpoint import a2a
from meshpoint.broker.base import Delivery
from meshpoint.context import TaskExecutionContext
from meshpoint.errors import (
    BadMessageError,
    CorruptCheckpointError,
    HistoryIntegrityError,
    KeyMissingError,
    StoreError,
    TaskBlockedError,
    UnknownTaskError,
    WrongAgentError,
)
from meshpoint.runtime import wire
from meshpoint.runtime.calls import CallKinds
from meshpoint.runtime.ending import OUTCOMES, record_ending
from meshpoint.runtime.outages import Outages
from meshpoint.runtime.scope import Scope
from meshpoint.runtime.stats import InstanceStats
from meshpoint.runtime.subjects import Subjects
from meshpoint.runtime.tasks import DeadLetters, InHand, LeaseOwners, TaskRun
from meshpoint.store.base import TASK_STATUSES

logger = logging.getLogger("meshpoint.runtime")


class Answering(Protocol):
    """What cancels need of the endings."""

    async def answer(self, ctx: TaskExecutionContext, state: a2a.TaskState,
                     text: str) -> None: ...

    async def finish_canceled(self, run: TaskRun) -> None: ...

    def note_end(self, task_id: str, state: a2a.TaskState, text: str) -> None: ...


@dataclass(frozen=True)
class Cancels:
    """Cancels the tasks of one instance's agent."""

    scope: Scope
    subjects: Subjects
    kinds: CallKinds
    endings: Answering
    outages: Outages
    in_hand: InHand
    owners: LeaseOwners
    dead_letters: DeadLetters
    stats: InstanceStats

    async def on_cancel(self, task_id: str, delivery: Delivery) -> None:
        """A ``tasks/cancel`` request for one of this agent's tasks."""
        run = self.in_hand.get(task_id)
        if run is not None:
            await self.cancel_local(run)
            await delivery.ack()
            return
        try:
            outcome = await self.outages.outlast(delivery, lambda: self.cancel_stored(task_id))
        except WrongAgentError as error:
            # Another agent's task, on this agent's subject: it is not this agent's to
            # cancel, and its own agent never sees this message.
            await self.dead_letters.reject(delivery, BadMessageError(f"cancel refused: {error}"))
            return
        except StoreError as error:
            logger.warning("%s: cancel of %s failed (%s); retrying", self.scope.instance_id,
                           task_id, error)
            await delivery.nak(1.0)
            return
        if outcome == "canceled":
            await delivery.ack()
            return
        await self.scope.broker.publish(self.subjects.control(self.scope.agent_name),
                                        wire.cancel_broadcast(task_id))
        if outcome == "leased" and delivery.delivery_count < self.scope.options.max_deliver:
            # Resuming elsewhere: if that instance is dead, its lease will expire and
            # the next attempt cancels the stored task itself.
            await delivery.nak(self.scope.lease_ttl_s)
        else:
            await delivery.ack()

    async def cancel_stored(self, task_id: str) -> str:
        """Cancel a stored task: ``canceled``, ``leased`` (another owner resumes it)
        or ``unknown`` (not stored: running before its first checkpoint, or ended)."""
        return await self.end_stored(task_id, a2a.TaskState.CANCELED, "canceled")

    async def end_stored(self, task_id: str, state: a2a.TaskState, text: str, *,
                         outcome: str | None = None) -> str:
        """End a stored task of this agent nobody is running, in ``state``: its rows
        go, its items are withdrawn, its caller is answered ``text``; its history
        records ``outcome`` (by default the state's). Returns ``canceled`` (done),
        ``leased`` (another owner runs it, or this instance lacks the signing key its
        signed history needs: an instance that holds it ends it) or ``unknown`` (not
        stored); WrongAgentError for another agent's task, which is left alone."""
        owner = self.owners.next()
        try:
            # Before the lease, which would make the task `resuming`: ending a signed
            # task appends its last record, which this instance may be unable to sign.
            await self.scope.store.check_signing_key(task_id)
            lease = await self.scope.store.take_resume_lease(
                task_id, owner, self.scope.lease_ttl_s, statuses=TASK_STATUSES,
                agent_name=self.scope.agent_name)
        except UnknownTaskError:
            return "unknown"
        except KeyMissingError as error:
            return self._leave(task_id, error)
        if lease is None:
            return "leased"
        ctx: TaskExecutionContext | None = None
        try:
            ctx = (await self.scope.store.restore_task(task_id, lease_owner=owner)).context
        except KeyMissingError as error:  # signed since the check: nothing written
            await self.scope.store.release_resume_lease(task_id, owner)
            return self._leave(task_id, error)
        except TaskBlockedError:
            # Blocking released the lease; the task still ends when asked to.
            if await self.scope.store.take_resume_lease(task_id, owner, self.scope.lease_ttl_s,
                                                        statuses=TASK_STATUSES,
                                                        agent_name=self.scope.agent_name) is None:
                return "leased"
        except HistoryIntegrityError as error:
            logger.warning("%s: ending %s, whose history fails verification: %s",
                           self.scope.instance_id, task_id, error)
        if ctx is None:
            # What its caller is told comes from its live row, if that decodes at all.
            with contextlib.suppress(CorruptCheckpointError):
                ctx = (await self.scope.store.restore_task(task_id, lease_owner=owner,
                                                           verify=False)).context
        # Rows first: once they are gone no answer, sweep or recovery can revive the
        # task. The withdrawals and the answer are then published (at most lost, never
        # half-applied: the peers' own deadlines end their work).
        record_ending(ctx, outcome or OUTCOMES[state], text)
        await self.scope.store.cleanup_task(task_id, lease_owner=owner,
                                            outcome=outcome or OUTCOMES[state], ctx=ctx)
        self.endings.note_end(task_id, state, text)
        if ctx is None:
            return "canceled"
        for sub_task_id, corr in list(ctx.active_peer_sub_tasks.items()):
            await self.kinds.withdraw(sub_task_id, corr)
        await self.endings.answer(ctx, state, text)
        return "canceled"

    def _leave(self, task_id: str, error: KeyMissingError) -> str:
        """Ending the task would append an unsigned record to its signed chain, which
        every verifier rejects: this instance writes nothing, and an instance with the
        signing key ends it (``leased``: the cancel is broadcast, and its request
        comes back)."""
        logger.error("%s: leaving the end of %s to an instance with the signing key: %s",
                     self.scope.instance_id, task_id, error)
        self.stats.note("key_missing", task_id, reason=str(error))
        return "leased"

    async def on_broadcast(self, task_id: str) -> None:
        """A cancel broadcast to every instance of the agent (read and acknowledged
        by ``AgentInstance._on_control``): the task is canceled here if it is in this
        instance's memory, else if it is stored and nobody runs it."""
        run = self.in_hand.get(task_id)
        if run is not None:
            await self.cancel_local(run)
        else:
            with contextlib.suppress(StoreError):
                await self.cancel_stored(task_id)

    async def cancel_local(self, run: TaskRun) -> None:
        """Cancel a task in this instance's memory. A turn in progress stops at its
        next step; a task waiting in memory ends now."""
        run.ctx.cancellation_event.set()
        if run.waiting:
            run.waiting = False
            await self.endings.finish_canceled(run)
