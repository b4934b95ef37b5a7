"""``meshpoint serve`` and ``meshpoint submit``: one instance process, one caller.

``serve`` runs one instance of one agent of a mesh config until SIGTERM or SIGINT,
then drains: it takes no new work, lets what is in hand reach its pause boundary
(checkpointed) or its end, and exits 0. Run as many ``serve`` processes per agent,
on as many hosts, as the load needs; they share the store and the broker. A
process that dies instead (SIGKILL, a lost host) loses nothing either: its
un-acked messages are redelivered and its leases expire.

``submit`` sends one task to an agent and waits for the answer.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from collections.abc import Callable

from meshpoint import a2a
from meshpoint.config import MeshConfig
from meshpoint.runtime import AgentInstance, Client

logger = logging.getLogger("meshpoint.serve")

#: Printed (and flushed) on stdout once the instance takes work; scripts wait for it.
READY = "meshpoint: ready"


async def serve(config: MeshConfig, agent_name: str, *, instance_id: str | None = None,
                on_ready: Callable[[AgentInstance], None] | None = None) -> None:
    """Serve ``agent_name`` until SIGTERM/SIGINT, then drain and return."""
    agent = config.build_agent(agent_name)
    store = await config.open_store()
    try:
        broker = await config.open_broker()
        try:
            instance = AgentInstance(agent, store, broker, instance_id=instance_id,
                                     options=config.runtime_options())
            stop = asyncio.Event()
            loop = asyncio.get_running_loop()
            for signum in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(signum, stop.set)
            await instance.start()
            logger.info("%s serving agent %s (namespace %s, broker %s)",
                        instance.instance_id, agent_name, config.namespace, config.broker.url)
            if on_ready is not None:
                on_ready(instance)
            await stop.wait()
            logger.info("%s: signal received, draining (up to %gs)", instance.instance_id,
                        config.runtime.drain_timeout_s)
            await instance.drain(config.runtime.drain_timeout_s)
        finally:
            await broker.close()
    finally:
        await store.close()


async def submit(config: MeshConfig, agent_name: str, text: str, *,
                 timeout_s: float) -> a2a.Task:
    """Send ``text`` to ``agent_name`` and return its final answer."""
    config.agent_config(agent_name)  # a clear error for a typo, before any I/O
    broker = await config.open_broker()
    try:
        async with Client(broker, namespace=config.namespace) as client:
            return await client.ask(agent_name, text, timeout_s=timeout_s)
    finally:
        await broker.close()


def print_ready(instance: AgentInstance) -> None:
    print(f"{READY} {instance.instance_id}", flush=True)
    sys.stdout.flush()
