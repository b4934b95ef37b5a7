"""``AgentInstance``: one worker of an agent, on a store and a broker.

An instance consumes its agent's requests, its peers' answers and status
updates, runs turns with the agent's model (see :mod:`meshpoint.runtime.turns`)
and keeps three loops: the database **sweeper** (peer deadlines that passed after
a checkpoint), **recovery** (tasks whose resume lease expired because their
instance died) and a **keeper** that renews the leases and ack waits of the
tasks it holds. All of an instance's work runs on one event loop; several
instances may share a loop (the in-process demo) or each have a process.

Every delivery is settled only after the state it carries is committed: an answer
is acknowledged after its resolution commits, a request after the checkpoint of
its first pause (or when its task ends without pausing). Anything malformed is
dead-lettered with a logged reason and changes no task.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

from meshpoint import a2a
from meshpoint.broker.base import Broker, ConsumerOptions, Delivery, Subscription
from meshpoint.context import TaskExecutionContext
from meshpoint.errors import (
    BadMessageError,
    InvalidArgumentError,
    StoreError,
    StoreUnavailableError,
    UnknownSubTaskError,
    UnknownTaskError,
)
from meshpoint.runtime import wire
from meshpoint.runtime.agent import Agent, RuntimeOptions, check_name
from meshpoint.runtime.stats import InstanceStats
from meshpoint.runtime.turns import TaskRun, TurnRunner
from meshpoint.store.sql import SqlStore

logger = logging.getLogger("meshpoint.runtime")
R = TypeVar("R")
#: How long a handler keeps retrying a store operation while the database is
#: unavailable before it gives the message back (nak) instead.
OUTAGE_PATIENCE_S = 60.0

#: Statuses of a stored task that a cancel may take the lease of.
_CANCELABLE = ("waiting_peers", "input_required", "handoff", "working", "resuming")


class AgentInstance(TurnRunner):
    """One instance of ``agent``. ``await start()`` joins the agent's queues;
    ``await stop()`` leaves them gracefully; ``await kill()`` simulates a crash
    (nothing in hand is acknowledged, no lease is released)."""

    def __init__(self, agent: Agent, store: SqlStore, broker: Broker, *,
                 instance_id: str | None = None,
                 options: RuntimeOptions | None = None) -> None:
        self.agent = agent
        self.store = store
        self.broker = broker
        self.options = options or RuntimeOptions()
        self.instance_id = check_name("instance_id", instance_id or
                                      f"{agent.name}-{wire.new_id()[:8]}")
        self.stats = InstanceStats(self.instance_id)
        #: Tasks in this instance's memory: running a turn, or waiting in memory.
        self.active: dict[str, TaskRun] = {}
        #: sub_task_id -> task_id of the in-memory path's outstanding calls.
        self.memory_subs: dict[str, str] = {}
        #: The agent's shared queues (new work: requests, answers, status updates), and
        #: this instance's own (its inbox and the control subject).
        self._work_queues: list[Subscription] = []
        self._own_queues: list[Subscription] = []
        self._tasks: set[asyncio.Task[Any]] = set()
        self._attempt = 0
        self.running = False
        #: Set by drain(): take no new work, let the work in hand finish.
        self.draining = False

    def __repr__(self) -> str:
        return f"AgentInstance({self.instance_id!r}, active={len(self.active)})"

    # -- lifecycle ----------------------------------------------------------------------

    async def start(self) -> None:
        ns, name, o = self.options.namespace, self.agent.name, self.options
        self.running = True
        requests = ConsumerOptions(ack_wait_s=o.request_ack_wait_s, max_deliver=o.max_deliver,
                                   max_in_flight=o.max_in_flight)
        answers = ConsumerOptions(ack_wait_s=o.response_ack_wait_s, max_deliver=o.max_deliver,
                                  max_in_flight=o.max_in_flight)
        mine = ConsumerOptions(ack_wait_s=o.response_ack_wait_s, max_deliver=o.max_deliver,
                               max_in_flight=o.max_in_flight, ephemeral=True)
        base = f"{ns}.a2a.v1.agent"
        for joined, subject, queue, handler, options in (
            (self._work_queues, wire.request_subject(ns, name), f"{ns}-{name}-requests",
             self._on_request, requests),
            (self._work_queues, f"{base}.response.{name}.*", f"{ns}-{name}-responses",
             self._on_response, answers),
            (self._work_queues, f"{base}.status.{name}.*", f"{ns}-{name}-status",
             self._on_status, answers),
            (self._own_queues, f"{wire.inbox_prefix(ns, self.instance_id)}.>",
             f"{ns}-inbox-{self.instance_id}", self._on_inbox, mine),
            (self._own_queues, wire.control_subject(ns, name),
             f"{ns}-control-{self.instance_id}", self._on_control, mine),
        ):
            joined.append(await self.broker.subscribe(subject, queue, handler, options))
        self.spawn(self._forever("keeper", self._keep, self._keeper_period(),
                                 while_draining=True))
        if self.agent.peers:
            # Only an agent that calls peers ever pauses: the others have no deadlines
            # to sweep and no leases to recover, and spare the database the polling.
            self.spawn(self._forever("sweeper", self._sweep, self.options.sweep_interval_s))
            self.spawn(self._forever("recovery", self._recover,
                                     self.options.recovery_interval_s))

    async def drain(self, timeout_s: float = 20.0) -> None:
        """Stop gracefully (SIGTERM): take no new tasks, answers or recoveries; let the
        work in hand reach its pause boundary (checkpointed) or its end, for up to
        ``timeout_s``; then stop. Tasks waiting in this instance's memory keep their
        inbox until they end or time runs out. Whatever is still in hand then is
        recovered elsewhere, as after a crash (un-acked messages, expiring leases)."""
        if not self.running or self.draining:
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        self.draining = True
        # No new work; the inbox and the control subject serve the tasks in hand.
        await asyncio.gather(*(s.drain(timeout_s) for s in self._work_queues))
        self._work_queues.clear()
        while loop.time() < deadline and (self.active or len(self._tasks) > 1):
            await asyncio.sleep(0.02)  # the keeper is the one task left when idle
        left = len(self.active)
        # Handlers still running on the inbox or the control subject (a cancel midway)
        # finish too, within what is left of the time.
        await asyncio.gather(*(s.drain(max(0.0, deadline - loop.time()))
                               for s in self._own_queues))
        self._own_queues.clear()
        await self._halt()
        logger.info("%s: drained (%d task(s) left to recovery)", self.instance_id, left)

    async def stop(self) -> None:
        """Leave the queues and stop the loops. Tasks still in hand are not lost:
        their messages were not acknowledged and their leases expire."""
        await self._halt()

    async def kill(self) -> None:
        """Die as a crash would: same as :meth:`stop`, which never acks or releases."""
        await self._halt()

    async def _halt(self) -> None:
        self.running = False
        for subscription in (*self._work_queues, *self._own_queues):
            await subscription.stop()
        self._work_queues.clear()
        self._own_queues.clear()
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        for run in self.active.values():
            run.cancel_timers()
        self.active.clear()
        self.memory_subs.clear()

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        """Run ``coro`` as this instance's background work (killed with it)."""
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            logger.error("%s: background work failed", self.instance_id,
                         exc_info=task.exception())

    def next_owner(self) -> str:
        """A lease owner naming one resume attempt of this instance."""
        self._attempt += 1
        return f"{self.instance_id}#{self._attempt}"

    # -- inbound: requests ------------------------------------------------------------------

    async def _on_request(self, delivery: Delivery) -> None:
        try:
            request = a2a.parse_request(delivery.message.data,
                                        max_bytes=self.options.max_message_bytes)
            reply_to = wire.header_subject(delivery.message.headers, wire.REPLY_TO)
            status_to = wire.header_subject(delivery.message.headers, wire.STATUS_TO)
        except BadMessageError as error:
            await self._reject(delivery, error)
            return
        if isinstance(request, a2a.CancelTaskRequest):
            await self._on_cancel(request.params.id, delivery)
            return
        task_id = wire.derive_task_id(self.agent.name, reply_to, request.id)
        run = self.active.get(task_id)
        if run is not None:
            # A redelivery of a task still in hand (its ack wait ran out): keep the
            # new delivery, the one the broker will accept an ack for.
            run.delivery = delivery
            return
        message = request.params.message
        ctx = TaskExecutionContext(task_id, {
            "agent": self.agent.name, "request_id": request.id, "reply_to": reply_to,
            "status_to": status_to, "context_id": message.context_id or task_id,
            "caller": (message.metadata or {}).get("meshpoint_caller")})
        ctx.append_session_event({"role": "user", "content": message.text})
        run = TaskRun(ctx, delivery=delivery)
        self.active[task_id] = run
        self.stats.note("started", task_id)
        # No "working" status update here: it would cost the caller a database write
        # per call, and the caller can name this task anyway (derive_task_id).
        await self.drive(run)

    # -- inbound: answers and status updates -----------------------------------------------

    async def _on_response(self, delivery: Delivery) -> None:
        parsed = await self._parse_answer(delivery)
        if parsed is None:
            return
        sub_task_id, response = parsed
        result = wire.as_result(response)
        if result is None:  # progress on the answer subject: treat as a status update
            await self._refresh_deadline(sub_task_id, response, delivery)
            return
        owner = self.next_owner()
        try:
            resolution = await self.outlasting_outages(delivery, lambda: (
                self.store.resolve_peer_sub_task(sub_task_id, result, lease_owner=owner,
                                                 lease_ttl_s=self.options.lease_ttl_s)))
        except UnknownSubTaskError:
            resolution = None  # its task already ended (a late answer)
        except StoreError as error:
            logger.warning("%s: could not record the answer to %s (%s); retrying later",
                           self.instance_id, sub_task_id, error)
            await delivery.nak(1.0)
            return
        # The resolution is committed: only now may the message go.
        await delivery.ack()
        if resolution is None:
            self.stats.note("ignored_answer", sub_task_id)
            return
        if resolution.join_complete and resolution.lease_owner == owner:
            await self.resume(resolution.sub_task.task_id, owner)

    async def outlasting_outages(self, delivery: Delivery,
                                 operation: Callable[[], Awaitable[R]]) -> R:
        """Run a store operation for ``delivery``; while the database is unavailable,
        keep the delivery (``in_progress``) and retry with backoff for up to
        ``OUTAGE_PATIENCE_S``. A nak per attempt would spend the message's deliveries
        and dead-letter an answer during a database restart."""
        loop = asyncio.get_running_loop()
        give_up = loop.time() + OUTAGE_PATIENCE_S
        pause = 0.25
        while True:
            try:
                return await operation()
            except StoreUnavailableError as error:
                if not self.running or loop.time() + pause > give_up:
                    raise
                logger.warning("%s: %s; retrying in %.2fs", self.instance_id, error, pause)
            await delivery.in_progress()
            await asyncio.sleep(pause)
            pause = min(5.0, pause * 2)

    async def _on_status(self, delivery: Delivery) -> None:
        parsed = await self._parse_answer(delivery)
        if parsed is not None:
            await self._refresh_deadline(parsed[0], parsed[1], delivery)

    async def _refresh_deadline(self, sub_task_id: str, response: Any,
                                delivery: Delivery) -> None:
        """A status update restarts the sub-task's deadline; it claims nothing."""
        try:
            await self.outlasting_outages(delivery, lambda: self.store.reset_timeout_deadline(
                sub_task_id, peer_task_id=wire.progress_task_id(response)))
        except UnknownSubTaskError:
            pass
        except InvalidArgumentError as error:  # e.g. a peer task id that is too long
            await self._reject(delivery, BadMessageError(f"bad status update: {error}"))
            return
        except StoreError as error:
            logger.warning("%s: could not refresh %s (%s)", self.instance_id, sub_task_id,
                           error)
            await delivery.nak(1.0)
            return
        await delivery.ack()

    async def _on_inbox(self, delivery: Delivery) -> None:
        """Answers and status updates for tasks waiting in this instance's memory."""
        parsed = await self._parse_answer(delivery)
        if parsed is None:
            return
        sub_task_id, response = parsed
        task_id = self.memory_subs.get(sub_task_id)
        run = self.active.get(task_id) if task_id else None
        await delivery.ack()
        if run is None:
            self.stats.note("ignored_answer", sub_task_id)
            return
        result = wire.as_result(response)
        if result is None:
            run.refresh_timer(sub_task_id, wire.progress_task_id(response), self)
            return
        self.resolve_in_memory(run, sub_task_id, result)

    async def _parse_answer(self, delivery: Delivery
                            ) -> tuple[str, a2a.SuccessResponse | a2a.ErrorResponse] | None:
        """The sub-task id (the subject's last token) and the validated response."""
        sub_task_id = delivery.message.subject.rsplit(".", 1)[-1]
        try:
            response = a2a.parse_response(delivery.message.data,
                                          max_bytes=self.options.max_message_bytes)
            if response.id is not None and str(response.id) != sub_task_id:
                raise BadMessageError(
                    f"response id {response.id!r} does not match the sub-task "
                    f"{sub_task_id!r} of its subject")
        except BadMessageError as error:
            await self._reject(delivery, error)
            return None
        return sub_task_id, response

    async def _reject(self, delivery: Delivery, error: BadMessageError) -> None:
        logger.warning("%s: dead-lettering a message on %s: %s", self.instance_id,
                       delivery.message.subject, error)
        self.stats.note("dead_lettered", delivery.message.subject)
        await delivery.term(str(error))

    # -- cancel ---------------------------------------------------------------------------

    async def _on_cancel(self, task_id: str, delivery: Delivery) -> None:
        """Cancel a task wherever it is: in this instance's memory, paused in the
        store, or running on another instance (told by a broadcast)."""
        run = self.active.get(task_id)
        if run is not None:
            await self.cancel_local(run)
            await delivery.ack()
            return
        try:
            outcome = await self.outlasting_outages(delivery,
                                                    lambda: self.cancel_stored(task_id))
        except StoreError as error:
            logger.warning("%s: cancel of %s failed (%s); retrying", self.instance_id,
                           task_id, error)
            await delivery.nak(1.0)
            return
        if outcome == "canceled":
            await delivery.ack()
            return
        await self.broker.publish(wire.control_subject(self.options.namespace,
                                                       self.agent.name),
                                  json.dumps({"cancel": task_id}).encode())
        if outcome == "leased" and delivery.delivery_count < self.options.max_deliver:
            # Resuming elsewhere: if that instance is dead, its lease will expire and
            # the next attempt cancels the stored task itself.
            await delivery.nak(self.options.lease_ttl_s)
        else:
            await delivery.ack()

    async def cancel_stored(self, task_id: str) -> str:
        """Cancel a stored task: ``canceled``, ``leased`` (another owner resumes it)
        or ``unknown`` (not stored: running before its first checkpoint, or ended)."""
        owner = self.next_owner()
        try:
            lease = await self.store.take_resume_lease(
                task_id, owner, self.options.lease_ttl_s, statuses=_CANCELABLE)
        except UnknownTaskError:
            return "unknown"
        if lease is None:
            return "leased"
        restored = await self.store.restore_task(task_id, lease_owner=owner)
        ctx = restored.context
        # Rows first: once they are gone no answer, sweep or recovery can revive the
        # task. The cancels and the answer are then published (at most lost, never
        # half-applied: the peers' own deadlines end their work).
        await self.store.cleanup_task(task_id, lease_owner=owner)
        self.stats.note("canceled", task_id)
        for sub_task_id, corr in list(ctx.active_peer_sub_tasks.items()):
            await self.cancel_peer(sub_task_id, corr)
        await self.answer(ctx, a2a.TaskState.CANCELED, "canceled")
        return "canceled"

    async def _on_control(self, delivery: Delivery) -> None:
        try:
            document = json.loads(delivery.message.data)
            task_id = document["cancel"]
            if type(task_id) is not str or not task_id:
                raise ValueError("'cancel' must name a task id")
        except (ValueError, KeyError, TypeError) as error:
            await self._reject(delivery, BadMessageError(f"bad control message: {error}"))
            return
        await delivery.ack()
        run = self.active.get(task_id)
        if run is not None:
            await self.cancel_local(run)
        else:
            with contextlib.suppress(StoreError):
                await self.cancel_stored(task_id)

    async def cancel_peer(self, sub_task_id: str, corr: dict[str, Any]) -> None:
        """Send ``tasks/cancel`` to the peer of a sub-task, naming the peer's own task."""
        peer = corr.get("peer_agent_name")
        if not peer:
            return
        peer_task_id = corr.get("peer_task_id") or wire.derive_task_id(
            peer, corr.get("reply_to"), sub_task_id)
        await self.broker.publish(wire.request_subject(self.options.namespace, peer),
                                  wire.cancel_request(peer_task_id))

    # -- loops ----------------------------------------------------------------------------

    async def _forever(self, name: str, step: Any, period_s: float, *,
                       while_draining: bool = False) -> None:
        """Run ``step`` every ``period_s`` until the instance stops (or drains, unless
        ``while_draining``). A failing step is logged and retried next period: a loop
        must never die of one bad row."""
        while self.running and (while_draining or not self.draining):
            await asyncio.sleep(period_s)
            if self.draining and not while_draining:
                return
            try:
                await step()
            except StoreError as error:
                logger.warning("%s: %s failed: %s", self.instance_id, name, error)
            except Exception:
                logger.exception("%s: %s failed", self.instance_id, name)

    async def _sweep(self) -> None:
        """Resolve sub-tasks whose deadline passed after their checkpoint."""
        owner = self.next_owner()
        resolutions = await self.store.sweep_expired_timeouts(
            self.agent.name, lease_owner=owner, lease_ttl_s=self.options.lease_ttl_s)
        for resolution in resolutions:
            sub = resolution.sub_task
            self.stats.note("timeout", sub.task_id)
            if resolution.join_complete and resolution.lease_owner == owner:
                self.spawn(self.resume(sub.task_id, owner))
            try:
                await self.cancel_peer(sub.sub_task_id, sub.correlation_data)
            except Exception as error:  # the timeout stands; the peer's own ends it
                logger.warning("%s: could not cancel %s at its peer: %s", self.instance_id,
                               sub.sub_task_id, error)

    async def _recover(self) -> None:
        """Take over tasks whose resuming instance died (their lease expired)."""
        for task_id in await self.store.resumable_tasks(self.agent.name):
            if task_id in self.active:
                continue
            owner = self.next_owner()
            lease = await self.store.take_resume_lease(task_id, owner,
                                                       self.options.lease_ttl_s)
            if lease is not None:
                self.stats.note("recovered", task_id)
                self.spawn(self.resume(task_id, owner))

    def _keeper_period(self) -> float:
        return min(self.options.lease_ttl_s, self.options.request_ack_wait_s) / 3

    async def _keep(self) -> None:
        """Renew the leases and ack waits of the tasks in hand."""
        for run in list(self.active.values()):
            if run.delivery is not None:
                await run.delivery.in_progress()
            if run.lease_owner is not None and not run.lost:
                try:
                    lease = await self.store.renew_resume_lease(
                        run.ctx.task_id, run.lease_owner, self.options.lease_ttl_s)
                except UnknownTaskError:
                    lease = None
                except StoreError as error:
                    logger.warning("%s: could not renew the lease of %s: %s",
                                   self.instance_id, run.ctx.task_id, error)
                    continue
                if lease is None:
                    # Another instance took the task over; it is theirs now.
                    run.lost = True

