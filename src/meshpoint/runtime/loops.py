"""An instance's background loops: the sweeper, recovery and the lease keeper.

* The **sweeper** resolves items whose deadline passed after their checkpoint
  (``sweep_interval_s``) and withdraws them from whoever was to answer.
* **Recovery** takes over tasks whose instance died while it held their lease
  (``recovery_interval_s``; past ``max_recoveries`` take-overs in a row it blocks the
  task instead, its caller told), fails tasks older than the agent's recovery timeout,
  and reminds the callers of tasks waiting for a human (docs/runtime.md, "Recovery
  and statistics"). Each task gets one action, the first that matches in that order:
  expired, then resumed, then left to (or its caller reminded of) a human;
  :func:`recovery_plan` says which, without doing it (``meshpoint recover --dry-run``).
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
from dataclasses import dataclass, field
from typing import Any, Protocol

from meshpoint import a2a
from meshpoint.errors import KeyMissingError, StoreError, TaskBlockedError, UnknownTaskError
from meshpoint.runtime.agent import RecoveryPolicy
from meshpoint.runtime.calls import CallKinds
from meshpoint.runtime.scope import Scope
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

    scope: Scope
    kinds: CallKinds
    owners: LeaseOwners
    stats: InstanceStats
    background: Background
    resume: Resume

    async def step(self) -> None:
        owner = self.owners.next()
        resolutions = await self.scope.store.sweep_expired_timeouts(
            self.scope.agent_name, lease_owner=owner, lease_ttl_s=self.scope.lease_ttl_s)
        for resolution in resolutions:
            sub = resolution.sub_task
            self.stats.note("timeout", sub.task_id, sub_task_id=sub.sub_task_id,
                            peer=sub.peer_agent_name)
            if resolution.join_complete and resolution.lease_owner == owner:
                self.background.spawn(self.resume(sub.task_id, owner))
            try:
                await self.kinds.withdraw(sub.sub_task_id, sub.correlation_data)
            except Exception as error:  # the timeout stands; the peer's own ends it
                logger.warning("%s: could not withdraw %s: %s", self.scope.instance_id,
                               sub.sub_task_id, error)
        # Requests the peer has said nothing of since the pause: published again, once
        # (the caller may have died between its checkpoint and the publish; the broker
        # drops the copy of one it has).
        if not self.kinds.checks_announcements:
            return
        for sub in await self.scope.store.check_announcements(self.scope.agent_name):
            try:
                if await self.kinds.announce_again(sub):
                    self.stats.note("announced_again", sub.task_id,
                                    sub_task_id=sub.sub_task_id, peer=sub.peer_agent_name)
            except Exception as error:  # it waits for its answer or its timeout
                logger.warning("%s: could not publish %s again: %s", self.scope.instance_id,
                               sub.sub_task_id, error)


#: The statuses of a task recovery takes over once its lease expired: its join
#: completed, or it was checkpointed mid-turn.
RESUMABLE = ("resuming", "working")
#: What recovery does with a stored task, in the order it looks (docs/runtime.md's first
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


class TakeOvers(Protocol):
    """What recovery tells the agent's breaker (:class:`~meshpoint.runtime.breaker.
    Breaker`): a task was taken over, its holder having died (a failed resume)."""

    async def note(self, outcome: str, *, owner: str | None) -> None: ...

    async def holds(self) -> bool:
        """Whether the breaker is open now (no resume would be let through)."""
        ...


#: Tells a blocked task's caller (Endings.tell_blocked).
TellBlocked = Callable[[TaskBlockedError], Coroutine[Any, Any, None]]


class StoredEnding(Protocol):
    """What recovery needs of the cancels (:class:`~meshpoint.runtime.cancels.Cancels`):
    to end a stored task nobody is running."""

    async def end_stored(self, task_id: str, state: a2a.TaskState, text: str, *,
                         outcome: str | None = None) -> str: ...


@dataclass(frozen=True)
class Recovery:
    """The recovery of an agent's stored tasks (docs/runtime.md), by its
    :class:`~meshpoint.runtime.agent.RecoveryPolicy`: takes over the tasks whose
    instance died while it held their lease (it was resuming them, or running them
    past a mid-turn checkpoint); fails the tasks not checkpointed for longer than the
    policy's timeout; and, when an instance starts, tells the callers of tasks
    waiting for a human again. ``ending`` ends an expired task as failed (its caller
    answered, its items withdrawn, its rows removed)."""

    scope: Scope
    kinds: CallKinds
    policy: RecoveryPolicy
    in_hand: InHand
    owners: LeaseOwners
    stats: InstanceStats
    background: Background
    resume: Resume
    ending: StoredEnding
    #: Tasks this instance cannot continue without a key it lacks: left to others.
    key_missing: KeyMissing
    #: Tells the caller of a task blocked past ``max_recoveries``.
    tell_blocked: TellBlocked | None = None
    #: The agent's breaker, told of each take-over (once per dead instance).
    breaker: TakeOvers | None = None
    #: The instances whose tasks this instance took over (see _first_of_its_holder).
    dead_holders: set[str] = field(default_factory=set)

    async def at_start(self) -> None:
        """The pass an instance makes as it starts, in the first-match order of
        :func:`recovery_plan`: the expired tasks fail before any is resumed."""
        await self.expire()
        await self.step()
        if self.policy.auto_resume_hitl:
            await self.remind()

    async def step(self) -> None:
        """Take over the tasks whose lease expired (``auto_resume``), but not an
        expired one: :meth:`expire` fails it (first match, as the plan says). Tasks
        whose lease is free (an operator's ``meshpoint tasks resume``, a breaker that
        held them, an instance that lacked a key) are resumed with ``auto_resume`` off
        too: only taking over a dead holder's task is what it switches off."""
        if self.breaker is not None and await self.breaker.holds():
            return  # it would give every lease up at once: not even taken
        only_free = not self.policy.auto_resume
        resumable = await self.scope.store.resumable_tasks(self.scope.agent_name)
        expired: set[str] = set()
        if resumable and self.policy.timeout_s:  # rare: an instance died
            expired.update(await self.scope.store.expired_tasks(
                self.scope.agent_name, older_than_s=self.policy.timeout_s, limit=_PASS))
        for task_id in resumable:
            if (self.in_hand.get(task_id) is not None or task_id in expired
                    or task_id in self.key_missing):
                continue
            owner = self.owners.next()
            try:
                lease = await self.scope.store.recovery.take_over_task(
                    task_id, owner, self.scope.lease_ttl_s, agent_name=self.scope.agent_name,
                    only_free=only_free)
            except KeyMissingError as error:  # its record cannot be signed here
                logger.error("%s: leaving task %s to an instance with the key: %s",
                             self.scope.instance_id, task_id, error)
                self.key_missing.add(task_id)
                continue
            if lease is None:
                continue
            if lease.taken_over and self.breaker is not None and \
                    self._first_of_its_holder(lease.previous_owner):
                # Noted (and the breaker it opens alerted) before the task resumes: a
                # resume that dies at once (the fault that killed its holder, again)
                # would take a note still in the background with it, and the resume
                # is then held by the breaker it opened.
                await self.breaker.note("failure", owner=None)
            limit = self.policy.max_recoveries
            if limit and lease.recoveries > limit:
                await self.block(task_id, owner, lease.recoveries)
                continue
            if lease.taken_over or not await self._decided_by_a_human(task_id):
                self.stats.note("recovered", task_id, attempt=lease.recoveries,
                                lease_owner=owner, previous_owner=lease.previous_owner)
            else:
                self.stats.note("approval_resumed", task_id, lease_owner=owner)
            self.background.spawn(self.resume(task_id, owner))

    async def _decided_by_a_human(self, task_id: str) -> bool:
        """Whether the free lease of ``task_id`` is that of a join a human's answer
        completed with no instance taking the lease (``meshpoint tasks approve``,
        ``deny`` or ``reply``, straight into the store): every call it waits on is
        answered and one of them is an approval. Its resume is then an approval's, not a
        recovery (nobody died); an operator's ``tasks resume``, a breaker's or a
        missing key's release stay recoveries."""
        from meshpoint.runtime.approvals import APPROVAL

        try:
            subs = await self.scope.store.get_peer_sub_tasks_for_task(task_id)
        except (StoreError, UnknownTaskError):
            return False
        return bool(subs) and all(s.status != "pending" for s in subs) and any(
            APPROVAL in s.correlation_data for s in subs)

    def _first_of_its_holder(self, previous_owner: str | None) -> bool:
        """Whether a take-over is the first this instance made from its dead holder's
        instance: one instance that dies holding many tasks is one failed resume on
        the breaker, not one per task (a crash of every instance that resumes a
        poisonous task still counts once each)."""
        instance = (previous_owner or "").rpartition("#")[0] or previous_owner or ""
        if instance in self.dead_holders:
            return False
        if len(self.dead_holders) >= 1000:
            self.dead_holders.clear()
        self.dead_holders.add(instance)
        return True

    async def block(self, task_id: str, owner: str, recoveries: int) -> None:
        """Block a task taken over more than ``max_recoveries`` times in a row: it
        waits for an operator (``meshpoint tasks resume``); its caller is told and an
        alert raised (the stats' ``blocked``, which the alerts watch)."""
        reason = (f"taken over {recoveries} times in a row, its holder dying each time "
                  f"without progress (the agent's max_recoveries is "
                  f"{self.policy.max_recoveries})")
        try:
            blocked = await self.scope.store.block_task(task_id, lease_owner=owner,
                                                        reason=reason)
        except (StoreError, UnknownTaskError) as error:  # then the lease expires: again
            logger.warning("%s: could not block task %s: %s", self.scope.instance_id,
                           task_id, error)
            return
        logger.error("%s: task %s is blocked: %s", self.scope.instance_id, task_id, reason)
        self.stats.note("blocked", task_id, reason=reason)
        if self.tell_blocked is not None:
            await self.tell_blocked(TaskBlockedError(task_id, reason,
                                                     a2a_context=blocked.a2a_context))

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
        for task_id in await self.scope.store.expired_tasks(self.scope.agent_name,
                                                            older_than_s=timeout_s):
            if self.in_hand.get(task_id) is not None or task_id in self.key_missing:
                continue
            reason = (f"expired: not checkpointed for more than {timeout_s:g} s "
                      "(the agent's recovery timeout_s)")
            if await self.ending.end_stored(task_id, a2a.TaskState.FAILED, reason,
                                            outcome="expired") == "canceled":
                self.stats.note("expired", task_id)

    async def remind(self) -> None:
        """Send the callers of tasks waiting for a human their update again."""
        waiting = await self.scope.store.list_paused_tasks(
            agent_name=self.scope.agent_name, status="input_required", limit=10_000)
        for summary in waiting:
            try:
                ctx = (await self.scope.store.restore_task(summary.task_id)).context
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

    scope: Scope

    @property
    def period_s(self) -> float:
        return self.scope.options.ended_task_memory_s / 4

    async def step(self) -> None:
        await self.scope.store.forget_ended_tasks(
            self.scope.agent_name, older_than_s=self.scope.options.ended_task_memory_s)


@dataclass(frozen=True)
class LeaseKeeper:
    """Renews the leases and ack waits of the tasks in hand."""

    scope: Scope
    in_hand: InHand

    @property
    def period_s(self) -> float:
        """Three renewals within the shorter of a lease and a request's ack wait."""
        return min(self.scope.lease_ttl_s, self.scope.options.request_ack_wait_s) / 3

    async def step(self) -> None:
        for run in self.in_hand:
            if run.delivery is not None:
                await run.delivery.in_progress()
            if run.lease_owner is None or run.lost:
                continue
            try:
                lease = await self.scope.store.renew_resume_lease(
                    run.ctx.task_id, run.lease_owner, self.scope.lease_ttl_s)
            except UnknownTaskError:
                lease = None
            except StoreError as error:
                logger.warning("%s: could not renew the lease of %s: %s",
                               self.scope.instance_id, run.ctx.task_id, error)
                continue
            if lease is None:
                # Another instance took the task over; it is theirs now.
                run.lost = True
