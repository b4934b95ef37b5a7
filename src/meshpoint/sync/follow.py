"""Keeping a cloud store caught up: a sync pass as soon as the local file has new rows
(and at least every ``interval_s``), retried with backoff (tenacity) while the cloud
cannot be reached (``meshpoint sync --follow``, and ``serve`` on a local store with a
``sync:`` section).

Between passes the follower looks at the file every :data:`WATCH_S`: the largest rowid
of each table that travels, the end of a b-tree, read without a scan and without a
word to the cloud. A row committed locally is thus in a pass within ``WATCH_S`` plus
the pass in progress; an idle file costs the cloud one pass per ``interval_s``.

The cloud store stays open from pass to pass, and is closed and opened anew after a
pass that failed because it could not be reached, so a cloud that went away and came
back (a restart, a failover) is reached again without a restart of the follower; the
local store stays open (it is a file). A pass is :meth:`Syncer.run
<meshpoint.sync.push.Syncer.run>`: exactly once whatever interrupts it, so a pass cut
off by an outage or a stop is simply run again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager, AsyncExitStack
from typing import Any

from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception_type,
    stop_after_delay,
    stop_never,
    wait_exponential,
)

from meshpoint.errors import StoreUnavailableError
from meshpoint.store import SqlStore
from meshpoint.sync import queries as sq
from meshpoint.sync.push import DEFAULT_BATCH, Syncer, TableReport

log = logging.getLogger("meshpoint.sync")

#: ``on_pass(source_id, reports)``: called after each pass.
OnPass = Callable[[str | None, list[TableReport]], None]
#: ``on_retry(error, wait_s)``: called when a pass failed on an unreachable cloud.
OnRetry = Callable[[BaseException, float], None]
#: Seconds between two looks at the local file for new rows.
WATCH_S = 0.05
#: The longest a closing cloud store whose server went away may take.
_CLOSE_TIMEOUT_S = 10.0


def _log_retry(error: BaseException, wait_s: float) -> None:
    log.warning("sync: the cloud store is unreachable (%s); next try in %.1f s", error,
                wait_s)


def unreachable_retrying(on_retry: OnRetry, *, max_backoff_s: float,
                         give_up_after_s: float | None = None) -> AsyncRetrying:
    """The policy of a pass that failed because the cloud could not be reached
    (StoreUnavailableError): tried again after a backoff doubling from 0.5 s to
    ``max_backoff_s``, ``on_retry`` told each time; for ever, or until
    ``give_up_after_s`` have passed (then the last error is raised)."""
    def before_sleep(state: RetryCallState) -> None:
        error = state.outcome.exception() if state.outcome is not None else None
        wait_s = state.next_action.sleep if state.next_action is not None else 0.0
        if error is not None:
            on_retry(error, wait_s)

    return AsyncRetrying(retry=retry_if_exception_type(StoreUnavailableError),
                         wait=wait_exponential(multiplier=0.5, max=max_backoff_s),
                         stop=stop_never if give_up_after_s is None
                         else stop_after_delay(give_up_after_s),
                         before_sleep=before_sleep, reraise=True)


class _Cloud:
    """The cloud store, opened at the first pass and kept open; dropped (closed) when
    a pass finds it unreachable, to be opened anew by the next."""

    def __init__(self, opener: Callable[[], AbstractAsyncContextManager[Any]]) -> None:
        self.opener = opener
        self.stack: AsyncExitStack | None = None
        self.store: Any = None

    async def get(self) -> Any:
        if self.stack is None:
            stack = AsyncExitStack()
            self.store = await stack.enter_async_context(self.opener())
            self.stack = stack
        return self.store

    async def drop(self) -> None:
        stack, self.stack, self.store = self.stack, None, None
        if stack is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(stack.aclose(), _CLOSE_TIMEOUT_S)


async def follow(local: SqlStore, open_cloud: Callable[[], AbstractAsyncContextManager[Any]],
                 *, interval_s: float, batch: int = DEFAULT_BATCH,
                 max_backoff_s: float = 60.0, stop: asyncio.Event | None = None,
                 unsigned: bool = False, on_pass: OnPass | None = None,
                 on_retry: OnRetry = _log_retry, watch_s: float = WATCH_S) -> None:
    """Run a pass; then another as soon as the local file has new rows (looked at
    every ``watch_s``), or ``interval_s`` after the last one; until ``stop`` is set.
    A pass that fails because the cloud cannot be reached (StoreUnavailableError) is
    tried again after a backoff doubling from 0.5 s to ``max_backoff_s``, on a cloud
    store opened anew; any other error ends the loop (a wrong schema or tenant, or no
    key to check signatures with without ``unsigned``, does not mend by waiting)."""
    stop = stop if stop is not None else asyncio.Event()
    cloud = _Cloud(open_cloud)

    async def one_pass() -> tuple[str | None, list[TableReport]]:
        try:
            return await Syncer(local, await cloud.get(), batch=batch,
                                unsigned=unsigned).run()
        except StoreUnavailableError:
            await cloud.drop()
            raise

    async def mark() -> tuple[Any, ...]:
        return tuple(await local.run(lambda conn: sq.WATCH.first(conn, {})))

    try:
        while not stop.is_set():
            seen = await mark()  # before the pass: a row committed during it starts the next
            retrying = unreachable_retrying(on_retry, max_backoff_s=max_backoff_s)
            result: tuple[str | None, list[TableReport]] = await retrying(one_pass)
            source, reports = result
            if on_pass is not None:
                on_pass(source, reports)
            until = time.monotonic() + interval_s
            while not stop.is_set() and time.monotonic() < until:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), min(watch_s, interval_s))
                if await mark() != seen:
                    break
    finally:
        await cloud.drop()
