"""PostgreSQL: how a transaction runs on asyncpg, and the fast paths that await
asyncpg directly.

A portable body runs through ``AsyncConnection.run_sync``: its statements await
the network through SQLAlchemy's greenlet bridge. Reads run REPEATABLE READ, READ
ONLY, so several SELECTs see one snapshot; a transaction that loses a deadlock or
serialization check is retried whole by the store.

The pause boundary's operations (a first checkpoint, a resolution, a restore) are
each one statement here, chained through data-modifying CTEs or subqueries, and
run natively: :class:`PostgresFastPaths` awaits asyncpg on a pooled connection of
its own (:meth:`PostgresDatabase.native`), with no BEGIN and COMMIT around a
statement that is atomic by itself. Every statement is a network round trip, so
one instead of five or six is most of what a pause costs (docs/store.md). A
re-checkpoint (a resumed task paused again, or a mid-turn checkpoint) is one
statement too, instead of six.
Each is kept only while ``benchmarks/bench_hooks.py`` shows it pays, and the suite
runs with them on and off.
"""

from __future__ import annotations

import contextlib
import importlib.util
import re
from collections.abc import AsyncIterator, Callable
from typing import Any, TypeVar

from sqlalchemy import (
    JSON,
    Float,
    Integer,
    String,
    Text,
    bindparam,
    cast,
    column,
    delete,
    exc,
    func,
    insert,
    literal,
    literal_column,
    or_,
    select,
    true,
    type_coerce,
    update,
)
from sqlalchemy.dialects.postgresql import JSON as PG_JSON
from sqlalchemy.dialects.postgresql import aggregate_order_by
from sqlalchemy.engine import URL, Connection, Dialect
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.pool import PoolProxiedConnection

from meshpoint import _json
from meshpoint.errors import (
    ConfigurationError,
    MeshpointError,
    StoreError,
    UnknownSubTaskError,
)
from meshpoint.store import history_queries as hq
from meshpoint.store import queries as q
from meshpoint.store.engine import Database, translate
from meshpoint.store.hooks import PORTABLE, FastPaths, Portable
from meshpoint.store.postgres_migration_lock import take_migration_lock
from meshpoint.store.postgres_tenancy import SET_TENANT, check_tenant_role, session_function
from meshpoint.store.records import Resolution
from meshpoint.store.rows import (
    EventRow,
    HeadRow,
    InvocationRow,
    RecordRow,
    RestoreRows,
    SubTaskRow,
    TaskRow,
    check_agent,
    sub_task,
)
from meshpoint.store.sealing import Sealer
from meshpoint.store.statement import Compiled, Statement
from meshpoint.tls import URL_PARAMETERS, TlsConfig, postgres_ssl

R = TypeVar("R")
T, S, I, E = q.T, q.S, q.I, q.E  # noqa: E741
ONLY = ("postgresql",)

# -- the statements of the fast paths -------------------------------------------------

# A checkpoint's children travel as JSON arrays (p_subs, p_invs), expanded by
# json_to_recordset, so that a checkpoint is one statement however many it has. The
# caller's JSON in them (correlation data, results, call order) travels as JSON text,
# cast to json: PostgreSQL's JSON functions de-escape every string of what they parse
# and refuse a \u0000 in any of them, which the json type stores (the portable body
# binds each value as json and stores it). As text inside the array it is never NUL:
# JSON text escapes it.
_SUB_FIELDS = (("sub_task_id", String), ("invocation_id", String),
               ("function_call_id", String), ("peer_agent_name", String),
               ("peer_task_id", String), ("correlation_data", Text), ("timeout_s", Float),
               ("timeout_deadline", Float))
_INVOCATION_FIELDS = (("invocation_id", String), ("total_expected", Integer),
                      ("completed_count", Integer), ("call_order", Text), ("results", Text))
#: The fields of p_subs and p_invs that hold the caller's JSON, as JSON text.
_JSON_TEXT = {"p_subs": ("correlation_data",), "p_invs": ("call_order", "results")}


def _records(param: str, fields: tuple[tuple[str, Any], ...]) -> Any:
    return (func.json_to_recordset(bindparam(param, type_=PG_JSON))
            .table_valued(*(column(name, kind) for name, kind in fields))
            .render_derived(name=param.removeprefix("p_"), with_types=True))


def _columns(records: Any, param: str, fields: tuple[tuple[str, Any], ...]) -> list[Any]:
    """The recordset's columns, the caller's JSON cast from its text to json."""
    return [cast(records.c[name], PG_JSON) if name in _JSON_TEXT[param] else records.c[name]
            for name, _ in fields]


def _child_inserts(*where: Any) -> tuple[Any, ...]:
    """The CTEs inserting a checkpoint's children, each under ``where``."""
    subs = _records("p_subs", _SUB_FIELDS)
    invs = _records("p_invs", _INVOCATION_FIELDS)
    sub_names = [name for name, _ in _SUB_FIELDS]
    inv_names = [name for name, _ in _INVOCATION_FIELDS]
    insert_subs = insert(S).from_select(
        ["tenant_id", "logical_task_id", "agent_name", *sub_names, "status", "created_at"],
        select(q.tenant, q.task, q.agent, *_columns(subs, "p_subs", _SUB_FIELDS),
               literal("pending"), q.now).where(*where))
    insert_invs = insert(I).from_select(
        ["tenant_id", "logical_task_id", *inv_names, "created_at"],
        select(q.tenant, q.task, *_columns(invs, "p_invs", _INVOCATION_FIELDS), q.now)
        .where(*where))
    return (insert_subs.cte("new_sub_tasks"), insert_invs.cte("new_invocations"),
            q.append_events(*where).cte("new_events"))


def _first_checkpoint(history: bool) -> Any:
    """The task row and its children (and its history record, with ``history``); the
    children only if the task row was written (insert_task writes none for a task
    that already ended). Returns how many task rows it wrote: 0 means the portable
    body must say why."""
    new_task = q.insert_task().returning(T.c.logical_task_id).cte("new_task")
    written = select(new_task.c.logical_task_id).exists()
    if not history:
        return (select(func.count()).select_from(new_task)
                .add_cte(new_task, *_child_inserts(written)))
    record, head, moved = _record_inserts(written)
    return (select(func.count(), _head_moved_or_fail(written, moved))
            .select_from(new_task).add_cte(new_task, *_child_inserts(written),
                                           record, head, moved))


def _record_inserts(*where: Any) -> tuple[Any, Any, Any]:
    """The CTEs writing a checkpoint's history record and moving its task's head
    (insert_record, and insert_head or advance_head), each under ``where``."""
    return (hq.insert_record(*where).cte("new_record"),
            hq.insert_head(*where).cte("new_head"),
            hq.advance_head().where(*where).returning(hq.H.c.records)
            .cte("moved_head"))


def _head_moved_or_fail(written: Any, moved: Any) -> Any:
    """1, or a division by zero (the whole statement rolled back) if a record after
    the first was written and did not move its head: the head was not its parent
    when the update ran (a purge or another writer moved it after the statement's
    snapshot). The portable body then says so."""
    fine = or_(~written, ~hq.has_record, hq.seq == 1, select(moved.c.records).exists())
    return (literal(1) / cast(fine, Integer)).label("head_moved_or_fail")


#: Each write and the restore come in two forms: with the history (the default) and
#: without it, for a store that keeps none (it does not touch the history's tables).
FIRST_CHECKPOINT = {
    True: Statement(
        "pg_first_checkpoint", "Writes a first checkpoint in one statement: the task row "
        "(insert_task), and if it was written its sub-tasks, invocations, new events and "
        "history record.", _first_checkpoint(True), dialects=ONLY),
    False: Statement(
        "pg_first_checkpoint_no_history", "pg_first_checkpoint without the history record.",
        _first_checkpoint(False), dialects=ONLY)}


def _recheckpoint(history: bool) -> Any:
    """recheckpoint_task guarded as count_open_sub_tasks guards it (no sub-task still
    open) and as advance_head does (the history's head is the new record's parent),
    then delete_task_sub_tasks, delete_task_invocations, the inserts of the new
    children and the history record, each only if the task row was rewritten.
    Returns the new version, or no row if the rewrite was refused: the portable body
    then says why (or finds that the open sub-tasks were resolved since).

    A data-modifying CTE that no other reads runs in an order PostgreSQL does not
    promise, and an invocation checkpointed again keeps its key: so each insert's
    condition counts the rows the deletes returned, which runs the deletes to
    completion before any row is inserted (the unique check then sees the old row
    deleted by this transaction). The task row is locked first, as the portable body
    locks it."""
    no_open_sub_task = ~select(literal(1)).where(q.OF_TASK[S], q.OPEN_OF_TASK).exists()
    rewritten = (q.recheckpoint_task()
                 .where(no_open_sub_task, *((hq.head_is_parent(),) if history else ()))
                 .cte("rewritten"))
    done = select(rewritten.c.version).exists()
    old_subs = (delete(S).where(q.OF_TASK[S], done).returning(S.c.sub_task_id)
                .cte("old_sub_tasks"))
    old_invs = (delete(I).where(q.OF_TASK[I], done).returning(I.c.invocation_id)
                .cte("old_invocations"))
    deletes_done = (select(func.count()).select_from(old_subs).scalar_subquery()
                    + select(func.count()).select_from(old_invs).scalar_subquery()) >= 0
    children = _child_inserts(done, deletes_done)
    if not history:
        return select(rewritten.c.version).add_cte(rewritten, old_subs, old_invs, *children)
    record, head, moved = _record_inserts(done)
    return (select(rewritten.c.version, _head_moved_or_fail(done, moved))
            .add_cte(rewritten, old_subs, old_invs, *children, record, head, moved))


RECHECKPOINT = {
    True: Statement(
        "pg_recheckpoint", "Writes a re-checkpoint in one statement: recheckpoint_task (if "
        "no sub-task is open and the history's head is the new record's parent), the old "
        "children deleted, the new ones and the history record inserted.",
        _recheckpoint(True), dialects=ONLY),
    False: Statement(
        "pg_recheckpoint_no_history", "pg_recheckpoint without the history record.",
        _recheckpoint(False), dialects=ONLY)}


def _resolve_one() -> Any:
    """The same three updates as resolve_pending, advance_invocation and mark_resuming,
    in the same lock order, chained through data-modifying CTEs. Run without BEGIN
    and COMMIT it is one round trip instead of five, and still atomic, but nothing
    can be rolled back once it returns: so it leaves alone every row the store would
    refuse after reading it (correlation data that is not an object, an invocation
    row missing or already full). It then returns no row, and the portable body
    runs, which explains the refusal. If the invocation filled up between the guard
    and the count (which consistent rows never do), the statement fails by a
    division by zero and is rolled back; the portable body then runs too.
    """
    # Every row is found by its primary key through a scalar subquery, never by a
    # join: PostgreSQL evaluates those as lookups whatever its estimates, whereas
    # without statistics (a table never analyzed) it joined the one returned row to a
    # scan of the whole tenant.
    open_slot = (select(I.c.completed_count < I.c.total_expected)
                 .where(I.c.tenant_id == S.c.tenant_id,
                        I.c.logical_task_id == S.c.logical_task_id,
                        I.c.invocation_id == S.c.invocation_id)
                 .scalar_subquery())
    resolved = (
        update(S)
        .where(q.SUB_KEY, S.c.status == "pending", or_(q.any_agent, S.c.agent_name == q.agent),
               func.json_typeof(S.c.correlation_data) == "object", open_slot)
        .values(status="resolved", resolved_by=q.resolved_by, result=q.result,
                resolved_at=q.now)
        .returning(*q.SUB_COLUMNS)
        .cte("resolved"))
    counted = (
        update(I)
        .where(I.c.tenant_id == q.tenant,
               I.c.logical_task_id == select(resolved.c.logical_task_id).scalar_subquery(),
               I.c.invocation_id == select(resolved.c.invocation_id).scalar_subquery(),
               I.c.completed_count < I.c.total_expected)
        .values(completed_count=I.c.completed_count + 1)
        .returning(I.c.logical_task_id, I.c.completed_count, I.c.total_expected)
        .cte("counted"))
    resumed = (
        update(T)
        .where(T.c.tenant_id == q.tenant, T.c.logical_task_id == (
            select(counted.c.logical_task_id)
            .where(counted.c.completed_count == counted.c.total_expected)
            .scalar_subquery()))
        .values(q.MARK_RESUMING_VALUES)
        .returning(T.c.owner)
        .cte("resumed"))
    # Division by zero if the sub-task was resolved but not counted: the statement
    # fails and rolls back whole (an expression of a column, so never folded early).
    counted_or_fail = literal(1) / cast(counted.c.completed_count.is_not(None), Integer)
    return (select(*resolved.c, counted.c.completed_count.label("completed"),
                   counted.c.total_expected.label("total"), resumed.c.owner.label("holder"),
                   counted_or_fail.label("counted_or_fail"))
            .select_from(resolved.outerjoin(counted, true()).outerjoin(resumed, true())))


RESOLVE_ONE = Statement(
    "pg_resolve_one", "Resolves one sub-task in one statement: resolve_pending, "
    "advance_invocation and, if that completes the join, mark_resuming.",
    _resolve_one(), dialects=ONLY)
def _restore(history: bool) -> Any:
    """A paused task's row with its children as JSON arrays of arrays (``[seq, data]``
    per event row, ``[invocation_id, call_order, results]`` per invocation, a
    sub-task's SUB_COLUMNS in order), each read by key in a subquery. One statement
    sees one snapshot by itself, so it needs no REPEATABLE READ transaction."""
    def rows_of(table: Any, columns: Any, *, order_by: Any = ()) -> Any:
        aggregated = (func.json_agg(aggregate_order_by(func.json_build_array(*columns),
                                                       *order_by)) if order_by
                      else func.json_agg(func.json_build_array(*columns)))
        return (select(func.coalesce(aggregated, literal_column("'[]'::json")))
                .where(table.c.tenant_id == q.tenant, table.c.logical_task_id == q.task)
                .scalar_subquery())

    return select(
        *T.c,
        type_coerce(rows_of(E, (E.c.seq, E.c.data), order_by=(E.c.seq,)),
                    JSON).label("event_rows"),
        type_coerce(rows_of(I, (I.c.invocation_id, I.c.call_order, I.c.results)),
                    JSON).label("invocation_rows"),
        type_coerce(rows_of(S, q.SUB_COLUMNS, order_by=(S.c.created_at, S.c.sub_task_id)),
                    JSON).label("sub_task_rows"),
        *((type_coerce(select(func.json_build_array(*hq.HEAD_COLUMNS)).where(hq.HEAD_KEY)
                       .scalar_subquery(), JSON).label("head_row"),
           type_coerce(select(func.json_build_array(*hq.RECORD_COLUMNS)).where(
               hq.OF_TASK, hq.C.c.seq == select(hq.H.c.records).where(hq.HEAD_KEY)
               .scalar_subquery()).scalar_subquery(), JSON).label("latest_row"))
          if history else ()),
    ).where(q.TASK_KEY)


RESTORE = {
    True: Statement(
        "pg_restore", "Reads a paused task's row, all its children and its history head "
        "with the record it names in one statement (get_task, get_events, "
        "get_invocations, get_task_sub_tasks, get_head and get_record_at).",
        _restore(True), dialects=ONLY),
    False: Statement(
        "pg_restore_no_history", "pg_restore without the history's head and record.",
        _restore(False), dialects=ONLY)}


class PostgresFastPaths(FastPaths):
    """PostgreSQL's hooks (see :mod:`meshpoint.store.hooks`)."""

    name = "postgresql"

    def __init__(self, db: PostgresDatabase) -> None:
        self._db = db

    async def _fetch(self, statement: Statement, params: dict[str, Any]) -> list[Any]:
        async with self._db.native() as conn:
            return await fetch(statement, conn, self._db.engine.dialect, params)

    async def statement(self, statement: Statement,
                        params: dict[str, Any]) -> list[Any] | Portable:
        return await self._fetch(statement, params)

    async def first_checkpoint(self, params: dict[str, Any]) -> int | Portable:
        rows = await self._unless_head_moved(FIRST_CHECKPOINT[params["p_history"]], params)
        written = rows is not PORTABLE and bool(rows[0][0])
        return 1 if written else PORTABLE  # not written: the task ended, as the body says

    async def recheckpoint(self, params: dict[str, Any]) -> int | Portable:
        rows = await self._unless_head_moved(RECHECKPOINT[params["p_history"]], params)
        if rows is PORTABLE or not rows:
            return PORTABLE  # refused: the body says why
        return int(rows[0].version)

    async def _unless_head_moved(self, statement: Statement, params: dict[str, Any]
                                 ) -> Any:
        """The rows of a checkpoint's statement, or PORTABLE if it was rolled back
        because its record did not move the head (see _head_moved_or_fail)."""
        try:
            return await self._fetch(statement, _children_as_text(params))
        except exc.DBAPIError as error:
            if getattr(error.orig, "sqlstate", None) == "22012":
                return PORTABLE
            raise

    async def resolve_one(self, params: Callable[[], dict[str, Any]],
                          lease_owner: str | None,
                          sealer: Sealer) -> Resolution | Portable | None:
        dialect = self._db.engine.dialect
        async with self._db.native() as conn:
            values = params()  # once the connection is ours: the clock starts the lease
            try:
                rows = await fetch(RESOLVE_ONE, conn, dialect, values)
            except exc.DBAPIError as error:
                if getattr(error.orig, "sqlstate", None) == "22012":  # resolved, not counted
                    return PORTABLE  # rolled back
                raise
            if not rows:
                # A late or duplicate answer is told here, without a second transaction.
                status = await fetch(q.SUB_TASK_STATUS, conn, dialect, values)
                if not status:
                    raise UnknownSubTaskError(values["p_sub"])
                check_agent(f"the task of sub-task {values['p_sub']!r}", status[0].agent_name,
                            values["p_agent"])
                # Still pending: a join whose rows are inconsistent, which the portable
                # body explains.
                return PORTABLE if status[0].status == "pending" else None
        row = rows[0]
        # holder is set only when this resolution completed the join.
        granted = lease_owner if lease_owner is not None and row.holder == lease_owner \
            else None
        return Resolution(sub_task=sub_task(SubTaskRow(*row[:len(SubTaskRow._fields)]),
                                            sealer),
                          completed=row.completed, total=row.total, lease_owner=granted)

    async def restore(self, params: dict[str, Any]) -> RestoreRows:
        history = params["p_history"]
        rows = await self._fetch(RESTORE[history], params)
        if not rows:
            return RestoreRows(None, [], [], [])
        row = rows[0]
        head = row.head_row if history else None
        latest = row.latest_row if history else None
        return RestoreRows(TaskRow(*row[:len(TaskRow._fields)]),
                           [EventRow(*r) for r in row.event_rows],
                           [InvocationRow(*r) for r in row.invocation_rows],
                           [SubTaskRow(*r) for r in row.sub_task_rows],
                           None if head is None else HeadRow(*head),
                           None if latest is None else RecordRow(*latest))


def _children_as_text(params: dict[str, Any]) -> dict[str, Any]:
    """``params`` with the caller's JSON in p_subs and p_invs as JSON text (see
    _SUB_FIELDS)."""
    return {**params, **{
        param: [{**row, **{name: _json.dumps(row[name]) for name in names}}
                for row in params[param]]
        for param, names in _JSON_TEXT.items()}}


# -- the database ----------------------------------------------------------------------

def open_postgres(url: URL, *, busy_timeout_s: float, schema: str | None,
                  pool_size: int, tls: TlsConfig | None = None) -> PostgresDatabase:
    """The database at ``url`` (already :func:`~meshpoint.store.engine.parse_url`-ed);
    with ``tls`` (or libpq's sslmode in the URL), over TLS only (meshpoint.tls)."""
    if importlib.util.find_spec("asyncpg") is None:
        raise ConfigurationError(
            "PostgreSQL needs the asyncpg driver: pip install 'meshpoint[postgres]'")
    connect_args: dict[str, Any] = {"timeout": busy_timeout_s}
    ssl_arg = postgres_ssl(url.query, tls)
    if ssl_arg is not None:
        connect_args["ssl"] = ssl_arg
    url = url.difference_update_query(URL_PARAMETERS)  # asyncpg takes them as ssl
    if schema is not None:
        connect_args["server_settings"] = {"search_path": schema}
    return PostgresDatabase(create_async_engine(
        url, pool_size=pool_size, max_overflow=0, connect_args=connect_args,
        json_serializer=_json.dumps, json_deserializer=_json.loads))


class PostgresDatabase(Database):
    """PostgreSQL through asyncpg (see the module docstring)."""

    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine
        self.dialect = engine.dialect.name
        self.fast_paths = PostgresFastPaths(self)
        self._reader = engine.execution_options(isolation_level="REPEATABLE READ",
                                                postgresql_readonly=True)
        self._autocommit = engine.execution_options(isolation_level="AUTOCOMMIT")
        # A connection kept out of the pool between native statements (see native()),
        # and how many callers are waiting for the pool (then nothing is kept).
        self._parked: PoolProxiedConnection | None = None
        self._waiting = 0

    @contextlib.asynccontextmanager
    async def _pool_wait(self) -> AsyncIterator[None]:
        """Count a caller waiting for a pooled connection, after returning the parked
        one to the pool: a caller must never wait for a connection that sits idle."""
        self._waiting += 1
        try:
            self._return_parked()
            yield
        finally:
            self._waiting -= 1

    @contextlib.asynccontextmanager
    async def native(self) -> AsyncIterator[PoolProxiedConnection]:
        """A pooled connection whose asyncpg connection the caller awaits directly
        (with :func:`fetch`), outside any transaction: each statement commits by
        itself, so only one-statement writes, and reads that explain them, belong
        here.

        Afterwards the connection is discarded if a statement lost it, was cancelled
        mid-way, or failed in a way that is not the server's verdict on the
        statement. Otherwise one connection is kept out of the pool for the next
        native statement, unless someone waits for the pool: a checkout from
        SQLAlchemy's pool and the return to it cost more CPU than asyncpg's own work
        for a resolution (the greenlet bridge, the pool's bookkeeping). The others go
        back to the pool."""
        if self.closed:
            raise StoreError("the store is closed; open a new one with open_store()")
        proxied, self._parked = self._parked, None
        if proxied is None:
            dialect = self.engine.dialect
            try:
                async with self._pool_wait():
                    proxied = await self.engine.raw_connection()
            except dialect.loaded_dbapi.Error as error:
                # Connecting failed (the server is down, starting or stopping): raised
                # as SQLAlchemy raises it from Engine.connect(), for translate().
                raise exc.DBAPIError.instance(
                    None, None, error, dialect.loaded_dbapi.Error,
                    connection_invalidated=dialect.is_disconnect(error, None, None),
                    dialect=dialect) from error
        try:
            yield proxied
        except BaseException as error:
            if isinstance(error, exc.DBAPIError):
                lost = error.connection_invalidated
            elif isinstance(error, MeshpointError):  # the hook refused, after a statement
                lost = proxied.driver_connection is None \
                    or proxied.driver_connection.is_closed()
            else:  # the socket, a cancellation mid-statement, a bug
                lost = True
            if lost:
                proxied.invalidate(error)  # terminated at once, never reused
            else:
                proxied.close()
            raise
        if self._parked is None and self._waiting == 0 and not self.closed:
            self._parked = proxied
        else:
            proxied.close()

    async def _run(self, body: Callable[[Connection], R], write: bool,
                   one_statement: bool, short: bool, tenant: str | None) -> R:
        # A tenant's transaction begins by setting the tenant, which lasts only a
        # transaction: so a tenant's one-statement write is a transaction too.
        autocommit = write and one_statement and tenant is None
        engine = self._autocommit if autocommit else self.engine if write else self._reader
        if tenant is not None:
            unscoped = body

            def body(conn: Connection) -> R:
                SET_TENANT.rows(conn, {"p_tenant": tenant})
                return unscoped(conn)

        async with contextlib.AsyncExitStack() as stack:
            # The connection's own context manager closes it, and finishes closing
            # even if this task is cancelled meanwhile; the wait counts the checkout.
            async with self._pool_wait():
                conn = await stack.enter_async_context(engine.connect())
            if autocommit:
                result: R = await conn.run_sync(body)
                return result
            async with conn.begin():
                result = await conn.run_sync(body)
                return result

    def before_migration(self, sync_conn: Connection, direction: str,
                         lock_timeout_s: float) -> None:
        """Migrations run under an advisory lock, so instances may start together,
        waited for ``lock_timeout_s`` at most (MigrationLockError naming its holder);
        an upgrade creates the schema ``schema=`` selected if it does not exist yet, so
        a fresh database needs no manual step."""
        take_migration_lock(sync_conn, lock_timeout_s)
        if direction != "upgrade":
            return
        if sync_conn.exec_driver_sql("SELECT current_schema()").scalar() is not None:
            return
        path = str(sync_conn.exec_driver_sql("SHOW search_path").scalar() or "")
        if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,62}", path):
            sync_conn.exec_driver_sql(f'CREATE SCHEMA IF NOT EXISTS "{path}"')

    async def check_tenant(self, tenant_id: str) -> None:
        with translate(f"checking that this role may act as tenant {tenant_id!r}"):
            await self.run(lambda conn: check_tenant_role(conn, tenant_id), write=False,
                           tenant=tenant_id)

    def _return_parked(self) -> None:
        if self._parked is not None:
            parked, self._parked = self._parked, None
            parked.close()

    async def dispose(self) -> None:
        await super().dispose()
        self._return_parked()
        await self.engine.dispose()


# -- asyncpg, awaited directly ----------------------------------------------------------

async def fetch(statement: Statement, native: PoolProxiedConnection, dialect: Dialect,
                params: dict[str, Any]) -> list[Any]:
    """Run ``statement`` with ``params`` on the asyncpg connection under ``native``
    (outside any transaction) and return its rows, decoded as the statement decodes
    them; for a tenant's statement (``p_tenant``), through its session function
    (:func:`~meshpoint.store.postgres_tenancy.session_function`), the
    tenant set first. asyncpg keeps the prepared statement in its own cache (and
    re-prepares it, outside a transaction, if a migration changed the tables). Its
    errors are raised as the SQLAlchemy exceptions its adapter would raise, with
    asyncpg's exception as ``orig`` (``sqlstate`` included)."""
    compiled: Compiled = statement.compiled(dialect)
    driver = native.driver_connection
    assert driver is not None, "a statement runs on an open connection"
    args = statement.bind(compiled, params)
    tenant = params.get("p_tenant")
    codes: list[int] = []
    try:
        if not statement.decodes(dialect):
            # Once per process: the result types asyncpg reports. (prepare() bypasses
            # asyncpg's statement cache, which fetch() uses.)
            prepared = await driver.prepare(compiled.sql)
            codes = [attr.type.oid for attr in prepared.get_attributes()]
        if tenant is None:
            fetched = await driver.fetch(compiled.sql, *args)
        else:
            name = await session_function(driver, statement, compiled)
            call = f"SELECT * FROM pg_temp.{name}(" + ", ".join(
                f"${n}" for n in range(1, len(args) + 2)) + ")"
            fetched = await driver.fetch(call, tenant, *args)
    except Exception as error:
        raise _asyncpg_error(compiled.sql, args, error, driver) from error
    return statement.decode(dialect, compiled, fetched, lambda: codes)


def _asyncpg_error(sql: str, args: Any, error: Exception, driver: Any) -> Exception:
    """asyncpg's ``error`` as the SQLAlchemy exception its adapter would raise, with
    ``connection_invalidated`` set when the connection cannot be used again. An
    error that is not the driver's (an ``OSError`` of the socket) is returned as it
    is, for :func:`meshpoint.store.engine.translate`."""
    import asyncpg

    lost = connection_lost(error, driver)
    if isinstance(error, asyncpg.IntegrityConstraintViolationError):
        kind: type[exc.DBAPIError] = exc.IntegrityError
    elif isinstance(error, asyncpg.DataError):
        kind = exc.DataError
    elif isinstance(error, asyncpg.exceptions.SyntaxOrAccessError):
        kind = exc.ProgrammingError
    elif isinstance(error, asyncpg.PostgresError):
        kind = exc.OperationalError if lost else exc.DatabaseError
    elif isinstance(error, asyncpg.InterfaceError | asyncpg.InternalClientError):
        # Such as "another operation is in progress": a connection whose protocol
        # state is unknown, for one the server terminated while it was idle.
        kind = exc.InterfaceError
    else:
        return error
    return kind(sql, args, error, connection_invalidated=lost)


def connection_lost(error: BaseException, driver: Any) -> bool:
    """Whether the asyncpg connection ``driver`` must be discarded after ``error``.

    An error the server reported about the statement (a unique key, a division by
    zero) leaves the connection usable; anything else (the socket, a protocol
    state, a cancellation mid-statement, the server shutting down) does not."""
    import asyncpg

    if driver.is_closed():
        return True
    if isinstance(error, asyncpg.PostgresConnectionError):
        return True
    if isinstance(error, asyncpg.PostgresError):
        state = str(getattr(error, "sqlstate", "") or "")
        return state.startswith(("08", "57P"))  # connection exception, shutdown
    return True
