"""The checkpoint store: one SQLAlchemy Core implementation for SQLite and PostgreSQL.

Every public operation is one transaction. Writes on SQLite begin with
``BEGIN IMMEDIATE`` (see :mod:`meshpoint.store.engine`); on PostgreSQL a
transaction that loses a deadlock or serialization check is retried whole.
Nothing is committed when an operation raises.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import logging
import random
import time
import zlib
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, NoReturn, TypeVar

from sqlalchemy import Connection, exc, func, select, text
from sqlalchemy.engine import Dialect
from sqlalchemy.pool import PoolProxiedConnection

from meshpoint import _json
from meshpoint.context import ParallelCalls, TaskExecutionContext
from meshpoint.errors import (
    CheckpointConflictError,
    CorruptCheckpointError,
    InvalidArgumentError,
    LeaseNotHeldError,
    UnknownSubTaskError,
    UnknownTaskError,
)
from meshpoint.store import queries as q
from meshpoint.store.engine import AsyncDatabase, Database, is_retryable, translate
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
    check_id,
    check_timeout,
    check_ttl,
    plan_join,
    rebuild,
    sub_task,
)
from meshpoint.store.schema import (
    CHECKPOINT_STATUSES,
    RESUMING_PREDICATE,
    TASK_STATUSES,
    paused_tasks,
    peer_sub_tasks,
)

R = TypeVar("R")
logger = logging.getLogger("meshpoint.store")


class _Collision(Exception):
    """A checkpoint hit a unique key; its transaction is rolled back (internal)."""


class _NeedsTransaction:
    """The one-statement resolution left a pending sub-task alone: the transactional
    path must tell why (internal)."""


_NEEDS_TRANSACTION = _NeedsTransaction()

#: The result a sub-task resolved by its deadline carries.
TIMEOUT_RESULT: dict[str, Any] = {"status": "timeout",
                                  "error": "the peer did not answer before the deadline"}
#: Keys of the checkpoint dict that are stored in tables of their own.
_SPLIT_KEYS = ("active_peer_sub_tasks", "parallel_tool_calls", "session_events",
               "session_events_persisted")
_RETRIES = 6


class SqlStore:
    """The checkpoint store of one tenant. Create it with :func:`meshpoint.store.open_store`.

    Ids (task, sub-task, invocation) are caller-chosen strings of 1-255 characters,
    unique per tenant. A store never sees another tenant's rows: an id of another
    tenant is reported exactly like an unknown one.
    """

    def __init__(self, db: Database, *, tenant_id: str,
                 clock: Callable[[], float] = time.time,
                 compress_threshold_bytes: int = 16_384, owns_db: bool = True) -> None:
        check_id("tenant_id", tenant_id, max_len=64)
        self._db = db
        self.tenant_id = tenant_id
        self._clock = clock
        self._compress_threshold = compress_threshold_bytes
        self._owns_db = owns_db

    @property
    def dialect(self) -> str:
        """``"sqlite"`` or ``"postgresql"``."""
        return self._db.dialect

    @property
    def _pg_dialect(self) -> Dialect:
        db = self._db
        assert isinstance(db, AsyncDatabase), "native statements are PostgreSQL's"
        return db.engine.dialect

    def for_tenant(self, tenant_id: str) -> SqlStore:
        """A view of the same database for another tenant, sharing this store's pool."""
        return SqlStore(self._db, tenant_id=tenant_id, clock=self._clock,
                        compress_threshold_bytes=self._compress_threshold, owns_db=False)

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
        """Run a write transaction, retried whole if PostgreSQL picks it as a deadlock
        victim. ``short`` (few rows by key) and ``one_statement``: see Database.run."""
        return await self._retried(doing, lambda: self._db.run(
            body, write=True, one_statement=one_statement, short=short))

    async def _write_native(self, doing: str,
                            body: Callable[[PoolProxiedConnection], Awaitable[R]]) -> R:
        """Run ``body``, a one-statement write, on a PostgreSQL connection it awaits
        directly (see AsyncDatabase.native), retried like :meth:`_write`."""
        return await self._retried(doing, lambda: self._on_native(body))

    async def _read_native(self, doing: str,
                           body: Callable[[PoolProxiedConnection], Awaitable[R]]) -> R:
        """Run ``body``, one read statement, as :meth:`_write_native` does (no retry)."""
        with translate(doing):
            return await self._on_native(body)

    async def _on_native(self, body: Callable[[PoolProxiedConnection], Awaitable[R]]) -> R:
        db = self._db
        assert isinstance(db, AsyncDatabase), "native statements are PostgreSQL's"
        async with db.native() as conn:
            return await body(conn)

    async def _retried(self, doing: str, attempt: Callable[[], Awaitable[R]]) -> R:
        for number in range(_RETRIES):
            with translate(doing):
                try:
                    return await attempt()
                except exc.DBAPIError as error:
                    if not is_retryable(error) or number == _RETRIES - 1:
                        raise
            # A PostgreSQL deadlock victim: nothing was committed, run it again.
            await asyncio.sleep(random.uniform(0, 0.002 * (number + 1)))
        raise AssertionError("unreachable")

    async def _read(self, doing: str, body: Callable[[Connection], R], *,
                    short: bool = True) -> R:
        with translate(doing):
            return await self._db.run(body, write=False, short=short)

    def _keys(self, **extra: Any) -> dict[str, Any]:
        return {"p_tenant": self.tenant_id, **extra}

    # -- checkpoint ---------------------------------------------------------------------

    async def checkpoint_task(self, ctx: TaskExecutionContext, agent_name: str, *,
                              status: str = "waiting_peers", default_timeout_s: float = 600.0,
                              expires_at: float | None = None,
                              lease_owner: str | None = None) -> CheckpointReceipt:
        """Persist a paused task in one transaction: the task row, its pending peer
        sub-tasks (each with a ``timeout_deadline``), its parallel invocations, and
        the conversation events appended since the previous checkpoint.

        A first checkpoint inserts the task; a task that is already stored can be
        checkpointed again only by the holder of its resume lease (``lease_owner``),
        which this write releases. Each sub-task times out after its correlation
        data's ``timeout_s``, or ``default_timeout_s``. On success
        ``ctx.session_events_persisted`` is advanced; on any error nothing is written.
        """
        check_id("agent_name", agent_name)
        if status not in CHECKPOINT_STATUSES:
            raise InvalidArgumentError(
                f"status must be one of {CHECKPOINT_STATUSES}, got {status!r} (resuming is "
                "set by the store when a join completes)")
        check_timeout("default_timeout_s", default_timeout_s)
        if lease_owner is not None:
            check_id("lease_owner", lease_owner)
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
        raw = _json.dump_bytes(context_doc)
        compressed = len(raw) > self._compress_threshold
        blob = zlib.compress(raw, 1) if compressed else raw
        # One set of parameters for every statement of either path; the sub-tasks,
        # invocations and new events travel as JSON arrays.
        params = self._keys(
            p_task=ctx.task_id, p_agent=agent_name, p_status=status, p_owner=lease_owner,
            p_invocation=doc["current_invocation_id"], p_context=blob,
            p_encoding="zlib" if compressed else "json",
            p_sha256=hashlib.sha256(raw).hexdigest(), p_event_count=event_count, p_now=now,
            p_expires_at=expires_at, p_events=new_events, p_first=first_new,
            p_has_events=bool(new_events),
            p_subs=[{"sub_task_id": sub_task_id, "invocation_id": corr["invocation_id"],
                     "function_call_id": corr["function_call_id"],
                     "peer_agent_name": corr.get("peer_agent_name"),
                     "peer_task_id": corr.get("peer_task_id"), "correlation_data": corr,
                     "timeout_s": timeout_s, "timeout_deadline": now + timeout_s}
                    for sub_task_id, corr, timeout_s in subs],
            p_invs=[{"invocation_id": inv, "total_expected": calls.total,
                     "completed_count": calls.completed, "call_order": calls.call_order,
                     "results": calls.results} for inv, calls in invocations.items()])

        async def first_on_postgresql(conn: PoolProxiedConnection) -> int:
            try:
                await q.Hot.pg_first_checkpoint.fetch(conn, self._pg_dialect, params)
            except exc.IntegrityError as error:
                raise _Collision(str(error.orig)) from None
            return 1

        def body(conn: Connection) -> int:
            try:
                if lease_owner is None:
                    q.Hot.insert_task.rows(conn, params)
                    version = 1
                else:
                    row = conn.execute(q.RECHECKPOINT_TASK, params).first()
                    if row is None:
                        self._explain_refused_recheckpoint(conn, params)
                    version = row[0]
                    # Only a task whose join completed is rewritten: an answer arriving
                    # while the lease is held would otherwise be erased by the rewrite.
                    if conn.execute(q.COUNT_OPEN_SUB_TASKS, params).scalar():
                        raise CheckpointConflictError(
                            f"task {ctx.task_id!r} still waits on peer sub-tasks; it can be "
                            "checkpointed again only after its join completed")
                    conn.execute(q.DELETE_TASK_SUB_TASKS, params)
                    conn.execute(q.DELETE_TASK_INVOCATIONS, params)
                self._insert_children(conn, params)
                return version
            except exc.IntegrityError as error:
                raise _Collision(str(error.orig)) from None

        doing = f"checkpointing task {ctx.task_id!r}"
        try:
            if lease_owner is None and self.dialect == "postgresql":
                version = await self._write_native(doing, first_on_postgresql)  # 1 round trip
            else:
                version = await self._write(doing, body)
        except _Collision as collision:
            # Which key collided? PostgreSQL's one-statement first checkpoint reports
            # whichever constraint it hit first, so ask the database (error path only).
            def task_exists(conn: Connection) -> bool:
                return conn.execute(q.TASK_STATE, params).first() is not None

            if lease_owner is None and await self._read("checking a collision", task_exists):
                raise CheckpointConflictError(
                    f"task {ctx.task_id!r} is already checkpointed; a resumed task is "
                    "checkpointed again by the holder of its resume lease (lease_owner=)"
                ) from None
            raise CheckpointConflictError(
                f"checkpoint of task {ctx.task_id!r} collides with stored rows (a sub-task "
                f"id already in use, or conversation events already stored): {collision}"
            ) from None
        ctx.session_events_persisted = event_count
        return CheckpointReceipt(
            task_id=ctx.task_id, version=version,
            sub_task_deadlines={sub["sub_task_id"]: sub["timeout_deadline"]
                                for sub in params["p_subs"]},
            events_appended=len(params["p_events"]), context_bytes=len(blob),
            compressed=compressed)

    def _insert_children(self, conn: Connection, params: dict[str, Any]) -> None:
        """Insert a checkpoint's sub-tasks, invocations and new events."""
        if self.dialect == "postgresql":
            conn.execute(q.PG_INSERT_CHILDREN, params)
            return
        if params["p_subs"]:
            q.Hot.insert_sub_task.execute_many(conn, [{**params, **sub}
                                                      for sub in params["p_subs"]])
        if params["p_invs"]:
            q.Hot.insert_invocation.execute_many(conn, [{**params, **inv}
                                                        for inv in params["p_invs"]])
        if params["p_has_events"]:
            q.Hot.append_events.rows(conn, params)

    # -- resolving sub-tasks ------------------------------------------------------------------

    async def resolve_peer_sub_task(self, sub_task_id: str, result: Any, *,
                                    resolved_by: str = "answer", lease_owner: str | None = None,
                                    lease_ttl_s: float = 30.0) -> Resolution | None:
        """Claim a sub-task **and** record its result in one transaction.

        Returns the :class:`Resolution` for the first call, ``None`` for every later
        one (a duplicate answer, or an answer that lost to its timeout). If this
        resolution completes the join the task becomes ``resuming``; with
        ``lease_owner`` the same transaction gives that owner the resume lease for
        ``lease_ttl_s``. Raises :class:`UnknownSubTaskError` for an unknown id.
        """
        check_id("sub_task_id", sub_task_id)
        value = _json.json_copy(result, "result")
        self._check_lease(lease_owner, lease_ttl_s)

        doing = f"resolving sub-task {sub_task_id!r}"
        if self.dialect == "postgresql":
            done = await self._write_native(doing, functools.partial(
                self._pg_resolve_one, sub_task_id, value, resolved_by, lease_owner,
                lease_ttl_s))
            if not isinstance(done, _NeedsTransaction):
                return done
            # Still pending: a join whose rows are inconsistent, which the
            # transactional path below explains.

        def body(conn: Connection) -> Resolution | None:
            row = (conn.execute(q.RESOLVE_PENDING, self._keys(
                p_sub=sub_task_id, p_resolved_by=resolved_by, p_result=value,
                p_now=self._clock()))).first()
            if row is None:
                self._raise_if_unknown_sub_task(conn, sub_task_id)
                return None
            return self._advance(conn, [sub_task(row)], lease_owner, lease_ttl_s)[0]

        return await self._write(doing, body)

    async def _pg_resolve_one(self, sub_task_id: str, value: Any, resolved_by: str,
                              lease_owner: str | None, lease_ttl_s: float,
                              conn: PoolProxiedConnection
                              ) -> Resolution | _NeedsTransaction | None:
        now = self._clock()
        try:
            rows = await q.Hot.pg_resolve_one.fetch(conn, self._pg_dialect, self._keys(
                p_sub=sub_task_id, p_resolved_by=resolved_by, p_result=value, p_now=now,
                p_owner=lease_owner,
                p_lease_until=None if lease_owner is None else now + lease_ttl_s))
        except exc.DBAPIError as error:
            if getattr(error.orig, "sqlstate", None) == "22012":  # resolved, not counted
                return _NEEDS_TRANSACTION  # rolled back
            raise
        if not rows:
            # A late or duplicate answer is told here, without a second transaction.
            status = await q.Hot.sub_task_status.fetch(conn, self._pg_dialect,
                                                       self._keys(p_sub=sub_task_id))
            if not status:
                raise UnknownSubTaskError(sub_task_id)
            return _NEEDS_TRANSACTION if status[0].status == "pending" else None
        row = rows[0]
        # holder is set only when this resolution completed the join.
        granted = lease_owner if lease_owner is not None and row.holder == lease_owner \
            else None
        return Resolution(sub_task=sub_task(row), completed=row.completed, total=row.total,
                          lease_owner=granted)

    async def claim_peer_sub_task(self, sub_task_id: str) -> PeerSubTask | None:
        """Exactly-once claim without a result (seed 000's first step).

        The first caller gets the sub-task, later callers ``None``. The claimed call
        counts towards its join only once :meth:`record_parallel_result` records its
        result; prefer :meth:`resolve_peer_sub_task`, which does both atomically.
        """
        check_id("sub_task_id", sub_task_id)

        def body(conn: Connection) -> PeerSubTask | None:
            row = (conn.execute(q.CLAIM_PENDING, self._keys(
                p_sub=sub_task_id, p_now=self._clock()))).first()
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
        """Record the result of a call claimed with :meth:`claim_peer_sub_task`.

        Increments the invocation's completion counter atomically and returns the
        :class:`Resolution` (``completed``/``total``). Returns ``None`` if the call was
        resolved meanwhile: its deadline passed before the result was recorded (a claim
        does not stop the clock), or the result was already recorded. Raises
        :class:`CheckpointConflictError` for a call that was never claimed.
        """
        for name, value in (("task_id", task_id), ("invocation_id", invocation_id),
                            ("function_call_id", function_call_id)):
            check_id(name, value)
        copied = _json.json_copy(result, "result")
        self._check_lease(lease_owner, lease_ttl_s)
        keys = self._keys(p_task=task_id, p_invocation=invocation_id, p_call=function_call_id)

        def body(conn: Connection) -> Resolution | None:
            row = (conn.execute(q.RECORD_CLAIMED, {
                **keys, "p_resolved_by": "answer", "p_result": copied,
                "p_now": self._clock()})).first()
            if row is None:
                status = (conn.execute(q.CALL_STATUS, keys)).scalar()
                if status is None:
                    self._raise_if_unknown_task(conn, task_id)
                    raise InvalidArgumentError(
                        f"task {task_id!r} has no peer call {function_call_id!r} in "
                        f"invocation {invocation_id!r}")
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
        """Resolve up to ``limit`` of ``agent_name``'s sub-tasks whose deadline passed.

        Each is claimed and given :data:`TIMEOUT_RESULT` in one transaction, so a
        racing answer or a second sweeper can never resolve it again. Returns one
        :class:`Resolution` per sub-task; a completed join makes its task
        ``resuming`` (leased to ``lease_owner`` if given).
        """
        check_id("agent_name", agent_name)
        if type(limit) is not int or limit < 1:
            raise InvalidArgumentError(f"limit must be a positive int, got {limit!r}")
        self._check_lease(lease_owner, lease_ttl_s)

        def body(conn: Connection) -> list[Resolution]:
            sweep = q.PG_SWEEP_EXPIRED if self.dialect == "postgresql" else q.SWEEP_EXPIRED
            rows = (conn.execute(sweep, self._keys(
                p_agent=agent_name, p_now=self._clock(), p_limit=limit,
                p_result=TIMEOUT_RESULT))).all()
            return self._advance(conn, [sub_task(row) for row in rows], lease_owner,
                                 lease_ttl_s, quarantine=True)

        return await self._write(f"sweeping expired sub-tasks of {agent_name!r}", body, short=False)

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
            counts = (conn.execute(q.ADVANCE_INVOCATION, self._keys(
                p_task=task_id, p_invocation=invocation_id, p_n=len(items)))).first()
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
                conn.execute(q.ADVANCE_INVOCATION, self._keys(  # undo this group's count
                    p_task=task_id, p_invocation=invocation_id, p_n=-len(items)))
                conn.execute(q.QUARANTINE, self._keys(
                    p_subs=[item.sub_task_id for item in items], p_now=now))
                logger.error("quarantined %d sub-task(s) of task %r: it %s", len(items),
                             task_id, problem)
                continue
            assert counts is not None
            completed, total = counts
            granted = None
            if completed == total:
                holder = conn.execute(q.MARK_RESUMING, self._keys(
                    p_task=task_id, p_owner=lease_owner, p_now=now,
                    p_lease_until=None if lease_owner is None else now + lease_ttl_s)).scalar()
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
        """Push a pending sub-task's deadline to now + its timeout (a status update
        from the peer), without claiming it. ``timeout_s`` replaces the timeout;
        ``peer_task_id`` records the peer's own task id for a later cancel.
        Returns the new deadline, or ``None`` if the sub-task is already resolved."""
        check_id("sub_task_id", sub_task_id)
        if timeout_s is not None:
            check_timeout("timeout_s", timeout_s)
        if peer_task_id is not None:
            check_id("peer_task_id", peer_task_id)

        def body(conn: Connection) -> float | None:
            deadline = (conn.execute(q.RESET_DEADLINE, self._keys(
                p_sub=sub_task_id, p_now=self._clock(), p_timeout=timeout_s,
                p_peer_task=peer_task_id))).scalar()
            if deadline is None:
                self._raise_if_unknown_sub_task(conn, sub_task_id)
            return None if deadline is None else float(deadline)

        return await self._write(f"resetting the deadline of {sub_task_id!r}", body,
                                 one_statement=True)

    # -- leases -------------------------------------------------------------------------------

    async def take_resume_lease(self, task_id: str, owner: str, ttl_s: float, *,
                                statuses: Sequence[str] = ("resuming",)) -> Lease | None:
        """Take the right to resume a task for ``ttl_s`` seconds.

        Succeeds if the task's status is in ``statuses`` and its lease is free,
        expired, or already ``owner``'s; returns ``None`` while another owner holds
        it. The task's status becomes ``resuming``. Taking is re-entrant for the same
        ``owner``, so an owner must name one resume attempt (an instance id plus a
        per-attempt suffix), not an instance that may resume a task twice at once.
        """
        check_id("task_id", task_id)
        check_id("owner", owner)
        check_ttl(ttl_s)
        bad = [s for s in statuses if s not in TASK_STATUSES]
        if bad or not statuses:
            raise InvalidArgumentError(f"statuses must be non-empty, from {TASK_STATUSES}")

        def body(conn: Connection) -> Lease | None:
            now = self._clock()
            version = (conn.execute(q.TAKE_LEASE, self._keys(
                p_task=task_id, p_owner=owner, p_now=now, p_lease_until=now + ttl_s,
                p_statuses=list(statuses)))).scalar()
            if version is None:
                self._raise_if_unknown_task(conn, task_id)
                return None
            return Lease(task_id=task_id, owner=owner, expires_at=now + ttl_s, version=version)

        return await self._write(f"taking the lease of task {task_id!r}", body,
                                 one_statement=True)

    async def renew_resume_lease(self, task_id: str, owner: str, ttl_s: float) -> Lease | None:
        """Extend ``owner``'s lease to now + ``ttl_s``; ``None`` if it no longer holds it."""
        check_id("task_id", task_id)
        check_id("owner", owner)
        check_ttl(ttl_s)

        def body(conn: Connection) -> Lease | None:
            now = self._clock()
            version = (conn.execute(q.RENEW_LEASE, self._keys(
                p_task=task_id, p_owner=owner, p_lease_until=now + ttl_s))).scalar()
            if version is None:
                self._raise_if_unknown_task(conn, task_id)
                return None
            return Lease(task_id=task_id, owner=owner, expires_at=now + ttl_s, version=version)

        return await self._write(f"renewing the lease of task {task_id!r}", body,
                                 one_statement=True)

    async def release_resume_lease(self, task_id: str, owner: str) -> bool:
        """Give the lease up so any instance may take it now; ``False`` if not held."""
        check_id("task_id", task_id)
        check_id("owner", owner)

        def body(conn: Connection) -> bool:
            version = (conn.execute(q.RELEASE_LEASE, self._keys(
                p_task=task_id, p_owner=owner))).scalar()
            if version is None:
                self._raise_if_unknown_task(conn, task_id)
                return False
            return True

        return await self._write(f"releasing the lease of task {task_id!r}", body,
                                 one_statement=True)

    # -- reads --------------------------------------------------------------------------------

    async def restore_task(self, task_id: str, *, lease_owner: str | None = None) -> RestoredTask:
        """Read a paused task back as a live context, with its conversation, pending
        sub-tasks and every known result. With ``lease_owner``, raises
        :class:`LeaseNotHeldError` unless that owner holds the resume lease."""
        check_id("task_id", task_id)
        keys = self._keys(p_task=task_id)
        doing = f"restoring task {task_id!r}"

        def check(tasks: list[Any]) -> Any:
            if not tasks:
                raise UnknownTaskError(task_id)
            if lease_owner is not None and tasks[0].owner != lease_owner:
                raise LeaseNotHeldError(task_id, lease_owner)
            return tasks[0]

        if self.dialect == "postgresql":  # one statement, one snapshot, one round trip
            async def read(conn: PoolProxiedConnection) -> RestoredTask:
                task = check(await q.Hot.pg_restore.fetch(conn, self._pg_dialect, keys))
                return rebuild(
                    task, [q.EventRow(*row) for row in task.event_rows],
                    [q.InvocationRow(*row) for row in task.invocation_rows],
                    [sub_task(q.SubTaskRow(*row)) for row in task.sub_task_rows])

            return await self._read_native(doing, read)

        def body(conn: Connection) -> RestoredTask:
            task = check(q.Hot.get_task.rows(conn, keys))
            event_rows = q.Hot.get_events.rows(conn, keys)
            invocations = q.Hot.get_invocations.rows(conn, keys)
            subs = [sub_task(row) for row in q.Hot.get_task_sub_tasks.rows(conn, keys)]
            return rebuild(task, event_rows, invocations, subs)

        return await self._read(doing, body)

    async def get_peer_sub_task(self, sub_task_id: str) -> PeerSubTask:
        """Read one sub-task without claiming it (for status updates and operators)."""
        check_id("sub_task_id", sub_task_id)

        def body(conn: Connection) -> PeerSubTask:
            row = (conn.execute(q.GET_SUB_TASK, self._keys(p_sub=sub_task_id))).first()
            if row is None:
                raise UnknownSubTaskError(sub_task_id)
            return sub_task(row)

        return await self._read(f"reading sub-task {sub_task_id!r}", body)

    async def get_peer_sub_tasks_for_task(self, task_id: str) -> list[PeerSubTask]:
        """Every sub-task of a paused task, pending and resolved (e.g. to cancel peers)."""
        check_id("task_id", task_id)
        keys = self._keys(p_task=task_id)

        def body(conn: Connection) -> list[PeerSubTask]:
            self._raise_if_unknown_task(conn, task_id)
            return [sub_task(row) for row in
                    (conn.execute(q.GET_TASK_SUB_TASKS, keys)).all()]

        return await self._read(f"listing the sub-tasks of task {task_id!r}", body)

    async def get_parallel_results(self, task_id: str,
                                   invocation_id: str) -> list[tuple[str, Any]]:
        """``(function_call_id, result)`` of an invocation's finished calls, in call order."""
        check_id("task_id", task_id)
        check_id("invocation_id", invocation_id)
        keys = self._keys(p_task=task_id, p_invocation=invocation_id)

        def body(conn: Connection) -> list[tuple[str, Any]]:
            invocation = (conn.execute(q.GET_INVOCATION, keys)).first()
            if invocation is None:
                self._raise_if_unknown_task(conn, task_id)
                raise InvalidArgumentError(
                    f"task {task_id!r} has no parallel invocation {invocation_id!r}")
            calls = ParallelCalls(list(invocation.call_order), dict(invocation.results))
            for call, value in (conn.execute(q.GET_INVOCATION_RESULTS, keys)).all():
                calls.results[call] = value
            return calls.ordered_results()

        return await self._read(f"reading the results of task {task_id!r}", body)

    # -- cleanup and operators ----------------------------------------------------------------

    async def cleanup_task(self, task_id: str, *, lease_owner: str | None = None) -> None:
        """Delete every live row of a task in one transaction (it completed, failed
        or was canceled). With ``lease_owner``, only that lease holder may do it."""
        check_id("task_id", task_id)
        keys = self._keys(p_task=task_id, p_owner=lease_owner)

        def body(conn: Connection) -> None:
            # Children first, matching the lock order of resolvers (see queries.py).
            # These deletes are what keeps a task from leaving orphans (no foreign keys).
            for statement in (q.DELETE_TASK_SUB_TASKS, q.DELETE_TASK_INVOCATIONS,
                              q.DELETE_TASK_EVENTS):
                conn.execute(statement, keys)
            delete = q.DELETE_TASK if lease_owner is None else q.DELETE_TASK_OF_OWNER
            if (conn.execute(delete, keys)).first() is None:
                self._raise_missing_or_unleased(conn, task_id, lease_owner)

        await self._write(f"cleaning up task {task_id!r}", body)

    async def list_paused_tasks(self, *, agent_name: str | None = None,
                                status: str | None = None,
                                limit: int = 100) -> list[PausedTaskSummary]:
        """Paused tasks, oldest checkpoint first, with pending sub-tasks and next deadline."""
        t, s = paused_tasks, peer_sub_tasks
        pending = (select(s.c.logical_task_id, func.count().label("n"),
                          func.min(s.c.timeout_deadline).label("next_deadline"))
                   .where(s.c.tenant_id == self.tenant_id, q.OPEN)
                   .group_by(s.c.logical_task_id).subquery())
        stmt = (select(t.c.logical_task_id, t.c.agent_name, t.c.status, t.c.owner,
                       t.c.lease_expires_at, t.c.version, t.c.checkpointed_at,
                       pending.c.n, pending.c.next_deadline)
                .select_from(t.outerjoin(pending,
                                         pending.c.logical_task_id == t.c.logical_task_id))
                .where(t.c.tenant_id == self.tenant_id)
                .order_by(t.c.checkpointed_at, t.c.logical_task_id).limit(limit))
        if agent_name is not None:
            stmt = stmt.where(t.c.agent_name == agent_name)
        if status is not None:
            stmt = stmt.where(t.c.status == status)

        def body(conn: Connection) -> list[PausedTaskSummary]:
            return [PausedTaskSummary(
                task_id=r[0], agent_name=r[1], status=r[2], owner=r[3], lease_expires_at=r[4],
                version=r[5], checkpointed_at=r[6], pending_sub_tasks=r[7] or 0,
                next_deadline=r[8]) for r in (conn.execute(stmt)).all()]

        return await self._read("listing paused tasks", body, short=False)

    async def resumable_tasks(self, agent_name: str, *, limit: int = 100) -> list[str]:
        """Ids of ``agent_name``'s tasks whose join completed but that nobody is
        resuming: no lease was granted, or its holder let it expire (it crashed).
        The recovery loop takes their leases with :meth:`take_resume_lease`."""
        check_id("agent_name", agent_name)
        t = paused_tasks
        stmt = (select(t.c.logical_task_id)
                .where(t.c.agent_name == agent_name, t.c.tenant_id == self.tenant_id,
                       text(RESUMING_PREDICATE),  # word for word: the partial index's
                       (t.c.owner.is_(None)) | (t.c.lease_expires_at <= self._clock()))
                .order_by(t.c.lease_expires_at).limit(limit))

        def body(conn: Connection) -> list[str]:
            return [row[0] for row in conn.execute(stmt).all()]

        return await self._read(f"listing resumable tasks of {agent_name!r}", body, short=False)

    async def next_deadlines(self, *, agent_name: str | None = None,
                             limit: int = 10) -> list[PeerSubTask]:
        """The pending sub-tasks that expire soonest."""
        stmt = (select(*q.SUB_COLUMNS)
                .where(peer_sub_tasks.c.tenant_id == self.tenant_id, q.OPEN)
                .order_by(peer_sub_tasks.c.timeout_deadline).limit(limit))
        if agent_name is not None:
            stmt = stmt.where(peer_sub_tasks.c.agent_name == agent_name)

        def body(conn: Connection) -> list[PeerSubTask]:
            return [sub_task(row) for row in (conn.execute(stmt)).all()]

        return await self._read("listing deadlines", body, short=False)

    async def live_row_counts(self) -> dict[str, int]:
        """Rows of every live table (paused tasks, their sub-tasks, joins and session
        events), across tenants. All zero once every task has ended: the check that
        nothing was left behind."""
        from meshpoint.store.schema import LIVE_TABLES

        def body(conn: Connection) -> dict[str, int]:
            return {t.name: int(conn.exec_driver_sql(f"SELECT count(*) FROM {t.name}")
                                .scalar() or 0) for t in LIVE_TABLES}

        return await self._read("counting live rows", body, short=False)

    async def stats(self) -> StoreStats:
        """Counts of paused tasks by ``(agent_name, status)``, pending and expired
        sub-tasks, the oldest checkpoint and the next deadline."""
        keys = self._keys(p_now=self._clock())

        def body(conn: Connection) -> StoreStats:
            by_status = {(a, s): n for a, s, n in
                         (conn.execute(q.COUNT_BY_AGENT_STATUS, keys)).all()}
            pending, next_deadline = (conn.execute(q.PENDING_SUMMARY, keys)).one()
            return StoreStats(
                paused_tasks=by_status, pending_sub_tasks=pending,
                expired_sub_tasks=(conn.execute(q.EXPIRED_COUNT, keys)).scalar_one(),
                oldest_checkpointed_at=(conn.execute(q.OLDEST_CHECKPOINT, keys)).scalar(),
                next_deadline=next_deadline)

        return await self._read("computing store stats", body, short=False)

    # -- helpers -------------------------------------------------------------------------------

    @staticmethod
    def _check_lease(owner: str | None, ttl_s: float) -> None:
        if owner is not None:
            check_id("lease_owner", owner)
            check_ttl(ttl_s)

    def _raise_if_unknown_sub_task(self, conn: Connection, sub_task_id: str) -> None:
        if (conn.execute(q.SUB_TASK_STATUS, self._keys(p_sub=sub_task_id))).first() is None:
            raise UnknownSubTaskError(sub_task_id)

    def _raise_if_unknown_task(self, conn: Connection, task_id: str) -> None:
        if (conn.execute(q.TASK_STATE, self._keys(p_task=task_id))).first() is None:
            raise UnknownTaskError(task_id)

    def _explain_refused_recheckpoint(self, conn: Connection, params: dict[str, Any]
                                      ) -> NoReturn:
        task_id, owner = params["p_task"], params["p_owner"]
        state = conn.execute(q.TASK_STATE, params).first()
        if state is None:
            raise UnknownTaskError(task_id)
        if state.owner != owner:
            raise LeaseNotHeldError(task_id, owner)
        raise CheckpointConflictError(
            f"task {task_id!r} has {state.session_event_count} stored conversation events "
            f"but the context says {params['p_first']}: checkpoint the context restored "
            "from the store, whose conversation only grows")

    def _raise_missing_or_unleased(self, conn: Connection, task_id: str,
                                         owner: str | None) -> NoReturn:
        self._raise_if_unknown_task(conn, task_id)
        raise LeaseNotHeldError(task_id, owner)
