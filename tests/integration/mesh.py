"""A small mesh of agents for end-to-end runtime tests: a real store, a real
in-process broker that records what was published and acknowledged, instances,
a client, the dead-letter subject, and a peer the test drives by hand."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from meshpoint import a2a
from meshpoint.broker.base import Broker, ConsumerOptions, Delivery, Handler, Subscription
from meshpoint.broker.inprocess import InProcessBroker
from meshpoint.runtime import Agent, AgentInstance, Client, RuntimeOptions, wire
from meshpoint.store import SqlStore

#: Short intervals so crashes are recovered in well under a second.
FAST = RuntimeOptions(sweep_interval_s=0.05, recovery_interval_s=0.1, lease_ttl_s=0.6,
                      request_ack_wait_s=1.0, response_ack_wait_s=1.0)


class RecordingBroker(InProcessBroker):
    """The in-process broker, logging every publish and every ack in order."""

    def __init__(self) -> None:
        super().__init__()
        self.log: list[tuple[str, str, bytes]] = []

    async def publish(self, subject: str, data: bytes,
                      headers: Mapping[str, str] | None = None, *,
                      msg_id: str | None = None) -> None:
        self.log.append(("publish", subject, data))
        await super().publish(subject, data, headers, msg_id=msg_id)

    async def subscribe(self, subject: str, queue: str, handler: Handler,
                        options: ConsumerOptions | None = None) -> Subscription:
        async def recording(delivery: Delivery) -> None:
            original = delivery.ack

            async def ack() -> None:
                self.log.append(("ack", delivery.message.subject, delivery.message.data))
                await original()

            delivery.ack = ack  # type: ignore[method-assign]
            await handler(delivery)

        return await super().subscribe(subject, queue, recording, options)

    def published(self, prefix: str) -> list[tuple[str, bytes]]:
        return [(s, d) for kind, s, d in self.log if kind == "publish" and s.startswith(prefix)]


class Mesh:
    """Instances of several agents on one store and one broker: by default a recording
    in-process broker; ``broker`` puts them on another (a NatsBroker, say), which the
    mesh then closes too."""

    def __init__(self, store: SqlStore, options: RuntimeOptions = FAST,
                 broker: Broker | None = None) -> None:
        self.store = store
        self.options = options
        self.broker: Broker = broker or RecordingBroker()
        self.instances: list[AgentInstance] = []
        self.dead_letters: list[tuple[str, dict[str, str]]] = []
        self.client = Client(self.broker, namespace=options.namespace,
                             tenant=store.tenant_id)

    async def start(self) -> Mesh:
        await self.client.start()

        async def dead(delivery: Delivery) -> None:
            self.dead_letters.append((delivery.message.subject, dict(delivery.message.headers)))
            await delivery.ack()

        await self.broker.subscribe(f"{self.options.namespace}.deadletter.>",
                                    "test-dead-letters", dead)
        return self

    async def run(self, agent: Agent, count: int = 1, **kwargs: Any) -> list[AgentInstance]:
        started = []
        for _ in range(count):
            instance = AgentInstance(agent, self.store, self.broker, options=self.options,
                                     **kwargs)
            await instance.start()
            started.append(instance)
        self.instances += started
        return started

    def of(self, agent: str) -> list[AgentInstance]:
        return [i for i in self.instances if i.agent.name == agent]

    def events(self, what: str, agent: str | None = None) -> list[tuple[str, str]]:
        """``(instance_id, task_id)`` of every ``what`` event, over all instances."""
        return [(i.instance_id, task) for i in self.instances
                if agent is None or i.agent.name == agent for task in i.stats.tasks(what)]

    async def close(self) -> None:
        for instance in self.instances:
            await instance.stop()
        await self.client.close()
        await self.broker.close()


async def eventually(check: Callable[[], bool | Awaitable[bool]], timeout_s: float = 10.0,
                     what: str = "the condition", interval_s: float = 0.02) -> None:
    """Wait until ``check()`` is true, looking every ``interval_s``; fail the test
    with ``what`` after ``timeout_s``. The way tests wait: on a condition, never on
    a sleep that hopes it holds by then."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if not isinstance(value, bool):
            value = await value
        if value:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        await asyncio.sleep(interval_s)


class ManualPeer:
    """An agent the test plays by hand: it records the requests and cancels it gets
    and answers, or sends status updates, only when told to."""

    def __init__(self, mesh: Mesh, agent: str) -> None:
        self.mesh = mesh
        self.agent = agent
        #: sub_task_id -> (text, reply_to, status_to), in arrival order.
        self.requests: dict[str, tuple[str, str, str]] = {}
        #: Task ids named by the tasks/cancel requests received.
        self.cancels: list[str] = []
        #: sub_task_id -> the context the request named (its caller's task), which
        #: answers and status updates carry back, as A2A asks.
        self.contexts: dict[str, str] = {}

    async def start(self) -> ManualPeer:
        ns = self.mesh.options.namespace
        await self.mesh.broker.subscribe(wire.request_subject(ns, self.agent),
                                         f"{ns}-{self.agent}-requests", self._on_request)
        return self

    async def _on_request(self, delivery: Delivery) -> None:
        request = a2a.parse_request(delivery.message.data)
        if isinstance(request, a2a.CancelTaskRequest):
            self.cancels.append(request.params.id)
        else:
            headers = delivery.message.headers
            self.requests[str(request.id)] = (request.params.message.text,
                                              headers[wire.REPLY_TO], headers[wire.STATUS_TO])
            self.contexts[str(request.id)] = request.params.message.context_id or "ctx"
        await delivery.ack()

    def task_id(self, sub_task_id: str) -> str:
        """This peer's own id for the task of a request (not the caller's sub-task id)."""
        return f"{self.agent}-own-{sub_task_id[:8]}"

    async def status(self, sub_task_id: str) -> None:
        _, _, status_to = self.requests[sub_task_id]
        await self.mesh.broker.publish(status_to, wire.status_update(
            sub_task_id, self.task_id(sub_task_id), self.contexts[sub_task_id],
            a2a.TaskState.WORKING))

    async def answer(self, sub_task_id: str, text: str) -> None:
        _, reply_to, _ = self.requests[sub_task_id]
        task_id = self.task_id(sub_task_id)
        await self.mesh.broker.publish(reply_to, wire.final_task(
            sub_task_id, task_id, self.contexts[sub_task_id], a2a.TaskState.COMPLETED, text,
            [wire.answer_artifact(task_id, self.agent, text)], {"agent": self.agent}))
