"""The broker interface: publish, and competing consumers with per-delivery acks.

Shaped after NATS JetStream so that both implementations mean the same thing:

* A **subscription** names a ``queue`` (a durable consumer) and a subject filter.
  Every message published to a matching subject is delivered to *one* member of
  that queue; another queue on the same subjects gets its own copy. The queue
  outlives its members: messages published while no member listens wait for the
  next one (an agent whose every instance restarted loses nothing).
* A **delivery** is acknowledged explicitly. ``ack`` ends it; ``nak(delay_s)``
  asks for redelivery after ``delay_s``; ``term(reason)`` ends it without
  redelivery and dead-letters it. A delivery neither acked nor nak'd within
  ``ack_wait_s`` (its consumer died, or hangs) is redelivered, possibly to another
  member. After ``max_deliver`` deliveries a message is dead-lettered instead.
* **Dead letters** are published to the queue's ``dead_letter_subject`` with
  headers naming the original subject, the delivery count and the reason.
* A publish may carry a ``msg_id``: a second publish with the same id within the
  broker's dedupe window is dropped (JetStream's ``Nats-Msg-Id``). The runtime gives
  every final answer such an id, so an answer re-sent by a turn re-run after a crash
  reaches its caller once.
* An **ephemeral** queue (an instance's or a client's inbox) takes only messages
  published after it was created, and goes away with its last member; a durable
  queue also takes what was published to its subjects before it first existed.

Subjects are dot-separated tokens; a filter may use ``*`` (one token) and ``>``
(one or more trailing tokens), as in NATS.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field

from pydantic.dataclasses import dataclass as pydantic_dataclass

from meshpoint._validation import OPTIONS, AtLeastOne, Seconds, checked
from meshpoint.errors import InvalidArgumentError

#: Headers a dead letter carries.
DEAD_LETTER_SUBJECT = "Meshpoint-Original-Subject"
DEAD_LETTER_REASON = "Meshpoint-Dead-Letter-Reason"
DEAD_LETTER_DELIVERIES = "Meshpoint-Deliveries"


@dataclass(frozen=True, slots=True)
class Message:
    """A published message: its subject, payload bytes and headers."""

    subject: str
    data: bytes
    headers: Mapping[str, str] = field(default_factory=dict)


class Delivery(ABC):
    """One delivery of a message to one member of a queue."""

    message: Message
    #: 1 on the first delivery, 2 on the first redelivery, and so on.
    delivery_count: int

    @abstractmethod
    async def ack(self) -> None:
        """Done with the message: it will not be delivered again."""

    @abstractmethod
    async def in_progress(self) -> None:
        """Still working on it: restart the ack wait (JetStream's ``+WPI``). A task
        that holds its inbound message un-acked for long calls this periodically."""

    @abstractmethod
    async def nak(self, delay_s: float = 0.0) -> None:
        """Not done: deliver it again after ``delay_s`` (to any member)."""

    @abstractmethod
    async def term(self, reason: str) -> None:
        """Never deliver it again: it is dead-lettered with ``reason``."""


Handler = Callable[[Delivery], Awaitable[None]]


class Subscription(ABC):
    """A member of a queue; :meth:`stop` leaves the queue (the queue stays)."""

    @abstractmethod
    async def stop(self) -> None:
        """Take no more deliveries. Deliveries in hand and not acked are redelivered
        after their ``ack_wait_s``, as if this member had crashed."""

    @abstractmethod
    async def drain(self, timeout_s: float) -> None:
        """Take no more deliveries, let the handlers in hand finish (up to
        ``timeout_s``), then :meth:`stop`. A graceful shutdown."""


@checked
@pydantic_dataclass(frozen=True, config=OPTIONS)
class ConsumerOptions:
    """How a queue treats its deliveries (fixed when the queue is first created).
    A bad value raises :class:`~meshpoint.errors.InvalidArgumentError` naming it."""

    ack_wait_s: Seconds = 30.0
    max_deliver: AtLeastOne = 5
    #: Where dead letters go; default ``<first token of the filter>.deadletter.<queue>``
    #: (in the namespace's own stream on NATS).
    dead_letter_subject: str | None = None
    #: Deliveries one member handles at once.
    max_in_flight: AtLeastOne = 16
    #: Delete the queue, with what it still holds, when its last member stops
    #: (NATS: an ephemeral consumer). For inboxes of one instance or one client.
    ephemeral: bool = False


class Broker(ABC):
    """Publish and subscribe with competing consumers; see the module docstring."""

    #: Seconds a published ``msg_id`` is remembered to drop a repeat of it by; None:
    #: repeats are never dropped (a request must then not be published twice).
    dedupe_window_s: float | None = None

    @abstractmethod
    async def publish(self, subject: str, data: bytes,
                      headers: Mapping[str, str] | None = None, *,
                      msg_id: str | None = None) -> None:
        """Publish ``data`` to ``subject``; returns once the broker holds it. With a
        ``msg_id``, a repeat of the same id within the dedupe window is dropped."""

    @abstractmethod
    async def subscribe(self, subject: str, queue: str, handler: Handler,
                        options: ConsumerOptions | None = None) -> Subscription:
        """Join ``queue`` (creating it with ``subject`` as its filter) and have
        ``handler`` called with each delivery this member receives. A handler that
        raises without settling its delivery has it redelivered (``nak``)."""

    @abstractmethod
    async def close(self) -> None:
        """Stop every subscription and release the broker's resources."""


def default_dead_letter_subject(filter_tokens: list[str], queue: str) -> str:
    """``<namespace>.deadletter.<queue>``, or ``deadletter.<queue>`` when the filter
    starts with a wildcard."""
    head = filter_tokens[0]
    return f"deadletter.{queue}" if head in ("*", ">") else f"{head}.deadletter.{queue}"


def check_message(subject: str, data: bytes, msg_id: str | None) -> list[str]:
    """Check what :meth:`Broker.publish` is given; the subject's tokens, or raise."""
    tokens = check_subject(subject, pattern=False)
    check_msg_id(msg_id)
    if type(data) is not bytes:
        raise InvalidArgumentError(f"data must be bytes, got {type(data).__name__}")
    return tokens


def one_filter_per_queue(queue: str, existing: str, subject: str) -> None:
    """A queue keeps the filter it was created with: another one is refused."""
    if existing != subject:
        raise InvalidArgumentError(
            f"queue {queue!r} filters {existing!r}; it cannot also take {subject!r} "
            "(use another queue name)")


def check_delay(delay_s: float) -> None:
    """What :meth:`Delivery.nak` is given: a delay of at least 0 seconds."""
    if not delay_s >= 0:
        raise InvalidArgumentError(f"delay_s must be >= 0, got {delay_s!r}")


def check_msg_id(msg_id: str | None) -> None:
    if msg_id is not None and (type(msg_id) is not str or not msg_id or len(msg_id) > 256):
        raise InvalidArgumentError(f"msg_id must be a non-empty str of at most 256 "
                                   f"characters, got {msg_id!r}")


def check_subject(subject: str, *, pattern: bool) -> list[str]:
    """Split a subject (or, with ``pattern``, a filter) into tokens, or raise."""
    if type(subject) is not str or not subject:
        raise InvalidArgumentError(f"a subject must be a non-empty str, got {subject!r}")
    tokens = subject.split(".")
    for index, token in enumerate(tokens):
        wildcard = token in ("*", ">")
        if not token or any(c.isspace() for c in token) or (wildcard and not pattern) or (
                not wildcard and ("*" in token or ">" in token)):
            raise InvalidArgumentError(f"subject {subject!r} has an invalid token {token!r}")
        if token == ">" and index != len(tokens) - 1:
            raise InvalidArgumentError(f"'>' must be the last token of subject {subject!r}")
    return tokens


def subject_matches(pattern: list[str], subject: list[str]) -> bool:
    """NATS matching: ``*`` is one token, a final ``>`` is one or more tokens."""
    for index, token in enumerate(pattern):
        if token == ">":
            return len(subject) > index
        if index >= len(subject) or (token != "*" and token != subject[index]):
            return False
    return len(subject) == len(pattern)
