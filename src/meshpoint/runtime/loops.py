"""An instance's background loops: the sweeper, recovery and the lease keeper.

* The **sweeper** resolves items whose deadline passed after their checkpoint
  (``sweep_interval_s``) and withdraws them from whoever was to answer.
* **Recovery** takes over tasks whose resuming instance died: their join completed
  but their lease expired (``recovery_interval_s``).
* The **keeper** renews the leases and ack waits of the tasks in hand; a lease it
  can no longer renew was taken over, and its run stops quietly.

A failing pass is logged and tried again next period: a loop never dies of one bad
row.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from meshpoint.errors import StoreError, UnknownTaskError
from meshpoint.runtime.calls import CallKinds
from meshpoint.runtime.stats import InstanceStats
from meshpoint.runtime.tasks import Background, InHand, LeaseOwners, Lifecycle
from meshpoint.store.base import Store

logger = logging.getLogger("meshpoint.runtime")
#: Continues a stored task under a lease: ``resume(task_id, owner)``.
Resume = Callable[[str, str], Coroutine[Any, Any, None]]


async def forever(name: str, step: Callable[[], Awaitable[None]], period_s: float, *,
                  lifecycle: Lifecycle, instance_id: str, while_draining: bool = False) -> None:
    """Run ``step`` every ``period_s`` until the instance stops (or drains, unless
    ``while_draining``)."""
    while lifecycle.running and (while_draining or not lifecycle.draining):
        await asyncio.sleep(period_s)
        if lifecycle.draining and not while_draining:
            return
        try:
            await step()
        except StoreError as error:
            logger.warning("%s: %s failed: %s", instance_id, name, error)
        except Exception:
            logger.exception("%s: %s failed", instance_id, name)


class Sweeper:
    """Resolves an agent's expired items after their checkpoint."""

    def __init__(self, agent_name: str, instance_id: str, store: Store, kinds: CallKinds,
                 owners: LeaseOwners, stats: InstanceStats, background: Background,
                 lease_ttl_s: float, resume: Resume) -> None:
        self._agent_name = agent_name
        self._instance_id = instance_id
        self._store = store
        self._kinds = kinds
        self._owners = owners
        self._stats = stats
        self._background = background
        self._lease_ttl_s = lease_ttl_s
        self._resume = resume

    async def step(self) -> None:
        owner = self._owners.next()
        resolutions = await self._store.sweep_expired_timeouts(
            self._agent_name, lease_owner=owner, lease_ttl_s=self._lease_ttl_s)
        for resolution in resolutions:
            sub = resolution.sub_task
            self._stats.note("timeout", sub.task_id)
            if resolution.join_complete and resolution.lease_owner == owner:
                self._background.spawn(self._resume(sub.task_id, owner))
            try:
                await self._kinds.withdraw(sub.sub_task_id, sub.correlation_data)
            except Exception as error:  # the timeout stands; the peer's own ends it
                logger.warning("%s: could not withdraw %s: %s", self._instance_id,
                               sub.sub_task_id, error)


class Recovery:
    """Takes over an agent's tasks whose resuming instance died (their lease expired)."""

    def __init__(self, agent_name: str, store: Store, in_hand: InHand, owners: LeaseOwners,
                 stats: InstanceStats, background: Background, lease_ttl_s: float,
                 resume: Resume) -> None:
        self._agent_name = agent_name
        self._store = store
        self._in_hand = in_hand
        self._owners = owners
        self._stats = stats
        self._background = background
        self._lease_ttl_s = lease_ttl_s
        self._resume = resume

    async def step(self) -> None:
        for task_id in await self._store.resumable_tasks(self._agent_name):
            if self._in_hand.get(task_id) is not None:
                continue
            owner = self._owners.next()
            lease = await self._store.take_resume_lease(task_id, owner, self._lease_ttl_s)
            if lease is not None:
                self._stats.note("recovered", task_id)
                self._background.spawn(self._resume(task_id, owner))


class LeaseKeeper:
    """Renews the leases and ack waits of the tasks in hand."""

    def __init__(self, instance_id: str, store: Store, in_hand: InHand,
                 lease_ttl_s: float, request_ack_wait_s: float) -> None:
        self._instance_id = instance_id
        self._store = store
        self._in_hand = in_hand
        self._lease_ttl_s = lease_ttl_s
        #: Three renewals within the shorter of a lease and a request's ack wait.
        self.period_s = min(lease_ttl_s, request_ack_wait_s) / 3

    async def step(self) -> None:
        for run in self._in_hand:
            if run.delivery is not None:
                await run.delivery.in_progress()
            if run.lease_owner is None or run.lost:
                continue
            try:
                lease = await self._store.renew_resume_lease(
                    run.ctx.task_id, run.lease_owner, self._lease_ttl_s)
            except UnknownTaskError:
                lease = None
            except StoreError as error:
                logger.warning("%s: could not renew the lease of %s: %s",
                               self._instance_id, run.ctx.task_id, error)
                continue
            if lease is None:
                # Another instance took the task over; it is theirs now.
                run.lost = True
