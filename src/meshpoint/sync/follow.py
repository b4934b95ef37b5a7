"""Keeping a cloud store caught up: a sync pass every ``interval_s``, retried with
backoff (tenacity) while the cloud cannot be reached (``meshpoint sync --follow``, and
``serve`` on a local store with a ``sync:`` section).

Each pass opens the cloud store anew, so a cloud that went away and came back is
reached again without a restart; the local store stays open (it is a file). A pass
is :meth:`Syncer.run <meshpoint.sync.push.Syncer.run>`: exactly once whatever
interrupts it, so a pass cut off by an outage or a stop is simply run again.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

from tenacity import AsyncRetrying, RetryCallState, retry_if_exception_type, wait_exponential

from meshpoint.errors import StoreUnavailableError
from meshpoint.store import SqlStore
from meshpoint.sync.push import DEFAULT_BATCH, Syncer, TableReport

log = logging.getLogger("meshpoint.sync")

#: ``on_pass(source_id, reports)``: called after each pass.
OnPass = Callable[[str | None, list[TableReport]], None]
#: ``on_retry(error, wait_s)``: called when a pass failed on an unreachable cloud.
OnRetry = Callable[[BaseException, float], None]


def _log_retry(error: BaseException, wait_s: float) -> None:
    log.warning("sync: the cloud store is unreachable (%s); next try in %.1f s", error,
                wait_s)


async def follow(local: SqlStore, open_cloud: Callable[[], AbstractAsyncContextManager[Any]],
                 *, interval_s: float, batch: int = DEFAULT_BATCH,
                 max_backoff_s: float = 60.0, stop: asyncio.Event | None = None,
                 unsigned: bool = False,
                 on_pass: OnPass | None = None, on_retry: OnRetry = _log_retry) -> None:
    """Run a pass, wait ``interval_s``, and again, until ``stop`` is set. A pass that
    fails because the cloud cannot be reached (StoreUnavailableError) is tried again
    after a backoff doubling from 0.5 s to ``max_backoff_s``; any other error ends
    the loop (a wrong schema or tenant, or no key to check signatures with without
    ``unsigned``, does not mend by waiting)."""
    stop = stop if stop is not None else asyncio.Event()

    def before_sleep(state: RetryCallState) -> None:
        error = state.outcome.exception() if state.outcome is not None else None
        wait_s = state.next_action.sleep if state.next_action is not None else 0.0
        if error is not None:
            on_retry(error, wait_s)

    async def one_pass() -> tuple[str | None, list[TableReport]]:
        async with open_cloud() as cloud:
            return await Syncer(local, cloud, batch=batch, unsigned=unsigned).run()

    while not stop.is_set():
        retrying = AsyncRetrying(retry=retry_if_exception_type(StoreUnavailableError),
                                 wait=wait_exponential(multiplier=0.5, max=max_backoff_s),
                                 before_sleep=before_sleep, reraise=True)
        result: tuple[str | None, list[TableReport]] = await retrying(one_pass)
        source, reports = result
        if on_pass is not None:
            on_pass(source, reports)
        try:
            await asyncio.wait_for(stop.wait(), timeout=interval_s)
        except TimeoutError:
            pass
