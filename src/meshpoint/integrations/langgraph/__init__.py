"""A LangGraph checkpoint saver on meshpoint's store (``get_checkpointer``; docs/langgraph.md).

::

    from meshpoint.integrations.langgraph import get_checkpointer

    checkpointer = get_checkpointer("sqlite:///graphs.db")  # or postgresql://...
    graph = builder.compile(checkpointer=checkpointer)
    graph.invoke(inputs, {"configurable": {"thread_id": "t-1"}})

In async code, open it on the loop that uses it::

    saver = await MeshpointSaver.open("postgresql+asyncpg://app@db/mesh")
    graph = builder.compile(checkpointer=saver)
    await graph.ainvoke(inputs, {"configurable": {"thread_id": "t-1"}})

Its tables are created by meshpoint's migrations (0010), in the same database as the
rest of meshpoint's, held to the tenant by row-level security on PostgreSQL.
docs/langgraph.md says what it guarantees and which test proves each.

Importing this package does not import LangGraph: the saver's names load on first use
(PEP 562), so the store can load the saver's tables (:mod:`.tables`) and statements
(:mod:`.queries`), which it registers (:mod:`meshpoint.store.integrations`), without
the ``langgraph`` extra installed.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from meshpoint.integrations.langgraph.saver import MeshpointSaver
    from meshpoint.integrations.langgraph.serde import SafeSerializer

__all__ = ["DEFAULT_URL", "MeshpointSaver", "SafeSerializer", "get_checkpointer"]

#: Where get_checkpointer() keeps checkpoints without a URL (and without
#: ``MESHPOINT_STORE_URL``): a SQLite file in the working directory.
DEFAULT_URL = "sqlite:///meshpoint_checkpoints.db"


def get_checkpointer(url: str | None = None, use_memory: bool = False, *,
                     tenant_id: str = "default", types: Iterable[type] = (),
                     **store_options: Any) -> MeshpointSaver:
    """A checkpointer for LangGraph graphs, usable from synchronous and async code.

    Persistent by default: the store at ``url``, or ``MESHPOINT_STORE_URL``, or
    :data:`DEFAULT_URL`, migrated first. ``use_memory=True`` (for tests) is the same
    saver on an in-memory SQLite database, so tests exercise the code production
    runs; it is gone when the saver is closed. The saver runs its store on an event
    loop of its own, on a daemon thread, so that ``graph.invoke`` (synchronous) and
    ``graph.ainvoke`` on any loop both work; ``close()`` stops it. ``types`` are the
    pydantic models, dataclasses, enums and named tuples of the graph's state (see
    :class:`SafeSerializer`); ``store_options`` go to :func:`meshpoint.open_store`.
    """
    from meshpoint.integrations.langgraph.loop import OwnerLoop
    from meshpoint.integrations.langgraph.saver import MeshpointSaver
    from meshpoint.store import open_store

    target = "sqlite:///:memory:" if use_memory else (
        url or os.environ.get("MESHPOINT_STORE_URL") or DEFAULT_URL)
    loop = OwnerLoop.private()

    async def opened() -> Any:
        return await open_store(target, tenant_id=tenant_id, **store_options)

    try:
        store = loop.call(opened())
    except BaseException:
        loop.stop()
        raise
    return MeshpointSaver(store, types=types, owns_store=True, loop=loop)


def __getattr__(name: str) -> Any:
    """``MeshpointSaver`` and ``SafeSerializer``, imported (with LangGraph) when first
    asked for."""
    if name == "MeshpointSaver":
        from meshpoint.integrations.langgraph.saver import MeshpointSaver
        return MeshpointSaver
    if name == "SafeSerializer":
        from meshpoint.integrations.langgraph.serde import SafeSerializer
        return SafeSerializer
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
