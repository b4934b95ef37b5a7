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
"""

from __future__ import annotations

from collections import namedtuple
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, exc
from sqlalchemy.engine import Dialect
from sqlalchemy.sql import ClauseElement
from sqlalchemy.sql.compiler import SQLCompiler

Processor = Callable[[Any], Any] | None


@dataclass(frozen=True)
class _Compiled:
    sql: str
    names: tuple[str, ...]  # the bind parameter of each placeholder, in order
    defaults: dict[str, Any]  # values bound in the statement itself (literals)
    processors: tuple[Processor, ...]
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
        processors = tuple(sql.binds[name].type.dialect_impl(dialect).bind_processor(dialect)
                           for name in names)
        defaults = {name: bind.value for name, bind in sql.binds.items()
                    if not bind.required and bind.callable is None}
        columns = tuple(getattr(self.statement, "exported_columns", ()))
        row = namedtuple("Row", [str(c.key) for c in columns], rename=True) if columns else None
        compiled = _Compiled(sql.string, names, defaults, processors, row, columns)
        self._compiled[dialect.name] = compiled
        return compiled

    def _args(self, compiled: _Compiled, params: dict[str, Any]) -> tuple[Any, ...]:
        values = []
        for name, process in zip(compiled.names, compiled.processors, strict=True):
            value = params[name] if name in params else compiled.defaults[name]
            values.append(value if process is None or value is None else process(value))
        return tuple(values)

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
