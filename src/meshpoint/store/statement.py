"""Named statements: what the store runs, and how it runs them lean.

Every statement of the store is a :class:`Statement`: a SQLAlchemy Core construct
with a name and one line saying what it does. The portable statements are in
:mod:`meshpoint.store.queries`, a dialect's own in its module
(:mod:`meshpoint.store.postgres`). Each is rendered, for each dialect it runs on,
into ``store/sql/<name>.<dialect>.sql`` (see :mod:`meshpoint.store.render`), so
the SQL can be reviewed as SQL.

A statement runs *lean*. SQLAlchemy's execution path (execution context,
parameter setup, result metadata, events) costs as much as a short statement's
own work: nothing for an operator's query, much of a pause-boundary write
(docs/store.md, *Performance*, has the measurements). So:

* the statement is compiled by SQLAlchemy for the connection's dialect, once per
  dialect;
* its parameters go through the bind processors SQLAlchemy would apply (the JSON
  serializer, for one), its result columns through the same result processors;
* it is executed on the PEP 249 connection under the SQLAlchemy connection:
  sqlite3's, or SQLAlchemy's adapter of asyncpg, which keeps asyncpg's prepared
  statement cache and the transaction SQLAlchemy began;
* driver errors are raised as SQLAlchemy's (``IntegrityError`` and the rest), for
  :func:`meshpoint.store.engine.translate`; a connection the driver reports as
  lost, or whose statement was interrupted by a cancellation, is invalidated, as
  SQLAlchemy does. (Unlike SQLAlchemy, an error of a bind processor is not
  wrapped: the store passes checked JSON only.)

A dialect may also run a statement outside any transaction on its driver's own
connection (PostgreSQL's fast paths await asyncpg directly): :meth:`compiled`,
:meth:`bind` and :meth:`decode` are what such a runner needs.

What this takes of SQLAlchemy beyond its documented API is reached through
:mod:`meshpoint.store.sa_internals` only, where a unit test checks each piece.
"""

from __future__ import annotations

import operator
from collections import namedtuple
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection
from sqlalchemy.engine import Dialect
from sqlalchemy.sql import ClauseElement

from meshpoint.store import sa_internals as sa
from meshpoint.store.sa_internals import Processor

#: The dialects a portable statement runs on.
DIALECTS = ("sqlite", "postgresql")


@dataclass(frozen=True)
class Compiled:
    """A statement compiled for one dialect, with what binding and decoding need."""

    sql: str
    names: tuple[str, ...]  # the bind parameter of each placeholder, in order
    defaults: dict[str, Any]  # values bound in the statement itself (literals)
    # The placeholders' values from a dict by bind name, in one call (always a tuple).
    getter: Callable[[dict[str, Any]], tuple[Any, ...]]
    processors: tuple[tuple[int, Callable[[Any], Any]], ...]  # (placeholder, processor)
    row: Any  # a namedtuple class, or None for a statement without result columns
    columns: tuple[Any, ...]  # the result columns, whose types decode the values


class Statement:
    """One named statement of the store (see the module docstring).

    ``name`` names its SQL file; ``doc`` is the one line on what it does;
    ``dialects`` are those it runs on (a dialect's own statement names only its
    dialect); ``row``, a NamedTuple class whose fields are the result columns in
    order, is the type of the rows it returns (by default an anonymous one).
    Creating a statement registers it; names are unique.
    """

    def __init__(self, name: str, doc: str, clause: ClauseElement, *,
                 dialects: Sequence[str] = DIALECTS, row: Any = None) -> None:
        if name in _REGISTRY:
            raise ValueError(f"statement {name!r} is defined twice")
        if "\n" in doc or not doc.endswith("."):
            raise ValueError(f"statement {name!r}: its doc is one sentence on one line")
        self.name = name
        self.doc = doc
        self.clause: Any = clause
        self.dialects = tuple(dialects)
        self._row = row
        self._compiled: dict[str, Compiled] = {}
        # Result processors, per dialect: some depend on the type the driver reports.
        self._results: dict[str, tuple[Processor, ...]] = {}
        _REGISTRY[name] = self

    def __repr__(self) -> str:
        return f"Statement({self.name!r})"

    # -- compiling, binding, decoding ----------------------------------------------------

    def compiled(self, dialect: Dialect) -> Compiled:
        """The statement compiled for ``dialect`` (once per dialect name)."""
        compiled = self._compiled.get(dialect.name)
        if compiled is not None:
            return compiled
        assert dialect.name in self.dialects, f"{self.name} does not run on {dialect.name}"
        sql = sa.compile_positional(self.clause, dialect)
        columns = sa.result_columns(self.clause)
        keys = [str(c.key) for c in columns]
        row: Any = self._row
        if row is not None:
            assert list(row._fields) == keys, f"{self.name}: {row.__name__} is not {keys}"
        elif columns:
            row = namedtuple("Row", keys, rename=True)  # type: ignore[misc, no-redef]
        compiled = Compiled(sql.sql, sql.names, sql.literals, _tuple_getter(sql.names),
                            sql.processors, row, columns)
        self._compiled[dialect.name] = compiled
        return compiled

    def bind(self, compiled: Compiled, params: dict[str, Any]) -> tuple[Any, ...]:
        """The placeholders' values from ``params`` (a dict by bind name), processed."""
        values = compiled.getter({**compiled.defaults, **params} if compiled.defaults
                                 else params)
        if not compiled.processors:
            return values
        processed = list(values)
        for index, process in compiled.processors:
            if processed[index] is not None:
                processed[index] = process(processed[index])
        return tuple(processed)

    def decodes(self, dialect: Dialect) -> bool:
        """Whether :meth:`decode` knows the driver's result types for ``dialect``
        (a statement without result columns needs none)."""
        return dialect.name in self._results or self.compiled(dialect).row is None

    def decode(self, dialect: Dialect, compiled: Compiled, raw: Sequence[Sequence[Any]],
               type_codes: Callable[[], Sequence[Any]]) -> list[Any]:
        """Rows of driver values as named tuples of Python values. ``type_codes``
        gives the driver's type of each result column; it is asked once per dialect
        (a Float column comes back as float or Decimal depending on it)."""
        make = compiled.row
        if make is None:
            return []
        results = self._results.get(dialect.name)
        if results is None:
            results = self._results[dialect.name] = sa.result_processors(
                compiled.columns, dialect, list(type_codes()))
        return [make(*(value if process is None else process(value)
                       for value, process in zip(row, results, strict=True)))
                for row in raw]

    # -- running on a transaction's connection -------------------------------------------

    def rows(self, conn: Connection, params: dict[str, Any]) -> list[Any]:
        """Execute with ``params`` (a dict by bind name) and return every row."""
        compiled = self.compiled(conn.dialect)
        args = self.bind(compiled, params)
        return self._execute(conn, compiled,
                             lambda cursor: cursor.execute(compiled.sql, args), args)

    def first(self, conn: Connection, params: dict[str, Any]) -> Any:
        """The first row, or None."""
        rows = self.rows(conn, params)
        return rows[0] if rows else None

    def scalar(self, conn: Connection, params: dict[str, Any]) -> Any:
        """The first column of the first row, or None."""
        rows = self.rows(conn, params)
        return rows[0][0] if rows else None

    def rowcount(self, conn: Connection, params: dict[str, Any]) -> int:
        """Execute a statement that returns no rows; how many rows it changed (the
        driver's count, cheaper than a RETURNING clause: docs/store.md, *Performance*)."""
        compiled = self.compiled(conn.dialect)
        args = self.bind(compiled, params)
        count = 0

        def call(cursor: Any) -> None:
            nonlocal count
            cursor.execute(compiled.sql, args)
            count = cursor.rowcount

        self._execute(conn, compiled, call, args)
        return count

    def execute_many(self, conn: Connection, params: Sequence[dict[str, Any]]) -> None:
        """Execute once per parameter dict (an INSERT of several rows)."""
        compiled = self.compiled(conn.dialect)
        many = [self.bind(compiled, p) for p in params]
        self._execute(conn, compiled, lambda cursor: cursor.executemany(compiled.sql, many),
                      many)

    def _execute(self, conn: Connection, compiled: Compiled,
                 call: Callable[[Any], Any], args: Any) -> list[Any]:
        errors = sa.driver_errors(conn.dialect)
        dbapi_conn = sa.dbapi_connection(conn)
        cursor = dbapi_conn.cursor()
        try:
            call(cursor)
            description = cursor.description
            if compiled.row is None or description is None:
                return []
            fetched = cursor.fetchall()
        except errors as error:
            raise sa.statement_error(conn, compiled.sql, args, error, dbapi_conn,
                                     cursor) from error
        except BaseException:
            # Cancelled mid-statement: the driver may still be busy with it, so the
            # connection must not go back to the pool (SQLAlchemy does the same).
            conn.invalidate()
            raise
        finally:
            cursor.close()
        return self.decode(conn.dialect, compiled, fetched,
                           lambda: [kind[1] for kind in description])


_REGISTRY: dict[str, Statement] = {}


def registered() -> Iterator[Statement]:
    """Every statement defined so far, by name (import the modules that define
    them first: :mod:`meshpoint.store.queries`, :mod:`meshpoint.store.postgres`)."""
    return iter(sorted(_REGISTRY.values(), key=lambda s: s.name))


def _tuple_getter(names: tuple[str, ...]) -> Callable[[dict[str, Any]], tuple[Any, ...]]:
    """``operator.itemgetter(*names)``, which returns a tuple for any number of names
    (itemgetter returns the bare value for one name)."""
    if not names:
        return lambda _params: ()
    if len(names) == 1:
        name = names[0]
        return lambda params: (params[name],)
    return operator.itemgetter(*names)
