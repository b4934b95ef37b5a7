"""Store operations for a message in hand, outlasting a database outage.

While the database is unavailable (a restart, a failover) the message is kept
(``in_progress``) and the operation retried with backoff, for up to
:data:`OUTAGE_PATIENCE_S`: a nak per attempt would spend the message's deliveries
and dead-letter an answer during a database restart. The policy is tenacity's
(see :mod:`meshpoint._retry`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from tenacity import AsyncRetrying, RetryCallState, retry_if_exception_type, wait_exponential

from meshpoint._retry import retried
from meshpoint.broker.base import Delivery
from meshpoint.errors import StoreUnavailableError
from meshpoint.runtime.tasks import Lifecycle

logger = logging.getLogger("meshpoint.runtime")
R = TypeVar("R")
#: How long a handler keeps retrying a store operation while the database is
#: unavailable before it gives the message back (nak) instead.
OUTAGE_PATIENCE_S = 60.0


@dataclass(frozen=True)
class Outages:
    """Retries a message's store operations through outages, while the instance runs."""

    instance_id: str
    lifecycle: Lifecycle

    async def outlast(self, delivery: Delivery, operation: Callable[[], Awaitable[R]]) -> R:
        """``await operation()`` for ``delivery``: retried every 0.25 s, doubling up to
        5 s, while it raises StoreUnavailableError, until the next attempt would start
        past the patience or the instance stops; then the error is raised."""
        give_up = asyncio.get_running_loop().time() + OUTAGE_PATIENCE_S

        def stop(state: RetryCallState) -> bool:
            late = asyncio.get_running_loop().time() + state.upcoming_sleep > give_up
            return late or not self.lifecycle.running

        async def before_sleep(state: RetryCallState) -> None:
            error = state.outcome.exception() if state.outcome else None
            logger.warning("%s: %s; retrying in %.2fs", self.instance_id, error,
                           state.upcoming_sleep)
            await delivery.in_progress()

        def policy() -> AsyncRetrying:
            return AsyncRetrying(retry=retry_if_exception_type(StoreUnavailableError),
                                 wait=wait_exponential(multiplier=0.25, max=5.0), stop=stop,
                                 before_sleep=before_sleep, reraise=True)

        return await retried(operation, policy,
                             lambda error: isinstance(error, StoreUnavailableError))
