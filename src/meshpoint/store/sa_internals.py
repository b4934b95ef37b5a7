"""What the store uses of SQLAlchemy beyond its documented API, in one place.

The store runs its named statements lean (:mod:`meshpoint.store.statement`): on the
driver's cursor under a SQLAlchemy connection, without SQLAlchemy's execution path
(docs/store.md, *Performance*, says what that saves). SQLAlchemy still compiles
each statement and binds and decodes its values, and its errors are still
SQLAlchemy's; reaching those pieces from outside its execution path takes parts of
SQLAlchemy that it does not document as public (the compiler's bind parameters in
placeholder order, a type's processors for a dialect, the dialect's test for a lost
connection, the wrapping of a driver's error). Each is reached only through a
function of this module, and ``tests/unit/test_sa_internals.py`` checks each
against the installed SQLAlchemy, one test per function, so that a SQLAlchemy
release that changes one fails there, by name, rather than inside a store
operation. ``pyproject.toml`` pins the SQLAlchemy releases the suite runs on.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

from sqlalchemy import Connection, exc
from sqlalchemy.engine import Dialect
from sqlalchemy.sql import ClauseElement
from sqlalchemy.sql.compiler import SQLCompiler

#: A bind or result processor: a function of one value, or None for "as it is".
Processor = Callable[[Any], Any] | None


@dataclass(frozen=True)
class Positional:
    """A statement compiled for one dialect, its parameters in placeholder order."""

    #: The SQL, with the dialect's placeholders (``?``, ``$1``).
    sql: str
    #: The bind parameter of each placeholder, in order.
    names: tuple[str, ...]
    #: ``(placeholder index, processor)`` for each parameter whose type processes
    #: its value for the driver (JSON serialised, say).
    processors: tuple[tuple[int, Callable[[Any], Any]], ...]
    #: The values the statement binds itself (a literal, a column default): used
    #: when the caller's parameters do not name them.
    literals: dict[str, Any]


def compile_positional(clause: ClauseElement, dialect: Dialect) -> Positional:
    """Compile ``clause`` for ``dialect`` and read its bind parameters from the
    compiler: their order (``positiontup``), their types' bind processors for the
    dialect, and the values bound in the statement itself (a bind neither
    ``required`` nor ``callable``)."""
    compiled = clause.compile(dialect=dialect)
    assert isinstance(compiled, SQLCompiler), "a statement is SQL, not DDL"
    names = tuple(compiled.positiontup or ())
    binds = compiled.binds
    processors = tuple(
        (index, process) for index, name in enumerate(names)
        if (process := binds[name].type.dialect_impl(dialect).bind_processor(dialect))
        is not None)
    literals = {name: bind.value for name, bind in binds.items()
                if not bind.required and bind.callable is None}
    return Positional(compiled.string, names, processors, literals)


def result_columns(clause: ClauseElement) -> tuple[Any, ...]:
    """The columns a statement returns (a SELECT's, a RETURNING clause's), in order;
    empty for one that returns none."""
    return tuple(getattr(clause, "exported_columns", ()))


def result_processors(columns: tuple[Any, ...], dialect: Dialect,
                      type_codes: list[Any]) -> tuple[Processor, ...]:
    """Each result column's processor for ``dialect``, given the driver's type code
    of each (as the cursor's description reports it: a Float column decodes
    differently from a numeric or a float type code)."""
    return tuple(column.type.dialect_impl(dialect).result_processor(dialect, code)
                 for column, code in zip(columns, type_codes, strict=True))


def dbapi_connection(conn: Connection) -> Any:
    """The driver's (PEP 249) connection under a SQLAlchemy connection: sqlite3's,
    or SQLAlchemy's adapter of asyncpg, in the transaction SQLAlchemy began."""
    dbapi_conn = conn.connection.dbapi_connection
    assert dbapi_conn is not None, "a statement runs on an open connection"
    return dbapi_conn


def driver_errors(dialect: Dialect) -> type[Exception]:
    """The base class of the errors ``dialect``'s driver raises (PEP 249's Error)."""
    error: type[Exception] = dialect.loaded_dbapi.Error
    return error


def wrapped(sql: str | None, args: Any, error: Exception, dialect: Dialect, *,
            lost: bool = False) -> exc.StatementError:
    """A driver's ``error`` as SQLAlchemy raises it: ``IntegrityError``,
    ``OperationalError`` and the rest, by the driver's class, with the driver's
    error as ``orig`` (what :func:`meshpoint.store.engine.translate` reads);
    ``lost``: the connection was invalidated."""
    return exc.DBAPIError.instance(sql, args, error, driver_errors(dialect),
                                   connection_invalidated=lost, dialect=dialect)


def statement_error(conn: Connection, sql: str, args: Any, error: Exception,
                    dbapi_conn: Any, cursor: Any) -> exc.StatementError:
    """A driver's ``error`` from running ``sql`` on ``conn``, :func:`wrapped`; the
    connection is invalidated first if the dialect says the error lost it."""
    lost = conn.dialect.is_disconnect(cast(Any, error), dbapi_conn, cursor)
    if lost:
        conn.invalidate(error)
    return wrapped(sql, args, error, conn.dialect, lost=lost)


def connect_error(dialect: Dialect, error: Exception) -> exc.StatementError:
    """A driver's ``error`` from opening a connection, :func:`wrapped` as SQLAlchemy
    raises it from ``Engine.connect()`` (lost when the dialect calls it a
    disconnect)."""
    return wrapped(None, None, error, dialect,
                   lost=dialect.is_disconnect(cast(Any, error), None, None))


def sql_with_own_values_inline(clause: ClauseElement, dialect: Dialect) -> str:
    """``clause``'s SQL for ``dialect`` with the values the statement binds itself
    written inline and the caller's parameters (named ``p_...``) left as
    placeholders: how a statement is rendered for review (store/render.py)."""

    class Compiler(dialect.statement_compiler):  # type: ignore[name-defined, misc]
        def visit_bindparam(self, bindparam: Any, **kw: Any) -> str:
            if not bindparam.key.startswith("p_") and bindparam.value is not None \
                    and bindparam.callable is None:
                kw["literal_binds"] = True  # a value of the statement's own
            result: str = super().visit_bindparam(bindparam, **kw)
            return result

    sql: str = Compiler(dialect, clause).string
    return sql
