"""``meshpoint.embedded``: a whole mesh config served in this process, for a first try.

``async with embedded("mesh.yaml") as client:`` opens the config's store and broker,
starts an instance of every agent of the file (or of those named), and gives a
started :class:`~meshpoint.runtime.Client` of the mesh; on exit the instances drain
(the work in hand finishes or checkpoints) and everything is closed. With a SQLite
store and the ``memory://`` broker nothing else needs to run; the same file, given a
PostgreSQL store and a NATS broker, is what ``meshpoint serve --agent`` processes run,
one agent each (``examples/support/README.md`` goes from one to the other).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterable
from pathlib import Path

from meshpoint.config import MeshConfig, load_config
from meshpoint.errors import ConfigurationError
from meshpoint.runtime import AgentInstance, Client


@contextlib.asynccontextmanager
async def embedded(config: MeshConfig | str | Path, *, agents: Iterable[str] | None = None,
                   drain_timeout_s: float | None = None) -> AsyncIterator[Client]:
    """Serve ``agents`` (default: every agent of ``config``, a :class:`MeshConfig` or
    the path of its YAML) in this process, one instance each; yields a started client
    of the mesh. ``drain_timeout_s`` (default: the config's ``runtime.drain_timeout_s``)
    bounds the drain on exit."""
    mesh = config if isinstance(config, MeshConfig) else load_config(config)
    names = list(mesh.agents) if agents is None else list(agents)
    if not names:
        raise ConfigurationError("the config defines no agents to serve: add them under "
                                 "agents:")
    built = [mesh.build_agent(name) for name in names]  # a mistake named before any I/O
    approvers = mesh.build_approvers()
    store = await mesh.open_store()
    try:
        broker = await mesh.open_broker()
        instances: list[AgentInstance] = []
        try:
            for agent in built:
                instance = mesh.instance(agent, store, broker, approvers=approvers)
                await instance.start()
                instances.append(instance)
            async with mesh.client(broker) as client:
                yield client
        finally:
            timeout = mesh.runtime.drain_timeout_s if drain_timeout_s is None \
                else drain_timeout_s
            await asyncio.gather(*(instance.drain(timeout) for instance in instances))
            await broker.close()
    finally:
        await store.close()


__all__ = ["embedded"]
