"""Engines for the store: which URL means which backend, and the dialect hooks.

Only two small things differ between the backends, and both live here:

* **SQLite** must be correct across processes on one host. Each connection
  uses WAL (readers never block the writer), a busy timeout (a writer waits for
  the lock instead of failing), foreign keys, and ``BEGIN IMMEDIATE`` for write
  transactions so the write lock is taken up front: two processes can never both
  read a sub-task as pending and then both claim it, and a transaction never
  fails half-way when it upgrades from reading to writing.
* **PostgreSQL** runs migrations under an advisory lock so that many instances
  starting at once do not race each other's DDL.

Driver errors are translated into :mod:`meshpoint.errors` by :func:`translate`.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, event, exc
from sqlalchemy.engine import URL, make_url
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.pool import StaticPool

from meshpoint import _json
from meshpoint.errors import (
    ConfigurationError,
    CorruptCheckpointError,
    MeshpointError,
    SchemaError,
    StoreError,
    StoreUnavailableError,
)

MIGRATIONS_DIR = Path(__file__).parent / "migrations"
#: Key of the execution option that selects SQLite's BEGIN mode.
SQLITE_BEGIN = "meshpoint_sqlite_begin"
_PG_MIGRATION_LOCK = 0x6D657368  # "mesh": the advisory lock id migrations take


def parse_url(url: str | URL) -> URL:
    """Normalise a store URL to an async driver, or raise ConfigurationError."""
    try:
        parsed = make_url(url)
    except exc.ArgumentError as error:
        raise ConfigurationError(
            f"cannot parse store URL {url!r}: {error}. Use sqlite+aiosqlite:///path.db, "
            "sqlite+aiosqlite:///:memory: or postgresql+asyncpg://user@host/db"
        ) from None
    backend, _, driver = parsed.drivername.partition("+")
    if backend == "sqlite" and driver in ("", "aiosqlite"):
        return parsed.set(drivername="sqlite+aiosqlite")
    if backend in ("postgresql", "postgres") and driver in ("", "asyncpg"):
        if importlib.util.find_spec("asyncpg") is None:
            raise ConfigurationError(
                "PostgreSQL needs the asyncpg driver: pip install 'meshpoint[postgres]'"
            )
        return parsed.set(drivername="postgresql+asyncpg")
    raise ConfigurationError(
        f"unsupported store URL scheme {parsed.drivername!r}: meshpoint runs on "
        "sqlite+aiosqlite:// and postgresql+asyncpg://"
    )


def is_memory_sqlite(url: URL) -> bool:
    return url.get_backend_name() == "sqlite" and url.database in (None, "", ":memory:")


def create_engine(url: URL, *, busy_timeout_s: float, schema: str | None,
                  pool_size: int) -> AsyncEngine:
    """Create the async engine for ``url`` with the backend's hooks installed."""
    kwargs: dict[str, Any] = {"json_serializer": _json.dumps, "json_deserializer": _json.loads}
    if url.get_backend_name() == "sqlite":
        if schema is not None:
            raise ConfigurationError("schema= is a PostgreSQL option; SQLite has one schema")
        if is_memory_sqlite(url):
            # One shared connection, or every checkout would see an empty database.
            kwargs.update(poolclass=StaticPool, connect_args={"check_same_thread": False})
        else:
            Path(url.database or "").expanduser().parent.mkdir(parents=True, exist_ok=True)
            kwargs.update(pool_size=pool_size, max_overflow=0,
                          connect_args={"timeout": busy_timeout_s})
        engine = create_async_engine(url, **kwargs)
        _install_sqlite_hooks(engine, memory=is_memory_sqlite(url), busy_timeout_s=busy_timeout_s)
        return engine
    connect_args: dict[str, Any] = {"timeout": busy_timeout_s}
    if schema is not None:
        connect_args["server_settings"] = {"search_path": schema}
    return create_async_engine(url, pool_size=pool_size, max_overflow=pool_size,
                               connect_args=connect_args, **kwargs)


def _install_sqlite_hooks(engine: AsyncEngine, *, memory: bool, busy_timeout_s: float) -> None:
    sync_engine = engine.sync_engine

    @event.listens_for(sync_engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # Take BEGIN away from pysqlite's legacy transaction control: we emit our own.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        if not memory:
            cursor.execute("PRAGMA journal_mode=WAL")
            # NORMAL in WAL mode: a commit survives a crash of any process; only a
            # power loss may drop the last transactions (never corrupts the file).
            cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.execute(f"PRAGMA busy_timeout={int(busy_timeout_s * 1000)}")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.close()

    @event.listens_for(sync_engine, "begin")
    def _on_begin(conn: Connection) -> None:
        mode = conn.get_execution_options().get(SQLITE_BEGIN, "DEFERRED")
        conn.exec_driver_sql(f"BEGIN {mode}")


# -- migrations -----------------------------------------------------------------------

def alembic_config() -> Config:
    """An Alembic config pointing at meshpoint's migrations (no ini file needed)."""
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    return config


def head_revision() -> str:
    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    assert head is not None, "meshpoint ships at least one migration"
    return head


def _run_alembic(sync_conn: Connection, direction: str, revision: str) -> None:
    from alembic import command

    if sync_conn.dialect.name == "postgresql":
        sync_conn.exec_driver_sql(f"SELECT pg_advisory_xact_lock({_PG_MIGRATION_LOCK})")
    config = alembic_config()
    config.attributes["connection"] = sync_conn
    getattr(command, direction)(config, revision)


def _current_revision(sync_conn: Connection) -> str | None:
    return MigrationContext.configure(sync_conn).get_current_revision()


async def migrate(engine: AsyncEngine, revision: str = "head") -> None:
    """Bring the database's schema up to ``revision`` (default: the newest)."""
    await _migrate(engine, "upgrade", revision)


async def downgrade(engine: AsyncEngine, revision: str) -> None:
    """Take the schema down to ``revision`` (``"base"`` drops every meshpoint table)."""
    await _migrate(engine, "downgrade", revision)


async def _migrate(engine: AsyncEngine, direction: str, revision: str) -> None:
    write_engine = engine.execution_options(**{SQLITE_BEGIN: "IMMEDIATE"})
    with translate(f"running the schema {direction} to {revision}"):
        async with write_engine.begin() as conn:
            await conn.run_sync(_run_alembic, direction, revision)


async def check_schema(engine: AsyncEngine) -> None:
    """Raise SchemaError unless the database is at this meshpoint's head revision."""
    with translate("reading the schema version"):
        async with engine.connect() as conn:
            current = await conn.run_sync(_current_revision)
    head = head_revision()
    if current != head:
        raise SchemaError(
            f"the database schema is at revision {current or 'none (empty database)'} but "
            f"this meshpoint needs {head}: run `meshpoint migrate` or open the store "
            "with migrate=True"
        )


# -- error translation ----------------------------------------------------------------

_UNAVAILABLE_MARKERS = ("database is locked", "connection refused", "could not connect",
                        "connection was closed", "connection is closed", "unable to open",
                        "the database system is", "terminating connection",
                        "cannot connect", "connect call failed")
_SCHEMA_MARKERS = ("no such table", "undefinedtable")


def is_retryable(error: BaseException) -> bool:
    """A PostgreSQL deadlock or serialization failure: the whole transaction may be retried."""
    return getattr(getattr(error, "orig", None), "sqlstate", None) in ("40P01", "40001")


@contextmanager
def translate(doing: str) -> Iterator[None]:
    """Turn driver errors raised while ``doing`` into meshpoint errors."""
    try:
        yield
    except MeshpointError:
        raise
    except (TimeoutError, OSError) as error:
        raise StoreUnavailableError(
            f"the database could not be reached while {doing}: {error}. Is it running, "
            "and is the store URL right?"
        ) from error
    except exc.DBAPIError as error:
        message = str(error.orig if error.orig is not None else error).lower()
        if error.connection_invalidated or any(m in message for m in _UNAVAILABLE_MARKERS):
            raise StoreUnavailableError(
                f"the database was unavailable while {doing}: {error.orig}. For SQLite, "
                "another process held the write lock past the busy timeout"
            ) from error
        if any(m in message for m in _SCHEMA_MARKERS) or (
                "relation" in message and "does not exist" in message):
            raise SchemaError(
                f"the schema is missing a table while {doing}: {error.orig}. Run "
                "`meshpoint migrate` or open the store with migrate=True"
            ) from error
        raise StoreError(f"the database failed while {doing}: {error.orig}") from error
    except exc.SQLAlchemyError as error:
        raise StoreError(f"the store failed while {doing}: {error}") from error
    except ValueError as error:
        # A JSON column that no longer parses (SQLite stores JSON as text).
        raise CorruptCheckpointError(
            f"a stored row does not decode while {doing}: {error}; it was not used"
        ) from error
