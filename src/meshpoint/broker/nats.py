"""``NatsBroker``: the broker contract of :mod:`meshpoint.broker.base` on NATS JetStream.

How the contract maps onto JetStream:

* **Streams per namespace.** A subject's first token is its namespace; the first
  publish or subscribe under a namespace creates the stream ``<prefix><namespace>``
  capturing ``<namespace>.>`` (file storage, limits retention bounded by
  ``max_age_s``, a dedupe window of ``dedupe_window_s``). Several brokers, processes
  and hosts share it. A client's broker (``create_streams=False``) never creates
  one: it raises :class:`~meshpoint.errors.NamespaceNotServedError` instead, so a
  request is never stored in a namespace that no ``meshpoint serve`` has run in.
* **A queue is a pull consumer** on that stream (its members, which pull from it,
  are in :mod:`meshpoint.broker.nats_members`), named after the queue, filtered by
  the subscription's subject, with explicit acks and the queue's ``ack_wait_s``.
  A durable queue is a durable consumer (delivering from the start of the stream, so
  messages published before its first member wait for it); the members of a queue,
  in any process, pull from the same consumer and so compete, each asking for as
  many messages as it has free slots. An ephemeral queue is
  a named consumer that starts at new messages, is deleted when its last member in
  this process stops, and by the server after ``ephemeral_inactive_s`` without pulls
  (its process died).
* **max_deliver** is enforced here, not by the server: the consumer redelivers without
  limit and a member that receives delivery ``max_deliver + 1`` dead-letters it (the
  handler saw exactly ``max_deliver``). The server alone would drop the message with
  only an advisory; this way the message itself reaches the dead-letter subject.
* **Settlements** are JetStream acks (``+ACK``, ``-NAK`` with a delay, ``+WPI``,
  ``+TERM``). A settlement that cannot be sent (the connection is down) is logged and
  dropped: the message comes back after its ack wait, as after a lost ack.
* **Users.** With a ``user`` (``connect(user=, password=)`` or credentials in the
  URL) the connection is that NATS user's, one of those ``meshpoint nats-config``
  writes: its replies come to an inbox of its own (``_INBOX_<user>``), and the
  server refuses what its permissions do not allow (:class:`BrokerPermissionError`,
  at once, naming the subject). An ephemeral queue's consumer gets an unguessable
  name (never listed to users), so that no other user can read from it; a durable
  queue's consumer is named after the queue, and users' permissions name theirs.
* **Restarts.** The client reconnects forever; a publish retries (with the same
  ``Nats-Msg-Id``, so a retry is never stored twice) until ``publish_timeout_s``;
  members keep pulling through the outage. Streams and consumers are on disk, so a
  restarted server loses nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import re
import secrets
import uuid
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

import nats
import nats.errors
import nats.js.errors
from nats.aio.client import Client as NatsClient
from nats.js import JetStreamContext
from nats.js.api import (
    AckPolicy,
    ConsumerConfig,
    DeliverPolicy,
    DiscardPolicy,
    RetentionPolicy,
    StorageType,
    StreamConfig,
    StreamInfo,
)
from tenacity import AsyncRetrying, retry_if_exception_type, wait_exponential

from meshpoint._redact import redact_url
from meshpoint._retry import retried
from meshpoint.broker.base import (
    Broker,
    ConsumerOptions,
    Handler,
    Subscription,
    check_message,
    check_subject,
    default_dead_letter_subject,
    one_filter_per_queue,
)
from meshpoint.broker.nats_members import TRANSIENT, Member
from meshpoint.broker.nats_tls import ConnectionRefused, NoTls, TlsClient, first_connection
from meshpoint.errors import (
    BrokerClosedError,
    BrokerError,
    BrokerPermissionError,
    InvalidArgumentError,
    NamespaceNotServedError,
    TlsError,
)
from meshpoint.tls import TlsConfig, tls_failure

logger = logging.getLogger("meshpoint.broker.nats")

_UNSAFE_NAME = re.compile(r"[^A-Za-z0-9_-]")
T = TypeVar("T")


def _wrong_user(error: BaseException) -> bool:
    """Whether the server refused the connection's user or password."""
    return "authorization violation" in str(error).lower()


def inbox_prefix(user: str) -> str:
    """The subject prefix of a NATS user's replies (pull deliveries, API answers):
    one per user, so that a user's permissions can allow its own replies only."""
    return f"_INBOX_{safe_name(user)}"


def safe_name(name: str) -> str:
    """A stream or consumer name for ``name``: kept as is when NATS accepts it, else
    its unsafe characters replaced and a hash of the original appended (no clashes)."""
    cleaned = _UNSAFE_NAME.sub("_", name)
    if cleaned == name and len(name) <= 64:
        return name
    return f"{cleaned[:48]}_{hashlib.sha256(name.encode()).hexdigest()[:12]}"


class NatsBroker(Broker):
    """The broker on a NATS server with JetStream; create it with :meth:`connect`."""

    def __init__(self, nc: NatsClient, url: str, *, stream_prefix: str = "MESHPOINT_",
                 max_age_s: float = 7 * 86400.0, dedupe_window_s: float = 120.0,
                 publish_timeout_s: float = 30.0, pull_expires_s: float = 1.0,
                 ephemeral_inactive_s: float = 60.0, user: str | None = None,
                 create_streams: bool = True) -> None:
        self.nc = nc
        #: False for a client's broker: a namespace's stream must exist already.
        self.create_streams = create_streams
        #: The NATS user this connection is (None: the server's default, no auth).
        self.user = user
        #: What the server refused this user lately (subject -> its error), oldest first.
        self._denied: dict[str, str] = {}
        # Requests under way (publishes, JetStream API calls), each told of the server's
        # refusal of a subject it matches at once, rather than when it times out.
        self._refusable: list[tuple[Callable[[str], bool], asyncio.Future[tuple[str, str]]]] = []
        #: An ephemeral queue -> the unguessable name of its consumer on the server.
        self._ephemeral: dict[str, str] = {}
        self.js: JetStreamContext = nc.jetstream(timeout=5.0)
        #: The server's URL as messages show it: credentials replaced by ``***``.
        self.url = redact_url(url)
        self.stream_prefix = stream_prefix
        self.max_age_s = max_age_s
        self.dedupe_window_s: float = dedupe_window_s
        self.publish_timeout_s = publish_timeout_s
        self.pull_expires_s = pull_expires_s
        self.ephemeral_inactive_s = ephemeral_inactive_s
        self.closed = False
        #: Set once close() begins: disconnects from then on are expected.
        self.closing = False
        self._streams: set[str] = set()
        self._stream_lock = asyncio.Lock()
        #: (stream, consumer) -> members of that queue in this process.
        self._members: dict[tuple[str, str], set[Member]] = {}

    @classmethod
    async def connect(cls, url: str = "nats://127.0.0.1:4222", *,
                      connect_timeout_s: float = 10.0, name: str | None = None,
                      tls: TlsConfig | None = None, user: str | None = None,
                      password: str | None = None, **options: Any) -> NatsBroker:
        """Connect to the NATS server at ``url`` (reconnecting forever afterwards), as
        ``user`` with ``password`` if given (else as the URL's credentials, if any).
        Raises :class:`BrokerError` if it cannot be reached within
        ``connect_timeout_s`` or refuses the user; ``options`` are those of
        :class:`NatsBroker`.

        ``tls`` (or a ``tls://`` URL) requires TLS (:mod:`meshpoint.tls`): a server
        that offers none, or whose certificate does not verify, is refused at once
        with :class:`~meshpoint.errors.TlsError`, before anything is sent to it."""
        from urllib.parse import unquote, urlsplit

        parts = urlsplit(url)
        if user is None and parts.username:
            user = unquote(parts.username)
        setting = "broker.tls" if tls is not None else "the broker URL's tls:// scheme"
        required = tls if tls is not None else TlsConfig() if url.startswith("tls://") \
            else None
        nc = TlsClient(require_tls=required is not None)
        broker = cls(nc, url, user=user, **options)  # the client connects below
        shown = broker.url
        errors: list[Exception] = []
        loop = asyncio.get_running_loop()
        refused: asyncio.Future[Exception] = loop.create_future()

        async def quiet(error: Exception) -> None:  # reconnects are logged below
            errors[:] = [error]  # the last, to say why a first connection failed
            if required is not None and not refused.done() and (
                    isinstance(error, NoTls) or tls_failure(error) is not None):
                refused.set_result(error)  # nats-py would try again, forever
            if not refused.done() and not nc.is_connected and _wrong_user(error):
                refused.set_result(error)  # retrying is no use
            # What the server refuses this user arrives here, not at the call that
            # asked (a publish or request then times out): remember it, so that the
            # call can say so at once.
            # nats-py lowercases the server's error, subject included: keys are too.
            text = str(error).lower()
            if "permissions violation" in text:
                subject = text.rsplit(" to ", 1)[-1].strip("'\" ")
                broker._denied[subject] = text.removeprefix("nats: ").split(" to ", 1)[0]
                broker._tell_refused(subject)
                while len(broker._denied) > 256:
                    broker._denied.pop(next(iter(broker._denied)))

        async def disconnected() -> None:
            if not broker.closing and not nc.is_closed:  # closing: expected
                logger.warning("NATS connection to %s lost; reconnecting", shown)

        async def reconnected() -> None:
            logger.warning("NATS connection to %s re-established", shown)

        settings: dict[str, Any] = {
            "servers": [url], "name": name or "meshpoint", "max_reconnect_attempts": -1,
            "reconnect_time_wait": 0.25, "connect_timeout": 2, "error_cb": quiet,
            "disconnected_cb": disconnected, "reconnected_cb": reconnected,
            "allow_reconnect": True}
        if required is not None:
            settings["tls"] = required.ssl_context(setting)
        if user is not None:
            settings["inbox_prefix"] = inbox_prefix(user)
            if password is not None or not parts.username:
                settings.update(user=user, password=password or "")
        wrong_user = BrokerError(f"NATS at {shown} refused user {user!r}: wrong user or "
                                 "password (Authorization Violation)")
        try:
            await asyncio.wait_for(first_connection(nc, settings, refused), connect_timeout_s)
        except ConnectionRefused as error:
            with contextlib.suppress(Exception):
                await nc.close()
            if _wrong_user(error.cause):
                raise wrong_user from None
            assert required is not None
            if isinstance(error.cause, NoTls):
                raise TlsError(
                    f"NATS at {shown} offers no TLS, and {setting} requires it: nothing was "
                    "sent to it (credentials included). Turn TLS on in the server (or, to "
                    f"connect in the clear, remove {setting})") from None
            raise TlsError(
                f"TLS to NATS at {shown} failed: {tls_failure(error.cause)} ({setting}: "
                f"{required.describe()})") from None
        except nats.errors.AuthorizationError:
            with contextlib.suppress(Exception):
                await nc.close()
            raise wrong_user from None
        except (TimeoutError, OSError, nats.errors.Error) as error:
            with contextlib.suppress(Exception):
                await nc.close()
            if "uthorization" in str(error) or "uthorization" in repr(nc.last_error):
                raise wrong_user from None
            last = f"; the last error: {errors[-1]!r}" if errors and errors[-1] is not error \
                else ""
            raise BrokerError(
                f"cannot reach NATS at {shown} within {connect_timeout_s:g}s ({error!r}"
                f"{last}); start nats-server with JetStream (-js) or fix the broker URL"
            ) from None
        try:
            await broker.js.account_info()
        except nats.errors.TimeoutError:
            await nc.close()
            raise BrokerError(f"NATS user {user!r} may not use JetStream's API "
                              f"($JS.API.INFO): {broker._denial('$JS.API.') or 'timed out'}"
                              ) from None
        except nats.errors.Error as error:
            await nc.close()
            raise BrokerError(f"NATS at {shown} has no JetStream ({error}); start "
                              "nats-server with -js") from None
        return broker

    # -- streams and consumers -----------------------------------------------------------

    def _tell_refused(self, subject: str) -> None:
        """The server refused this user ``subject`` (lowercased, as nats-py tells it):
        end the first request under way that it matches, as told to the error
        callback only (the request itself would wait out its timeout)."""
        for matches, waiter in self._refusable:
            if not waiter.done() and matches(subject):
                waiter.set_result((self._denied.pop(subject, "refused"), subject))
                return

    async def _refusable_request(self, request: Awaitable[T], matches: Callable[[str], bool],
                                 subject: str | None = None) -> T:
        """``request``, ended at once with BrokerPermissionError when the server
        refuses a subject that ``matches`` (named as ``subject`` if given)."""
        refused: asyncio.Future[tuple[str, str]] = asyncio.get_running_loop().create_future()
        entry = (matches, refused)
        self._refusable.append(entry)
        asking = asyncio.ensure_future(request)
        try:
            await asyncio.wait((asking, refused), return_when=asyncio.FIRST_COMPLETED)
            if not asking.done():
                what, told = refused.result()
                raise BrokerPermissionError(
                    self._refused(what, subject) if subject is not None
                    else self._refused(f"{what} to {told!r}"))
            return asking.result()
        finally:
            asking.cancel()
            self._refusable.remove(entry)

    async def _api(self, request: Awaitable[T], kind: str, *names: str) -> T:
        """A JetStream API ``request`` on a ``kind`` ("stream" or "consumer") whose
        subject names ``names`` (the stream's, then the consumer's):
        $JS.API.STREAM.<verb>.<stream>, $JS.API.CONSUMER.<verb>.<stream>.<consumer>
        (.<filter>), $JS.API.CONSUMER.DURABLE.CREATE.<stream>.<consumer>."""
        wanted = [name.lower() for name in names]

        def matches(subject: str) -> bool:
            tokens = subject.split(".")
            return tokens[:3] == ["$js", "api", kind] and any(
                tokens[at:at + len(wanted)] == wanted for at in (4, 5))

        return await self._refusable_request(request, matches)

    def stream_name(self, namespace: str) -> str:
        return safe_name(f"{self.stream_prefix}{namespace}")

    async def _ensure_stream(self, namespace: str) -> str:
        name = self.stream_name(namespace)
        if name in self._streams:
            return name
        async with self._stream_lock:
            if name not in self._streams and not self.create_streams:
                try:
                    info = await self._api(self.js.stream_info(name), "stream", name)
                    self._use_window(name, info)
                except nats.js.errors.NotFoundError:
                    raise NamespaceNotServedError(namespace, name, self.url) from None
                self._streams.add(name)
            if name not in self._streams:
                config = StreamConfig(
                    name=name, subjects=[f"{namespace}.>"], retention=RetentionPolicy.LIMITS,
                    storage=StorageType.FILE, max_age=self.max_age_s,
                    duplicate_window=self.dedupe_window_s, discard=DiscardPolicy.OLD)
                try:
                    await self._api(self.js.add_stream(config), "stream", name)
                except nats.js.errors.BadRequestError:
                    # It exists with other limits (set by an operator): use it as it is,
                    # if it captures the namespace.
                    info = await self._api(self.js.stream_info(name), "stream", name)
                    if f"{namespace}.>" not in (info.config.subjects or []):
                        raise BrokerError(
                            f"NATS stream {name} exists but does not capture "
                            f"{namespace}.>; delete it or use another stream_prefix") from None
                    self._use_window(name, info)
                self._streams.add(name)
        return name

    def _use_window(self, name: str, info: StreamInfo) -> None:
        """An existing stream drops repeats for its own ``duplicate_window``: a shorter
        one than ``dedupe_window_s`` becomes this broker's (what a request published
        again relies on)."""
        window = info.config.duplicate_window
        if window and window < self.dedupe_window_s:
            logger.warning("NATS stream %s drops a repeated msg_id for %gs only, less than "
                           "dedupe_window_s (%gs): %gs is used", name, window,
                           self.dedupe_window_s, window)
            self.dedupe_window_s = float(window)

    async def ensure_consumer(self, stream: str, consumer: str, subject: str,
                               options: ConsumerOptions, *, lost: bool = False) -> None:
        """Create the queue's consumer unless it exists. ``lost``: it existed and the
        server no longer has it (an ephemeral one idle too long, or deleted by hand);
        the new one starts at new messages, never replaying the stream's history."""
        try:
            info = await self._api(self.js.consumer_info(stream, consumer), "consumer", stream,
                                   consumer)
        except nats.js.errors.NotFoundError:
            info = None
        if info is not None:
            one_filter_per_queue(consumer, info.config.filter_subject, subject)
            return
        if lost:
            logger.error("queue %s on stream %s was deleted on the server; re-creating it "
                         "from new messages on", consumer, stream)
        await self._api(self.js.add_consumer(stream, ConsumerConfig(
            name=consumer, durable_name=None if options.ephemeral else consumer,
            deliver_policy=(DeliverPolicy.NEW if options.ephemeral or lost
                            else DeliverPolicy.ALL),
            ack_policy=AckPolicy.EXPLICIT, ack_wait=options.ack_wait_s, max_deliver=-1,
            # Tasks waiting in memory hold their requests un-acked: leave them room.
            filter_subject=subject, max_ack_pending=max(10_000, 64 * options.max_in_flight),
            inactive_threshold=self.ephemeral_inactive_s if options.ephemeral else None)),
            "consumer", stream, consumer)

    async def delete_namespace(self, namespace: str) -> None:
        """Delete a namespace's stream, with every message and queue in it."""
        with contextlib.suppress(nats.js.errors.NotFoundError):
            await self.js.delete_stream(self.stream_name(namespace))
        self._streams.discard(self.stream_name(namespace))

    async def subject_counts(self, namespace: str, subjects: str = ">") -> dict[str, int]:
        """Messages held in a namespace's stream, by subject (matching ``subjects``)."""
        stream = self.stream_name(namespace)
        info = await self.js.stream_info(stream, subjects_filter=f"{namespace}.{subjects}")
        return dict(info.state.subjects or {})

    # -- the contract --------------------------------------------------------------------

    async def publish(self, subject: str, data: bytes,
                      headers: Mapping[str, str] | None = None, *,
                      msg_id: str | None = None) -> None:
        self._check_open()
        tokens = check_message(subject, data, msg_id)
        sent = {**(headers or {}), "Nats-Msg-Id": msg_id or uuid.uuid4().hex}
        await self._retrying(f"publish to {subject}", lambda: self._publish_once(
            tokens[0], subject, data, sent))

    async def _publish_once(self, namespace: str, subject: str, data: bytes,
                            headers: dict[str, str]) -> None:
        if not self.nc.is_connected:
            # Never hand nats-py a publish to buffer while disconnected: it would go
            # out on reconnect even after we reported it failed.
            raise nats.errors.ConnectionReconnectingError
        stream = await self._ensure_stream(namespace)
        key = subject.lower()
        self._denied.pop(key, None)
        try:
            await self._refusable_request(
                self.js.publish(subject, data, headers=headers, timeout=2.0), key.__eq__,
                subject)
        except nats.js.errors.NoStreamResponseError:
            self._streams.discard(stream)  # deleted under us: create it again
            raise
        except (nats.errors.TimeoutError, TimeoutError):
            refused = self._denied.pop(key, None)
            if refused is not None:
                raise BrokerPermissionError(self._refused(refused, subject)) from None
            raise

    def _denial(self, prefix: str) -> str | None:
        """The latest refused subject starting with ``prefix`` (as the server named it,
        lowercased), forgotten once told."""
        for subject in reversed(list(self._denied)):
            if subject.startswith(prefix.lower()):
                return f"{self._denied.pop(subject)} to {subject!r}"
        return None

    def _refused(self, what: str, subject: str | None = None) -> str:
        told = f'{what} to "{subject}"' if subject is not None else what
        return (f"NATS refused user {self.user!r}: {told} (its permissions do not allow "
                "it; see `meshpoint nats-config`)")

    async def _retrying(self, doing: str, attempt: Callable[[], Awaitable[None]]) -> None:
        """``attempt()``, retried every 0.05 s, doubling up to 1 s, while NATS is not
        reachable, until the next attempt would start past ``publish_timeout_s``; then
        a BrokerError. A closed broker or a refusal by the server is not retried."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.publish_timeout_s

        async def once() -> None:
            self._check_open()
            await attempt()

        def policy() -> AsyncRetrying:
            return AsyncRetrying(
                retry=retry_if_exception_type(TRANSIENT), wait=wait_exponential(0.05, max=1.0),
                stop=lambda state: loop.time() + state.upcoming_sleep > deadline,
                reraise=True)

        async def checked() -> None:
            try:
                await once()
            except TRANSIENT:
                # A JetStream API call the server refused this user only times out.
                refused = self._denial("$JS.")
                if refused is not None:
                    raise BrokerPermissionError(self._refused(refused)) from None
                raise

        try:
            await retried(checked, policy, lambda error: isinstance(error, TRANSIENT))
        except TRANSIENT as error:
            raise BrokerError(f"NATS at {self.url}: could not {doing} within "
                              f"{self.publish_timeout_s:g}s ({error!r})") from None
        except nats.js.errors.APIError as error:
            raise BrokerError(f"NATS at {self.url}: could not {doing}: {error}") from None

    async def subscribe(self, subject: str, queue: str, handler: Handler,
                        options: ConsumerOptions | None = None) -> Subscription:
        self._check_open()
        tokens = check_subject(subject, pattern=True)
        check_subject(queue, pattern=False)
        if tokens[0] in ("*", ">"):
            raise InvalidArgumentError(
                f"subject {subject!r}: NatsBroker needs a literal first token (the "
                f"namespace, which names the stream)")
        options = options or ConsumerOptions()
        stream = self.stream_name(tokens[0])
        consumer = self.consumer_of(queue, ephemeral=options.ephemeral)

        async def setup() -> None:
            await self._ensure_stream(tokens[0])
            await self.ensure_consumer(stream, consumer, subject, options)

        await self._retrying(f"subscribe to {subject}", setup)
        dead_letter = options.dead_letter_subject or default_dead_letter_subject(tokens, queue)
        member = Member(self, stream, consumer, subject, handler, options, dead_letter)
        await member.start()
        self._members.setdefault((stream, consumer), set()).add(member)
        return member

    def consumer_of(self, queue: str, *, ephemeral: bool = False) -> str:
        """The name of ``queue``'s consumer on the server: the queue's own (made safe)
        for a durable queue, which every process shares; for an ephemeral one, of this
        broker only, a random name nobody else can guess."""
        if not ephemeral:
            return safe_name(queue)
        return self._ephemeral.setdefault(queue, f"eph_{secrets.token_hex(16)}")

    async def close(self) -> None:
        if self.closed:
            return
        self.closing = True
        for members in list(self._members.values()):
            for member in list(members):
                await member.stop()
        self.closed = True
        with contextlib.suppress(Exception):
            await self.nc.drain()
        with contextlib.suppress(Exception):
            await self.nc.close()

    def _check_open(self) -> None:
        if self.closed:
            raise BrokerClosedError("the broker is closed")

    async def left(self, member: Member) -> None:
        """A member stopped; delete an ephemeral queue when its last member did."""
        key = (member.stream, member.consumer)
        members = self._members.get(key, set())
        members.discard(member)
        if not members:
            self._members.pop(key, None)
            if member.options.ephemeral:
                self._ephemeral = {q: c for q, c in self._ephemeral.items()
                                   if c != member.consumer}
            if member.options.ephemeral and not self.nc.is_closed:
                with contextlib.suppress(Exception):
                    await self.js.delete_consumer(member.stream, member.consumer)
