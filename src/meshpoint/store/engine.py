"""What every database of the store shares: which URL means which backend, the
contract of running one transaction, migrations, and the one place driver errors
become meshpoint's.

The store writes every operation once, as a synchronous function of a SQLAlchemy
:class:`~sqlalchemy.Connection` that runs named statements on it (see
:mod:`meshpoint.store.statement`); a :class:`Database` runs that function as one
transaction without blocking the event loop. How is the dialect's business:

* :mod:`meshpoint.store.sqlite` runs the whole transaction on a worker thread
  (or inline, when it is short and the lock is free), and keeps SQLite's
  write-ahead log short;
* :mod:`meshpoint.store.postgres` runs it on asyncpg through SQLAlchemy's greenlet
  bridge, and has the fast paths that await asyncpg directly.

Driver errors reach :func:`translate` as SQLAlchemy's exceptions (each dialect
module raises its driver's errors in that form) and leave it as
:mod:`meshpoint.errors`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, exc
from sqlalchemy.engine import URL, make_url

from meshpoint._redact import redact_url
from meshpoint.errors import (
    ConfigurationError,
    CorruptCheckpointError,
    MeshpointError,
    SchemaError,
    StoreError,
    StoreUnavailableError,
    TlsError,
)
from meshpoint.store.hooks import NO_FAST_PATHS, FastPaths
from meshpoint.tls import NO_TLS, tls_failure

R = TypeVar("R")
MIGRATIONS_DIR = Path(__file__).parent / "migrations"
_URL_HELP = ("sqlite:///path.db, sqlite:///:memory: or "
             "postgresql+asyncpg://user@host:5432/db (postgresql:// and postgres:// "
             "mean the same)")


def parse_url(url: str | URL) -> URL:
    """Normalise a store URL, or raise ConfigurationError.

    ``sqlite:///path.db`` is the embedded default (``sqlite+aiosqlite://`` and
    ``sqlite+pysqlite://``, which earlier versions documented, mean the same);
    ``postgresql://`` and ``postgresql+asyncpg://`` run on asyncpg.
    """
    try:
        parsed = make_url(url)
    except (exc.ArgumentError, ValueError) as error:  # ValueError: a port not a number
        shown = redact_url(url)  # the error may quote the URL: say it without credentials
        raise ConfigurationError(
            f"cannot parse store URL {shown!r}: {str(error).replace(str(url), shown)}. "
            f"Use {_URL_HELP}") from None
    backend, _, driver = parsed.drivername.partition("+")
    if backend == "sqlite" and driver in ("", "aiosqlite", "pysqlite"):
        return parsed.set(drivername="sqlite+pysqlite")
    if backend in ("postgresql", "postgres") and driver in ("", "asyncpg"):
        return parsed.set(drivername="postgresql+asyncpg")
    raise ConfigurationError(
        f"unsupported store URL scheme {parsed.drivername!r}: meshpoint runs on "
        f"{_URL_HELP}")


class Database:
    """A connection pool of one dialect, and the way to run one transaction on it."""

    dialect: str
    #: The SQLAlchemy engine (an AsyncEngine on PostgreSQL), for tests and tools.
    engine: Any
    closed = False
    #: What this dialect does faster than the portable bodies (see hooks.py).
    fast_paths: FastPaths = NO_FAST_PATHS

    async def run(self, body: Callable[[Connection], R], *, write: bool,
                  one_statement: bool = False, short: bool = False,
                  tenant: str | None = None) -> R:
        """Run ``body`` in one transaction: committed if it returns, rolled back if
        it raises. ``write`` transactions take SQLite's write lock up front; the
        others see one consistent snapshot of the database.

        ``one_statement`` promises that ``body`` writes with a single statement and
        otherwise only reads (to explain a refusal). PostgreSQL then runs it without
        BEGIN and COMMIT: a statement is atomic by itself, and the two round trips
        were most of a short write's time. SQLite ignores it (its write lock must be
        taken up front either way).

        ``short`` promises that ``body`` touches a few rows by key (a checkpoint, a
        resolution, a restore): SQLite may then run it on the event loop's thread.
        PostgreSQL ignores it.

        ``tenant``: the transaction is that tenant's. PostgreSQL sets it first, for
        its row-level security policies (migration 0009); SQLite has none."""
        if self.closed:
            raise StoreError("the store is closed; open a new one with open_store()")
        return await self._run(body, write, one_statement, short, tenant)

    async def _run(self, body: Callable[[Connection], R], write: bool,
                   one_statement: bool, short: bool, tenant: str | None) -> R:
        raise NotImplementedError

    def before_migration(self, sync_conn: Connection, direction: str,
                         lock_timeout_s: float) -> None:
        """Called in the migration's transaction before Alembic runs (PostgreSQL
        takes a lock there so that many instances may start at once, waiting
        ``lock_timeout_s`` for it at most)."""

    def after_lock_wait(self, repeat: Callable[[], None]) -> None:
        """Called in a write transaction after a statement that may have waited for
        another writer's lock on a row, with the statements before it that must run
        again if that writer committed rows they could not see. SQLite runs one
        writer at a time, whose write lock is taken up front: nothing to repeat.
        (A dialect's own need, not a fast path: it holds with ``fast_paths=False``.)"""

    async def check_tenant(self, tenant_id: str) -> None:
        """Raise TenantRoleError if this database would not let the connected role
        act as ``tenant_id`` (PostgreSQL's tenant roles; SQLite has no roles)."""

    async def dispose(self) -> None:
        self.closed = True


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


#: How long a migration waits for the lock another session holds, by default.
MIGRATION_LOCK_TIMEOUT_S = 60.0


def _alembic(db: Database, direction: str, revision: str,
             lock_timeout_s: float) -> Callable[[Connection], None]:
    def body(sync_conn: Connection) -> None:
        from alembic import command

        db.before_migration(sync_conn, direction, lock_timeout_s)
        config = alembic_config()
        config.attributes["connection"] = sync_conn
        getattr(command, direction)(config, revision)

    return body


async def migrate(db: Database, revision: str = "head", *,
                  lock_timeout_s: float = MIGRATION_LOCK_TIMEOUT_S) -> None:
    """Bring the database's schema up to ``revision`` (default: the newest). A schema
    already at the newest is left alone without taking the migrations' lock (which
    any role can hold: a runtime role holding it stops no store that needs no
    migration); otherwise the lock is waited for ``lock_timeout_s`` at most
    (MigrationLockError)."""
    if revision == "head" and await current_revision(db) == head_revision():
        return
    with translate(f"migrating the schema to {revision}"):
        await db.run(_alembic(db, "upgrade", revision, lock_timeout_s), write=True)


async def downgrade(db: Database, revision: str, *,
                    lock_timeout_s: float = MIGRATION_LOCK_TIMEOUT_S) -> None:
    """Take the schema down to ``revision`` (``"base"`` drops every meshpoint table)."""
    with translate(f"downgrading the schema to {revision}"):
        await db.run(_alembic(db, "downgrade", revision, lock_timeout_s), write=True)


def _current_revision(sync_conn: Connection) -> str | None:
    return MigrationContext.configure(sync_conn).get_current_revision()


async def current_revision(db: Database) -> str | None:
    """The Alembic revision the database is at (None for an empty database)."""
    with translate("reading the schema version"):
        return await db.run(_current_revision, write=False)


async def check_schema(db: Database) -> None:
    """Raise SchemaError unless the database is at this meshpoint's head revision."""
    current = await current_revision(db)
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
    """A PostgreSQL deadlock or serialization failure, or a prepared statement that a
    migration invalidated (the driver has dropped its cache of them by then): the
    whole transaction may be run again."""
    orig = getattr(error, "orig", None)
    return getattr(orig, "sqlstate", None) in ("40P01", "40001") or \
        type(orig).__name__ == "InvalidCachedStatementError"


def is_unique_violation(error: BaseException) -> bool:
    """A unique key refused a row: PostgreSQL's 23505, SQLite's ``UNIQUE constraint
    failed`` (not a NOT NULL or CHECK constraint, which are integrity errors too)."""
    orig = getattr(error, "orig", None)
    return getattr(orig, "sqlstate", None) == "23505" or \
        "UNIQUE constraint failed" in str(orig)


@contextmanager
def translate(doing: str) -> Iterator[None]:
    """Turn driver errors raised while ``doing`` into meshpoint errors."""
    try:
        yield
    except MeshpointError:
        raise
    except (TimeoutError, OSError) as error:
        _refuse_tls(error, doing)
        raise StoreUnavailableError(
            f"the database could not be reached while {doing}: {error}. Is it running, "
            "and is the store URL right?"
        ) from error
    except exc.DBAPIError as error:
        _refuse_tls(error, doing)
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
        orig = getattr(error, "orig", None)
        if isinstance(orig, MeshpointError):
            raise orig from None  # a bind processor (meshpoint's JSON encoder) refused
        raise StoreError(f"the store failed while {doing}: {error}") from error
    except json.JSONDecodeError as error:
        # A JSON column that no longer parses (SQLite stores JSON as text). Other
        # ValueErrors are bugs, not corruption, and propagate as they are.
        raise CorruptCheckpointError(
            f"a stored row does not decode while {doing}: {error}; it was not used"
        ) from error


def _refuse_tls(error: Exception, doing: str) -> None:
    """Raise TlsError if ``error`` is TLS to the database failing (meshpoint.tls): a
    server that offers none, a handshake that failed, a client certificate refused."""
    why = tls_failure(error)
    orig = getattr(error, "orig", None)
    if why is None and getattr(orig, "sqlstate", None) == "28000" and \
            "certificate" in str(orig):
        why = f"the server refused this client: {orig}"
    if why is None:
        return
    if why == NO_TLS:
        raise TlsError(
            f"the database offers no TLS (while {doing}), and the store requires it "
            "(store.tls in the config, open_store(tls=), or sslmode in the store URL): "
            "nothing was sent to it. Turn ssl on in the server, or connect in the clear "
            "by removing that setting") from error
    raise TlsError(
        f"TLS to the database failed while {doing}: {why}. Check the store's TLS "
        "settings (store.tls in the config, open_store(tls=), or sslmode, sslrootcert, "
        "sslcert and sslkey in the store URL) against the server's certificate") from error
