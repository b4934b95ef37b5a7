"""``AgentInstance``: one worker of an agent, on a store and a broker.

An instance is composed of parts, each handed the narrow interface it needs and no
reference back (docs/runtime.md draws them):

* the **turn loop** (:mod:`~meshpoint.runtime.turns`) runs a task's model and tool
  calls, each call made by its **kind** (:mod:`~meshpoint.runtime.calls`: local
  tools, :mod:`~meshpoint.runtime.peers`, :mod:`~meshpoint.runtime.approvals`);
* the **pause boundary** (:mod:`~meshpoint.runtime.boundary`) checkpoints a task
  with items outstanding, announces them, acknowledges and forgets it; the
  **in-memory path** (:mod:`~meshpoint.runtime.memory`) keeps a task that could not
  be checkpointed;
* **answers** (:mod:`~meshpoint.runtime.answers`; a human's, in
  :mod:`~meshpoint.runtime.approvals`), **cancels**
  (:mod:`~meshpoint.runtime.cancels`) and **endings**
  (:mod:`~meshpoint.runtime.ending`) handle what comes back and how a task ends;
* the **loops** (:mod:`~meshpoint.runtime.loops`): sweeper, recovery, lease keeper;
* the **breaker** (:mod:`~meshpoint.runtime.breaker`) every resume goes through, and the
  **alerts** (:mod:`~meshpoint.runtime.alerts`), which watch what the stats count.

This module builds and wires them, subscribes their handlers to the agent's
subjects, turns a request into a new task, and starts and stops the whole. All of
an instance's work runs on one event loop; several instances may share a loop (the
in-process demo) or each have a process. Every delivery is settled only after the
state it carries is committed, and anything malformed is dead-lettered with a
logged reason and changes no task.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

import orjson

from meshpoint import a2a
from meshpoint.broker.base import Broker, ConsumerOptions, Delivery, Subscription
from meshpoint.context import TaskExecutionContext
from meshpoint.errors import BadMessageError, StoreError
from meshpoint.events.log import EventJournal, EventStore
from meshpoint.history.planning import request_digest
from meshpoint.ops.tracing import TRACEPARENT, Tracing, kept
from meshpoint.runtime import wire
from meshpoint.runtime.agent import Agent, RuntimeOptions, check_name
from meshpoint.runtime.alerts import Alerts
from meshpoint.runtime.answers import Answers
from meshpoint.runtime.approvals import ApprovalCalls, Inputs
from meshpoint.runtime.approvers import Approvers
from meshpoint.runtime.boundary import PauseBoundary
from meshpoint.runtime.breaker import Breaker
from meshpoint.runtime.calls import CallKind, CallKinds, LocalTools
from meshpoint.runtime.cancels import Cancels
from meshpoint.runtime.ending import Endings
from meshpoint.runtime.handoff import HandoffCalls, Handoffs, HandoffTaker, HandoffTriggers
from meshpoint.runtime.loops import EndedTasks, LeaseKeeper, Recovery, Sweeper, forever
from meshpoint.runtime.memory import MemoryPath
from meshpoint.runtime.midturn import MidTurn
from meshpoint.runtime.options import AlertOptions
from meshpoint.runtime.outages import Outages
from meshpoint.runtime.peers import PeerCalls, announce_check
from meshpoint.runtime.scope import Scope
from meshpoint.runtime.stats import InstanceStats
from meshpoint.runtime.subjects import Subjects
from meshpoint.runtime.tasks import (
    Background,
    DeadLetters,
    InHand,
    KeyMissing,
    LeaseOwners,
    Lifecycle,
    TaskRun,
)
from meshpoint.runtime.turns import TurnCheck, TurnLimit, TurnLoop
from meshpoint.runtime.workflows import METADATA_KEY, STATE_KEY, StageCalls
from meshpoint.store.base import Store

logger = logging.getLogger("meshpoint.runtime")


def call_kinds(agent: Agent, broker: Broker, subjects: Subjects, stats: InstanceStats,
               approvers: Approvers | None = None,
               options: RuntimeOptions | None = None) -> list[CallKind]:
    """The kinds of call an instance makes, in the order they claim a call: where a
    new kind is registered. The first kind with an item outstanding names the
    pause: a task waiting on a human and on peers is ``input_required``."""
    handoff: list[CallKind] = [] if agent.handoff is None else [HandoffCalls(agent.handoff)]
    return [*handoff, ApprovalCalls(agent=agent, broker=broker, stats=stats,
                                    approvers=approvers, tenant=subjects.tenant),
            (StageCalls if agent.workflow is not None else PeerCalls)(
                agent=agent, broker=broker, subjects=subjects, announce_check_s=announce_check(
                    broker, (options or RuntimeOptions()).announce_check_s),
                tracing=stats.tracing),
            LocalTools(agent=agent)]


def turn_checks(agent: Agent) -> list[TurnCheck]:
    """What is checked before each model call: where a new check is registered (the
    loop guard, then the handoff triggers)."""
    checks: list[TurnCheck] = [TurnLimit(agent.max_turns)]
    if agent.handoff is not None:
        checks.append(HandoffTriggers(agent.handoff, agent.model))
    return checks


class AgentInstance:
    """One instance of ``agent``. ``await start()`` joins the agent's queues;
    ``await drain()`` stops gracefully; ``await stop()`` and ``await kill()`` stop at
    once, as a crash would (nothing in hand is acknowledged, no lease is released).
    Its subjects are its store's tenant's. With ``approvers``, a decision on a call
    waiting for approval is taken only if one of them signed it
    (:mod:`meshpoint.runtime.approvers`). ``alerts`` says where its alerts go besides
    the agent's alert subject and the event log (a webhook)."""

    def __init__(self, agent: Agent, store: Store, broker: Broker, *,
                 instance_id: str | None = None,
                 options: RuntimeOptions | None = None,
                 approvers: Approvers | None = None,
                 alerts: AlertOptions | None = None) -> None:
        self.agent = agent
        self.store = store
        self.broker = broker
        self.options = options = options or RuntimeOptions()
        self.instance_id = name = check_name("instance_id", instance_id or
                                             f"{agent.name}-{wire.new_id()[:8]}")
        # Every part gets the one scope, and only parts built before it: no part is
        # given a reference to one built after it (docs/runtime.md draws them).
        tracing = Tracing(agent.name, name, str(getattr(store, "dialect", "")))
        scope = Scope(agent_name=agent.name, instance_id=name, store=store, broker=broker,
                      options=options, tracing=tracing)
        self.stats = stats = InstanceStats(name, tracing=tracing)
        #: The agent's event log, if it keeps one (Agent(events=True)).
        self.events = EventStore(store) if agent.events else None
        if self.events is not None:
            stats.journal = EventJournal(self.events, agent.name, name)
        self._lifecycle = lifecycle = Lifecycle()
        self._in_hand = in_hand = InHand()
        self._background = background = Background(name)
        owners, dead_letters = LeaseOwners(name), DeadLetters(name, stats)
        key_missing = KeyMissing()
        outages = Outages(instance_id=name, lifecycle=lifecycle)
        #: The subjects of the store's tenant: two tenants never share a subject.
        self.subjects = subjects = Subjects(options.namespace, store.tenant_id)
        kinds = CallKinds(call_kinds(agent, broker, subjects, stats, approvers, options))
        #: The event log alerts are recorded in when the agent keeps none (closed here).
        alert_log = self.events if self.events is not None else EventStore(store)
        self._alert_log = None if alert_log is self.events else alert_log
        #: The instance's alerts (runtime/alerts.py): hand them to what raises its own.
        self.alerts = Alerts(
            agent_name=agent.name, instance_id=name, broker=broker,
            subject=subjects.alerts(agent.name), events=alert_log,
            background=background, options=alerts or AlertOptions())
        self.breaker = breaker = Breaker(scope=scope, policy=agent.recovery, alerts=self.alerts,
                                         stats=stats, background=background)
        stats.watchers += [self.alerts.watch, breaker.watch]
        endings = Endings(scope=scope, kinds=kinds, in_hand=in_hand, stats=stats)
        self._cancels = cancels = Cancels(
            scope=scope, subjects=subjects, kinds=kinds, endings=endings, outages=outages,
            in_hand=in_hand, owners=owners, dead_letters=dead_letters, stats=stats)
        memory = MemoryPath(in_hand=in_hand, kinds=kinds, stats=stats, background=background,
                            inbox=subjects.inbox(agent.name, name))
        boundary = PauseBoundary(
            scope=scope, checkpointing=agent.stateless_checkpointing, kinds=kinds,
            memory=memory, in_hand=in_hand, stats=stats, background=background,
            cancel_stored=cancels.cancel_stored, annotate=agent.annotate)
        mid_turn = MidTurn(scope=scope, owners=owners, in_hand=in_hand, stats=stats,
                           annotate=agent.annotate)
        self._handoffs = handoffs = None if agent.handoff is None else Handoffs(
            scope=scope, agent=agent, policy=agent.handoff, in_hand=in_hand, stats=stats,
            annotate=agent.annotate, publish=self._publish_handoff,
            checkpoint=mid_turn.checkpoint, tell_blocked=endings.tell_blocked)
        self._turns = turns = TurnLoop(
            scope=scope, agent=agent, kinds=kinds, checks=turn_checks(agent),
            pauses=boundary, ends=endings, in_hand=in_hand, stats=stats,
            background=background, mid_turn=mid_turn, owners=owners,
            key_missing=key_missing, events=self.events, handoffs=handoffs)
        #: Every resume of a stored task goes through the agent's breaker.
        resume = breaker.guard(turns.resume)
        self._taker = None if agent.handoff is None else HandoffTaker(
            scope=scope, owners=owners, in_hand=in_hand, stats=stats,
            dead_letters=dead_letters, resume=turns.resume, spawn=background.spawn,
            publish=self._publish_handoff)
        self._answers = Answers(
            scope=scope, outages=outages, memory=memory, in_hand=in_hand, owners=owners,
            dead_letters=dead_letters, stats=stats, resume=resume)
        self._inputs = Inputs(
            scope=scope, outages=outages, owners=owners, dead_letters=dead_letters,
            stats=stats, resume=resume, approvers=approvers)
        self._dead_letters = dead_letters
        self._sweeper = Sweeper(scope=scope, kinds=kinds, owners=owners, stats=stats,
                                background=background, resume=resume)
        self._recovery = Recovery(
            scope=scope, kinds=kinds, policy=agent.recovery, in_hand=in_hand, owners=owners,
            stats=stats, background=background, resume=resume, ending=cancels,
            key_missing=key_missing, tell_blocked=endings.tell_blocked, breaker=breaker)
        self._ledger = EndedTasks(scope=scope)
        self._keeper = LeaseKeeper(scope=scope, in_hand=in_hand)
        #: The agent's shared queues (new work: requests, answers, status updates), and
        #: this instance's own (its inbox and the control subject).
        self._work_queues: list[Subscription] = []
        self._own_queues: list[Subscription] = []

    def __repr__(self) -> str:
        return f"AgentInstance({self.instance_id!r}, active={len(self._in_hand)})"

    @property
    def active(self) -> dict[str, TaskRun]:
        """Tasks in this instance's memory (running a turn, or waiting in memory)."""
        return self._in_hand.runs

    @property
    def running(self) -> bool:
        return self._lifecycle.running

    @property
    def draining(self) -> bool:
        """Set by :meth:`drain`: no new work is taken, the work in hand finishes."""
        return self._lifecycle.draining

    # -- lifecycle ----------------------------------------------------------------------

    async def start(self) -> None:
        name, o, subjects = self.agent.name, self.options, self.subjects
        self._lifecycle.running = True
        requests = ConsumerOptions(ack_wait_s=o.request_ack_wait_s, max_deliver=o.max_deliver,
                                   max_in_flight=o.max_in_flight)
        answers = ConsumerOptions(ack_wait_s=o.response_ack_wait_s, max_deliver=o.max_deliver,
                                  max_in_flight=o.max_in_flight)
        mine = ConsumerOptions(ack_wait_s=o.response_ack_wait_s, max_deliver=o.max_deliver,
                               max_in_flight=o.max_in_flight, ephemeral=True)
        for joined, subject, queue, handler, options in (
            (self._work_queues, subjects.request(name), subjects.queue(f"{name}-requests"),
             self._on_request, requests),
            (self._work_queues, subjects.responses(name), subjects.queue(f"{name}-responses"),
             self._answers.on_response, answers),
            (self._work_queues, subjects.statuses(name), subjects.queue(f"{name}-status"),
             self._answers.on_status, answers),
            (self._own_queues, f"{subjects.inbox(name, self.instance_id)}.>",
             subjects.queue(f"inbox-{self.instance_id}"), self._answers.on_inbox, mine),
            (self._own_queues, subjects.control(name),
             subjects.queue(f"control-{self.instance_id}"), self._on_control, mine),
        ):
            joined.append(await self.broker.subscribe(subject, queue, handler, options))
        if self._taker is not None:
            self._work_queues.append(await self.broker.subscribe(
                subjects.handoff(name), subjects.queue(f"{name}-handoffs"),
                self._taker.on_handoff, answers))
        def loop(name: str, step: Callable[[], Awaitable[None]], period_s: float, *,
                 while_draining: bool = False) -> None:
            self._background.spawn(forever(name, step, period_s, lifecycle=self._lifecycle,
                                           instance_id=self.instance_id,
                                           while_draining=while_draining))

        loop("keeper", self._keeper.step, self._keeper.period_s, while_draining=True)
        if self.agent.pauses:
            # Only an agent that calls peers or asks for approvals ever pauses: the
            # others have no deadlines to sweep and no leases to recover, and spare the
            # database the polling.
            self._background.spawn(self._recover_at_start())
            loop("sweeper", self._sweeper.step, o.sweep_interval_s)
            loop("recovery", self._recovery.step, o.recovery_interval_s)
            loop("expiry", self._recovery.expire, self._recovery.expiry_period_s)
            loop("ledger", self._ledger.step, self._ledger.period_s)
        if self._taker is not None:
            loop("handoffs", self._taker.sweep, o.recovery_interval_s)

    async def _recover_at_start(self) -> None:
        try:
            await self._recovery.at_start()
        except StoreError as error:
            logger.warning("%s: recovery at start failed: %s", self.instance_id, error)

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
        self._lifecycle.begin_draining()
        # No new work; the inbox and the control subject serve the tasks in hand.
        await asyncio.gather(*(s.drain(timeout_s) for s in self._work_queues))
        self._work_queues.clear()
        while loop.time() < deadline and (self._in_hand or len(self._background) > 1):
            await asyncio.sleep(0.02)  # the keeper is the one task left when idle
        left = len(self._in_hand)
        # Handlers still running on the inbox or the control subject (a cancel midway)
        # finish too, within what is left of the time.
        await asyncio.gather(*(s.drain(max(0.0, deadline - loop.time()))
                               for s in self._own_queues))
        self._own_queues.clear()
        await self._halt()
        logger.info("%s: drained (%d task(s) left to recovery)", self.instance_id, left)

    async def stop(self) -> None:
        """Leave the queues and stop the loops. Tasks still in hand are not lost:
        their messages were not acknowledged and their leases expire. The event log's
        buffered events are written."""
        await self._halt()

    async def kill(self) -> None:
        """Die as a crash would: same as :meth:`stop`, which never acks or releases,
        except that the event log's buffered events are lost, as SIGKILL loses them."""
        await self._halt(crash=True)

    async def _halt(self, *, crash: bool = False) -> None:
        """Stop the loops; then write the event log's buffer, or, as a ``crash``,
        lose it."""
        self._lifecycle.running = False
        for subscription in (*self._work_queues, *self._own_queues):
            await subscription.stop()
        self._work_queues.clear()
        self._own_queues.clear()
        await self._background.cancel_all()
        self._in_hand.clear()
        for log in (self.events, self._alert_log):
            if log is None:
                continue
            if crash:
                log.abandon()
            else:
                await log.close()

    # -- handoffs and alerts ----------------------------------------------------------------

    async def _publish_handoff(self, agent: str, body: dict[str, object]) -> None:
        """Publish a handed-off task for any instance of ``agent`` to take."""
        await self.broker.publish(self.subjects.handoff(agent), orjson.dumps(body))

    async def _on_handoff_request(self, request: a2a.HandoffTaskRequest,
                                  delivery: Delivery) -> None:
        """An operator's handoff request (any one instance of the agent takes it from
        the request queue): taken here if the task is in this instance's memory, else
        broadcast to every instance, and the one running it takes it. An agent
        without a handoff policy cannot: the request is dead-lettered, saying so."""
        task_id, reason = request.params.id, request.params.reason
        if self._handoffs is None:
            await self._dead_letters.reject(delivery, BadMessageError(
                f"handoff of task {task_id!r} refused: agent {self.agent.name!r} has no "
                "handoff policy"))
            return
        if not self._handoffs.request(task_id, reason):
            await self.broker.publish(self.subjects.control(self.agent.name),
                                      wire.handoff_broadcast(task_id, reason))
        await delivery.ack()

    async def _on_control(self, delivery: Delivery) -> None:
        """A message broadcast to every instance of the agent: a cancel
        (:meth:`Cancels.on_broadcast`), or an operator's handoff request, which the
        instance holding the task in its memory takes (:meth:`Handoffs.request`) and
        every other ignores."""
        try:
            message = wire.parse_control_message(
                delivery.message.data, max_bytes=self.options.max_message_bytes)
        except BadMessageError as error:
            await self._dead_letters.reject(delivery,
                                            BadMessageError(f"bad control message: {error}"))
            return
        await delivery.ack()
        if isinstance(message, wire.CancelBroadcast):
            await self._cancels.on_broadcast(message.cancel)
        elif self._handoffs is not None:
            self._handoffs.request(message.task_id, message.reason)

    # -- requests -------------------------------------------------------------------------

    async def _on_request(self, delivery: Delivery) -> None:
        """A new task (``message/send``), a human's answer to a waiting one (a
        ``message/send`` naming the task), a cancel (``tasks/cancel``), or an
        operator's handoff request (``meshpoint/handoff``)."""
        try:
            request = a2a.parse_request(delivery.message.data,
                                        max_bytes=self.options.max_message_bytes)
            headers = delivery.message.headers
            reply_to = self.subjects.reply_subject(headers, wire.REPLY_TO, "response")
            status_to = self.subjects.reply_subject(headers, wire.STATUS_TO, "status")
        except BadMessageError as error:
            await self._dead_letters.reject(delivery, error)
            return
        if delivery.delivery_count > 1:
            self.stats.note("redelivered", delivery.message.subject, journal=False)
        if isinstance(request, a2a.CancelTaskRequest):
            await self._cancels.on_cancel(request.params.id, delivery)
            return
        if isinstance(request, a2a.HandoffTaskRequest):
            await self._on_handoff_request(request, delivery)
            return
        if request.params.message.task_id is not None:
            await self._inputs.on_answer(request, reply_to, delivery)
            return
        task_id = wire.derive_task_id(self.agent.name, reply_to, request.id)
        run = self._in_hand.get(task_id)
        if run is not None:
            # A redelivery of a task still in hand (its ack wait ran out): keep the
            # new delivery, the one the broker will accept an ack for.
            run.delivery = delivery
            return
        message = request.params.message
        # The request's hash rides in the context into every history record, signed
        # with it: a reconstruction checks the request it reads from the (unsigned)
        # event log against it.
        ctx = TaskExecutionContext(task_id, {
            "agent": self.agent.name, "request_id": request.id, "reply_to": reply_to,
            "status_to": status_to, "context_id": message.context_id or task_id,
            "caller": (message.metadata or {}).get("meshpoint_caller"),
            "request_sha256": request_digest(message.text)})
        state = ((message.metadata or {}).get(METADATA_KEY) or {}).get("state")
        if isinstance(state, dict):
            ctx.a2a_context[STATE_KEY] = state  # for its system prompt's placeholders
        parent = kept((message.metadata or {}).get(TRACEPARENT))
        if parent is not None:  # the caller's span; else a trace of its own
            ctx.a2a_context[TRACEPARENT] = parent
        ctx.append_session_event({"role": "user", "content": message.text})
        ctx.history = self.agent.history_annotations()
        self.stats.log("protocol_receive", task_id, step="request", message=request)
        # No "working" status update here: it would cost the caller a database write
        # per call, and the caller can name this task anyway (derive_task_id).
        await self._turns.start(TaskRun(ctx, delivery=delivery))
