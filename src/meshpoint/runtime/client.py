"""``Client``: submit tasks to agents and collect their answers.

A client is a caller that is not an agent (a CLI, a web backend, a test). Its
answers come to its own inbox; it counts every final answer it receives, so a
duplicate answer (at-least-once delivery of the final response) is visible.
"""

from __future__ import annotations

import asyncio
import logging

from meshpoint import a2a
from meshpoint.broker.base import Broker, ConsumerOptions, Delivery, Subscription
from meshpoint.errors import BadMessageError, InvalidArgumentError
from meshpoint.runtime import wire
from meshpoint.runtime.agent import check_name

logger = logging.getLogger("meshpoint.client")


class Client:
    """Submits tasks to agents over ``broker``; use as ``async with Client(...)``."""

    def __init__(self, broker: Broker, *, namespace: str = "meshpoint",
                 client_id: str | None = None) -> None:
        self.broker = broker
        self.namespace = check_name("namespace", namespace)
        self.client_id = check_name("client_id", client_id or f"client-{wire.new_id()[:12]}")
        self._prefix = wire.client_prefix(namespace, self.client_id)
        #: request id -> every final answer received for it (normally one).
        self.answers: dict[str, list[a2a.Task]] = {}
        self._waiters: dict[str, asyncio.Future[a2a.Task]] = {}
        self._subscription: Subscription | None = None

    async def start(self) -> Client:
        self._subscription = await self.broker.subscribe(
            f"{self._prefix}.>", f"{self.namespace}-{self.client_id}", self._on_message,
            ConsumerOptions(ephemeral=True))
        return self

    async def close(self) -> None:
        if self._subscription is not None:
            await self._subscription.stop()
            self._subscription = None

    async def __aenter__(self) -> Client:
        return await self.start()

    async def __aexit__(self, *_exc: object) -> None:
        await self.close()

    async def submit(self, agent: str, text: str, *, request_id: str | None = None) -> str:
        """Send ``text`` to ``agent`` as a new task; returns the request id."""
        if self._subscription is None:
            raise InvalidArgumentError("start the client (async with Client(...)) first")
        check_name("agent", agent)
        request_id = check_name("request_id", request_id or wire.new_id())
        self._waiters.setdefault(request_id, asyncio.get_running_loop().create_future())
        await self.broker.publish(
            wire.request_subject(self.namespace, agent), wire.send_request(request_id, text),
            wire.reply_headers(f"{self._prefix}.response.{request_id}",
                               f"{self._prefix}.status.{request_id}"))
        return request_id

    def task_id(self, agent: str, request_id: str) -> str:
        """The id ``agent`` gives the task of ``request_id`` (see derive_task_id)."""
        return wire.derive_task_id(agent, f"{self._prefix}.response.{request_id}", request_id)

    async def wait(self, request_id: str, timeout_s: float | None = None) -> a2a.Task:
        """The first final answer to ``request_id``."""
        future = self._waiters.get(request_id)
        if future is None:
            raise InvalidArgumentError(f"no task was submitted with request id {request_id!r}")
        return await asyncio.wait_for(asyncio.shield(future), timeout_s)

    async def ask(self, agent: str, text: str, timeout_s: float | None = 60.0) -> a2a.Task:
        """Submit and wait for the answer."""
        return await self.wait(await self.submit(agent, text), timeout_s)

    async def cancel(self, agent: str, task_id: str) -> None:
        """Ask ``agent`` to cancel ``task_id``; its caller is answered ``canceled``."""
        await self.broker.publish(wire.request_subject(self.namespace, agent),
                                  wire.cancel_request(task_id))

    async def _on_message(self, delivery: Delivery) -> None:
        kind, _, request_id = delivery.message.subject[len(self._prefix) + 1:].partition(".")
        try:
            response = a2a.parse_response(delivery.message.data)
        except BadMessageError as error:
            await delivery.term(str(error))
            return
        await delivery.ack()
        if isinstance(response, a2a.ErrorResponse):
            logger.warning("request %s failed: %s", request_id, response.error.message)
            return
        result = response.result
        if kind == "response" and isinstance(result, a2a.Task) and result.status.state.is_final:
            self.answers.setdefault(request_id, []).append(result)
            future = self._waiters.get(request_id)
            if future is not None and not future.done():
                future.set_result(result)
