"""The checkpoint store: one body per operation, for SQLite and PostgreSQL.

Each operation checks its arguments, builds its parameters once, and runs one
transaction of named statements (:mod:`meshpoint.store.queries`) on the store's
:class:`~meshpoint.store.engine.Database`. Where the database's dialect has a fast
path for the operation (:mod:`meshpoint.store.hooks`), the operation offers it the
same parameters first; the portable body runs when it declines, or when the store
was opened with ``fast_paths=False``. Nothing here depends on the dialect.

The contract of every operation, its docstring included, is
:class:`~meshpoint.store.base.Store`'s.
"""

from __future__ import annotations

import hashlib
import logging
import math
import random
import time
import zlib
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, NoReturn, TypeVar

from sqlalchemy import Connection, exc
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception, stop_after_attempt

from meshpoint import _json
from meshpoint._retry import retried
from meshpoint.context import ParallelCalls, TaskExecutionContext
from meshpoint.encryption import is_envelope
from meshpoint.errors import (
    CheckpointConflictError,
    CorruptCheckpointError,
    InvalidArgumentError,
    LeaseNotHeldError,
    TaskEndedError,
    UnknownCallError,
    UnknownInvocationError,
    UnknownSubTaskError,
    UnknownTaskError,
)
from meshpoint.history import (
    END_PHASES,
    HistoryHead,
    HistoryOptions,
    PlannedRecord,
    open_context,
    plan_record,
    seal_context,
)
from meshpoint.store import history_queries as hq
from meshpoint.store import queries as q
from meshpoint.store.base import TIMEOUT_RESULT, Store
from meshpoint.store.engine import Database, is_retryable, translate
from meshpoint.store.history import (
    HistoryStore,
    head_of,
    record_params,
    stored_record,
    write_record,
)
from meshpoint.store.hooks import NO_FAST_PATHS, Portable
from meshpoint.store.records import (
    CheckpointReceipt,
    Lease,
    PausedTaskSummary,
    PeerSubTask,
    Resolution,
    RestoredTask,
    StoreStats,
)
from meshpoint.store.rows import (
    RestoreRows,
    check_id,
    check_limit,
    check_timeout,
    check_ttl,
    plan_join,
    restored,
    sub_task,
)
from meshpoint.store.schema import CHECKPOINT_STATUSES, TASK_STATUSES
from meshpoint.store.verified import VerifiedRestore

__all__ = ["TIMEOUT_RESULT", "SqlStore"]

R = TypeVar("R")
logger = logging.getLogger("meshpoint.store")


class _Collision(Exception):
    """A checkpoint hit a unique key; its transaction is rolled back (internal)."""


#: Keys of the checkpoint dict that are stored in tables of their own.
_SPLIT_KEYS = ("active_peer_sub_tasks", "parallel_tool_calls", "session_events",
               "session_events_persisted")


def _deadlock_backoff(state: RetryCallState) -> float:
    """Up to 2 ms more after each attempt, at random, so the victims do not meet again."""
    return random.uniform(0, 0.002 * state.attempt_number)


def _deadlock_retries() -> AsyncRetrying:
    """A transaction PostgreSQL picks as a deadlock victim is run again, up to 6 times."""
    return AsyncRetrying(retry=retry_if_exception(is_retryable), stop=stop_after_attempt(6),
                         wait=_deadlock_backoff, reraise=True)


class SqlStore(Store):
    """The checkpoint store of one tenant. Open it with :func:`meshpoint.store.open_store`.

    ``fast_paths=False`` runs the portable body of every operation even where the
    database's dialect has a faster one (for tests that prove both agree, and for
    benchmarks that weigh them).
    """

    def __init__(self, db: Database, *, tenant_id: str,
                 clock: Callable[[], float] = time.time,
                 compress_threshold_bytes: int = 16_384, fast_paths: bool = True,
                 owns_db: bool = True, history: HistoryOptions | None = None) -> None:
        check_id("tenant_id", tenant_id, max_len=64)
        self._db = db
        self.tenant_id = tenant_id
        self._clock = clock
        self._compress_threshold = compress_threshold_bytes
        self._fast = db.fast_paths if fast_paths else NO_FAST_PATHS
        self._owns_db = owns_db
        self._history = HistoryOptions() if history is None else history
        #: The checkpoint history of this tenant (seed 001's operations).
        self.history = HistoryStore(
            tenant_id=tenant_id, options=self._history, clock=clock,
            compress_threshold=compress_threshold_bytes,
            read=lambda doing, body: self._read(doing, body, short=False),
            write=lambda doing, body: self._write(doing, body))
        self._verified = VerifiedRestore(
            tenant_id=tenant_id, options=self._history, clock=clock,
            compress_threshold=compress_threshold_bytes,
            read=lambda doing, body: self._read(doing, body, short=False),
            write=lambda doing, body: self._write(doing, body))

    def __repr__(self) -> str:
        return (f"SqlStore({self.dialect}, tenant={self.tenant_id!r}, "
                f"fast_paths={self._fast.name!r})")

    @property
    def dialect(self) -> str:
        """``"sqlite"`` or ``"postgresql"``."""
        return self._db.dialect

    @property
    def fast_paths(self) -> bool:
        """Whether this store takes its dialect's fast paths (see hooks.py)."""
        return self._fast is not NO_FAST_PATHS

    def for_tenant(self, tenant_id: str) -> SqlStore:
        """A view of the same database for another tenant, sharing this store's pool."""
        return SqlStore(self._db, tenant_id=tenant_id, clock=self._clock,
                        compress_threshold_bytes=self._compress_threshold,
                        fast_paths=self.fast_paths, owns_db=False, history=self._history)

    def with_history(self, history: HistoryOptions) -> SqlStore:
        """A view of the same database and tenant keeping the history as ``history``
        says (other keys, say, to verify with), sharing this store's pool."""
        return SqlStore(self._db, tenant_id=self.tenant_id, clock=self._clock,
                        compress_threshold_bytes=self._compress_threshold,
                        fast_paths=self.fast_paths, owns_db=False, history=history)

    async def close(self) -> None:
        """Close the connection pool (a no-op on a :meth:`for_tenant` view)."""
        if self._owns_db:
            await self._db.dispose()

    async def __aenter__(self) -> SqlStore:
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.close()

    async def run(self, body: Callable[[Connection], R], *, write: bool = False) -> R:
        """Run ``body(connection)`` in one transaction of this store's database.

        For operator tooling and tests that need SQL of their own; driver errors
        are translated like the store's. Rows of every tenant are visible to it.
        """
        with translate("running a caller's transaction"):
            return await self._db.run(body, write=write)

    # -- transactions -----------------------------------------------------------------

    async def _write(self, doing: str, body: Callable[[Connection], R], *,
                     one_statement: bool = False, short: bool = True) -> R:
        """Run a write transaction (``short`` and ``one_statement``: see Database.run)."""
        return await self._retried(doing, lambda: self._db.run(
            body, write=True, one_statement=one_statement, short=short,
            tenant=self.tenant_id))

    async def _retried(self, doing: str, attempt: Callable[[], Awaitable[R]]) -> R:
        """Run ``attempt`` (a write), again if PostgreSQL picked it as a deadlock
        victim: nothing was committed then."""
        with translate(doing):
            return await retried(attempt, _deadlock_retries, is_retryable)

    async def _read(self, doing: str, body: Callable[[Connection], R], *,
                    short: bool = True) -> R:
        with translate(doing):
            return await retried(lambda: self._db.run(body, write=False, short=short,
                                                      tenant=self.tenant_id),
                                 _deadlock_retries, is_retryable)

    def _keys(self, **extra: Any) -> dict[str, Any]:
        return {"p_tenant": self.tenant_id, **extra}

    # -- checkpoint ---------------------------------------------------------------------

    async def checkpoint_task(self, ctx: TaskExecutionContext, agent_name: str, *,
                              status: str = "waiting_peers", default_timeout_s: float = 600.0,
                              expires_at: float | None = None,
                              lease_owner: str | None = None, holder: str | None = None,
                              hold_lease_s: float = 30.0) -> CheckpointReceipt:
        check_id("agent_name", agent_name)
        if status not in CHECKPOINT_STATUSES:
            raise InvalidArgumentError(
                f"status must be one of {CHECKPOINT_STATUSES}, got {status!r} (resuming is "
                "set by the store when a join completes)")
        check_timeout("default_timeout_s", default_timeout_s)
        if lease_owner is not None:
            check_id("lease_owner", lease_owner)
        if holder is not None:
            check_id("holder", holder)
            check_ttl(hold_lease_s)
            if status != "working" or lease_owner not in (None, holder):
                raise InvalidArgumentError(
                    "holder= keeps the lease through a mid-turn checkpoint: the status must "
                    f"be 'working' (got {status!r}) and a resumed task's holder its "
                    f"lease_owner (got {holder!r} and {lease_owner!r})")
        elif status == "working":
            raise InvalidArgumentError(
                "a task checkpointed as working is still running: name its lease holder "
                "(holder=)")
        doc = ctx.checkpoint_delta()  # validates and copies before any I/O
        now = self._clock()
        subs, invocations = plan_join(doc, status, default_timeout_s)
        new_events = doc["session_events"]
        first_new = doc["session_events_persisted"]
        event_count = first_new + len(new_events)
        if lease_owner is None and first_new != 0:
            raise InvalidArgumentError(
                f"task {ctx.task_id!r} is checkpointed for the first time but its context "
                f"says {first_new} events are already stored: a resumed task is checkpointed "
                "again with lease_owner=, by the holder of its resume lease")
        context_doc = {k: v for k, v in doc.items() if k not in _SPLIT_KEYS}
        cipher = self._history.encryption
        if cipher is not None:
            seal_context(cipher, context_doc, self.tenant_id, ctx.task_id)
        raw = _json.dump_bytes(context_doc)
        compressed = len(raw) > self._compress_threshold
        blob = zlib.compress(raw, 1) if compressed else raw
        sha256 = hashlib.sha256(raw).hexdigest()

        def replan(head: HistoryHead | None) -> PlannedRecord:
            return plan_record(
                tenant_id=self.tenant_id, task_id=ctx.task_id, agent_name=agent_name,
                status=status, phase=None, doc=doc, context_sha256=sha256,
                session_event_count=event_count, head=head, now=now,
                options=self._history, compress_threshold=self._compress_threshold,
                snapshot_context=context_doc)

        planned = replan(None if lease_owner is None else ctx.history_head) \
            if self._history.enabled else None
        # One set of parameters for every statement of either path; the sub-tasks,
        # invocations and new events also travel as JSON arrays (for fast paths).
        params = self._keys(
            p_task=ctx.task_id, p_agent=agent_name, p_status=status, p_owner=lease_owner,
            p_invocation=doc["current_invocation_id"], p_context=blob,
            p_encoding="zlib" if compressed else "json",
            p_sha256=sha256, p_event_count=event_count, p_now=now,
            p_expires_at=expires_at, p_events=new_events, p_first=first_new,
            p_holder=holder, p_hold_until=None if holder is None else now + hold_lease_s,
            p_has_events=bool(new_events),
            p_subs=[{"sub_task_id": sub_task_id, "invocation_id": corr["invocation_id"],
                     "function_call_id": corr["function_call_id"],
                     "peer_agent_name": corr.get("peer_agent_name"),
                     "peer_task_id": corr.get("peer_task_id"), "correlation_data": corr,
                     "timeout_s": timeout_s, "timeout_deadline": now + timeout_s}
                    for sub_task_id, corr, timeout_s in subs],
            p_invs=[{"invocation_id": inv, "total_expected": calls.total,
                     "completed_count": calls.completed, "call_order": calls.call_order,
                     "results": calls.results} for inv, calls in invocations.items()],
            **record_params(planned))

        async def fast() -> int | Portable:
            try:
                if lease_owner is None:
                    return await self._fast.first_checkpoint(params)
                return await self._fast.recheckpoint(params)
            except exc.IntegrityError as error:
                raise _Collision(str(error.orig)) from None

        def body(conn: Connection) -> int:
            try:
                if lease_owner is None:
                    if not q.INSERT_TASK.rowcount(conn, params):
                        raise TaskEndedError(ctx.task_id)
                    version = 1
                else:
                    version = self._rewrite_task(conn, params)
                _insert_children(conn, params)
                write_record(conn, params)
                return version
            except exc.IntegrityError as error:
                raise _Collision(str(error.orig)) from None

        doing = f"checkpointing task {ctx.task_id!r}"
        try:
            done = await self._retried(doing, fast)
            version = await self._write(doing, body) if isinstance(done, Portable) else done
        except _Collision as collision:
            problem = str(collision)
            # Which key collided? A one-statement first checkpoint reports whichever
            # constraint it hit first, so ask the database (error path only).
            def task_exists(conn: Connection) -> tuple[bool, HistoryHead | None]:
                if q.TASK_STATE.first(conn, params) is not None:
                    return True, None
                head = hq.GET_HEAD.first(conn, params)
                last = None if head is None else hq.GET_RECORD_AT.first(
                    conn, {**params, "p_rec_seq": head.records})
                return False, None if last is None else head_of(stored_record(last), head)

            exists, head = await self._read("checking a collision", task_exists)
            if lease_owner is None and exists:
                raise CheckpointConflictError(
                    f"task {ctx.task_id!r} is already checkpointed; a resumed task is "
                    "checkpointed again by the holder of its resume lease (lease_owner=)"
                ) from None
            if lease_owner is None and planned is not None and head is not None:
                # The id of an ended task whose end was forgotten, started again: its
                # history goes on from where the earlier task's ended.
                planned = replan(head)
                params.update(record_params(planned))
                try:
                    version = await self._write(doing, body)
                except _Collision as again:
                    problem = str(again)
                else:
                    return self._checkpointed(ctx, event_count, planned, version, params,
                                              blob, compressed)
            raise CheckpointConflictError(
                f"checkpoint of task {ctx.task_id!r} collides with stored rows (a sub-task "
                f"id already in use, or conversation events already stored): {problem}"
            ) from None
        return self._checkpointed(ctx, event_count, planned, version, params, blob,
                                  compressed)

    @staticmethod
    def _checkpointed(ctx: TaskExecutionContext, event_count: int,
                      planned: PlannedRecord | None, version: int, params: dict[str, Any],
                      blob: bytes, compressed: bool) -> CheckpointReceipt:
        """What a checkpoint that committed tells its context, and its receipt."""
        ctx.session_events_persisted = event_count
        if planned is not None:
            ctx.history_head = planned.head(planned.document["metrics"]["tokens"]["total"])
        return CheckpointReceipt(
            task_id=ctx.task_id, version=version,
            sub_task_deadlines={sub["sub_task_id"]: sub["timeout_deadline"]
                                for sub in params["p_subs"]},
            events_appended=len(params["p_events"]), context_bytes=len(blob),
            compressed=compressed)

    def _rewrite_task(self, conn: Connection, params: dict[str, Any]) -> int:
        """A re-checkpoint's task row, and the removal of its finished join."""
        row = q.RECHECKPOINT_TASK.first(conn, params)
        if row is None:
            self._explain_refused_recheckpoint(conn, params)
        # Only a task whose join completed is rewritten: an answer arriving while the
        # lease is held would otherwise be erased by the rewrite.
        if q.COUNT_OPEN_SUB_TASKS.scalar(conn, params):
            raise CheckpointConflictError(
                f"task {params['p_task']!r} still waits on peer sub-tasks; it can be "
                "checkpointed again only after its join completed")
        q.DELETE_TASK_SUB_TASKS.rows(conn, params)
        q.DELETE_TASK_INVOCATIONS.rows(conn, params)
        return int(row.version)

    # -- resolving sub-tasks ------------------------------------------------------------------

    async def resolve_peer_sub_task(self, sub_task_id: str, result: Any, *,
                                    resolved_by: str = "answer", lease_owner: str | None = None,
                                    lease_ttl_s: float = 30.0) -> Resolution | None:
        check_id("sub_task_id", sub_task_id)
        value = _json.json_copy(result, "result")
        self._check_lease(lease_owner, lease_ttl_s)
        doing = f"resolving sub-task {sub_task_id!r}"

        def params() -> dict[str, Any]:  # read when the statement runs: its clock too
            now = self._clock()
            return self._keys(
                p_sub=sub_task_id, p_resolved_by=resolved_by, p_result=value, p_now=now,
                p_owner=lease_owner,
                p_lease_until=None if lease_owner is None else now + lease_ttl_s)

        done = await self._retried(doing, lambda: self._fast.resolve_one(params, lease_owner))
        if not isinstance(done, Portable):
            return done

        def body(conn: Connection) -> Resolution | None:
            row = q.RESOLVE_PENDING.first(conn, params())
            if row is None:
                self._raise_if_unknown_sub_task(conn, sub_task_id)
                return None
            return self._advance(conn, [sub_task(row)], lease_owner, lease_ttl_s)[0]

        return await self._write(doing, body)

    async def claim_peer_sub_task(self, sub_task_id: str) -> PeerSubTask | None:
        check_id("sub_task_id", sub_task_id)

        def body(conn: Connection) -> PeerSubTask | None:
            row = q.CLAIM_PENDING.first(conn, self._keys(p_sub=sub_task_id,
                                                         p_now=self._clock()))
            if row is None:
                self._raise_if_unknown_sub_task(conn, sub_task_id)
                return None
            return sub_task(row)

        # Not one_statement: the row is decoded after the UPDATE, and a corrupt one must
        # leave the claim rolled back.
        return await self._write(f"claiming sub-task {sub_task_id!r}", body)

    async def record_parallel_result(self, task_id: str, invocation_id: str,
                                     function_call_id: str, result: Any, *,
                                     lease_owner: str | None = None,
                                     lease_ttl_s: float = 30.0) -> Resolution | None:
        for name, value in (("task_id", task_id), ("invocation_id", invocation_id),
                            ("function_call_id", function_call_id)):
            check_id(name, value)
        copied = _json.json_copy(result, "result")
        self._check_lease(lease_owner, lease_ttl_s)
        keys = self._keys(p_task=task_id, p_invocation=invocation_id, p_call=function_call_id)

        def body(conn: Connection) -> Resolution | None:
            row = q.RECORD_CLAIMED.first(conn, {
                **keys, "p_resolved_by": "answer", "p_result": copied,
                "p_now": self._clock()})
            if row is None:
                status = q.CALL_STATUS.scalar(conn, keys)
                if status is None:
                    self._raise_if_unknown_task(conn, task_id)
                    raise UnknownCallError(task_id, invocation_id, function_call_id)
                if status == "pending":
                    raise CheckpointConflictError(
                        f"call {function_call_id!r} of task {task_id!r} was never claimed: "
                        "claim it with claim_peer_sub_task first")
                return None
            return self._advance(conn, [sub_task(row)], lease_owner, lease_ttl_s)[0]

        return await self._write(f"recording a result for task {task_id!r}", body)

    async def sweep_expired_timeouts(self, agent_name: str, limit: int = 100, *,
                                     lease_owner: str | None = None,
                                     lease_ttl_s: float = 30.0) -> list[Resolution]:
        check_id("agent_name", agent_name)
        check_limit(limit)
        self._check_lease(lease_owner, lease_ttl_s)

        def body(conn: Connection) -> list[Resolution]:
            rows = q.SWEEP_EXPIRED.rows(conn, self._keys(
                p_agent=agent_name, p_now=self._clock(), p_limit=limit,
                p_result=TIMEOUT_RESULT))
            return self._advance(conn, [sub_task(row) for row in rows], lease_owner,
                                 lease_ttl_s, quarantine=True)

        return await self._write(f"sweeping expired sub-tasks of {agent_name!r}", body,
                                 short=False)

    def _advance(self, conn: Connection, resolved: list[PeerSubTask], lease_owner: str | None,
                 lease_ttl_s: float, *, quarantine: bool = False) -> list[Resolution]:
        """Count freshly resolved sub-tasks on their invocations and mark completed joins.

        Invocations are advanced in key order (see the lock order in queries.py). The
        clock is read here, after any wait for locks, so a lease starts when granted.
        A join whose rows are corrupt raises, unless ``quarantine`` (the sweeper): then
        its sub-tasks are parked as ``quarantined`` and the batch goes on.
        """
        groups: dict[tuple[str, str], list[PeerSubTask]] = {}
        for item in resolved:
            groups.setdefault((item.task_id, item.invocation_id), []).append(item)
        out: list[Resolution] = []
        now = self._clock()
        for (task_id, invocation_id), items in sorted(groups.items()):
            keys = self._keys(p_task=task_id, p_invocation=invocation_id)
            counts = q.ADVANCE_INVOCATION.first(conn, {**keys, "p_n": len(items)})
            problem = None
            if counts is None:
                problem = f"has sub-tasks but no row for invocation {invocation_id!r}"
            elif counts[0] > counts[1]:
                problem = (f"would count {counts[0]} of {counts[1]} calls in invocation "
                           f"{invocation_id!r}")
            if problem is not None:
                if not quarantine:
                    raise CorruptCheckpointError(
                        f"task {task_id!r} {problem}; nothing was resolved", task_id=task_id)
                q.ADVANCE_INVOCATION.rows(conn, {**keys, "p_n": -len(items)})  # undo the count
                for item in items:
                    q.QUARANTINE.rows(conn, self._keys(p_sub=item.sub_task_id, p_now=now))
                logger.error("quarantined %d sub-task(s) of task %r: it %s", len(items),
                             task_id, problem)
                continue
            assert counts is not None
            completed, total = counts
            granted = None
            if completed == total:
                holder = q.MARK_RESUMING.scalar(conn, self._keys(
                    p_task=task_id, p_owner=lease_owner, p_now=now,
                    p_lease_until=None if lease_owner is None else now + lease_ttl_s))
                granted = lease_owner if lease_owner is not None and holder == lease_owner \
                    else None
            first = completed - len(items) + 1
            for offset, item in enumerate(items):
                done = first + offset
                out.append(Resolution(sub_task=item, completed=done, total=total,
                                      lease_owner=granted if done == total else None))
        return out

    async def reset_timeout_deadline(self, sub_task_id: str, *, timeout_s: float | None = None,
                                     peer_task_id: str | None = None) -> float | None:
        check_id("sub_task_id", sub_task_id)
        if timeout_s is not None:
            check_timeout("timeout_s", timeout_s)
        if peer_task_id is not None:
            check_id("peer_task_id", peer_task_id)

        def body(conn: Connection) -> float | None:
            deadline = q.RESET_DEADLINE.scalar(conn, self._keys(
                p_sub=sub_task_id, p_now=self._clock(), p_timeout=timeout_s,
                p_peer_task=peer_task_id))
            if deadline is None:
                self._raise_if_unknown_sub_task(conn, sub_task_id)
            return None if deadline is None else float(deadline)

        return await self._write(f"resetting the deadline of {sub_task_id!r}", body,
                                 one_statement=True)

    # -- leases -------------------------------------------------------------------------------

    async def take_resume_lease(self, task_id: str, owner: str, ttl_s: float, *,
                                statuses: Sequence[str] = ("resuming",)) -> Lease | None:
        check_id("task_id", task_id)
        check_id("owner", owner)
        check_ttl(ttl_s)
        if not statuses or any(s not in TASK_STATUSES for s in statuses):
            raise InvalidArgumentError(f"statuses must be non-empty, from {TASK_STATUSES}")
        wanted = list(dict.fromkeys(statuses))
        slots = dict(zip(q.STATUS_SLOTS, wanted + [None] * len(q.STATUS_SLOTS), strict=False))

        def body(conn: Connection) -> Lease | None:
            now = self._clock()
            version = q.TAKE_LEASE.scalar(conn, self._keys(
                p_task=task_id, p_owner=owner, p_now=now, p_lease_until=now + ttl_s,
                **slots))
            if version is None:
                self._raise_if_unknown_task(conn, task_id)
                return None
            return Lease(task_id=task_id, owner=owner, expires_at=now + ttl_s, version=version)

        return await self._write(f"taking the lease of task {task_id!r}", body,
                                 one_statement=True)

    async def renew_resume_lease(self, task_id: str, owner: str, ttl_s: float) -> Lease | None:
        check_id("task_id", task_id)
        check_id("owner", owner)
        check_ttl(ttl_s)

        def body(conn: Connection) -> Lease | None:
            now = self._clock()
            version = q.RENEW_LEASE.scalar(conn, self._keys(
                p_task=task_id, p_owner=owner, p_lease_until=now + ttl_s))
            if version is None:
                self._raise_if_unknown_task(conn, task_id)
                return None
            return Lease(task_id=task_id, owner=owner, expires_at=now + ttl_s, version=version)

        return await self._write(f"renewing the lease of task {task_id!r}", body,
                                 one_statement=True)

    async def release_resume_lease(self, task_id: str, owner: str) -> bool:
        check_id("task_id", task_id)
        check_id("owner", owner)

        def body(conn: Connection) -> bool:
            version = q.RELEASE_LEASE.scalar(conn, self._keys(p_task=task_id, p_owner=owner))
            if version is None:
                self._raise_if_unknown_task(conn, task_id)
                return False
            return True

        return await self._write(f"releasing the lease of task {task_id!r}", body,
                                 one_statement=True)

    # -- reads --------------------------------------------------------------------------------

    async def restore_task(self, task_id: str, *, lease_owner: str | None = None,
                           verify: bool = True) -> RestoredTask:
        check_id("task_id", task_id)
        history = self._history.enabled
        keys = self._keys(p_task=task_id, p_history=history)
        doing = f"restoring task {task_id!r}"

        def body(conn: Connection) -> RestoreRows:
            head = hq.GET_HEAD.first(conn, keys) if history else None
            return RestoreRows(
                q.GET_TASK.first(conn, keys), q.GET_EVENTS.rows(conn, keys),
                q.GET_INVOCATIONS.rows(conn, keys), q.GET_TASK_SUB_TASKS.rows(conn, keys),
                head, None if head is None else hq.GET_RECORD_AT.first(
                    conn, {**keys, "p_rec_seq": head.records}))

        with translate(doing):
            rows = await self._fast.restore(keys)
        if isinstance(rows, Portable):
            rows = await self._read(doing, body)
        result = restored(task_id, rows, lease_owner) if not (history and verify) \
            else await self._verified.restore(task_id, rows, lease_owner)
        ctx = result.context
        if is_envelope(ctx.security_context) or is_envelope(ctx.history):
            sealed: dict[str, Any] = {"security_context": ctx.security_context,
                                      "history": ctx.history}
            open_context(self._history, sealed, self.tenant_id, task_id)
            ctx.security_context, ctx.history = sealed["security_context"], sealed["history"]
        return result

    async def get_peer_sub_task(self, sub_task_id: str) -> PeerSubTask:
        check_id("sub_task_id", sub_task_id)

        def body(conn: Connection) -> PeerSubTask:
            row = q.GET_SUB_TASK.first(conn, self._keys(p_sub=sub_task_id))
            if row is None:
                raise UnknownSubTaskError(sub_task_id)
            return sub_task(row)

        return await self._read(f"reading sub-task {sub_task_id!r}", body)

    async def get_peer_sub_tasks_for_task(self, task_id: str) -> list[PeerSubTask]:
        check_id("task_id", task_id)
        keys = self._keys(p_task=task_id)

        def body(conn: Connection) -> list[PeerSubTask]:
            self._raise_if_unknown_task(conn, task_id)
            return [sub_task(row) for row in q.GET_TASK_SUB_TASKS.rows(conn, keys)]

        return await self._read(f"listing the sub-tasks of task {task_id!r}", body)

    async def get_parallel_results(self, task_id: str,
                                   invocation_id: str) -> list[tuple[str, Any]]:
        check_id("task_id", task_id)
        check_id("invocation_id", invocation_id)
        keys = self._keys(p_task=task_id, p_invocation=invocation_id)

        def body(conn: Connection) -> list[tuple[str, Any]]:
            invocation = q.GET_INVOCATION.first(conn, keys)
            if invocation is None:
                self._raise_if_unknown_task(conn, task_id)
                raise UnknownInvocationError(task_id, invocation_id)
            calls = ParallelCalls(list(invocation.call_order), dict(invocation.results))
            for call, value in q.GET_INVOCATION_RESULTS.rows(conn, keys):
                calls.results[call] = value
            return calls.ordered_results()

        return await self._read(f"reading the results of task {task_id!r}", body)

    # -- cleanup and operators ----------------------------------------------------------------

    async def cleanup_task(self, task_id: str, *, lease_owner: str | None = None,
                           outcome: str = "completed",
                           ctx: TaskExecutionContext | None = None) -> None:
        check_id("task_id", task_id)
        if outcome not in END_PHASES:
            raise InvalidArgumentError(f"outcome must be one of {END_PHASES}, got {outcome!r}")
        if ctx is not None and ctx.task_id != task_id:
            raise InvalidArgumentError(f"ctx is task {ctx.task_id!r}, not {task_id!r}")
        keys = self._keys(p_task=task_id, p_owner=lease_owner)
        final = None if ctx is None or not self._history.enabled else ctx.checkpoint_delta()

        def finalize(conn: Connection, agent_name: str) -> None:
            """Append the task's last record, chained to its head: the one ``ctx`` knows,
            or else the stored one, read in this transaction."""
            if not self._history.enabled:
                return
            head = None if ctx is None else ctx.history_head
            doc: dict[str, Any] = dict(final) if final is not None else {}
            if head is None:
                head_row = hq.GET_HEAD.first(conn, keys)
                if head_row is None:
                    return  # the task was checkpointed without a history
                last = hq.GET_RECORD_AT.first(conn, {**keys, "p_rec_seq": head_row.records})
                head = None if last is None else head_of(stored_record(last), head_row)
                if head is None:
                    return  # its chain is broken; verify reports it, the end goes on
                if final is None:  # the task's retention stays with its last record
                    doc = {"history": {"retention_policy": head_row.retention_policy}}
            now = self._clock()
            planned = plan_record(
                tenant_id=self.tenant_id, task_id=task_id, agent_name=agent_name,
                status=outcome, phase=outcome, doc=doc, context_sha256=None,
                session_event_count=0 if final is None else
                final["session_events_persisted"] + len(final["session_events"]),
                head=head, now=now, options=self._history,
                compress_threshold=self._compress_threshold, snapshot_context=None)
            write_record(conn, {**keys, "p_agent": agent_name, "p_now": now,
                                **record_params(planned, outcome=outcome)})

        def body(conn: Connection) -> None:
            # Children first, matching the lock order of resolvers (see queries.py).
            # These deletes are what keeps a task from leaving orphans (no foreign keys).
            for statement in (q.DELETE_TASK_SUB_TASKS, q.DELETE_TASK_INVOCATIONS,
                              q.DELETE_TASK_EVENTS):
                statement.rows(conn, keys)
            delete = q.DELETE_TASK if lease_owner is None else q.DELETE_TASK_OF_OWNER
            deleted = delete.first(conn, keys)
            if deleted is None:
                self._raise_if_unknown_task(conn, task_id)
                raise LeaseNotHeldError(task_id, lease_owner)
            q.RECORD_ENDED.rows(conn, {**keys, "p_agent": deleted.agent_name,
                                       "p_now": self._clock()})
            finalize(conn, deleted.agent_name)

        await self._write(f"cleaning up task {task_id!r}", body)

    async def forget_ended_tasks(self, agent_name: str, *, older_than_s: float) -> int:
        check_id("agent_name", agent_name)
        check_timeout("older_than_s", older_than_s)

        def body(conn: Connection) -> int:
            before = self._clock() - older_than_s
            return len(q.FORGET_ENDED.rows(conn, self._keys(p_agent=agent_name,
                                                            p_before=before)))

        return await self._write(f"forgetting ended tasks of {agent_name!r}", body,
                                 one_statement=True, short=False)

    async def list_paused_tasks(self, *, agent_name: str | None = None,
                                status: str | None = None,
                                limit: int = 100) -> list[PausedTaskSummary]:
        check_limit(limit)
        params = self._keys(p_agent=agent_name, p_any_agent=agent_name is None,
                            p_status=status, p_any_status=status is None, p_limit=limit)

        def body(conn: Connection) -> list[PausedTaskSummary]:
            return [PausedTaskSummary(
                task_id=r[0], agent_name=r[1], status=r[2], owner=r[3], lease_expires_at=r[4],
                version=r[5], checkpointed_at=r[6], pending_sub_tasks=r[7] or 0,
                next_deadline=r[8]) for r in q.LIST_PAUSED_TASKS.rows(conn, params)]

        return await self._read("listing paused tasks", body, short=False)

    async def resumable_tasks(self, agent_name: str, *, limit: int = 100) -> list[str]:
        check_id("agent_name", agent_name)
        check_limit(limit)
        params = self._keys(p_agent=agent_name, p_now=self._clock(), p_limit=limit)

        def body(conn: Connection) -> list[str]:
            return [row[0] for row in q.RESUMABLE_TASKS.rows(conn, params)]

        return await self._read(f"listing resumable tasks of {agent_name!r}", body, short=False)

    async def expired_tasks(self, agent_name: str, *, older_than_s: float,
                            limit: int = 100) -> list[str]:
        check_id("agent_name", agent_name)
        check_limit(limit)
        if type(older_than_s) not in (int, float) or not 0 < older_than_s < math.inf:
            raise InvalidArgumentError(
                f"older_than_s must be a finite number > 0, got {older_than_s!r}")
        now = self._clock()
        params = self._keys(p_agent=agent_name, p_now=now, p_before=now - older_than_s,
                            p_limit=limit)

        def body(conn: Connection) -> list[str]:
            return [row[0] for row in q.EXPIRED_TASKS.rows(conn, params)]

        return await self._read(f"listing expired tasks of {agent_name!r}", body, short=False)

    async def next_deadlines(self, *, agent_name: str | None = None,
                             limit: int = 10) -> list[PeerSubTask]:
        check_limit(limit)
        statement = q.NEXT_DEADLINES if agent_name is None else q.NEXT_DEADLINES_OF_AGENT
        params = self._keys(p_agent=agent_name, p_limit=limit)

        def body(conn: Connection) -> list[PeerSubTask]:
            return [sub_task(row) for row in statement.rows(conn, params)]

        return await self._read("listing deadlines", body, short=False)

    async def live_row_counts(self) -> dict[str, int]:
        def body(conn: Connection) -> dict[str, int]:
            row = q.LIVE_ROW_COUNTS.first(conn, {})
            return {name: int(count) for name, count in row._asdict().items()}

        return await self._read("counting live rows", body, short=False)

    async def stats(self, *, expire_after_s: float = 0.0) -> StoreStats:
        check_timeout("expire_after_s", expire_after_s)
        now = self._clock()
        keys = self._keys(p_now=now, p_expiring=expire_after_s > 0,
                          p_before=now - expire_after_s)

        def body(conn: Connection) -> StoreStats:
            by_status = {(a, s): n for a, s, n in q.COUNT_BY_AGENT_STATUS.rows(conn, keys)}
            pending, next_deadline = q.PENDING_SUMMARY.first(conn, keys)
            total, expired, waiting, working, oldest, mean = q.TASK_COUNTS.first(conn, keys)
            return StoreStats(
                paused_tasks=by_status, pending_sub_tasks=pending,
                expired_sub_tasks=q.EXPIRED_COUNT.scalar(conn, keys),
                oldest_checkpointed_at=oldest, next_deadline=next_deadline,
                total=total, expired=expired, input_required=waiting, working=working,
                oldest_age_s=None if oldest is None else max(0.0, now - oldest),
                mean_age_s=None if mean is None else max(0.0, now - float(mean)))

        return await self._read("computing store stats", body, short=False)

    # -- helpers -------------------------------------------------------------------------------

    @staticmethod
    def _check_lease(owner: str | None, ttl_s: float) -> None:
        if owner is not None:
            check_id("lease_owner", owner)
            check_ttl(ttl_s)

    def _raise_if_unknown_sub_task(self, conn: Connection, sub_task_id: str) -> None:
        if q.SUB_TASK_STATUS.first(conn, self._keys(p_sub=sub_task_id)) is None:
            raise UnknownSubTaskError(sub_task_id)

    def _raise_if_unknown_task(self, conn: Connection, task_id: str) -> None:
        if q.TASK_STATE.first(conn, self._keys(p_task=task_id)) is None:
            raise UnknownTaskError(task_id)

    def _explain_refused_recheckpoint(self, conn: Connection, params: dict[str, Any]
                                      ) -> NoReturn:
        task_id, owner = params["p_task"], params["p_owner"]
        state = q.TASK_STATE.first(conn, params)
        if state is None:
            raise UnknownTaskError(task_id)
        if state.owner != owner:
            raise LeaseNotHeldError(task_id, owner)
        raise CheckpointConflictError(
            f"task {task_id!r} has {state.session_event_count} stored conversation events "
            f"but the context says {params['p_first']}: checkpoint the context restored "
            "from the store, whose conversation only grows")


def _insert_children(conn: Connection, params: dict[str, Any]) -> None:
    """Insert a checkpoint's sub-tasks, invocations and new events (portable body)."""
    if params["p_subs"]:
        q.INSERT_SUB_TASK.execute_many(conn, [{**params, **sub} for sub in params["p_subs"]])
    if params["p_invs"]:
        q.INSERT_INVOCATION.execute_many(conn, [{**params, **inv} for inv in params["p_invs"]])
    if params["p_has_events"]:
        q.APPEND_EVENTS.rows(conn, params)
