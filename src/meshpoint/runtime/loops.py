"""An instance's background loops: the sweeper, recovery and the lease keeper.

* The **sweeper** resolves items whose deadline passed after their checkpoint
  (``sweep_interval_s``) and withdraws them from whoever was to answer.
* **Recovery** takes over tasks whose instance died while it held their lease
  (``recovery_interval_s``), fails tasks older than the agent's recovery timeout,
  and reminds the callers of tasks waiting for a human (seed 004's rules). Each task
  gets one action, the first that matches in that order: expired, then resumed, then
  left to (or its caller reminded of) a human; :func:`recovery_plan` says which,
  without doing it (``meshpoint recover --dry-run``).
* The **keeper** renews the leases and ack waits of the tasks in hand; a lease it
  can no longer renew was taken over, and its run stops quietly.
* The **ledger** loop forgets the agent's ended tasks once no copy of their
  requests can come back (``RuntimeOptions.ended_task_memory_s``).

A failing pass is logged and tried again next period: a loop never dies of one bad
row.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from meshpoint.errors import StoreError, UnknownTaskError
from meshpoint.runtime.agent import RecoveryPolicy
from meshpoint.runtime.calls import CallKinds
from meshpoint.runtime.stats import InstanceStats
from meshpoint.runtime.tasks import Background, InHand, KeyMissing, LeaseOwners, Lifecycle
from meshpoint.store.base import Store

logger = logging.getLogger("meshpoint.runtime")
#: Continues a stored task under a lease: ``resume(task_id, owner)``.
Resume = Callable[[str, str], Coroutine[Any, Any, None]]


async def forever(name: str, step: Callable[[], Awaitable[None]], period_s: float, *,
                  lifecycle: Lifecycle, instance_id: str, while_draining: bool = False) -> None:
    """Run ``step`` every ``period_s`` until the instance stops (or drains, unless
    ``while_draining``)."""
    while lifecycle.running and (while_draining or not lifecycle.draining):
        if while_draining:
            await asyncio.sleep(period_s)
        else:
            await lifecycle.sleep(period_s)  # cut short by a drain
        if lifecycle.draining and not while_draining:
            return
        try:
            await step()
        except StoreError as error:
            logger.warning("%s: %s failed: %s", instance_id, name, error)
        except Exception:
            logger.exception("%s: %s failed", instance_id, name)


@dataclass(frozen=True)
class Sweeper:
    """Resolves an agent's expired items after their checkpoint."""

    agent_name: str
    instance_id: str
    store: Store
    kinds: CallKinds
    owners: LeaseOwners
    stats: InstanceStats
    background: Background
    lease_ttl_s: float
    resume: Resume

    async def step(self) -> None:
        owner = self.owners.next()
        resolutions = await self.store.sweep_expired_timeouts(
            self.agent_name, lease_owner=owner, lease_ttl_s=self.lease_ttl_s)
        for resolution in resolutions:
            sub = resolution.sub_task
            self.stats.note("timeout", sub.task_id, sub_task_id=sub.sub_task_id,
                            peer=sub.peer_agent_name)
            if resolution.join_complete and resolution.lease_owner == owner:
                self.background.spawn(self.resume(sub.task_id, owner))
            try:
                await self.kinds.withdraw(sub.sub_task_id, sub.correlation_data)
            except Exception as error:  # the timeout stands; the peer's own ends it
                logger.warning("%s: could not withdraw %s: %s", self.instance_id,
                               sub.sub_task_id, error)


#: The statuses of a task recovery takes over once its lease expired: its join
#: completed, or it was checkpointed mid-turn.
RESUMABLE = ("resuming", "working")
#: What recovery does with a stored task, in the order it looks (seed 004's first
#: match: an expired task is failed, whatever else it is).
EXPIRE, RESUME = "fail (expired)", "resume"
REMIND, LEAVE = "remind the caller", "leave (waits for a human)"
#: Tasks one pass reads of each kind, at most.
_PASS = 10_000


async def recovery_plan(store: Store, agent_name: str, policy: RecoveryPolicy, *,
                        timeout_s: float | None = None) -> list[tuple[str, str]]:
    """``(task_id, action)`` for each stored task of ``agent_name`` that recovery
    would act on now under ``policy`` (``timeout_s`` in place of its timeout), one
    action per task, the first that matches: :data:`EXPIRE`, :data:`RESUME`, then
    :data:`REMIND` or :data:`LEAVE` for a task waiting for a human. Reads only."""
    timeout = policy.timeout_s if timeout_s is None else timeout_s
    plan: dict[str, str] = {}
    if timeout:
        plan.update((t, EXPIRE) for t in await store.expired_tasks(
            agent_name, older_than_s=timeout, limit=_PASS))
    if policy.auto_resume:
        for task_id in await store.resumable_tasks(agent_name, limit=_PASS):
            plan.setdefault(task_id, RESUME)
    waiting = await store.list_paused_tasks(agent_name=agent_name, status="input_required",
                                            limit=_PASS)
    for summary in waiting:
        plan.setdefault(summary.task_id, REMIND if policy.auto_resume_hitl else LEAVE)
    return list(plan.items())


@dataclass(frozen=True)
class Recovery:
    """Seed 004's recovery of an agent's stored tasks, by its
    :class:`~meshpoint.runtime.agent.RecoveryPolicy`: takes over the tasks whose
    instance died while it held their lease (it was resuming them, or running them
    past a mid-turn checkpoint); fails the tasks not checkpointed for longer than the
    policy's timeout; and, when an instance starts, tells the callers of tasks
    waiting for a human again. ``fail(task_id, reason)`` ends a stored task as
    failed (its caller answered, its items withdrawn, its rows removed)."""

    agent_name: str
    store: Store
    kinds: CallKinds
    policy: RecoveryPolicy
    in_hand: InHand
    owners: LeaseOwners
    stats: InstanceStats
    background: Background
    lease_ttl_s: float
    resume: Resume
    fail: Callable[[str, str], Awaitable[str]]
    #: Tasks this instance cannot continue without a key it lacks: left to others.
    key_missing: KeyMissing

    async def at_start(self) -> None:
        """The pass an instance makes as it starts, in the first-match order of
        :func:`recovery_plan`: the expired tasks fail before any is resumed."""
        await self.expire()
        await self.step()
        if self.policy.auto_resume_hitl:
            await self.remind()

    async def step(self) -> None:
        """Take over the tasks whose lease expired (``auto_resume``), but not an
        expired one: :meth:`expire` fails it (first match, as the plan says)."""
        if not self.policy.auto_resume:
            return
        resumable = await self.store.resumable_tasks(self.agent_name)
        expired: set[str] = set()
        if resumable and self.policy.timeout_s:  # rare: an instance died
            expired.update(await self.store.expired_tasks(
                self.agent_name, older_than_s=self.policy.timeout_s, limit=_PASS))
        for task_id in resumable:
            if (self.in_hand.get(task_id) is not None or task_id in expired
                    or task_id in self.key_missing):
                continue
            owner = self.owners.next()
            lease = await self.store.take_resume_lease(task_id, owner, self.lease_ttl_s,
                                                       statuses=RESUMABLE,
                                                       agent_name=self.agent_name)
            if lease is not None:
                self.stats.note("recovered", task_id)
                self.background.spawn(self.resume(task_id, owner))

    @property
    def expiry_period_s(self) -> float:
        """How often :meth:`expire` runs: it reads every stored task of the agent, so
        not at every recovery pass (a tenth of the timeout, within 1-60 s)."""
        return min(60.0, max(1.0, self.policy.timeout_s / 10))

    async def expire(self) -> None:
        """Fail the tasks last checkpointed strictly longer ago than the timeout."""
        timeout_s = self.policy.timeout_s
        if not timeout_s:
            return
        for task_id in await self.store.expired_tasks(self.agent_name,
                                                      older_than_s=timeout_s):
            if self.in_hand.get(task_id) is not None or task_id in self.key_missing:
                continue
            reason = (f"expired: not checkpointed for more than {timeout_s:g} s "
                      "(the agent's recovery timeout_s)")
            if await self.fail(task_id, reason) == "canceled":
                self.stats.note("expired", task_id)

    async def remind(self) -> None:
        """Send the callers of tasks waiting for a human their update again."""
        waiting = await self.store.list_paused_tasks(
            agent_name=self.agent_name, status="input_required", limit=10_000)
        for summary in waiting:
            try:
                ctx = (await self.store.restore_task(summary.task_id)).context
            except StoreError as error:
                logger.warning("cannot remind the caller of %s: %s", summary.task_id, error)
                continue
            human = [sub_task_id for sub_task_id, corr in ctx.active_peer_sub_tasks.items()
                     if (kind := self.kinds.of(corr)) is not None
                     and kind.pause_status == "input_required"]
            await self.kinds.announce(ctx, human)
            self.stats.note("reminded", summary.task_id)


@dataclass(frozen=True)
class EndedTasks:
    """Prunes an agent's ledger of ended tasks (see Store.forget_ended_tasks)."""

    agent_name: str
    store: Store
    memory_s: float

    @property
    def period_s(self) -> float:
        return self.memory_s / 4

    async def step(self) -> None:
        await self.store.forget_ended_tasks(self.agent_name, older_than_s=self.memory_s)


@dataclass(frozen=True)
class LeaseKeeper:
    """Renews the leases and ack waits of the tasks in hand."""

    instance_id: str
    store: Store
    in_hand: InHand
    lease_ttl_s: float
    request_ack_wait_s: float

    @property
    def period_s(self) -> float:
        """Three renewals within the shorter of a lease and a request's ack wait."""
        return min(self.lease_ttl_s, self.request_ack_wait_s) / 3

    async def step(self) -> None:
        for run in self.in_hand:
            if run.delivery is not None:
                await run.delivery.in_progress()
            if run.lease_owner is None or run.lost:
                continue
            try:
                lease = await self.store.renew_resume_lease(
                    run.ctx.task_id, run.lease_owner, self.lease_ttl_s)
            except UnknownTaskError:
                lease = None
            except StoreError as error:
                logger.warning("%s: could not renew the lease of %s: %s",
                               self.instance_id, run.ctx.task_id, error)
                continue
            if lease is None:
                # Another instance took the task over; it is theirs now.
                run.lost = True
