"""PostgreSQL: how a transaction runs on asyncpg, and the fast paths that await
asyncpg directly.

A portable body runs through ``AsyncConnection.run_sync``: its statements await
the network through SQLAlchemy's greenlet bridge. Reads run REPEATABLE READ, READ
ONLY, so several SELECTs see one snapshot; a transaction that loses a deadlock or
serialization check is retried whole by the store.

The pause boundary's operations (a first checkpoint, a resolution, a restore, a
resumed task's end) are each one statement
(:mod:`meshpoint.store.postgres_queries`), chained through data-modifying CTEs or
subqueries, and run natively: :class:`PostgresFastPaths`
awaits asyncpg on a pooled connection of its own (:meth:`PostgresDatabase.native`),
with no BEGIN and COMMIT around a statement that is atomic by itself. Every
statement is a network round trip, and round trips are most of what a pause costs
here (measured in docs/store.md, *Performance*). A re-checkpoint (a resumed task
paused again, or a mid-turn checkpoint) is one statement too, instead of six. Each
is kept only while ``benchmarks/bench_hooks.py`` shows it pays, and the suite runs
with them on and off.
"""

from __future__ import annotations

import contextlib
import importlib.util
import re
from collections.abc import AsyncIterator, Callable
from typing import Any, TypeVar

from sqlalchemy import (
    exc,
)
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
from meshpoint.store import queries as q
from meshpoint.store import sa_internals as sa
from meshpoint.store.checks import check_agent
from meshpoint.store.engine import Database, translate
from meshpoint.store.hooks import PORTABLE, FastPaths, Portable
from meshpoint.store.postgres_migration_lock import take_migration_lock
from meshpoint.store.postgres_queries import (
    CLEANUP,
    FIRST_CHECKPOINT,
    JSON_TEXT,
    RECHECKPOINT,
    RESOLVE_ONE,
    RESTORE,
)
from meshpoint.store.postgres_tenancy import SET_TENANT, check_tenant_role, session_function
from meshpoint.store.results import Resolution
from meshpoint.store.rows import (
    EventRow,
    HeadRow,
    InvocationRow,
    RecordRow,
    RestoreRows,
    SubTaskRow,
    TaskRow,
    sub_task,
)
from meshpoint.store.sealing import Sealer
from meshpoint.store.statement import Compiled, Statement
from meshpoint.tls import URL_PARAMETERS, TlsConfig, postgres_ssl

R = TypeVar("R")

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
        because its record did not move the head (see postgres_queries.head_moved_or_fail)."""
        try:
            return await self._fetch(statement, _children_as_text(params))
        except exc.DBAPIError as error:
            if getattr(error.orig, "sqlstate", None) == "22012":
                return PORTABLE
            raise

    async def cleanup(self, params: dict[str, Any]) -> int | Portable:
        try:
            await self._fetch(CLEANUP[params["p_history"]], params)
        except exc.DBAPIError as error:
            if getattr(error.orig, "sqlstate", None) == "22012":  # refused: rolled back
                return PORTABLE
            raise
        return 1

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
    SUB_FIELDS)."""
    return {**params, **{
        param: [{**row, **{name: _json.dumps(row[name]) for name in names}}
                for row in params[param]]
        for param, names in JSON_TEXT.items()}}


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
        SQLAlchemy's pool and the return to it (the greenlet bridge, the pool's
        bookkeeping) outweigh asyncpg's own work for a resolution (docs/store.md,
        *Performance*). The others go back to the pool."""
        if self.closed:
            raise StoreError("the store is closed; open a new one with open_store()")
        proxied, self._parked = self._parked, None
        if proxied is None:
            dialect = self.engine.dialect
            try:
                async with self._pool_wait():
                    proxied = await self.engine.raw_connection()
            except sa.driver_errors(dialect) as error:
                # Connecting failed (the server is down, starting or stopping): raised
                # as SQLAlchemy raises it from Engine.connect(), for translate().
                raise sa.connect_error(dialect, error) from error
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

    def after_lock_wait(self, repeat: Callable[[], None]) -> None:
        """Under READ COMMITTED a statement that waited for a row's lock sees the rows
        its holder committed meanwhile, but the statements before it did not: they
        run again (a task's delete waits for its holder's re-checkpoint, whose new
        children committed after the deletes of the old ones)."""
        repeat()

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
