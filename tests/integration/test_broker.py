"""The broker contract (meshpoint.broker.base), run against every implementation:
the in-process broker and NATS JetStream (a real server; each test has a namespace,
hence a stream, of its own, deleted afterwards).
"""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from collections.abc import AsyncIterator

import pytest

from meshpoint.broker import Broker, ConsumerOptions, Delivery, InProcessBroker
from meshpoint.broker.base import DEAD_LETTER_DELIVERIES, DEAD_LETTER_REASON, DEAD_LETTER_SUBJECT
from meshpoint.errors import BrokerClosedError, InvalidArgumentError
from tests.integration.mesh import eventually

FAST = ConsumerOptions(ack_wait_s=0.2, max_deliver=3)


@pytest.fixture
def ns() -> str:
    """A namespace (first subject token) of this test's own."""
    return f"t{uuid.uuid4().hex[:12]}"


@pytest.fixture(params=["inprocess", pytest.param("nats", marks=pytest.mark.nats)])
async def broker(request: pytest.FixtureRequest, ns: str) -> AsyncIterator[Broker]:
    if request.param == "inprocess":
        instance: Broker = InProcessBroker()
        try:
            yield instance
        finally:
            await instance.close()
        return
    from meshpoint.broker.nats import NatsBroker

    url = request.getfixturevalue("nats_url")
    nats_broker = await NatsBroker.connect(url, pull_expires_s=0.5)
    try:
        yield nats_broker
    finally:
        await nats_broker.close()
        cleanup = await NatsBroker.connect(url)
        await cleanup.delete_namespace(ns)
        await cleanup.close()


class Recorder:
    """A handler that records what it saw and settles each delivery as told."""

    def __init__(self, name: str = "", settle: str = "ack") -> None:
        self.name = name
        self.settle = settle
        self.seen: list[tuple[bytes, int, float]] = []

    async def __call__(self, delivery: Delivery) -> None:
        self.seen.append((delivery.message.data, delivery.delivery_count,
                          asyncio.get_running_loop().time()))
        if self.settle == "ack":
            await delivery.ack()
        elif self.settle == "nak":
            await delivery.nak()
        elif self.settle == "term":
            await delivery.term("cannot parse it")
        elif self.settle == "raise":
            raise RuntimeError("handler bug")
        # "none": neither ack nor nak, as a consumer that died would

    @property
    def payloads(self) -> list[bytes]:
        return [data for data, _, _ in self.seen]


async def test_a_queue_delivers_each_message_to_exactly_one_member(broker: Broker, ns: str) -> None:
    members = [Recorder(f"m{n}") for n in range(3)]
    for member in members:
        await broker.subscribe(f"{ns}.req.coordinator", "coordinator-requests", member)
    sent = [f"task-{n}".encode() for n in range(300)]
    for data in sent:
        await broker.publish(f"{ns}.req.coordinator", data)
    await eventually(lambda: sum(len(m.seen) for m in members) >= 300)
    await asyncio.sleep(0.3)  # a window past ack_wait: nothing acked may come back
    got = Counter(p for m in members for p in m.payloads)
    assert got == Counter(sent)
    assert sum(1 for m in members if m.seen) >= 2  # the work is shared


async def test_each_queue_gets_its_own_copy_and_filters_match_like_nats(
        broker: Broker, ns: str) -> None:
    exact, star, tail = Recorder(), Recorder(), Recorder()
    await broker.subscribe(f"{ns}.response.coordinator.s1", "exact", exact)
    await broker.subscribe(f"{ns}.response.*.s1", "star", star)
    await broker.subscribe(f"{ns}.response.>", "tail", tail)
    await broker.publish(f"{ns}.response.coordinator.s1", b"1")
    await broker.publish(f"{ns}.response.researcher.s1", b"2")
    await broker.publish(f"{ns}.response.coordinator.s1.extra", b"3")
    # A last message every queue takes: once each has it, each had all before it.
    await broker.publish(f"{ns}.response.coordinator.s1", b"end")
    await eventually(lambda: all(r.payloads[-1:] == [b"end"] for r in (exact, star, tail)))
    for recorder in (exact, star, tail):
        recorder.seen.pop()
    assert exact.payloads == [b"1"]
    assert sorted(star.payloads) == [b"1", b"2"]
    assert sorted(tail.payloads) == [b"1", b"2", b"3"]


async def test_an_unacknowledged_delivery_comes_back_after_ack_wait(
        broker: Broker, ns: str) -> None:
    first = Recorder(settle="none")
    await broker.subscribe(f"{ns}.a", "q", first, FAST)
    await broker.publish(f"{ns}.a", b"x")
    await eventually(lambda: len(first.seen) == 2)
    (_, n1, t1), (_, n2, t2) = first.seen[:2]
    assert (n1, n2) == (1, 2) and t2 - t1 >= 0.19


async def test_nak_redelivers_after_its_delay(broker: Broker, ns: str) -> None:
    seen: list[tuple[int, float]] = []

    async def handler(delivery: Delivery) -> None:
        seen.append((delivery.delivery_count, asyncio.get_running_loop().time()))
        if delivery.delivery_count == 1:
            await delivery.nak(0.15)
        else:
            await delivery.ack()

    await broker.subscribe(f"{ns}.a", "q", handler, ConsumerOptions(ack_wait_s=5))
    await broker.publish(f"{ns}.a", b"x")
    await eventually(lambda: len(seen) == 2)
    assert seen[1][1] - seen[0][1] >= 0.14
    await asyncio.sleep(0.3)  # a window: the acked message must not come back
    assert len(seen) == 2


async def test_term_dead_letters_with_its_reason_and_never_redelivers(
        broker: Broker, ns: str) -> None:
    poison, dead = Recorder(settle="term"), []

    async def dead_letters(delivery: Delivery) -> None:
        dead.append(delivery.message)
        await delivery.ack()

    await broker.subscribe(f"{ns}.a", "q", poison, FAST)
    await broker.subscribe(f"{ns}.deadletter.q", "dlq-reader", dead_letters)
    await broker.publish(f"{ns}.a", b"garbage", {"trace": "t-1"})
    await eventually(lambda: len(dead) == 1)
    await asyncio.sleep(0.3)  # a window past ack_wait: the terminated one stays gone
    assert len(poison.seen) == 1
    assert dead[0].data == b"garbage"
    assert dead[0].headers[DEAD_LETTER_SUBJECT] == f"{ns}.a"
    assert dead[0].headers[DEAD_LETTER_REASON] == "terminated: cannot parse it"
    assert dead[0].headers["trace"] == "t-1"


async def test_max_deliver_then_dead_letter(broker: Broker, ns: str) -> None:
    stubborn, dead = Recorder(settle="nak"), Recorder()
    await broker.subscribe(f"{ns}.a", "q", stubborn,
                           ConsumerOptions(ack_wait_s=5, max_deliver=3,
                                           dead_letter_subject=f"{ns}.dead.q"))
    await broker.subscribe(f"{ns}.dead.q", "dead", dead)
    await broker.publish(f"{ns}.a", b"x")
    await eventually(lambda: len(dead.seen) == 1)
    assert [n for _, n, _ in stubborn.seen] == [1, 2, 3]


async def test_a_failing_handler_has_its_delivery_redelivered(broker: Broker, ns: str) -> None:
    buggy, dead = Recorder(settle="raise"), Recorder()
    await broker.subscribe(f"{ns}.a", "q", buggy, FAST)
    await broker.subscribe(f"{ns}.deadletter.q", "dead", dead)
    await broker.publish(f"{ns}.a", b"x")
    await eventually(lambda: len(dead.seen) == 1)
    assert [n for _, n, _ in buggy.seen] == [1, 2, 3]


async def test_a_member_that_goes_away_without_acking_loses_nothing(
        broker: Broker, ns: str) -> None:
    gone, survivor = Recorder(settle="none"), Recorder()
    subscription = await broker.subscribe(f"{ns}.a", "q", gone, FAST)
    await broker.publish(f"{ns}.a", b"x")
    await eventually(lambda: len(gone.seen) == 1)
    await subscription.stop()  # crashed with the message in hand
    await broker.subscribe(f"{ns}.a", "q", survivor, FAST)
    await eventually(lambda: len(survivor.seen) == 1)
    assert survivor.seen[0][:2] == (b"x", 2)


async def test_a_queue_outlives_its_members_and_early_messages_wait(
        broker: Broker, ns: str) -> None:
    await broker.publish(f"{ns}.req.peer", b"before any instance started")
    first = Recorder()
    subscription = await broker.subscribe(f"{ns}.req.peer", "peer", first)
    await eventually(lambda: first.payloads == [b"before any instance started"])
    await subscription.stop()
    await broker.publish(f"{ns}.req.peer", b"while every instance was down")
    second = Recorder()
    await broker.subscribe(f"{ns}.req.peer", "peer", second)
    await eventually(lambda: second.payloads == [b"while every instance was down"])


async def test_settling_twice_and_late_settlements_are_harmless(broker: Broker, ns: str) -> None:
    deliveries: list[Delivery] = []

    async def keep(delivery: Delivery) -> None:
        deliveries.append(delivery)
        if delivery.delivery_count == 2:
            await delivery.ack()
            await delivery.ack()
            await delivery.nak()

    await broker.subscribe(f"{ns}.a", "q", keep, FAST)
    await broker.publish(f"{ns}.a", b"x")
    await eventually(lambda: len(deliveries) == 2)
    await deliveries[0].ack()  # its ack wait expired: too late, already redelivered
    await asyncio.sleep(0.3)  # a window past ack_wait: the acked redelivery stays gone
    assert len(deliveries) == 2


@pytest.mark.parametrize("subject", ["", "a..b", "a.>.b", "a b", "a.*x", ">x"])
async def test_bad_subjects_are_refused(broker: Broker, subject: str) -> None:
    with pytest.raises(InvalidArgumentError, match="subject"):
        await broker.subscribe(subject, "q", Recorder())


async def test_bad_publishes_and_closed_brokers_are_refused(broker: Broker, ns: str) -> None:
    with pytest.raises(InvalidArgumentError):
        await broker.publish(f"{ns}.*", b"x")  # wildcards only filter
    with pytest.raises(InvalidArgumentError, match="bytes"):
        await broker.publish(f"{ns}.a", "text")  # type: ignore[arg-type]
    await broker.subscribe(f"{ns}.a", "q", Recorder())
    with pytest.raises(InvalidArgumentError, match="cannot also take"):
        await broker.subscribe(f"{ns}.b", "q", Recorder())
    with pytest.raises(InvalidArgumentError, match="ack_wait_s"):
        ConsumerOptions(ack_wait_s=0)
    await broker.close()
    with pytest.raises(BrokerClosedError):
        await broker.publish(f"{ns}.a", b"x")


async def test_dead_letters_count_their_deliveries(broker: Broker, ns: str) -> None:
    dead = Recorder()
    await broker.subscribe(f"{ns}.a", "q", Recorder(settle="none"),
                           ConsumerOptions(ack_wait_s=0.05, max_deliver=2))
    captured = []

    async def capture(delivery: Delivery) -> None:
        captured.append(delivery.message.headers)
        await dead(delivery)

    await broker.subscribe(f"{ns}.deadletter.q", "dead", capture)
    await broker.publish(f"{ns}.a", b"x")
    await eventually(lambda: len(captured) == 1)
    assert captured[0][DEAD_LETTER_DELIVERIES] == "2"
    assert "max_deliver=2" in captured[0][DEAD_LETTER_REASON]


async def test_in_progress_restarts_the_ack_wait(broker: Broker, ns: str) -> None:
    held: list[Delivery] = []

    async def hold(delivery: Delivery) -> None:
        held.append(delivery)

    await broker.subscribe(f"{ns}.work.>", "holders", hold, FAST)
    await broker.publish(f"{ns}.work.long", b"x")
    await eventually(lambda: len(held) == 1)
    for _ in range(5):  # 0.5 s: 2.5 ack waits, kept alive
        await asyncio.sleep(0.1)
        await held[0].in_progress()
    assert len(held) == 1
    await eventually(lambda: len(held) == 2)  # no more progress: redelivered
    assert held[1].delivery_count == 2
    await held[1].ack()


async def test_an_ephemeral_queue_goes_away_with_its_last_member(broker: Broker, ns: str) -> None:
    got: list[bytes] = []

    async def take(delivery: Delivery) -> None:
        got.append(delivery.message.data)
        await delivery.ack()

    options = ConsumerOptions(ephemeral=True)
    first = await broker.subscribe(f"{ns}.inbox.a", "inbox-a", take, options)
    second = await broker.subscribe(f"{ns}.inbox.a", "inbox-a", take, options)
    await broker.publish(f"{ns}.inbox.a", b"1")
    await eventually(lambda: got == [b"1"])
    await first.stop()
    await broker.publish(f"{ns}.inbox.a", b"2")
    await eventually(lambda: got == [b"1", b"2"])  # one member left: still there
    consumer = consumer_name(broker, "inbox-a")
    assert await queue_exists(broker, ns, consumer)
    await second.stop()
    assert not await queue_exists(broker, ns, consumer)  # gone, with what it held
    await broker.publish(f"{ns}.inbox.a", b"3")  # before the next queue existed
    third = await broker.subscribe(f"{ns}.inbox.a", "inbox-b", take, options)
    await broker.publish(f"{ns}.inbox.a", b"4")
    await eventually(lambda: got[-1] == b"4")
    # A queue delivers in order: a "3" it took would have come before the "4".
    assert got == [b"1", b"2", b"4"]  # an ephemeral queue starts at new messages
    await third.stop()


def consumer_name(broker: Broker, queue: str) -> str:
    """What the broker calls an ephemeral queue's consumer: on NATS, a random name
    only its broker knows (so that no other user can read from it)."""
    from meshpoint.broker.nats import NatsBroker

    return broker.consumer_of(queue, ephemeral=True) if isinstance(broker, NatsBroker) \
        else queue


async def queue_exists(broker: Broker, ns: str, queue: str) -> bool:
    if isinstance(broker, InProcessBroker):
        return queue in broker.queues
    import nats.js.errors

    from meshpoint.broker.nats import NatsBroker
    assert isinstance(broker, NatsBroker)
    try:
        await broker.js.consumer_info(broker.stream_name(ns), queue)
    except nats.js.errors.NotFoundError:
        return False
    return True


async def test_a_repeated_msg_id_is_stored_once(broker: Broker, ns: str) -> None:
    got = Recorder()
    await broker.subscribe(f"{ns}.answers", "q", got)
    await broker.publish(f"{ns}.answers", b"first", msg_id="answer.t1")
    await broker.publish(f"{ns}.answers", b"again", msg_id="answer.t1")  # a re-run's
    await broker.publish(f"{ns}.answers", b"other", msg_id="answer.t2")
    await broker.publish(f"{ns}.answers", b"plain")
    await broker.publish(f"{ns}.answers", b"plain")  # no msg_id: never deduplicated
    await broker.publish(f"{ns}.answers", b"end")  # every message before it has come
    await eventually(lambda: got.payloads[-1:] == [b"end"])
    assert sorted(got.payloads[:-1]) == [b"first", b"other", b"plain", b"plain"]
    with pytest.raises(InvalidArgumentError, match="msg_id"):
        await broker.publish(f"{ns}.answers", b"x", msg_id="")


@pytest.mark.nats
async def test_an_operator_s_stream_with_a_shorter_dedupe_window_is_the_one_relied_on(
        nats_url: str, ns: str) -> None:
    """A request is published again (an announcement check) only while the broker
    still drops a repeat of it: an existing stream that remembers msg_ids for less than
    ``dedupe_window_s`` gives the broker its own window, for that check to read."""
    from nats.js.api import StreamConfig

    from meshpoint.broker.nats import NatsBroker

    broker = await NatsBroker.connect(nats_url, dedupe_window_s=120.0)
    try:
        await broker.js.add_stream(StreamConfig(  # made by an operator, with other limits
            name=broker.stream_name(ns), subjects=[f"{ns}.>"], duplicate_window=20.0,
            max_age=3600.0))
        assert broker.dedupe_window_s == 120.0
        await broker.publish(f"{ns}.requests", b"r", msg_id="request.s1")
        assert broker.dedupe_window_s == 20.0
    finally:
        await broker.delete_namespace(ns)
        await broker.close()


async def test_drain_lets_the_handlers_in_hand_finish_and_takes_nothing_new(
        broker: Broker, ns: str) -> None:
    started, finished = Recorder(settle="none"), []
    release = asyncio.Event()

    async def slow(delivery: Delivery) -> None:
        await started(delivery)
        await release.wait()
        finished.append(delivery.message.data)
        await delivery.ack()

    member = await broker.subscribe(f"{ns}.jobs", "workers", slow,
                                    ConsumerOptions(ack_wait_s=1.0))
    await broker.publish(f"{ns}.jobs", b"in hand")
    await eventually(lambda: len(started.seen) == 1)
    draining = asyncio.create_task(member.drain(timeout_s=5))
    await asyncio.sleep(0.2)  # the drain begins: the member stops taking messages
    await broker.publish(f"{ns}.jobs", b"after the drain began")
    await asyncio.sleep(0.2)  # a window: the member takes nothing new while it drains
    assert not draining.done() and len(started.seen) == 1
    release.set()
    await draining
    assert finished == [b"in hand"]
    later = Recorder()
    await broker.subscribe(f"{ns}.jobs", "workers", later)
    await eventually(lambda: later.payloads == [b"after the drain began"])
    await asyncio.sleep(1.2)  # a window past the ack wait: the finished one stays gone
    assert later.payloads == [b"after the drain began"]



@pytest.mark.nats
async def test_a_nats_member_takes_a_backlog_several_messages_a_request(
        nats_url: str, ns: str) -> None:
    """Each pull request asks for as many messages as the member has free slots: a
    backlog comes in a few requests, never more in hand than ``max_in_flight``."""
    from meshpoint.broker.nats import NatsBroker
    from meshpoint.broker.nats_members import Member

    broker = await NatsBroker.connect(nats_url, pull_expires_s=0.5)
    try:
        sent = [f"job-{n}".encode() for n in range(64)]
        for data in sent:
            await broker.publish(f"{ns}.jobs", data)
        seen: list[bytes] = []
        in_hand = most = 0

        async def handler(delivery: Delivery) -> None:
            nonlocal in_hand, most
            in_hand += 1
            most = max(most, in_hand)
            await asyncio.sleep(0.01)
            in_hand -= 1
            seen.append(delivery.message.data)
            await delivery.ack()

        member = await broker.subscribe(f"{ns}.jobs", "workers", handler,
                                        ConsumerOptions(max_in_flight=8))
        assert isinstance(member, Member)
        await eventually(lambda: len(seen) >= 64)
        await asyncio.sleep(0.6)  # past a pull's expiry: nothing comes twice
        assert Counter(seen) == Counter(sent)
        assert most <= 8
        # 64 messages, at most 8 a request: one request a message would be 64.
        assert member.requests < 32
    finally:
        await broker.delete_namespace(ns)
        await broker.close()
