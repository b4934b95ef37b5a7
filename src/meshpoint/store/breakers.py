"""Recovery limits and each agent's circuit breaker, in the store (0014; docs/runtime.md,
"Recovery limits, the circuit breaker and alerts").

:class:`RecoveryLimits` is ``store.recovery`` (the Store's ``block_task`` calls it) and
:class:`Breakers` is ``store.breakers``, parts of
:class:`~meshpoint.store.sqlstore.SqlStore`:

* ``take_over_task``: recovery's take of a task whose lease holder died, counted in
  the task's row (``recoveries``) and, with the history on, written as a history
  record of phase ``recovering`` naming the attempt and why, in the same transaction
  (not onto a last record that fails verification: the restore judges that task);
* ``block_task``: a task marked ``blocked`` for an operator, with a record of phase
  ``blocked``;
* ``take_task_by_hand``: an operator's resume (``meshpoint tasks resume``);
* :class:`Breakers` (``store.breakers``): ``admit``, ``note`` and ``state`` of an
  agent's breaker. Each transition reads the
  row locked (``FOR UPDATE`` on PostgreSQL; SQLite's write transaction excludes every
  other writer) and writes it in the same transaction, by :func:`admit` and
  :func:`noted`, which decide without I/O.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Literal

from sqlalchemy import Connection

from meshpoint.errors import InvalidArgumentError, LeaseNotHeldError
from meshpoint.history.planning import HistoryOptions, plan_record
from meshpoint.history.verification import said_policy, verify_head, verify_record
from meshpoint.store import queries as q
from meshpoint.store import recovery_queries as rq
from meshpoint.store.checks import check_id, check_ttl
from meshpoint.store.history_chain import (
    head_of,
    record_params,
    stored_head,
    stored_last,
    write_record,
)
from meshpoint.store.reads import raise_if_unknown_task
from meshpoint.store.results import Blocked, BreakerState, Lease
from meshpoint.store.transactions import Transactions

Outcome = Literal["success", "failure"]


def admit(state: BreakerState, owner: str, now: float, trial_ttl_s: float
          ) -> tuple[bool, BreakerState]:
    """Whether ``owner`` may resume one of the agent's tasks now, and the breaker's
    state after asking: closed lets everyone through; open lets nobody through until
    its cool-down ends, then gives the one trial to the first to ask (half-open); a
    half-open breaker lets only its trial's owner through, and gives the trial again
    once the trial's holder let it lapse (it died)."""
    if state.state == "closed":
        return True, state
    if state.state == "open" and (state.opened_until or 0) > now:
        return False, state
    if state.state == "half_open" and (state.trial_until or 0) > now:
        return state.trial_owner == owner, state
    return True, replace(state, state="half_open", trial_owner=owner,
                         trial_until=now + trial_ttl_s)


def noted(state: BreakerState, outcome: Outcome, owner: str | None, now: float, *,
          failures: int, window_s: float, cooldown_s: float) -> BreakerState:
    """The breaker after a resume's ``outcome``. Closed: a failure is counted in the
    window (a new window starts once it ended), and the ``failures``-th opens the
    breaker for ``cooldown_s``. Half-open: the trial's outcome (or any, if ``owner``
    is None) closes it (success) or opens it again (failure); others are ignored. Open:
    nothing changes."""
    if state.state == "half_open":
        if owner is not None and owner != state.trial_owner:
            return state
        if outcome == "success":
            return BreakerState("closed", 0, None, None, None, None)
        return BreakerState("open", 0, None, now + cooldown_s, None, None)
    if state.state == "open" or outcome == "success":
        return state
    in_window = state.window_started_at is not None and state.window_started_at + window_s > now
    count = state.failures + 1 if in_window else 1
    started = state.window_started_at if in_window else now
    if count >= failures:
        return BreakerState("open", 0, None, now + cooldown_s, None, None)
    return BreakerState("closed", count, started, None, None, None)


def _state(row: Any) -> BreakerState:
    if row is None:
        return BreakerState("closed", 0, None, None, None, None)
    return BreakerState(row.state, row.failures, row.window_started_at, row.opened_until,
                        row.trial_owner, row.trial_until)


def _state_params(state: BreakerState) -> dict[str, Any]:
    return {"p_state": state.state, "p_failures": state.failures,
            "p_window_started_at": state.window_started_at,
            "p_opened_until": state.opened_until, "p_trial_owner": state.trial_owner,
            "p_trial_until": state.trial_until}


@dataclass(frozen=True)
class RecoveryLimits:
    """Take-overs counted, tasks blocked, and breakers, of one tenant (see the module
    docstring)."""

    tx: Transactions
    clock: Callable[[], float]
    options: HistoryOptions
    #: Reads a blocked task's addressing from its live row (to tell its caller).
    a2a_context: Callable[[Any], dict[str, Any]]

    def _record(self, conn: Connection, keys: dict[str, Any], *, agent_name: str,
                phase: str, status: str, extension: dict[str, Any], row: Any,
                now: float) -> None:
        """Append a record of ``phase`` to the task's chain, if it has one (with the
        history on): the live row's state (its context's hash and event count, which
        the next restore checks) and no snapshot, the last record's iteration, type
        and retention policy, the tokens unchanged."""
        if not self.options.enabled:
            return
        head_row, last = stored_last(conn, keys)
        if head_row is None or last is None:
            return  # no history, or a broken chain: the restore judges it
        stored = stored_head(head_row)
        if (verify_head(stored, self.options) is not None or last.seq != stored.records
                or last.hash != stored.head_hash
                or verify_record(last, self.options) is not None):
            # Never chain a record onto one that fails verification: the restore would
            # then find a sound last record and not see the bad one. It judges the task
            # (rewinds or blocks it) instead.
            return
        head = head_of(last, head_row)
        meta = (last.document.get("metadata") or {}) if isinstance(last.document, dict) else {}
        doc = {"history": {"iteration": meta.get("iteration", 1),
                           "agent_type": meta.get("agent_type") or "general",
                           "retention_policy": said_policy(last.document),
                           "record": {"extensions": {phase: extension}}},
               "token_usage": head.tokens}
        planned = plan_record(
            tenant_id=keys["p_tenant"], task_id=keys["p_task"], agent_name=agent_name,
            status=status, phase=phase, doc=doc, context_sha256=row.context_sha256,
            session_event_count=row.session_event_count, head=head, now=now,
            options=self.options, compress_threshold=1 << 30, snapshot_context=None)
        write_record(conn, {**keys, "p_agent": agent_name, "p_now": now,
                            **record_params(planned)})

    async def take_over_task(self, task_id: str, owner: str, ttl_s: float, *,
                             agent_name: str, only_free: bool = False) -> Lease | None:
        """Recovery's take of agent ``agent_name``'s resumable task (``resuming`` or
        ``working``) whose lease is free or (unless ``only_free``) expired, for
        ``ttl_s`` seconds; None if another holds it. A take of an expired lease (its
        holder died) counts one more take-over in a row (``Lease.recoveries``; a
        checkpoint of progress clears the count) and, with the history on, appends a
        record of phase ``recovering`` naming the attempt and why, in the same
        transaction. UnknownTaskError, WrongAgentError as :meth:`take_resume_lease`."""
        check_id("task_id", task_id)
        check_id("owner", owner)
        check_id("agent_name", agent_name)
        check_ttl(ttl_s)

        def body(conn: Connection) -> Lease | None:
            now = self.clock()
            keys = self.tx.keys(p_task=task_id)
            before = rq.RECOVERY_STATE.first(conn, keys)
            taken = rq.TAKE_OVER.first(conn, {**keys, "p_owner": owner, "p_now": now,
                                              "p_lease_until": now + ttl_s,
                                              "p_agent": agent_name,
                                              "p_only_free": only_free})
            if taken is None:
                raise_if_unknown_task(conn, self.tx.keys(), task_id, agent_name)
                return None
            counted = before is not None and before.owner is not None
            if counted:
                self._record(conn, keys, agent_name=agent_name, phase="recovering",
                             status="resuming", row=before, now=now, extension={
                                 "attempt": taken.recoveries,
                                 "why": f"its holder {before.owner!r} stopped renewing its "
                                        f"lease, which expired at {before.lease_expires_at}",
                                 "owner": owner})
            return Lease(task_id=task_id, owner=owner, expires_at=now + ttl_s,
                         version=taken.version, recoveries=taken.recoveries,
                         taken_over=counted,
                         previous_owner=before.owner if counted and before else None)

        return await self.tx.write(f"taking over task {task_id!r}", body)

    async def take_task_by_hand(self, task_id: str, owner: str, ttl_s: float) -> Lease | None:
        """An operator's take (``meshpoint tasks resume``) of a ``blocked``, ``resuming``
        or ``working`` task whose lease is free or expired: the task becomes
        ``resuming`` under ``owner``'s lease and its count of take-overs starts again,
        with a ``recovering`` record saying so; None if another holds it. (The operator
        then releases the lease: any instance of its agent resumes a task whose lease is
        free, even with ``auto_resume`` off.) The only way a blocked task goes back to resuming
        without a restart."""
        check_id("task_id", task_id)
        check_id("owner", owner)
        check_ttl(ttl_s)

        def body(conn: Connection) -> Lease | None:
            now = self.clock()
            keys = self.tx.keys(p_task=task_id)
            before = rq.RECOVERY_STATE.first(conn, keys)
            taken = rq.TAKE_BY_HAND.first(conn, {**keys, "p_owner": owner, "p_now": now,
                                                 "p_lease_until": now + ttl_s})
            if taken is None:
                raise_if_unknown_task(conn, self.tx.keys(), task_id)
                return None
            self._record(conn, keys, agent_name=taken.agent_name, phase="recovering",
                         status="resuming", row=before, now=now, extension={
                             "attempt": 0, "why": f"resumed by hand from status "
                                                  f"{before.status!r}", "owner": owner})
            return Lease(task_id=task_id, owner=owner, expires_at=now + ttl_s,
                         version=taken.version)

        return await self.tx.write(f"taking task {task_id!r} by hand", body)

    async def block_task(self, task_id: str, *, lease_owner: str, reason: str) -> Blocked:
        check_id("task_id", task_id)
        check_id("lease_owner", lease_owner)
        if not isinstance(reason, str) or not reason.strip():
            raise InvalidArgumentError("reason must be a non-empty string saying why the "
                                       "task is blocked")

        def body(conn: Connection) -> Blocked:
            now = self.clock()
            keys = self.tx.keys(p_task=task_id)
            row = q.GET_TASK.first(conn, keys)
            if row is None:
                raise_if_unknown_task(conn, self.tx.keys(), task_id)
            if row.owner != lease_owner or not q.BLOCK_TASK.rowcount(
                    conn, {**keys, "p_owner": lease_owner}):
                raise LeaseNotHeldError(task_id, lease_owner, row.status)
            self._record(conn, keys, agent_name=row.agent_name, phase="blocked",
                         status="blocked", row=row, now=now, extension={"reason": reason})
            return Blocked(task_id=task_id, agent_name=row.agent_name, reason=reason,
                           a2a_context=self.a2a_context(row))

        return await self.tx.write(f"blocking task {task_id!r}", body)


@dataclass(frozen=True)
class Breakers:
    """The agents' circuit breakers of one tenant (``store.breakers``; see the module
    docstring): each transition in one transaction on the locked row."""

    tx: Transactions
    clock: Callable[[], float]

    async def admit(self, agent_name: str, owner: str, *,
                    trial_ttl_s: float) -> tuple[bool, BreakerState]:
        """Whether ``owner`` may resume one of the agent's tasks now, by the agent's
        breaker, and its state (:func:`admit`): closed, yes, after one read; open, no
        until its cool-down ended; then exactly one asker gets the half-open trial, for
        ``trial_ttl_s`` (decided in one transaction on the locked row)."""
        check_id("agent_name", agent_name)
        check_id("owner", owner)
        check_ttl(trial_ttl_s)

        seen = await self.state(agent_name)
        if seen.state == "closed":
            return True, seen  # the common case: one read, no write lock

        def body(conn: Connection) -> tuple[bool, BreakerState]:
            now = self.clock()
            keys = self.tx.keys(p_agent=agent_name, p_now=now)
            row = rq.GET_BREAKER.first(conn, keys)
            if row is None or row.state == "closed":
                return True, _state(row)
            allowed, after = admit(_state(row), owner, now, trial_ttl_s)
            if after != _state(row):
                rq.SET_BREAKER.rowcount(conn, {**keys, **_state_params(after)})
            return allowed, after

        return await self.tx.write(f"asking the breaker of agent {agent_name!r}", body)

    async def note(self, agent_name: str, outcome: Outcome, *, owner: str | None,
                   failures: int, window_s: float, cooldown_s: float
                   ) -> tuple[BreakerState, BreakerState]:
        """Note a resume's ``outcome`` on the agent's breaker (:func:`noted`) and
        return its state before and after, in one transaction on the locked row. A
        success changes only a half-open breaker, and costs one read otherwise."""
        check_id("agent_name", agent_name)
        if outcome not in ("success", "failure"):
            raise InvalidArgumentError("outcome must be 'success' or 'failure'")
        if failures < 1 or not window_s > 0 or not cooldown_s > 0:
            raise InvalidArgumentError("failures must be >= 1, window_s and cooldown_s > 0")

        if outcome == "success":
            seen = await self.state(agent_name)
            if seen.state != "half_open":
                return seen, seen  # a success changes only a half-open breaker: no write

        def body(conn: Connection) -> tuple[BreakerState, BreakerState]:
            now = self.clock()
            keys = self.tx.keys(p_agent=agent_name, p_now=now)
            row = rq.GET_BREAKER.first(conn, keys)
            if row is None and outcome == "success":
                return _state(None), _state(None)
            if row is None:
                rq.ENSURE_BREAKER.rowcount(conn, keys)
                row = rq.GET_BREAKER.first(conn, keys)
            before = _state(row)
            after = noted(before, outcome, owner, now, failures=failures, window_s=window_s,
                          cooldown_s=cooldown_s)
            if after != before:
                rq.SET_BREAKER.rowcount(conn, {**keys, **_state_params(after)})
            return before, after

        return await self.tx.write(f"noting a resume of agent {agent_name!r}", body)

    async def state(self, agent_name: str) -> BreakerState:
        """The agent's breaker as stored (closed if it never failed)."""
        check_id("agent_name", agent_name)
        # One statement (on PostgreSQL, without BEGIN and COMMIT): every resume reads it.
        rows = await self.tx.statement(rq.READ_BREAKER, {"p_agent": agent_name},
                                       doing=f"reading the breaker of agent {agent_name!r}")
        return _state(rows[0] if rows else None)
