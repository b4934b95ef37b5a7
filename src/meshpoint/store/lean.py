"""The hot statements, executed lean: compiled once, run on the DBAPI connection.

SQLAlchemy's execution path (execution context, parameter setup, result
metadata, events) costs tens of microseconds per statement. That is nothing
for an operator's query and most of the budget of a pause-boundary write: a
first checkpoint of 20 messages took p50 0.41 ms on SQLite through it and
0.21 ms through the driver, and 0.76 ms against 0.53 ms on PostgreSQL. So the
few statements on that path are run by :class:`Lean`:

* the statement is still a named SQLAlchemy Core statement of
  :mod:`meshpoint.store.queries`, compiled by SQLAlchemy for the connection's
  dialect (once per dialect);
* its parameters go through the same bind processors SQLAlchemy would apply (the
  JSON serializer, for one), its result columns through the same result
  processors;
* it is executed on the PEP 249 connection under the SQLAlchemy connection:
  sqlite3's, or SQLAlchemy's adapter of asyncpg, which keeps asyncpg's prepared
  statement cache and the transaction SQLAlchemy began;
* driver errors are raised as SQLAlchemy's (``IntegrityError`` and the rest); a
  connection the driver reports as lost, or whose statement was interrupted by a
  cancellation, is invalidated, as SQLAlchemy does. (Unlike SQLAlchemy, an error
  of a bind processor is not wrapped: the store passes checked JSON only.)

On PostgreSQL the statements of a one-statement write go one step further:
:meth:`Lean.fetch` awaits asyncpg itself (see
:meth:`meshpoint.store.engine.AsyncDatabase.native`). Through SQLAlchemy's
adapter, every statement crossed the greenlet bridge and the adapter's cursor:
0.3 ms of a 0.8 ms first checkpoint, measured with cProfile and with asyncpg
alone. asyncpg keeps the prepared statement in its own cache (and re-prepares
it, outside a transaction, if a migration changed the tables); its errors
become the same SQLAlchemy exceptions, with asyncpg's exception as ``orig``
(its ``sqlstate`` included).
"""

from __future__ import annotations

import operator
from collections import namedtuple
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, exc
from sqlalchemy.engine import Dialect
from sqlalchemy.pool import PoolProxiedConnection
from sqlalchemy.sql import ClauseElement
from sqlalchemy.sql.compiler import SQLCompiler

Processor = Callable[[Any], Any] | None


@dataclass(frozen=True)
class _Compiled:
    sql: str
    names: tuple[str, ...]  # the bind parameter of each placeholder, in order
    defaults: dict[str, Any]  # values bound in the statement itself (literals)
    # The placeholders' values from a dict by bind name, in one call (always a tuple).
    getter: Callable[[dict[str, Any]], tuple[Any, ...]]
    processors: tuple[tuple[int, Callable[[Any], Any]], ...]  # (placeholder, processor)
    row: Any  # a namedtuple class, or None for a statement without result columns
    columns: tuple[Any, ...]  # the result columns, whose types decode the values


class Lean:
    """One named statement, run on the driver connection (see the module docstring)."""

    def __init__(self, statement: ClauseElement) -> None:
        self.statement = statement
        self._compiled: dict[str, _Compiled] = {}
        # Result processors, per dialect: some depend on the type the driver reports.
        self._results: dict[str, tuple[Processor, ...]] = {}

    def _compile(self, dialect: Dialect) -> _Compiled:
        compiled = self._compiled.get(dialect.name)
        if compiled is not None:
            return compiled
        sql = self.statement.compile(dialect=dialect)
        assert isinstance(sql, SQLCompiler), "Lean runs SQL statements, not DDL"
        names = tuple(sql.positiontup or ())
        processors = tuple(
            (index, process) for index, name in enumerate(names)
            if (process := sql.binds[name].type.dialect_impl(dialect).bind_processor(dialect))
            is not None)
        defaults = {name: bind.value for name, bind in sql.binds.items()
                    if not bind.required and bind.callable is None}
        columns = tuple(getattr(self.statement, "exported_columns", ()))
        row = namedtuple("Row", [str(c.key) for c in columns], rename=True) if columns else None
        compiled = _Compiled(sql.string, names, defaults, _tuple_getter(names), processors,
                             row, columns)
        self._compiled[dialect.name] = compiled
        return compiled

    def _args(self, compiled: _Compiled, params: dict[str, Any]) -> tuple[Any, ...]:
        values = compiled.getter({**compiled.defaults, **params} if compiled.defaults
                                 else params)
        if not compiled.processors:
            return values
        processed = list(values)
        for index, process in compiled.processors:
            if processed[index] is not None:
                processed[index] = process(processed[index])
        return tuple(processed)

    def rows(self, conn: Connection, params: dict[str, Any]) -> list[Any]:
        """Execute with ``params`` (a dict by bind name) and return every row."""
        compiled = self._compile(conn.dialect)
        args = self._args(compiled, params)
        return self._execute(conn, compiled,
                             lambda cursor: cursor.execute(compiled.sql, args), args)

    def execute_many(self, conn: Connection, params: Sequence[dict[str, Any]]) -> None:
        """Execute once per parameter dict (an INSERT of several rows)."""
        compiled = self._compile(conn.dialect)
        many = [self._args(compiled, p) for p in params]
        self._execute(conn, compiled, lambda cursor: cursor.executemany(compiled.sql, many),
                      many)

    async def fetch(self, native: PoolProxiedConnection, dialect: Dialect,
                    params: dict[str, Any]) -> list[Any]:
        """Execute with ``params`` on the asyncpg connection under ``native`` (outside
        any transaction) and return every row. Raises SQLAlchemy's exceptions; the
        caller invalidates the connection when :func:`connection_lost` says so."""
        compiled = self._compile(dialect)
        driver = native.driver_connection
        assert driver is not None, "a Lean statement runs on an open connection"
        args = self._args(compiled, params)
        results = self._results.get(dialect.name)
        try:
            if results is None and compiled.row is not None:
                # Once per process: the result types asyncpg reports (a Float column
                # comes back as float or Decimal depending on them).
                prepared = await driver.prepare(compiled.sql)
                results = self._results[dialect.name] = tuple(
                    column.type.dialect_impl(dialect).result_processor(dialect, attr.type.oid)
                    for column, attr in zip(compiled.columns, prepared.get_attributes(),
                                            strict=True))
            fetched = await driver.fetch(compiled.sql, *args)
        except Exception as error:
            raise _asyncpg_error(compiled.sql, args, error, driver) from error
        if compiled.row is None or results is None:
            return []
        make = compiled.row
        return [make(*(value if process is None else process(value)
                       for value, process in zip(raw, results, strict=True)))
                for raw in fetched]

    def _execute(self, conn: Connection, compiled: _Compiled,
                 call: Callable[[Any], Any], args: Any) -> list[Any]:
        dbapi = conn.dialect.loaded_dbapi
        dbapi_conn = conn.connection.dbapi_connection
        assert dbapi_conn is not None, "a Lean statement runs on an open connection"
        cursor = dbapi_conn.cursor()
        try:
            call(cursor)
            description = cursor.description
            if compiled.row is None or description is None:
                return []
            fetched = cursor.fetchall()
        except dbapi.Error as error:
            lost = conn.dialect.is_disconnect(error, dbapi_conn, cursor)
            if lost:
                conn.invalidate(error)
            raise exc.DBAPIError.instance(compiled.sql, args, error, dbapi.Error,
                                          connection_invalidated=lost,
                                          dialect=conn.dialect) from error
        except BaseException:
            # Cancelled mid-statement: the driver may still be busy with it, so the
            # connection must not go back to the pool (SQLAlchemy does the same).
            conn.invalidate()
            raise
        finally:
            cursor.close()
        make = compiled.row
        results = self._results.get(conn.dialect.name)
        if results is None:
            results = self._results[conn.dialect.name] = tuple(
                column.type.dialect_impl(conn.dialect).result_processor(conn.dialect, kind[1])
                for column, kind in zip(compiled.columns, description, strict=True))
        return [make(*(value if process is None else process(value)
                       for value, process in zip(raw, results, strict=True)))
                for raw in fetched]


def _tuple_getter(names: tuple[str, ...]) -> Callable[[dict[str, Any]], tuple[Any, ...]]:
    """``operator.itemgetter(*names)``, which returns a tuple for any number of names
    (itemgetter returns the bare value for one name)."""
    if not names:
        return lambda _params: ()
    if len(names) == 1:
        name = names[0]
        return lambda params: (params[name],)
    return operator.itemgetter(*names)


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
