"""One test per piece of SQLAlchemy the store takes beyond its documented API
(src/meshpoint/store/sa_internals.py): a SQLAlchemy release that changes one fails
here, by the name of what changed, before any store operation misbehaves.

No database: the dialects compile offline, and the connection tests use SQLite in
memory.
"""

from __future__ import annotations

import decimal
import json
import sqlite3
from collections.abc import Callable, Iterator

import pytest
from sqlalchemy import (
    JSON,
    Column,
    Connection,
    Float,
    Integer,
    MetaData,
    Table,
    bindparam,
    create_engine,
    exc,
    insert,
    select,
)
from sqlalchemy.dialects.sqlite.pysqlite import SQLiteDialect_pysqlite
from sqlalchemy.engine import Dialect
from sqlalchemy.ext.asyncio import create_async_engine

from meshpoint.store import sa_internals as sa

T = Table("t", MetaData(), Column("a", Integer), Column("doc", JSON), Column("f", Float))
INSERT = insert(T).values(a=bindparam("p_a"), doc=bindparam("p_doc"))
SELECT = (select(T.c.a, T.c.doc).where(T.c.a == 5).where(T.c.doc == bindparam("p_doc"))
          .where(T.c.f == bindparam("p_f", callable_=lambda: 1.0)))


def sqlite_dialect() -> Dialect:
    """The dialect the store's SQLite engine has (sqlite3, ``?`` placeholders)."""
    return create_engine("sqlite://").dialect


def asyncpg_dialect() -> Dialect:
    """The dialect the store's PostgreSQL engine has (asyncpg, ``$n`` placeholders);
    building the engine connects to nothing."""
    return create_async_engine("postgresql+asyncpg://meshpoint@localhost/none").dialect


@pytest.fixture
def conn() -> Iterator[Connection]:
    engine = create_engine("sqlite://")
    with engine.connect() as connection:
        yield connection
    engine.dispose()


@pytest.mark.parametrize(("dialect", "sql"), [
    (sqlite_dialect, "INSERT INTO t (a, doc) VALUES (?, ?)"),
    (asyncpg_dialect, "INSERT INTO t (a, doc) VALUES ($1::INTEGER, $2::JSON)")])
def test_compile_positional_names_each_placeholder_in_order(dialect: Callable[[], Dialect],
                                                            sql: str) -> None:
    # SQLCompiler.positiontup and .string
    compiled = sa.compile_positional(INSERT, dialect())
    assert compiled.sql == sql
    assert compiled.names == ("p_a", "p_doc")


@pytest.mark.parametrize("dialect", [sqlite_dialect, asyncpg_dialect])
def test_compile_positional_finds_each_types_bind_processor(dialect: Callable[[], Dialect]) -> None:
    # TypeEngine.dialect_impl(dialect).bind_processor(dialect), through SQLCompiler.binds
    compiled = sa.compile_positional(INSERT, dialect())
    [(index, process)] = compiled.processors  # JSON serialises; Integer passes as it is
    assert index == 1
    serialised = process({"k": [1, "two"]})
    assert isinstance(serialised, str) and json.loads(serialised) == {"k": [1, "two"]}


def test_compile_positional_keeps_the_values_the_statement_binds_itself() -> None:
    # BindParameter.required, .callable and .value, through SQLCompiler.binds
    compiled = sa.compile_positional(SELECT, sqlite_dialect())
    assert compiled.names == ("a_1", "p_doc", "p_f")
    assert compiled.literals["a_1"] == 5
    assert "p_doc" not in compiled.literals  # required: the caller's
    assert "p_f" not in compiled.literals  # a callable's value is not the statement's


def test_result_columns_are_what_a_statement_returns_in_order() -> None:
    # exported_columns of a SELECT, of an INSERT ... RETURNING, of a plain INSERT
    assert [c.key for c in sa.result_columns(SELECT)] == ["a", "doc"]
    assert [c.key for c in sa.result_columns(insert(T).returning(T.c.f, T.c.a))] == ["f", "a"]
    assert sa.result_columns(INSERT) == ()


def test_result_processors_decode_by_the_drivers_type_codes() -> None:
    # TypeEngine.dialect_impl(dialect).result_processor(dialect, coltype)
    integer, document = sa.result_processors(sa.result_columns(SELECT), sqlite_dialect(),
                                             [None, None])
    assert integer is None
    assert document is not None and document('{"k": [1]}') == {"k": [1]}
    pg = asyncpg_dialect()
    [from_numeric] = sa.result_processors((T.c.f,), pg, [1700])  # numeric: a Decimal
    assert from_numeric is not None and from_numeric(decimal.Decimal("1.5")) == 1.5
    assert sa.result_processors((T.c.f,), pg, [701]) == (None,)  # float8: a float already


def test_dbapi_connection_is_the_drivers_own(conn: Connection) -> None:
    # Connection.connection.dbapi_connection
    driver = sa.dbapi_connection(conn)
    assert isinstance(driver, sqlite3.Connection)
    assert driver.execute("SELECT 41 + 1").fetchone() == (42,)


def test_driver_errors_is_the_drivers_error_class() -> None:
    # Dialect.loaded_dbapi.Error
    assert sa.driver_errors(sqlite_dialect()) is sqlite3.Error
    pg = asyncpg_dialect()
    assert issubclass(pg.loaded_dbapi.OperationalError, sa.driver_errors(pg))


def test_wrapped_raises_a_drivers_error_as_sqlalchemys() -> None:
    # DBAPIError.instance
    cause = sqlite3.IntegrityError("UNIQUE constraint failed: t.a")
    error = sa.wrapped("INSERT", (1,), cause, sqlite_dialect())
    assert type(error) is exc.IntegrityError
    assert error.orig is cause and not error.connection_invalidated
    assert sa.wrapped("INSERT", (1,), cause, sqlite_dialect(), lost=True).connection_invalidated


def test_statement_error_keeps_a_connection_the_error_did_not_lose(conn: Connection) -> None:
    # Dialect.is_disconnect (False), DBAPIError.instance
    driver = sa.dbapi_connection(conn)
    cursor = driver.cursor()
    with pytest.raises(sqlite3.OperationalError) as raised:
        cursor.execute("SELEC 1")
    error = sa.statement_error(conn, "SELEC 1", (), raised.value, driver, cursor)
    assert type(error) is exc.OperationalError and error.orig is raised.value
    assert not error.connection_invalidated and not conn.invalidated


def test_statement_error_invalidates_a_lost_connection(conn: Connection) -> None:
    # Dialect.is_disconnect (True), Connection.invalidate
    driver = sa.dbapi_connection(conn)
    lost = sqlite3.ProgrammingError("Cannot operate on a closed database.")
    error = sa.statement_error(conn, "SELECT 1", (), lost, driver, driver.cursor())
    assert type(error) is exc.ProgrammingError
    assert error.connection_invalidated and conn.invalidated


@pytest.mark.parametrize("dialect", [sqlite_dialect, asyncpg_dialect])
def test_connect_error_is_raised_as_engine_connect_raises_it(
        dialect: Callable[[], Dialect]) -> None:
    # DBAPIError.instance without a statement; Dialect.is_disconnect without a connection
    d = dialect()
    cause = d.loaded_dbapi.OperationalError("could not connect")
    error = sa.connect_error(d, cause)
    assert type(error) is exc.OperationalError and error.orig is cause
    assert error.statement is None


def test_sql_with_own_values_inline_leaves_the_callers_parameters() -> None:
    # a subclass of Dialect.statement_compiler overriding visit_bindparam
    sql = sa.sql_with_own_values_inline(SELECT, SQLiteDialect_pysqlite(paramstyle="named"))
    assert " ".join(sql.split()) == (
        "SELECT t.a, t.doc FROM t WHERE t.a = 5 AND t.doc = :p_doc AND t.f = :p_f")
