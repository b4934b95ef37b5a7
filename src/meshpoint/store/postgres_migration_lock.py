"""PostgreSQL: the advisory lock that serialises migrations, waited for a bounded time.

Instances may start together, each bringing the schema up to date: the first to take
the lock migrates, the others then find the schema at its head. Any role may take an
advisory lock, the runtime roles too, so the wait is bounded (``lock_timeout``, the
store's ``migration_lock_timeout_s``) and ends in a
:class:`~meshpoint.errors.MigrationLockError` that names who holds the lock; a store
whose schema is at its head takes no lock at all (``engine.migrate``).
"""

from __future__ import annotations

from sqlalchemy import Connection, exc

from meshpoint.errors import MigrationLockError

#: The advisory lock migrations take (pg_advisory_xact_lock's two keys): "mesh", and
#: the schema they migrate, so that migrations of different schemas do not wait for
#: one another. Any role may take an advisory lock, the runtime role too: so a
#: migration waits for it only ``migration_lock_timeout_s``, and a store whose schema
#: is up to date does not take it at all (engine.migrate).
MIGRATION_LOCK_KEY = ("1835365224, hashtext(coalesce(current_schema(), "
                      "current_setting('search_path')))")
#: Who holds the migration lock, as far as this role may see (pg_stat_activity shows
#: every session's role and process id; its query only to the same role or a
#: superuser).
_LOCK_HOLDER = (
    "SELECT l.pid, a.usename, a.application_name, a.state, a.backend_start "
    "FROM pg_locks l LEFT JOIN pg_stat_activity a ON a.pid = l.pid "
    "WHERE l.locktype = 'advisory' AND l.granted AND l.classid = 1835365224 "
    "AND l.objsubid = 2 AND l.objid = (hashtext(coalesce(current_schema(), "
    "current_setting('search_path'))))::oid "
    "AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())")


def take_migration_lock(sync_conn: Connection, lock_timeout_s: float) -> None:
    """Take the migrations' lock in ``sync_conn``'s transaction (held until it ends),
    waiting ``lock_timeout_s`` at most."""
    # lock_timeout bounds the wait for an advisory lock as for any lock; it is set
    # for the lock alone (the migration's own DDL keeps the session's setting), in a
    # savepoint, so that the transaction survives a timeout to say who holds it.
    sync_conn.exec_driver_sql(
        f"SET LOCAL lock_timeout = {max(1, round(lock_timeout_s * 1000))}")
    try:
        with sync_conn.begin_nested():
            sync_conn.exec_driver_sql(f"SELECT pg_advisory_xact_lock({MIGRATION_LOCK_KEY})")
    except exc.DBAPIError as error:
        if getattr(error.orig, "sqlstate", None) != "55P03":  # lock_not_available
            raise
        raise MigrationLockError(_lock_held(sync_conn, lock_timeout_s)) from None
    sync_conn.exec_driver_sql("SET LOCAL lock_timeout TO DEFAULT")


def _lock_held(sync_conn: Connection, lock_timeout_s: float) -> str:
    """Why a migration gave up waiting for its lock, naming who holds it."""
    holders = sync_conn.exec_driver_sql(_LOCK_HOLDER).all()
    if holders:
        who = "; ".join(
            f"role {h.usename or '(not shown)'}, pid {h.pid}"
            + (f", application {h.application_name!r}" if h.application_name else "")
            + (f", {h.state}" if h.state else "")
            + (f", connected since {h.backend_start:%Y-%m-%d %H:%M:%S %Z}"
               if h.backend_start else "") for h in holders)
    else:
        who = "a session this role cannot see (it released the lock since, or hides it)"
    return (f"another session held meshpoint's migration lock for this schema past "
            f"migration_lock_timeout_s ({lock_timeout_s:g} s): {who}. Nothing was "
            "migrated. If it is a migration, wait for it and try again; if not, end that "
            "session (SELECT pg_terminate_backend(pid), as its role or a superuser). The "
            "runtime role needs no migration: give it a store whose schema is up to date")
