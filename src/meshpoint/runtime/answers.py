"""Answers and progress from peers, taken by any instance of the calling agent.

An answer to a stored task is claimed and recorded in one transaction; its message
is acknowledged only after that commits (a store error naks it for later).
Duplicates and late answers resolve nothing and are acknowledged; an answer to
another agent's task is refused and dead-lettered; an answer whose sub-task no
task has, and that names (as its context) no task the agent has or had, is never
acknowledged and dropped: it is redelivered, then dead-lettered with the reason
past ``max_deliver``. The resolution
that completes the join took the resume lease in the same transaction: this
instance then resumes the task. A status update (or progress on the answer
subject) restarts the item's deadline and claims nothing. Answers for a task
waiting in this instance's memory come to its inbox.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from meshpoint import a2a
from meshpoint.broker.base import Delivery
from meshpoint.errors import (
    BadMessageError,
    InvalidArgumentError,
    StoreError,
    UnknownSubTaskError,
    WrongAgentError,
)
from meshpoint.runtime import wire
from meshpoint.runtime.memory import MemoryPath
from meshpoint.runtime.outages import Outages
from meshpoint.runtime.scope import Scope
from meshpoint.runtime.stats import InstanceStats
from meshpoint.runtime.tasks import DeadLetters, InHand, LeaseOwners
from meshpoint.store.results import Resolution

logger = logging.getLogger("meshpoint.runtime")
#: How long an answer no task of this instance's tenant and agent waits for is held
#: back before its next delivery.
UNPLACED_RETRY_S = 1.0
#: An answer this instance did not take (left for redelivery, or dead-lettered).
NOT_TAKEN: tuple[str, None] = ("not_taken", None)


@dataclass(frozen=True)
class Answers:
    """The handlers of one instance's answer, status and inbox subjects.
    ``resume(task_id, owner)`` continues a task whose join an answer completed."""

    scope: Scope
    outages: Outages
    memory: MemoryPath
    in_hand: InHand
    owners: LeaseOwners
    dead_letters: DeadLetters
    stats: InstanceStats
    resume: Callable[[str, str], Awaitable[None]]

    async def on_response(self, delivery: Delivery) -> None:
        parsed = await self._parse(delivery)
        if parsed is None:
            return
        sub_task_id, response = parsed
        result = wire.as_result(response)
        if result is None:  # progress on the answer subject: treat as a status update
            await self._refresh_deadline(sub_task_id, response, delivery)
            return
        owner = self.owners.next()
        with self.scope.tracing.claim(sub_task_id, _metadata_of(response)) as span:
            outcome, resolution = await self._claim(sub_task_id, response, result, owner,
                                                    delivery)
            span.set_attribute("meshpoint.claim.outcome", outcome)
            if resolution is not None:
                span.set_attribute("meshpoint.task_id", resolution.sub_task.task_id)
        if resolution is not None and resolution.join_complete and \
                resolution.lease_owner == owner:
            await self.resume(resolution.sub_task.task_id, owner)

    async def _claim(self, sub_task_id: str, response: a2a.SuccessResponse | a2a.ErrorResponse,
                     result: dict[str, Any], owner: str,
                     delivery: Delivery) -> tuple[str, Resolution | None]:
        """Resolve the sub-task with ``result`` in the store: ``won`` and its resolution,
        ``late`` (its task moved on), or ``not_taken`` (left for redelivery or
        dead-lettered)."""
        try:
            resolution = await self.outages.outlast(delivery, lambda: (
                self.scope.store.resolve_peer_sub_task(sub_task_id, result, lease_owner=owner,
                                                       lease_ttl_s=self.scope.lease_ttl_s,
                                                       agent_name=self.scope.agent_name)))
        except WrongAgentError as error:
            # Sent to this agent's subject, for another agent's task: nobody else ever
            # takes it from here, and nothing of it was written.
            await self.dead_letters.reject(delivery, BadMessageError(str(error)))
            return NOT_TAKEN
        except UnknownSubTaskError:
            try:
                late = await self._names_a_known_task(response, delivery)
            except StoreError as error:
                logger.warning("%s: could not look for the task of answer %s (%s); "
                               "retrying later", self.scope.instance_id, sub_task_id, error)
                await delivery.nak(1.0)
                return NOT_TAKEN
            if not late:
                await self._leave_for_its_owner(sub_task_id, response, delivery)
                return NOT_TAKEN
            resolution = None  # its task ended, or moved on: a late answer
        except StoreError as error:
            logger.warning("%s: could not record the answer to %s (%s); retrying later",
                           self.scope.instance_id, sub_task_id, error)
            await delivery.nak(1.0)
            return NOT_TAKEN
        # The resolution is committed: only now may the message go.
        await delivery.ack()
        if resolution is None:
            self.stats.note("ignored_answer", sub_task_id)
            return "late", None
        self.stats.note("answer_claimed", sub_task_id, journal=False)
        self.stats.log("protocol_receive", resolution.sub_task.task_id, step="answer",
                       input={"sub_task_id": sub_task_id,
                              "peer": resolution.sub_task.peer_agent_name,
                              "completed": resolution.completed, "total": resolution.total},
                       message=response)
        return "won", resolution

    async def _names_a_known_task(self, response: a2a.SuccessResponse | a2a.ErrorResponse,
                                  delivery: Delivery) -> bool:
        """Whether an answer whose sub-task is gone names, as its context, a task of
        this agent that the tenant has paused or remembers ended: then it is late (a
        duplicate, or an answer after a timeout, whose task has moved on since)."""
        context = _context_of(response)
        if context is None:
            return False
        return await self.outages.outlast(
            delivery, lambda: self.scope.store.task_known(context, self.scope.agent_name))

    async def _leave_for_its_owner(self, sub_task_id: str,
                                   response: a2a.SuccessResponse | a2a.ErrorResponse,
                                   delivery: Delivery) -> None:
        """An answer this instance cannot place is never acknowledged and dropped: it is
        handed back for redelivery (the broker may give it to whoever can place it),
        and once it has been delivered ``max_deliver`` times it is dead-lettered with
        the reason, where an operator sees it."""
        if delivery.delivery_count < self.scope.options.max_deliver:
            await delivery.nak(UNPLACED_RETRY_S)
            return
        context = _context_of(response)
        self.stats.note("unplaced_answer", sub_task_id)
        await self.dead_letters.reject(delivery, BadMessageError(
            f"no task of tenant {self.scope.store.tenant_id!r} waits for sub-task {sub_task_id!r}, "
            f"and the answer names no task agent {self.scope.agent_name!r} has or had "
            f"(context {context!r}): another tenant's or agent's answer, a forged one, or "
            f"an answer to a task that ended long ago; delivered {delivery.delivery_count} "
            "times"))

    async def on_status(self, delivery: Delivery) -> None:
        parsed = await self._parse(delivery)
        if parsed is not None:
            await self._refresh_deadline(parsed[0], parsed[1], delivery)

    async def on_inbox(self, delivery: Delivery) -> None:
        """Answers and status updates for tasks waiting in this instance's memory."""
        parsed = await self._parse(delivery)
        if parsed is None:
            return
        sub_task_id, response = parsed
        run = self.in_hand.waiting_for(sub_task_id)
        await delivery.ack()
        if run is None:
            self.stats.note("ignored_answer", sub_task_id)
            return
        result = wire.as_result(response)
        if result is None:
            self.memory.progress(run, sub_task_id, wire.progress_task_id(response))
            return
        self.memory.resolve(run, sub_task_id, result)

    async def _refresh_deadline(self, sub_task_id: str, response: Any,
                                delivery: Delivery) -> None:
        """A status update restarts the sub-task's deadline; it claims nothing."""
        try:
            await self.outages.outlast(delivery, lambda: self.scope.store.reset_timeout_deadline(
                sub_task_id, peer_task_id=wire.progress_task_id(response)))
        except UnknownSubTaskError:
            pass
        except InvalidArgumentError as error:  # e.g. a peer task id that is too long
            await self.dead_letters.reject(delivery,
                                            BadMessageError(f"bad status update: {error}"))
            return
        except StoreError as error:
            logger.warning("%s: could not refresh %s (%s)", self.scope.instance_id, sub_task_id,
                           error)
            await delivery.nak(1.0)
            return
        await delivery.ack()

    async def _parse(self, delivery: Delivery
                     ) -> tuple[str, a2a.SuccessResponse | a2a.ErrorResponse] | None:
        """The sub-task id (the subject's last token) and the validated response."""
        sub_task_id = delivery.message.subject.rsplit(".", 1)[-1]
        try:
            response = a2a.parse_response(delivery.message.data,
                                          max_bytes=self.scope.options.max_message_bytes)
            if response.id is not None and str(response.id) != sub_task_id:
                raise BadMessageError(
                    f"response id {response.id!r} does not match the sub-task "
                    f"{sub_task_id!r} of its subject")
        except BadMessageError as error:
            await self.dead_letters.reject(delivery, error)
            return None
        return sub_task_id, response


def _metadata_of(response: a2a.SuccessResponse | a2a.ErrorResponse) -> dict[str, Any] | None:
    """An answer's metadata (its ``traceparent``: the span that sent it)."""
    metadata = getattr(response.result, "metadata", None) \
        if isinstance(response, a2a.SuccessResponse) else None
    return metadata if isinstance(metadata, dict) else None


def _context_of(response: a2a.SuccessResponse | a2a.ErrorResponse) -> str | None:
    """The context an answer names: the calling task, for a peer that echoes the
    request's ``contextId`` as A2A asks (meshpoint's agents do)."""
    if isinstance(response, a2a.SuccessResponse):
        result = response.result
        if isinstance(result, a2a.Task | a2a.TaskStatusUpdateEvent | a2a.TaskArtifactUpdateEvent):
            return result.context_id or None
        if isinstance(result, a2a.Message):
            return result.context_id
    return None
