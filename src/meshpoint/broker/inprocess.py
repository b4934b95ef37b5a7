"""``InProcessBroker``: the broker semantics of :mod:`meshpoint.broker.base` in one
event loop. It is the embedded default and the fast test backend, not a mock:
queues are durable for the broker's lifetime, members compete for deliveries,
un-acked deliveries come back after ``ack_wait_s``, and poison messages end up on
a dead-letter subject, exactly as with NATS JetStream.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import logging
from collections import OrderedDict, deque
from collections.abc import Mapping

from meshpoint.broker.base import (
    DEAD_LETTER_DELIVERIES,
    DEAD_LETTER_REASON,
    DEAD_LETTER_SUBJECT,
    Broker,
    ConsumerOptions,
    Delivery,
    Handler,
    Message,
    Subscription,
    check_delay,
    check_message,
    check_subject,
    default_dead_letter_subject,
    one_filter_per_queue,
    subject_matches,
)
from meshpoint.errors import BrokerClosedError

logger = logging.getLogger("meshpoint.broker")
_REAPER_TICK_S = 0.01


class _Entry:
    """A message waiting in, or delivered from, one queue."""

    __slots__ = ("deliveries", "message")

    def __init__(self, message: Message) -> None:
        self.message = message
        self.deliveries = 0


class _Delivery(Delivery):
    def __init__(self, queue: _Queue, entry: _Entry, deadline: float) -> None:
        self._queue = queue
        self.entry = entry
        self.message = entry.message
        self.delivery_count = entry.deliveries
        self.deadline = deadline
        self.settled = False

    def _settle(self) -> bool:
        """Mark settled; False if it already was (settling twice is a no-op), or if
        its ack wait expired and the message was already handed out again."""
        if self.settled:
            return False
        self.settled = True
        self._queue.settled_in_heap += 1
        return True

    async def ack(self) -> None:
        self._settle()

    async def in_progress(self) -> None:
        if not self.settled:
            self.deadline = asyncio.get_running_loop().time() + self._queue.options.ack_wait_s
            self._queue.watch(self)

    async def nak(self, delay_s: float = 0.0) -> None:
        check_delay(delay_s)
        if self._settle():
            self._queue.redeliver(self.entry, delay_s)

    async def term(self, reason: str) -> None:
        if self._settle():
            self._queue.dead_letter(self.entry, f"terminated: {reason}")


class _Queue:
    """A durable consumer: a filter, its ready messages, and its pending deliveries."""

    def __init__(self, broker: InProcessBroker, name: str, filter_tokens: list[str],
                 options: ConsumerOptions) -> None:
        self.broker = broker
        self.name = name
        self.filter_tokens = filter_tokens
        self.options = options
        self.dead_letter_subject = (options.dead_letter_subject
                                    or default_dead_letter_subject(filter_tokens, name))
        self.ready: asyncio.Queue[_Entry] = asyncio.Queue()
        self.pending: list[tuple[float, int, _Delivery]] = []  # a heap by deadline
        #: Settled deliveries still in the heap; compacted away once they dominate,
        #: so memory follows the deliveries in hand, not the message rate x ack wait.
        self.settled_in_heap = 0

    def deliver(self, entry: _Entry) -> _Delivery:
        entry.deliveries += 1
        loop = asyncio.get_running_loop()
        delivery = _Delivery(self, entry, loop.time() + self.options.ack_wait_s)
        self.watch(delivery)
        return delivery

    def watch(self, delivery: _Delivery) -> None:
        heapq.heappush(self.pending, (delivery.deadline, next(self.broker.sequence), delivery))

    def redeliver(self, entry: _Entry, delay_s: float = 0.0) -> None:
        if entry.deliveries >= self.options.max_deliver:
            self.dead_letter(entry, f"not acknowledged after {entry.deliveries} deliveries "
                                    f"(max_deliver={self.options.max_deliver})")
        elif delay_s > 0:
            asyncio.get_running_loop().call_later(delay_s, self._requeue, entry)
        else:
            self._requeue(entry)

    def _requeue(self, entry: _Entry) -> None:
        if not self.broker.closed:
            self.ready.put_nowait(entry)

    def dead_letter(self, entry: _Entry, reason: str) -> None:
        logger.warning("dead-lettering a message on %s from queue %s: %s",
                       entry.message.subject, self.name, reason)
        headers = {**entry.message.headers, DEAD_LETTER_SUBJECT: entry.message.subject,
                   DEAD_LETTER_REASON: reason, DEAD_LETTER_DELIVERIES: str(entry.deliveries)}
        self.broker.route(Message(self.dead_letter_subject, entry.message.data, headers))

    def expire(self, now: float) -> None:
        """Take back deliveries whose ack wait passed without a settlement."""
        if self.settled_in_heap > 1024 and self.settled_in_heap * 2 > len(self.pending):
            self.pending = [item for item in self.pending if not item[2].settled]
            heapq.heapify(self.pending)
            self.settled_in_heap = 0
        while self.pending and self.pending[0][0] <= now:
            deadline, _, delivery = heapq.heappop(self.pending)
            # An entry left behind by in_progress() no longer matches the deadline.
            if delivery.settled:
                self.settled_in_heap = max(0, self.settled_in_heap - 1)
            elif deadline == delivery.deadline:
                delivery.settled = True  # a late ack/nak of this delivery is ignored
                self.redeliver(delivery.entry)


class _Member(Subscription):
    def __init__(self, queue: _Queue, handler: Handler) -> None:
        self.queue = queue
        self.handler = handler
        self.slots = asyncio.Semaphore(queue.options.max_in_flight)
        self.in_flight: set[asyncio.Task[None]] = set()
        self.loop_task = asyncio.create_task(self._take(), name=f"member of {queue.name}")

    async def _take(self) -> None:
        while True:
            await self.slots.acquire()
            entry = await self.queue.ready.get()
            # No await between taking the entry and registering its delivery: a stop
            # (cancellation) can never lose a message here.
            delivery = self.queue.deliver(entry)
            task = asyncio.create_task(self._handle(delivery))
            self.in_flight.add(task)
            task.add_done_callback(self.in_flight.discard)

    async def _handle(self, delivery: _Delivery) -> None:
        try:
            await self.handler(delivery)
        except asyncio.CancelledError:
            raise  # the member stopped: the delivery comes back after its ack wait
        except Exception:
            logger.exception("handler of queue %s failed on %s", self.queue.name,
                             delivery.message.subject)
            if not delivery.settled:
                await delivery.nak(min(1.0, 0.05 * delivery.delivery_count))
        finally:
            self.slots.release()

    async def drain(self, timeout_s: float) -> None:
        self.loop_task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.loop_task
        if self.in_flight:
            await asyncio.wait(set(self.in_flight), timeout=timeout_s)
        await self.stop()

    async def stop(self) -> None:
        tasks = [self.loop_task, *self.in_flight]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        broker = self.queue.broker
        broker.members.discard(self)
        if self.queue.options.ephemeral and not any(m.queue is self.queue
                                                    for m in broker.members):
            broker.queues.pop(self.queue.name, None)


class InProcessBroker(Broker):
    """A broker inside one process. Messages published to subjects that no queue
    matches are held (up to ``max_unrouted``) for the first durable queue that will.
    Publishes with a ``msg_id`` seen in the last ``dedupe_window_s`` are dropped."""

    def __init__(self, *, max_unrouted: int = 100_000, dedupe_window_s: float = 120.0
                 ) -> None:
        self.queues: dict[str, _Queue] = {}
        self.members: set[_Member] = set()
        self.unrouted: deque[Message] = deque()
        self.max_unrouted = max_unrouted
        self.sequence = itertools.count()
        self.dedupe_window_s: float = dedupe_window_s
        #: msg_id -> when it was published, oldest first.
        self.recent_ids: OrderedDict[str, float] = OrderedDict()
        self.closed = False
        self._reaper: asyncio.Task[None] | None = None

    async def publish(self, subject: str, data: bytes,
                      headers: Mapping[str, str] | None = None, *,
                      msg_id: str | None = None) -> None:
        if self.closed:
            raise BrokerClosedError("the broker is closed")
        check_message(subject, data, msg_id)
        if msg_id is not None and self._seen(msg_id):
            return
        self.route(Message(subject, data, dict(headers or {})))

    def _seen(self, msg_id: str) -> bool:
        """Whether ``msg_id`` was published within the window (and remember it)."""
        now = asyncio.get_running_loop().time()
        recent = self.recent_ids
        while recent:
            oldest, at = next(iter(recent.items()))
            if now - at <= self.dedupe_window_s:
                break
            del recent[oldest]
        if msg_id in recent:
            return True
        recent[msg_id] = now
        return False

    def route(self, message: Message) -> None:
        tokens = message.subject.split(".")
        matched = False
        for queue in self.queues.values():
            if subject_matches(queue.filter_tokens, tokens):
                queue.ready.put_nowait(_Entry(message))
                matched = True
        if not matched:
            if len(self.unrouted) >= self.max_unrouted:
                dropped = self.unrouted.popleft()
                logger.error("no queue takes %s; dropped the oldest held message (%s)",
                             message.subject, dropped.subject)
            self.unrouted.append(message)

    async def subscribe(self, subject: str, queue: str, handler: Handler,
                        options: ConsumerOptions | None = None) -> Subscription:
        if self.closed:
            raise BrokerClosedError("the broker is closed")
        tokens = check_subject(subject, pattern=True)
        check_subject(queue, pattern=False)
        existing = self.queues.get(queue)
        if existing is None:
            existing = _Queue(self, queue, tokens, options or ConsumerOptions())
            self.queues[queue] = existing
            # An ephemeral queue starts with what is published from now on.
            held = [] if existing.options.ephemeral else [
                m for m in self.unrouted if subject_matches(tokens, m.subject.split("."))]
            for message in held:
                self.unrouted.remove(message)
                existing.ready.put_nowait(_Entry(message))
        else:
            one_filter_per_queue(queue, ".".join(existing.filter_tokens), subject)
        if self._reaper is None:
            self._reaper = asyncio.create_task(self._reap(), name="in-process broker reaper")
        member = _Member(existing, handler)
        self.members.add(member)
        return member

    async def _reap(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(_REAPER_TICK_S)
            now = loop.time()
            for queue in self.queues.values():
                queue.expire(now)

    async def close(self) -> None:
        self.closed = True
        for member in list(self.members):
            await member.stop()
        if self._reaper is not None:
            self._reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reaper
