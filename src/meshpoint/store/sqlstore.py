"""The checkpoint store: one body per operation, for SQLite and PostgreSQL.

Each operation checks its arguments, builds its parameters once, and runs one
transaction of named statements (:mod:`meshpoint.store.queries`) on the store's
:class:`~meshpoint.store.engine.Database`. Where the database's dialect has a fast
path for the operation (:mod:`meshpoint.store.hooks`), the operation offers it the
same parameters first; the portable body runs when it declines, or when the store
was opened with ``fast_paths=False``. Nothing here depends on the dialect.

The contract of every operation, its docstring included, is
:class:`~meshpoint.store.base.Store`'s. The store is built of parts that each get what
they need and no reference back: :class:`~meshpoint.store.transactions.Transactions`
(how a tenant's transaction runs), :class:`~meshpoint.store.reads.Reads` (reads that
change nothing), :class:`~meshpoint.store.leases.Leases` (resume leases),
:class:`~meshpoint.store.history_store.HistoryStore` (``store.history``) and
:class:`~meshpoint.store.history_restore.VerifiedRestore` (restores verified against the
history).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from sqlalchemy import Connection, exc

from meshpoint import _json
from meshpoint.compression import DEFAULT_MAX_DECOMPRESSED_BYTES
from meshpoint.context import TaskExecutionContext
from meshpoint.errors import (
    CheckpointConflictError,
    InvalidArgumentError,
    LeaseNotHeldError,
    TaskEndedError,
    UnknownCallError,
)
from meshpoint.history.planning import (
    END_PHASES,
    HistoryHead,
    HistoryOptions,
)
from meshpoint.store import history_queries as hq
from meshpoint.store import queries as q
from meshpoint.store.base import TIMEOUT_RESULT, Store
from meshpoint.store.breakers import Breakers, RecoveryLimits
from meshpoint.store.checkpoints import insert_children, plan_checkpoint, rewrite_task
from meshpoint.store.checks import check_id, check_lease, check_timeout
from meshpoint.store.deadlines import Deadlines
from meshpoint.store.engine import Database, translate
from meshpoint.store.history_chain import (
    NO_RECORD,
    HeadMovedError,
    end_record,
    finalize,
    seq_taken_as_moved,
    stored_head_of,
    write_record,
)
from meshpoint.store.history_restore import VerifiedRestore, a2a_context, missing_signing_key
from meshpoint.store.history_store import HistoryStore
from meshpoint.store.hooks import NO_FAST_PATHS, Portable
from meshpoint.store.joins import advance
from meshpoint.store.leases import Leases
from meshpoint.store.reads import Reads, raise_if_unknown_sub_task, raise_if_unknown_task
from meshpoint.store.results import (
    Blocked,
    CheckpointReceipt,
    Lease,
    PausedTaskSummary,
    Resolution,
    RestoredTask,
    StoreStats,
    SubTask,
)
from meshpoint.store.rows import RestoreRows, restored, sub_task
from meshpoint.store.sealing import RESULT, Sealer
from meshpoint.store.statement import Statement
from meshpoint.store.transactions import Transactions

__all__ = ["TIMEOUT_RESULT", "SqlStore"]

R = TypeVar("R")
logger = logging.getLogger("meshpoint.store")
#: Tries of a first checkpoint that continues an ended chain a purge moved meanwhile.
_HEAD_ATTEMPTS = 3


class _Collision(Exception):
    """A checkpoint hit a unique key; its transaction is rolled back (internal)."""


class SqlStore(Store):
    """The checkpoint store of one tenant. Open it with :func:`meshpoint.store.open_store`.

    ``fast_paths=False`` runs the portable body of every operation even where the
    database's dialect has a faster one (for tests that prove both agree, and for
    benchmarks that weigh them).
    """

    def __init__(self, db: Database, *, tenant_id: str,
                 clock: Callable[[], float] = time.time,
                 compress_threshold_bytes: int = 16_384, fast_paths: bool = True,
                 owns_db: bool = True, history: HistoryOptions | None = None,
                 max_decompressed_bytes: int = DEFAULT_MAX_DECOMPRESSED_BYTES) -> None:
        check_id("tenant_id", tenant_id, max_len=64)
        self._db = db
        self.tenant_id = tenant_id
        self._clock = clock
        self._compress_threshold = compress_threshold_bytes
        self._max_inflate = max_decompressed_bytes
        self._fast = db.fast_paths if fast_paths else NO_FAST_PATHS
        self._owns_db = owns_db
        self._history = HistoryOptions() if history is None else history
        self._tx = Transactions(db, tenant_id, self._fast)
        #: How this tenant's columns that carry user content are encrypted at rest
        #: (:mod:`meshpoint.store.sealing`), for the parts built on the store too.
        self.sealer = Sealer(tenant_id, self._history.encryption,
                             self._history.encrypt_exclude)
        self._reads = Reads(self._tx, self.sealer, clock)
        self._leases = Leases(self._tx, clock)
        self._deadlines = Deadlines(self._tx, self.sealer, clock)
        #: The checkpoint history of this tenant (``store.history``).
        self.history: HistoryStore = HistoryStore(
            tenant_id=tenant_id, options=self._history, clock=clock,
            compress_threshold=compress_threshold_bytes, max_inflate=max_decompressed_bytes,
            read=self._tx.long_read, write=self._tx.write)
        self._verified = VerifiedRestore(
            tenant_id=tenant_id, options=self._history, sealer=self.sealer, clock=clock,
            compress_threshold=compress_threshold_bytes, max_inflate=max_decompressed_bytes,
            read=self._tx.long_read, write=self._tx.write)
        #: The agents' circuit breakers (:class:`~meshpoint.store.breakers.Breakers`).
        self.breakers = Breakers(self._tx, clock)
        #: Take-overs counted, tasks taken by hand (:class:`~meshpoint.store.breakers.
        #: RecoveryLimits`; ``block_task`` is the Store's own operation).
        self.recovery = RecoveryLimits(
            self._tx, clock, self._history,
            lambda row: a2a_context(row, self.sealer, max_decompressed_bytes))

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
                        fast_paths=self.fast_paths, owns_db=False, history=self._history,
                        max_decompressed_bytes=self._max_inflate)

    def with_history(self, history: HistoryOptions) -> SqlStore:
        """A view of the same database and tenant keeping the history as ``history``
        says (other keys, say, to verify with), sharing this store's pool."""
        return SqlStore(self._db, tenant_id=self.tenant_id, clock=self._clock,
                        compress_threshold_bytes=self._compress_threshold,
                        fast_paths=self.fast_paths, owns_db=False, history=history,
                        max_decompressed_bytes=self._max_inflate)

    @property
    def closed(self) -> bool:
        """Whether the database's pool was closed (by this store or the one it is a
        :meth:`for_tenant` view of): no operation succeeds any more."""
        return self._db.closed

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

    async def transaction(self, body: Callable[[Connection], R], *, write: bool = False,
                          doing: str = "running a transaction", short: bool = False) -> R:
        """Run ``body(connection)`` in one transaction of this store's tenant: on
        PostgreSQL the tenant is set first, so row-level security shows and admits
        this tenant's rows only (:meth:`run` sets none). For parts of meshpoint built
        on the store (the event log, the LangGraph saver) that run named statements
        of their own; a write that loses a deadlock is run again whole. ``short``
        promises a few rows by key, which SQLite may then run on the caller's thread
        (see :meth:`Database.run <meshpoint.store.engine.Database.run>`)."""
        if write:
            return await self._tx.write(doing, body, short=short)
        return await self._tx.read(doing, body, short=short)

    async def statement(self, statement: Statement, params: dict[str, Any], *,
                        write: bool = False, doing: str = "running a statement") -> list[Any]:
        """Run one named statement with ``params`` and this store's tenant
        (``p_tenant``), as a transaction of its own, and return its rows. On
        PostgreSQL it takes the store's one-statement path (the ``statement`` hook):
        one round trip, outside BEGIN and COMMIT, the tenant set first by the
        statement's session function (``store/postgres_tenancy.py``); otherwise, and
        with ``fast_paths=False``, a short transaction. For parts built on the store
        whose operation is one statement (the LangGraph saver's reads)."""
        return await self._tx.statement(statement, params, write=write, doing=doing)

    # -- checkpoint ---------------------------------------------------------------------

    async def checkpoint_task(self, ctx: TaskExecutionContext, agent_name: str, *,
                              status: str = "waiting_peers", default_timeout_s: float = 600.0,
                              expires_at: float | None = None,
                              lease_owner: str | None = None, holder: str | None = None,
                              hold_lease_s: float = 30.0) -> CheckpointReceipt:
        plan = plan_checkpoint(
            ctx, agent_name, keys=self._tx.keys(), status=status,
            default_timeout_s=default_timeout_s, expires_at=expires_at,
            lease_owner=lease_owner, holder=holder, hold_lease_s=hold_lease_s,
            now=self._clock(), history=self._history, sealer=self.sealer,
            compress_threshold=self._compress_threshold, max_inflate=self._max_inflate)
        params = plan.params

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
                    version = rewrite_task(conn, params)
                insert_children(conn, params)
                write_record(conn, params)
                return version
            except exc.IntegrityError as error:
                raise _Collision(str(error.orig)) from None

        doing = f"checkpointing task {ctx.task_id!r}"
        try:
            done = await self._tx.retried(doing, fast)
            version = await self._tx.write(doing, body) if isinstance(done, Portable) else done
        except _Collision as collision:
            problem = str(collision)
            # Which key collided? A one-statement first checkpoint reports whichever
            # constraint it hit first, so ask the database (error path only).
            def task_exists(conn: Connection) -> tuple[bool, HistoryHead | None]:
                if q.TASK_STATE.first(conn, params) is not None:
                    return True, None
                return False, stored_head_of(conn, params)

            def already() -> CheckpointConflictError:
                return CheckpointConflictError(
                    f"task {ctx.task_id!r} is already checkpointed; a resumed task is "
                    "checkpointed again by the holder of its resume lease (lease_owner=)")

            exists, head = await self._tx.read("checking a collision", task_exists)
            if lease_owner is None and exists:
                raise already() from None
            if lease_owner is None and plan.planned is not None:
                # The id of an ended task whose end was forgotten, started again: its
                # history goes on from where the earlier task's ended; planned again if
                # a purge moved where that chain starts meanwhile, or as a first record
                # if the purge removed it whole (then, or before the check above: a
                # first record colliding again collided with something else).
                first = plan
                for attempt in range(_HEAD_ATTEMPTS):
                    plan = first if head is None else first.with_head(head)
                    params = plan.params
                    try:
                        return plan.committed(ctx, await self._tx.write(doing, body))
                    except _Collision as again:
                        problem = str(again)
                        break
                    except HeadMovedError:
                        if attempt == _HEAD_ATTEMPTS - 1:
                            raise
                        exists, head = await self._tx.read("checking a collision", task_exists)
                        if exists:
                            raise already() from None
            raise CheckpointConflictError(
                f"checkpoint of task {ctx.task_id!r} collides with stored rows (a sub-task "
                f"id already in use, or conversation events already stored): {problem}"
            ) from None
        return plan.committed(ctx, version)

    # -- resolving sub-tasks ------------------------------------------------------------------

    async def resolve_peer_sub_task(self, sub_task_id: str, result: Any, *,
                                    resolved_by: str = "answer", lease_owner: str | None = None,
                                    lease_ttl_s: float = 30.0,
                                    agent_name: str | None = None) -> Resolution | None:
        check_id("sub_task_id", sub_task_id)
        if agent_name is not None:
            check_id("agent_name", agent_name)
        # Copied, checked and sealed (bound to its sub-task) once, for either path.
        value = self.sealer.seal("calls", _json.json_copy(result, "result"), RESULT,
                                 sub_task=sub_task_id)
        check_lease(lease_owner, lease_ttl_s)
        doing = f"resolving sub-task {sub_task_id!r}"

        def params() -> dict[str, Any]:  # read when the statement runs: its clock too
            now = self._clock()
            return self._tx.keys(
                p_sub=sub_task_id, p_resolved_by=resolved_by, p_result=value, p_now=now,
                p_owner=lease_owner, p_agent=agent_name, p_any_agent=agent_name is None,
                p_lease_until=None if lease_owner is None else now + lease_ttl_s)

        done = await self._tx.retried(doing, lambda: self._fast.resolve_one(
            params, lease_owner, self.sealer))
        if not isinstance(done, Portable):
            return done

        def body(conn: Connection) -> Resolution | None:
            row = q.RESOLVE_PENDING.first(conn, params())
            if row is None:
                raise_if_unknown_sub_task(conn, self._tx.keys(), sub_task_id, agent_name)
                return None
            return advance(conn, self._tx.keys(), self._clock, [sub_task(row, self.sealer)],
                           lease_owner, lease_ttl_s)[0]

        return await self._tx.write(doing, body)

    async def claim_peer_sub_task(self, sub_task_id: str) -> SubTask | None:
        check_id("sub_task_id", sub_task_id)

        def body(conn: Connection) -> SubTask | None:
            row = q.CLAIM_PENDING.first(conn, self._tx.keys(p_sub=sub_task_id,
                                                            p_now=self._clock()))
            if row is None:
                raise_if_unknown_sub_task(conn, self._tx.keys(), sub_task_id)
                return None
            return sub_task(row, self.sealer)

        # Not one_statement: the row is decoded after the UPDATE, and a corrupt one must
        # leave the claim rolled back.
        return await self._tx.write(f"claiming sub-task {sub_task_id!r}", body)

    async def record_parallel_result(self, task_id: str, invocation_id: str,
                                     function_call_id: str, result: Any, *,
                                     lease_owner: str | None = None,
                                     lease_ttl_s: float = 30.0) -> Resolution | None:
        for name, value in (("task_id", task_id), ("invocation_id", invocation_id),
                            ("function_call_id", function_call_id)):
            check_id(name, value)
        copied = _json.json_copy(result, "result")
        check_lease(lease_owner, lease_ttl_s)
        keys = self._tx.keys(p_task=task_id, p_invocation=invocation_id, p_call=function_call_id)

        def body(conn: Connection) -> Resolution | None:
            # The call's sub-task first: its result is sealed bound to that row.
            call = q.CALL_STATUS.first(conn, keys)
            if call is None:
                raise_if_unknown_task(conn, self._tx.keys(), task_id)
                raise UnknownCallError(task_id, invocation_id, function_call_id)
            if call.status == "pending":
                raise CheckpointConflictError(
                    f"call {function_call_id!r} of task {task_id!r} was never claimed: "
                    "claim it with claim_peer_sub_task first")
            row = q.RECORD_CLAIMED.first(conn, {
                **keys, "p_resolved_by": "answer", "p_now": self._clock(),
                "p_result": self.sealer.seal("calls", copied, RESULT,
                                             sub_task=call.sub_task_id)})
            if row is None:
                return None  # recorded already
            return advance(conn, self._tx.keys(), self._clock, [sub_task(row, self.sealer)],
                           lease_owner, lease_ttl_s)[0]

        return await self._tx.write(f"recording a result for task {task_id!r}", body)

    # -- deadlines (:mod:`meshpoint.store.deadlines`) -----------------------------------------

    async def sweep_expired_timeouts(self, agent_name: str, limit: int = 100, *,
                                     lease_owner: str | None = None,
                                     lease_ttl_s: float = 30.0) -> list[Resolution]:
        return await self._deadlines.sweep_expired_timeouts(
            agent_name, limit, lease_owner=lease_owner, lease_ttl_s=lease_ttl_s)

    async def check_announcements(self, agent_name: str, limit: int = 100) -> list[SubTask]:
        return await self._deadlines.check_announcements(agent_name, limit)

    async def reset_timeout_deadline(self, sub_task_id: str, *, timeout_s: float | None = None,
                                     peer_task_id: str | None = None) -> float | None:
        return await self._deadlines.reset_timeout_deadline(
            sub_task_id, timeout_s=timeout_s, peer_task_id=peer_task_id)

    # -- leases (:mod:`meshpoint.store.leases`) --------------------------------------------

    async def take_resume_lease(self, task_id: str, owner: str, ttl_s: float, *,
                                statuses: Sequence[str] = ("resuming",),
                                agent_name: str | None = None) -> Lease | None:
        return await self._leases.take_resume_lease(task_id, owner, ttl_s, statuses=statuses,
                                                    agent_name=agent_name)

    async def renew_resume_lease(self, task_id: str, owner: str, ttl_s: float) -> Lease | None:
        return await self._leases.renew_resume_lease(task_id, owner, ttl_s)

    async def release_resume_lease(self, task_id: str, owner: str) -> bool:
        return await self._leases.release_resume_lease(task_id, owner)

    async def block_task(self, task_id: str, *, lease_owner: str, reason: str) -> Blocked:
        return await self.recovery.block_task(task_id, lease_owner=lease_owner, reason=reason)

    # -- reads --------------------------------------------------------------------------------

    async def restore_task(self, task_id: str, *, lease_owner: str | None = None,
                           verify: bool = True) -> RestoredTask:
        check_id("task_id", task_id)
        history = self._history.enabled
        keys = self._tx.keys(p_task=task_id, p_history=history)
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
            rows = await self._tx.read(doing, body)
        if history and verify and rows.task is not None and rows.head is None:
            # No head: checkpointed without a history, or its head was deleted, which
            # must not pass for the former: a record of the task says it had one.
            rows = rows._replace(latest=await self._tx.read(doing, lambda conn: (
                hq.GET_HISTORY.first(conn, {**keys, "p_limit": 1}))))
        result = restored(task_id, rows, lease_owner, self.sealer,
                          max_inflate=self._max_inflate) \
            if not (history and verify) \
            else await self._verified.restore(task_id, rows, lease_owner)
        return result

    async def check_signing_key(self, task_id: str) -> None:
        check_id("task_id", task_id)
        options = self._history
        if not options.enabled or options.signing.signs:
            return
        keys = self._tx.keys(p_task=task_id)

        def body(conn: Connection) -> tuple[Any, Any]:
            raise_if_unknown_task(conn, self._tx.keys(), task_id)
            head = hq.GET_HEAD.first(conn, keys)
            return head, hq.GET_HISTORY.first(conn, {**keys, "p_limit": 1})

        head, latest = await self._tx.read(f"checking the keys task {task_id!r} needs", body)
        why = missing_signing_key(options, task_id, head, latest)
        if why is not None:
            raise why

    async def restart_task(self, ctx: TaskExecutionContext, agent_name: str, *,
                           lease_owner: str, reason: str) -> None:
        check_id("agent_name", agent_name)
        check_id("lease_owner", lease_owner)
        await self._verified.restart(ctx, agent_name, lease_owner, reason)

    async def begin_iteration(self, ctx: TaskExecutionContext, agent_name: str, *,
                              lease_owner: str, handoff: dict[str, Any]) -> None:
        check_id("agent_name", agent_name)
        check_id("lease_owner", lease_owner)
        await self._verified.fresh(
            ctx, agent_name, lease_owner, phase="iteration",
            extensions={"handoff_received": handoff}, event_type="agent_handoff_received",
            event_data=handoff)

    # -- reads (:mod:`meshpoint.store.reads`) --------------------------------------------

    async def get_peer_sub_task(self, sub_task_id: str) -> SubTask:
        return await self._reads.get_peer_sub_task(sub_task_id)

    async def get_peer_sub_tasks_for_task(self, task_id: str) -> list[SubTask]:
        return await self._reads.get_peer_sub_tasks_for_task(task_id)

    async def get_parallel_results(self, task_id: str,
                                   invocation_id: str) -> list[tuple[str, Any]]:
        return await self._reads.get_parallel_results(task_id, invocation_id)

    async def task_known(self, task_id: str, agent_name: str) -> bool:
        return await self._reads.task_known(task_id, agent_name)

    async def list_paused_tasks(self, *, agent_name: str | None = None,
                                status: str | None = None,
                                limit: int = 100) -> list[PausedTaskSummary]:
        return await self._reads.list_paused_tasks(agent_name=agent_name, status=status,
                                                   limit=limit)

    async def tasks_page(self, *, after: str = "", prefix: str = "",
                         agent_name: str | None = None, status: str | None = None,
                         limit: int = 50) -> list[PausedTaskSummary]:
        return await self._reads.tasks_page(after=after, prefix=prefix, agent_name=agent_name,
                                            status=status, limit=limit)

    async def resumable_tasks(self, agent_name: str, *, limit: int = 100) -> list[str]:
        return await self._reads.resumable_tasks(agent_name, limit=limit)

    async def expired_tasks(self, agent_name: str, *, older_than_s: float,
                            limit: int = 100) -> list[str]:
        return await self._reads.expired_tasks(agent_name, older_than_s=older_than_s, limit=limit)

    async def next_deadlines(self, *, agent_name: str | None = None,
                             limit: int = 10) -> list[SubTask]:
        return await self._reads.next_deadlines(agent_name=agent_name, limit=limit)

    async def live_row_counts(self) -> dict[str, int]:
        return await self._reads.live_row_counts()

    async def stats(self, *, expire_after_s: float = 0.0) -> StoreStats:
        return await self._reads.stats(expire_after_s=expire_after_s)

    # -- cleanup and operators ----------------------------------------------------------------

    async def cleanup_task(self, task_id: str, *, lease_owner: str | None = None,
                           outcome: str = "completed",
                           ctx: TaskExecutionContext | None = None,
                           agent_name: str | None = None) -> None:
        check_id("task_id", task_id)
        if agent_name is not None:
            check_id("agent_name", agent_name)
        if outcome not in END_PHASES:
            raise InvalidArgumentError(f"outcome must be one of {END_PHASES}, got {outcome!r}")
        if ctx is not None and ctx.task_id != task_id:
            raise InvalidArgumentError(f"ctx is task {ctx.task_id!r}, not {task_id!r}")
        keys = self._tx.keys(p_task=task_id, p_owner=lease_owner)
        final = None if ctx is None or not self._history.enabled else ctx.checkpoint_delta()
        head = None if ctx is None else ctx.history_head
        doing = f"cleaning up task {task_id!r}"
        if lease_owner is not None and agent_name is not None and (
                not self._history.enabled or (final is not None and head is not None)):
            # A lease holder's end, in one statement where the dialect has one.
            now = self._clock()
            params = ({**keys, "p_agent": agent_name, "p_now": now, **NO_RECORD}
                      if head is None or final is None else
                      end_record(keys, agent_name=agent_name, outcome=outcome, final=final,
                                 head=head, now=now, options=self._history))

            async def one_statement() -> int | Portable:
                with seq_taken_as_moved(task_id):
                    return await self._fast.cleanup(params)

            if not isinstance(await self._tx.retried(doing, one_statement), Portable):
                return

        children = (q.DELETE_TASK_SUB_TASKS, q.DELETE_TASK_INVOCATIONS, q.DELETE_TASK_EVENTS)

        def body(conn: Connection) -> None:
            def delete_children() -> None:
                for statement in children:
                    statement.rows(conn, keys)

            # Children first, matching the lock order of resolvers (see queries.py).
            # These deletes are what keeps a task from leaving orphans (no foreign keys).
            delete_children()
            delete = q.DELETE_TASK if lease_owner is None else q.DELETE_TASK_OF_OWNER
            deleted = delete.first(conn, keys)
            if deleted is None:
                raise_if_unknown_task(conn, self._tx.keys(), task_id)
                raise LeaseNotHeldError(task_id, lease_owner)
            # The task row's delete may have waited for the holder's re-checkpoint,
            # whose new children committed after the deletes above.
            self._db.after_lock_wait(delete_children)
            q.RECORD_ENDED.rows(conn, {**keys, "p_agent": deleted.agent_name,
                                       "p_now": self._clock()})
            if self._history.enabled:
                finalize(conn, keys, agent_name=deleted.agent_name, outcome=outcome,
                         final=final, head=head, now=self._clock(), options=self._history)

        await self._tx.write(doing, body)

    async def forget_ended_tasks(self, agent_name: str, *, older_than_s: float) -> int:
        check_id("agent_name", agent_name)
        check_timeout("older_than_s", older_than_s)

        def body(conn: Connection) -> int:
            before = self._clock() - older_than_s
            return len(q.FORGET_ENDED.rows(conn, self._tx.keys(p_agent=agent_name,
                                                               p_before=before)))

        return await self._tx.write(f"forgetting ended tasks of {agent_name!r}", body,
                                    one_statement=True, short=False)

