"""NatsBroker survives a NATS restart: clients reconnect, publishes made during the
outage go through once it is back, and nothing published or un-acknowledged is lost.

Runs its own nats-server (a private port and store directory), so restarting it
disturbs no other test.
"""

from __future__ import annotations

import asyncio
from collections import Counter

import nats.js.errors
import pytest

from meshpoint.broker import ConsumerOptions, Delivery
from meshpoint.broker.nats import NatsBroker
from tests.integration.mesh import eventually
from tests.nats_server import PrivateNats

pytestmark = pytest.mark.nats


async def test_a_restart_loses_nothing(private_nats: PrivateNats) -> None:
    broker = await NatsBroker.connect(private_nats.url, pull_expires_s=0.5)
    seen: list[bytes] = []
    held: list[Delivery] = []

    async def take(delivery: Delivery) -> None:
        if delivery.message.data == b"held" and delivery.delivery_count == 1:
            held.append(delivery)  # in hand, un-acked, when the server goes down
            return
        seen.append(delivery.message.data)
        await delivery.ack()

    try:
        await broker.subscribe("ns.jobs", "workers", take, ConsumerOptions(ack_wait_s=2))
        await broker.publish("ns.jobs", b"held")
        before = [f"before-{n}".encode() for n in range(50)]
        for data in before:
            await broker.publish("ns.jobs", data)
        await eventually(lambda: len(seen) == 50 and bool(held),
                         what="the first 50 and the held one")
        private_nats.stop()
        during = [f"during-{n}".encode() for n in range(20)]
        publishing = asyncio.gather(*(broker.publish("ns.jobs", d) for d in during))
        await asyncio.sleep(1.0)  # a window: the publishes wait for the server, not fail
        assert not publishing.done()
        private_nats.start()
        await asyncio.wait_for(publishing, 30)
        expected = Counter([*before, *during, b"held"])
        await eventually(lambda: set(seen) >= set(expected), timeout_s=20,
                         what="every message, the held one again included")
        assert set(seen) == set(expected)  # nothing lost, the held message came back
        assert Counter(seen)[b"held"] >= 1
    finally:
        await broker.close()


async def test_connecting_to_a_dead_server_fails_clearly(unused_tcp_port: int) -> None:
    from meshpoint.errors import BrokerError

    with pytest.raises(BrokerError, match=f"cannot reach NATS at nats://127.0.0.1:"
                                          f"{unused_tcp_port}.*nats-server"):
        await NatsBroker.connect(f"nats://127.0.0.1:{unused_tcp_port}", connect_timeout_s=1)


async def test_a_queue_deleted_on_the_server_is_re_created(private_nats: PrivateNats) -> None:
    """An ephemeral consumer the server dropped (its process was cut off longer than
    the inactivity threshold) or a consumer an operator deleted comes back, from new
    messages on (never replaying the stream)."""
    broker = await NatsBroker.connect(private_nats.url, pull_expires_s=0.3)
    seen: list[bytes] = []

    async def take(delivery: Delivery) -> None:
        seen.append(delivery.message.data)
        await delivery.ack()

    try:
        for queue, ephemeral in (("inbox", True), ("requests", False)):
            await broker.subscribe(f"ns.{queue}", queue, take,
                                   ConsumerOptions(ephemeral=ephemeral))
            await broker.publish(f"ns.{queue}", b"before")
            await eventually(lambda: seen[-1:] == [b"before"], what="the first message")
            consumer = broker.consumer_of(queue, ephemeral=ephemeral)
            await broker.js.delete_consumer(broker.stream_name("ns"), consumer)

            async def re_created(consumer: str = consumer) -> bool:
                try:
                    await broker.js.consumer_info(broker.stream_name("ns"), consumer)
                except nats.js.errors.NotFoundError:
                    return False
                return True

            # The member finds its queue gone and creates it again, from new messages
            # on: what is published from then on reaches it.
            await eventually(re_created, what=f"queue {queue} re-created")
            after = f"after-{queue}".encode()
            await broker.publish(f"ns.{queue}", after)
            await eventually(lambda after=after: seen[-1:] == [after],  # type: ignore[misc]
                             what="the message after the re-creation")
            assert seen[-2:] == [b"before", after]
    finally:
        await broker.close()
