"""The event loop a saver's store belongs to, and LangGraph's synchronous calls on it.

A store's connections belong to the event loop that opened them (asyncpg's do), so
every operation of a saver runs on that loop: an ``a*`` method awaited on another
loop is handed over to it, and a synchronous method (``graph.invoke`` calls them)
waits for it from its own thread. A synchronous call made *on* that loop's thread
would wait for itself forever; it is refused with the way out, as LangGraph's own
async savers refuse it. :func:`~meshpoint.integrations.langgraph.get_checkpointer`,
which synchronous code calls, gives its saver a loop of its own on a daemon thread.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Coroutine, Iterator
from typing import Any, TypeVar

from meshpoint.errors import ConfigurationError, StoreError

R = TypeVar("R")


class OwnerLoop:
    """The loop a saver runs its store on (bound on first use if not given)."""

    def __init__(self, loop: asyncio.AbstractEventLoop | None = None,
                 thread: threading.Thread | None = None) -> None:
        self._loop = loop
        self._thread = thread
        self.stopped = False  # stop() ran: the saver was closed

    @classmethod
    def current(cls) -> OwnerLoop:
        """The running loop, if there is one; else the first loop that uses the saver."""
        try:
            return cls(asyncio.get_running_loop())
        except RuntimeError:
            return cls()

    @classmethod
    def private(cls) -> OwnerLoop:
        """A new loop running forever on a daemon thread of its own."""
        loop = asyncio.new_event_loop()
        started = threading.Event()

        def run() -> None:
            asyncio.set_event_loop(loop)
            loop.call_soon(started.set)
            loop.run_forever()

        thread = threading.Thread(target=run, name="meshpoint-langgraph", daemon=True)
        thread.start()
        started.wait()
        return cls(loop, thread)

    async def run(self, coro: Coroutine[Any, Any, R]) -> R:
        """Await ``coro`` on the owner loop, from whichever loop awaits this."""
        if self.stopped:
            self._check(coro)  # raises
        running = asyncio.get_running_loop()
        if self._loop is None:
            self._loop = running
        if running is self._loop:
            return await coro
        self._check(coro)
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, self._loop))

    def call(self, coro: Coroutine[Any, Any, R]) -> R:
        """Run ``coro`` on the owner loop and wait for it, from synchronous code."""
        try:
            running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is not None and running is self._loop:
            coro.close()
            raise ConfigurationError(
                "a synchronous method of MeshpointSaver was called on the event loop its "
                "store runs on, where it would wait for itself: use the async methods "
                "(graph.ainvoke, astream, aget_state) there, or get_checkpointer(), whose "
                "saver runs on a loop of its own, from synchronous code")
        self._check(coro)
        assert self._loop is not None
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def iterate(self, agen: AsyncIterator[R]) -> Iterator[R]:
        """The items of an async iterator, fetched on the owner loop one at a time."""
        async def step() -> tuple[bool, R | None]:
            try:
                return True, await agen.__anext__()
            except StopAsyncIteration:
                return False, None

        while True:
            more, item = self.call(step())
            if not more:
                return
            yield item  # type: ignore[misc]

    def _check(self, coro: Coroutine[Any, Any, Any]) -> None:
        if self.stopped:
            coro.close()
            raise StoreError("the MeshpointSaver is closed: open a new one "
                             "(get_checkpointer() or MeshpointSaver.open())")
        if self._loop is None or self._loop.is_closed() or not self._loop.is_running():
            coro.close()
            raise ConfigurationError(
                "MeshpointSaver's store belongs to an event loop that is not running (it "
                "was opened in an asyncio.run() that has returned, say): open the saver "
                "on the loop that uses it, or use get_checkpointer() from synchronous code")

    def stop(self) -> None:
        """Stop the private loop and its thread (nothing for a borrowed loop)."""
        self.stopped = True
        thread, self._thread = self._thread, None
        if thread is None or self._loop is None:
            return
        self._loop.call_soon_threadsafe(self._loop.stop)
        if thread is not threading.current_thread():
            thread.join(timeout=10)
            self._loop.close()
