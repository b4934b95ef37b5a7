"""Retries with tenacity, at no cost to the attempts that succeed.

Every operation meshpoint retries (a deadlock victim's transaction, a store
operation during a database outage, a publish or subscribe while NATS restarts,
``serve`` opening its services) is retried by a tenacity policy. (A NATS queue
member's pull loop paces itself on errors too; it never gives up, so it is a loop,
not a retry.) tenacity's asyncio machinery costs as much as a
quarter of a SQLite checkpoint per call, even when the first attempt succeeds
(docs/store.md), and would be paid on every write and every publish. So
:func:`retried` makes the first attempt itself and builds the policy and hands over
to it only when that attempt fails with an error worth retrying; the policy's first
attempt then re-raises that failure, so its waits and its count of attempts are
exactly what it says.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

from tenacity import AsyncRetrying

R = TypeVar("R")


async def retried(attempt: Callable[[], Awaitable[R]], policy: Callable[[], AsyncRetrying],
                  retryable: Callable[[BaseException], bool]) -> R:
    """``await attempt()``, retried under the policy ``policy()`` builds while it fails
    with an error ``retryable`` accepts (the policy should retry the same errors)."""
    try:
        return await attempt()
    except Exception as error:
        if not retryable(error):
            raise
        seen: Exception | None = error

    async def again() -> R:
        nonlocal seen
        if seen is not None:
            failure, seen = seen, None
            raise failure
        return await attempt()

    return await policy()(again)
