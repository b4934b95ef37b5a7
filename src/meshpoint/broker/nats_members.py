"""The members of a NATS JetStream queue: each pulls from the queue's consumer and
hands deliveries to its handler (:class:`meshpoint.broker.nats.NatsBroker` makes
them; the broker's module docstring says how the contract maps onto JetStream).

A member needs little of its broker (:class:`QueueOwner`): the JetStream context to
pull from, the connection's state, a publish for dead letters, and to re-create its
consumer or say it left.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Protocol

import nats
import nats.errors
import nats.js.errors
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription as NatsSubscription
from nats.js import JetStreamContext
from nats.js.api import DEFAULT_PREFIX, Header, StatusCode

from meshpoint.broker.base import (
    DEAD_LETTER_DELIVERIES,
    DEAD_LETTER_REASON,
    DEAD_LETTER_SUBJECT,
    ConsumerOptions,
    Delivery,
    Handler,
    Message,
    Subscription,
    check_delay,
)
from meshpoint.errors import BrokerError

logger = logging.getLogger("meshpoint.broker.nats")

#: Errors that mean "NATS is not reachable right now": retry, do not give up.
TRANSIENT = (asyncio.TimeoutError, nats.errors.TimeoutError, nats.errors.ConnectionClosedError,
             nats.errors.ConnectionReconnectingError, nats.errors.StaleConnectionError,
             nats.errors.OutboundBufferLimitError, nats.errors.NoRespondersError,
             nats.js.errors.ServiceUnavailableError, nats.js.errors.NoStreamResponseError,
             OSError)
#: How often an idle member checks that its consumer still exists on the server.
CONSUMER_CHECK_S = 5.0
#: The most messages one pull request asks for (and so takes from the queue's other
#: members at once).
PULL_BATCH = 16
#: Statuses that end a pull request with nothing wrong: no messages, the request
#: expired.
QUIET_STATUSES = (StatusCode.NO_MESSAGES, StatusCode.REQUEST_TIMEOUT)


class QueueOwner(Protocol):
    """What a member needs of its broker."""

    js: JetStreamContext
    nc: NatsClient
    pull_expires_s: float

    async def publish(self, subject: str, data: bytes,
                      headers: Mapping[str, str] | None = None, *,
                      msg_id: str | None = None) -> None: ...

    async def ensure_consumer(self, stream: str, consumer: str, subject: str,
                              options: ConsumerOptions, *, lost: bool = False) -> None: ...

    async def left(self, member: Member) -> None: ...


class NatsDelivery(Delivery):
    """A JetStream message in a member's hands."""

    def __init__(self, member: Member, msg: Msg, count: int) -> None:
        self.member = member
        self._msg = msg
        headers = {k: v for k, v in (msg.headers or {}).items() if not k.startswith("Nats-")}
        self.message = Message(msg.subject, msg.data, headers)
        self.delivery_count = count
        self._deadline = asyncio.get_running_loop().time() + member.options.ack_wait_s
        self.settled = False

    def _take(self) -> bool:
        """Settle once; a settlement after the ack wait ran out is ignored (the message
        may be in another member's hands by now), as in the in-process broker."""
        if self.settled:
            return False
        self.settled = True
        return asyncio.get_running_loop().time() <= self._deadline

    async def _send(self, what: str, send: Callable[[], Awaitable[None]]) -> None:
        try:
            await send()
        except (*TRANSIENT, nats.errors.Error) as error:
            logger.warning("could not %s a message on %s (%r); it comes back after its "
                           "ack wait", what, self.message.subject, error)

    async def ack(self) -> None:
        if self._take():
            await self._send("ack", self._msg.ack)

    async def in_progress(self) -> None:
        loop = asyncio.get_running_loop()
        if not self.settled and loop.time() <= self._deadline:
            self._deadline = loop.time() + self.member.options.ack_wait_s
            await self._send("extend", self._msg.in_progress)

    async def nak(self, delay_s: float = 0.0) -> None:
        check_delay(delay_s)
        if self._take():
            await self._send("nak", lambda: self._msg.nak(delay_s or None))

    async def term(self, reason: str) -> None:
        if self._take():
            if await self.member.dead_letter(self._msg, f"terminated: {reason}",
                                              self.delivery_count):
                await self._send("terminate", self._msg.term)
            else:
                await self._send("nak", lambda: self._msg.nak(1.0))


class Member(Subscription):
    """One member of a queue: pulls only when it has a free slot and a connection,
    as many messages as it has free slots (up to ``PULL_BATCH``) in one request, and
    handles up to ``max_in_flight`` at once."""

    def __init__(self, broker: QueueOwner, stream: str, consumer: str, subject: str,
                 handler: Handler, options: ConsumerOptions, dead_letter_subject: str) -> None:
        self.broker = broker
        self.stream = stream
        self.consumer = consumer
        self.subject = subject
        self.handler = handler
        self.options = options
        self.dead_letter_subject = dead_letter_subject
        self.slots = asyncio.Semaphore(options.max_in_flight)
        self.in_flight: set[asyncio.Task[None]] = set()
        self.loop_task: asyncio.Task[None] | None = None
        #: Where the consumer delivers this member's messages, and its subscription.
        self.inbox = ""
        self.sub: NatsSubscription | None = None
        self.next_subject = f"{DEFAULT_PREFIX}.CONSUMER.MSG.NEXT.{stream}.{consumer}"
        #: The pull request under way (its outcome once ended) and the slots it holds
        #: for messages yet to come.
        self.request: asyncio.Future[str | None] | None = None
        self.reserved = 0
        #: Pull requests made (the number of the one under way ends its reply subject).
        self.requests = 0
        #: Messages brought that this member will not handle, to give back.
        self.unwanted: list[Msg] = []
        self.pulling = True
        self.stopped = False
        self.checked_at = 0.0

    async def start(self) -> None:
        self.inbox = self.broker.nc.new_inbox()
        self.sub = await self.broker.nc.subscribe(f"{self.inbox}.*", cb=self._delivered)
        self.loop_task = asyncio.create_task(self._take(), name=f"member of {self.consumer}")

    async def _take(self) -> None:
        """Ask the consumer for as many messages as this member has free slots (up to
        ``PULL_BATCH``), one request at a time, each lingering up to the broker's
        ``pull_expires_s``; :meth:`_delivered` hands each message to its handler as it
        comes. Under load one request brings several messages; idle, it is one
        request a ``pull_expires_s``."""
        loop = asyncio.get_running_loop()
        pause = 0.05
        while self.pulling:
            await self.slots.acquire()
            if not self.pulling:  # a drain began while this member waited for a slot
                self.slots.release()
                return
            wanted = 1
            while wanted < PULL_BATCH and not self.slots.locked():
                await self.slots.acquire()  # free: returns without waiting
                wanted += 1
            if not self.broker.nc.is_connected:
                # A pull request made now would be buffered and sent on reconnect, late.
                self._release(wanted)
                await asyncio.sleep(0.1)
                continue
            self.reserved = wanted
            self.request = ended = loop.create_future()
            self.requests += 1
            expires = self.broker.pull_expires_s
            try:
                await self.broker.nc.publish(
                    self.next_subject, b'{"batch":%d,"expires":%d}' % (
                        wanted, int(expires * 1e9) - 100_000),
                    reply=f"{self.inbox}.{self.requests}")
                with contextlib.suppress(TimeoutError):
                    # The server ends the request (the batch filled, or a status when
                    # it expires); past that, the request was lost (a reconnect).
                    await asyncio.wait_for(asyncio.shield(ended), expires + 0.5)
            except BaseException as error:
                self._end_request(None)
                if isinstance(error, asyncio.CancelledError | KeyboardInterrupt | SystemExit):
                    raise
                await self._recover(error, pause)
                pause = min(2.0, pause * 2)
                continue
            self._end_request(None)
            await self._give_back()
            outcome = ended.result()
            if outcome is None or outcome == "ok" or outcome in QUIET_STATUSES:
                pause = 0.05
                if outcome != "ok":
                    # Pulls from a consumer the server no longer has just time out:
                    # look for it now and then while idle.
                    now = loop.time()
                    if now - self.checked_at >= CONSUMER_CHECK_S:
                        self.checked_at = now
                        await self._recreate_if_lost()
                continue
            # A conflict (the consumer deleted, too many waiting pulls) or JetStream
            # unavailable: wait, then look for the consumer.
            await self._recover(nats.js.errors.APIError(description=str(outcome)), pause)
            pause = min(2.0, pause * 2)

    async def _give_back(self) -> None:
        """Nak the messages this member will not handle, for another member to take."""
        unwanted, self.unwanted = self.unwanted, []
        for msg in unwanted:
            with contextlib.suppress(*TRANSIENT, nats.errors.Error):
                await msg.nak()

    def _release(self, slots: int) -> None:
        for _ in range(slots):
            self.slots.release()

    def _end_request(self, outcome: str | None) -> None:
        """End the pull request under way, if any, with ``outcome`` ("ok": its batch
        came; a status: the server ended it; None: given up on), giving back the
        slots it held for messages that did not come."""
        request, self.request = self.request, None
        if request is None:
            return
        self._release(self.reserved)
        self.reserved = 0
        if not request.done():
            request.set_result(outcome)

    async def _delivered(self, msg: Msg) -> None:
        """A message, or a status ending a pull request, on this member's inbox."""
        headers = msg.headers or {}
        status = headers.get(Header.STATUS)
        if status is not None:
            # A status comes to the reply subject of its request: one that ends the
            # request under way (not a heartbeat, nor a late status of a request
            # given up on) ends it.
            if self.request is not None and status != StatusCode.CONTROL_MESSAGE and \
                    msg.subject == f"{self.inbox}.{self.requests}":
                self._end_request(status if status != StatusCode.CONFLICT
                                  else f"{status} {headers.get(Header.DESCRIPTION, '')}")
            return
        if self.reserved > 0:
            self.reserved -= 1  # a slot the request under way holds
        elif self.pulling and not self.slots.locked():
            # A message of a request given up on (a reconnect lost its status), or
            # more than the one under way asked for: a slot is free for it.
            await self.slots.acquire()  # free: returns without waiting
        else:
            self.unwanted.append(msg)  # no slot: given back once the request ended
            return
        if self.request is not None and self.reserved == 0:
            self._end_request("ok")
        if not self.pulling:
            # A drain began while the request was out: given back once the request
            # ended (given back now, the request would bring it again).
            self.slots.release()
            self.unwanted.append(msg)
            return
        task = asyncio.create_task(self._handle(msg))
        self.in_flight.add(task)
        task.add_done_callback(self.in_flight.discard)

    async def _recover(self, error: BaseException, pause: float) -> None:
        """A pull failed: wait, and re-create the queue if the server lost it (an
        ephemeral queue idle too long while this process was cut off, or a consumer
        deleted by an operator)."""
        logger.debug("pull from %s failed: %r", self.consumer, error)
        await asyncio.sleep(pause)
        await self._recreate_if_lost()

    async def _recreate_if_lost(self) -> None:
        if not self.broker.nc.is_connected:
            return
        try:
            await self.broker.js.consumer_info(self.stream, self.consumer)
        except nats.js.errors.NotFoundError:
            try:
                await self.broker.ensure_consumer(self.stream, self.consumer, self.subject,
                                                   self.options, lost=True)
            except BrokerError as error:  # refused this user: the pulls go on failing
                logger.error("queue %s on stream %s cannot be re-created: %s",
                             self.consumer, self.stream, error)
            except (*TRANSIENT, nats.errors.Error):
                pass
        except (*TRANSIENT, nats.errors.Error):
            pass

    async def _handle(self, msg: Msg) -> None:
        try:
            count = msg.metadata.num_delivered or 1
            if count > self.options.max_deliver:
                reason = (f"not acknowledged after {count - 1} deliveries "
                          f"(max_deliver={self.options.max_deliver})")
                if await self.dead_letter(msg, reason, count - 1):
                    with contextlib.suppress(*TRANSIENT, nats.errors.Error):
                        await msg.ack()
                return
            delivery = NatsDelivery(self, msg, count)
            try:
                await self.handler(delivery)
            except asyncio.CancelledError:
                raise  # the member stopped: the message comes back after its ack wait
            except Exception:
                logger.exception("handler of queue %s failed on %s", self.consumer,
                                 msg.subject)
                if not delivery.settled:
                    await delivery.nak(min(1.0, 0.05 * count))
        finally:
            self.slots.release()

    async def dead_letter(self, msg: Msg, reason: str, deliveries: int) -> bool:
        """Publish ``msg`` to the dead-letter subject; False if that failed (then the
        message must stay, to be dead-lettered on a later delivery)."""
        logger.warning("dead-lettering a message on %s from queue %s: %s", msg.subject,
                       self.consumer, reason)
        headers = {k: v for k, v in (msg.headers or {}).items() if not k.startswith("Nats-")}
        headers.update({DEAD_LETTER_SUBJECT: msg.subject, DEAD_LETTER_REASON: reason,
                        DEAD_LETTER_DELIVERIES: str(deliveries)})
        try:
            await self.broker.publish(
                self.dead_letter_subject, msg.data, headers,
                msg_id=f"dead.{self.stream}.{self.consumer}.{msg.metadata.sequence.stream}")
        except BrokerError as error:
            logger.error("could not dead-letter a message on %s: %s", msg.subject, error)
            return False
        return True

    async def drain(self, timeout_s: float) -> None:
        await self._stop_pulling(gently=True)
        if self.in_flight:
            await asyncio.wait(set(self.in_flight), timeout=timeout_s)
        await self.stop()

    async def _stop_pulling(self, *, gently: bool = False) -> None:
        """Stop the pull loop. ``gently`` lets a pull in progress end by itself and
        gives back (nak) a message it brings, rather than cancelling it and leaving a
        message it may hold stranded until its ack wait."""
        self.pulling = False
        if self.loop_task is not None:
            if gently:
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(asyncio.shield(self.loop_task),
                                           self.broker.pull_expires_s + 1.0)
            self.loop_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                try:
                    await self.loop_task
                except Exception:
                    logger.exception("the pull loop of %s failed", self.consumer)
        self._end_request(None)
        if self.sub is not None:
            # No interest left in the inbox: the server hands a pending pull request
            # nothing more; what it brought already goes through _delivered, to be
            # given back.
            try:
                await asyncio.wait_for(self.sub.drain(), 1.0)  # type: ignore[no-untyped-call]
            except Exception:  # the connection is down or closing
                with contextlib.suppress(Exception):
                    await self.sub.unsubscribe()
            self.sub = None
        await self._give_back()

    async def stop(self) -> None:
        if self.stopped:
            return
        self.stopped = True
        await self._stop_pulling()
        tasks = list(self.in_flight)
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self.broker.left(self)
