"""The agent's circuit breaker, as an instance uses it (docs/runtime.md, "Recovery limits,
the circuit breaker and alerts"); its state lives in the store
(:mod:`meshpoint.store.breakers`), shared by every instance and kept across restarts.

Every resume of a stored task (recovery's take-over, a join completed by an answer or a
deadline, a human's answer) goes through :meth:`Breaker.guard`: while the breaker is
open the instance gives the lease it took up at once, so the task stays paused (it is
``resuming`` with a free lease: recovery offers it again once the breaker lets it
through) and nothing is lost. A resume is *failed* when the task it continued then
ended ``failed`` (or ``rejected``), was ``blocked``, or when its holder died and the
task was taken over; it *succeeded* when the task then completed or paused again.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass, field
from typing import Any

from meshpoint.errors import StoreError
from meshpoint.runtime.alerts import Alerts
from meshpoint.runtime.loops import Resume
from meshpoint.runtime.options import RecoveryPolicy
from meshpoint.runtime.scope import Scope
from meshpoint.runtime.stats import InstanceStats
from meshpoint.runtime.tasks import Background

logger = logging.getLogger("meshpoint.runtime")

#: What the stats count of a resumed task -> the resume's outcome.
OUTCOMES = {"completed": "success", "paused": "success", "paused_in_memory": "success",
            "failed": "failure", "rejected": "failure", "blocked": "failure"}


@dataclass
class Breaker:
    """One instance's view of its agent's breaker (see the module docstring)."""

    scope: Scope
    policy: RecoveryPolicy
    alerts: Alerts
    stats: InstanceStats
    background: Background
    #: Resumes whose outcome is awaited: task id -> (lease owner, whether the trial).
    watched: dict[str, tuple[str, bool]] = field(default_factory=dict)

    @property
    def on(self) -> bool:
        return self.policy.breaker_failures > 0

    def guard(self, resume: Resume) -> Resume:
        """``resume``, let through only while the breaker allows it (see the module
        docstring); its outcome is then watched."""
        if not self.on:
            return resume

        async def guarded(task_id: str, owner: str) -> None:
            try:
                allowed, state = await self.scope.store.breakers.admit(
                    self.scope.agent_name, owner, trial_ttl_s=self.scope.lease_ttl_s)
            except StoreError as error:
                logger.warning("%s: cannot read the breaker (%s): task %s left for later",
                               self.scope.instance_id, error, task_id)
                allowed, state = False, None
            if not allowed:
                self.stats.note("breaker_held", task_id, journal=False)
                with contextlib.suppress(StoreError):
                    await self.scope.store.release_resume_lease(task_id, owner)
                return
            trial = state is not None and state.state == "half_open"
            if trial:
                logger.info("%s: the breaker of %s is half-open: task %s is its trial",
                            self.scope.instance_id, self.scope.agent_name, task_id)
            self.watched[task_id] = (owner, trial)
            await resume(task_id, owner)

        return guarded

    async def holds(self) -> bool:
        """Whether the breaker is open and in its cool-down (recovery then takes no
        task, rather than take each and give it up); one read. A store that fails is
        no hold: the resume's own admission decides."""
        if not self.on:
            return False
        try:
            state = await self.scope.store.breakers.state(self.scope.agent_name)
        except StoreError:
            return False
        return state.state == "open" and (state.opened_until or 0) > self.scope.clock()

    def watch(self, what: str, task_id: str, detail: dict[str, Any]) -> None:
        """A stats watcher: note the outcome of a watched resume."""
        outcome = OUTCOMES.get(what)
        if outcome is None or task_id not in self.watched:
            return
        owner, trial = self.watched.pop(task_id)
        if outcome == "success" and not trial:
            return  # only a trial's success changes the breaker: no write for the others
        self.background.spawn(self.note(outcome, owner=owner))

    async def note(self, outcome: str, *, owner: str | None) -> None:
        """Note a resume's outcome in the store, and raise the alert of a transition."""
        if not self.on:
            return
        p = self.policy
        try:
            before, after = await self.scope.store.breakers.note(
                self.scope.agent_name, "success" if outcome == "success" else "failure",
                owner=owner, failures=p.breaker_failures, window_s=p.breaker_window_s,
                cooldown_s=p.breaker_cooldown_s)
        except StoreError as error:
            logger.warning("%s: cannot note a resume on the breaker: %s",
                           self.scope.instance_id, error)
            return
        if before.state != "open" and after.state == "open":
            self.stats.note("breaker_opened", self.scope.agent_name, journal=False)
            await self.alerts.raise_(
                "breaker_opened", text=f"the breaker of agent {self.scope.agent_name} opened: "
                f"no instance resumes its tasks for {p.breaker_cooldown_s:g} s",
                opened_until=after.opened_until, reopened=before.state == "half_open")
        elif before.state != "closed" and after.state == "closed":
            self.stats.note("breaker_closed", self.scope.agent_name, journal=False)
            await self.alerts.raise_(
                "breaker_closed", text=f"the breaker of agent {self.scope.agent_name} "
                "closed: its trial resume succeeded")
