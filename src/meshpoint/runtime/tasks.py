"""What one instance holds: its tasks in memory, its background work, its lifecycle.

These are the small shared pieces the parts of an
:class:`~meshpoint.runtime.instance.AgentInstance` are handed (see docs/runtime.md):
none of them knows the instance or any other part.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass, field
from typing import Any

from meshpoint.broker.base import Delivery
from meshpoint.context import TaskExecutionContext
from meshpoint.errors import BadMessageError
from meshpoint.runtime.stats import InstanceStats

logger = logging.getLogger("meshpoint.runtime")


@dataclass(eq=False)
class TaskRun:
    """A task in one instance's memory."""

    ctx: TaskExecutionContext
    #: The un-acknowledged inbound request (first run, or the in-memory path).
    delivery: Delivery | None = None
    #: The resume lease this run holds, if it was restored from the store.
    lease_owner: str | None = None
    #: True while the task waits in memory for its outstanding calls (the in-memory path).
    waiting: bool = False
    #: While it waits in memory: what continues it once its join completes (given
    #: by the turn loop that paused it, with the pause).
    go_on: Callable[[TaskRun], None] | None = None
    #: Set when another instance took the lease over: this run must stop quietly.
    lost: bool = False
    #: A first checkpoint failed with the database unreachable: it may have been
    #: committed all the same (the connection dropped after the commit), so the
    #: in-memory path removes whatever rows it left when the task ends.
    maybe_stored: bool = False
    #: What the last mid-turn checkpoint held (events, results, calls settled): one
    #: with nothing new is not written.
    checkpointed_at: tuple[int, int, int] | None = None
    #: The in-memory path's deadline timers, by sub-task id.
    timers: dict[str, asyncio.TimerHandle] = field(default_factory=dict)

    def cancel_timers(self) -> None:
        for handle in self.timers.values():
            handle.cancel()
        self.timers.clear()


class InHand:
    """The tasks an instance holds in memory (running a turn, or waiting in memory),
    and, for the in-memory path, which task each outstanding sub-task belongs to."""

    def __init__(self) -> None:
        #: task id -> its run.
        self.runs: dict[str, TaskRun] = {}
        #: sub-task id -> task id, for tasks waiting in memory.
        self.memory_subs: dict[str, str] = {}

    def __len__(self) -> int:
        return len(self.runs)

    def __iter__(self) -> Iterator[TaskRun]:
        return iter(list(self.runs.values()))

    def add(self, run: TaskRun) -> None:
        self.runs[run.ctx.task_id] = run

    def get(self, task_id: str) -> TaskRun | None:
        return self.runs.get(task_id)

    def waiting_for(self, sub_task_id: str) -> TaskRun | None:
        """The run waiting in memory for ``sub_task_id``, if any."""
        task_id = self.memory_subs.get(sub_task_id)
        return self.runs.get(task_id) if task_id else None

    def forget(self, run: TaskRun) -> None:
        """The task leaves memory: its timers stop, its sub-tasks are no longer ours."""
        run.cancel_timers()
        for sub_task_id in list(run.ctx.active_peer_sub_tasks):
            self.memory_subs.pop(sub_task_id, None)
        if self.runs.get(run.ctx.task_id) is run:  # never another run of the same task
            del self.runs[run.ctx.task_id]

    def clear(self) -> None:
        for run in self.runs.values():
            run.cancel_timers()
        self.runs.clear()
        self.memory_subs.clear()


class KeyMissing:
    """The stored tasks this instance met and cannot continue for want of a key their
    history needs (a signed task, and no active signing key: KeyMissingError). Each
    was left as it was, its lease given up, for an instance configured with the key;
    this instance's recovery passes them by from then on (a key ring changes only
    with a restart). The oldest are forgotten past ``limit``."""

    def __init__(self, limit: int = 10_000) -> None:
        self._limit = limit
        self._ids: dict[str, None] = {}  # insertion-ordered: the oldest first

    def __contains__(self, task_id: object) -> bool:
        return task_id in self._ids

    def add(self, task_id: str) -> None:
        self._ids[task_id] = None
        while len(self._ids) > self._limit:
            del self._ids[next(iter(self._ids))]


class Lifecycle:
    """Whether an instance runs, and whether it drains (takes no new work)."""

    def __init__(self) -> None:
        self.running = False
        self.draining = False
        self._drain = asyncio.Event()

    def begin_draining(self) -> None:
        self.draining = True
        self._drain.set()

    async def sleep(self, seconds: float) -> None:
        """Sleep ``seconds``, or less: until the instance begins to drain (a loop that
        stops on a drain need not finish its period first)."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._drain.wait(), seconds)


class Background:
    """An instance's background work: spawned here, cancelled when it stops."""

    def __init__(self, instance_id: str) -> None:
        self._instance_id = instance_id
        self._tasks: set[asyncio.Task[Any]] = set()

    def __len__(self) -> int:
        return len(self._tasks)

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        """Run ``coro`` in the background (cancelled with the instance)."""
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            logger.error("%s: background work failed", self._instance_id,
                         exc_info=task.exception())

    async def cancel_all(self) -> None:
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task


class LeaseOwners:
    """Names for resume attempts: a lease owner is one attempt of one instance, since
    taking a lease is re-entrant for the same owner."""

    def __init__(self, instance_id: str) -> None:
        self._instance_id = instance_id
        self._attempt = 0

    def next(self) -> str:
        self._attempt += 1
        return f"{self._instance_id}#{self._attempt}"


@dataclass(frozen=True)
class DeadLetters:
    """Where a malformed message goes: dead-lettered with its reason, logged, counted.
    It never crashes an instance or changes a task (docs/security.md, "The broker")."""

    instance_id: str
    stats: InstanceStats

    async def reject(self, delivery: Delivery, error: BadMessageError) -> None:
        logger.warning("%s: dead-lettering a message on %s: %s", self.instance_id,
                       delivery.message.subject, error)
        self.stats.note("dead_lettered", delivery.message.subject)
        await delivery.term(str(error))
