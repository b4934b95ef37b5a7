"""Tenant isolation on PostgreSQL: the tenant of each transaction, set for the
row-level security policies of migration 0009, and the runtime role they hold.

Every transaction of a tenant's store sets ``meshpoint.tenant_id`` first, with
``set_config(..., true)`` (for that transaction only) and a bind parameter: a
portable body runs :data:`SET_TENANT` as its first statement; a native statement,
which runs outside any transaction in one round trip, runs inside a function of the
session that sets it first (:func:`session_function`). Nothing is set for a session,
so a pooled connection carries no tenant from one transaction to the next.
:func:`grant_runtime_role` sets up a role ``serve`` connects as, shared by the
tenants; :func:`grant_tenant_role` a role of one tenant, for a database that isolates
tenants by role (migration 0012), and :func:`check_tenant_role` refuses to run a
store as a role that may not act as its tenant. docs/store.md, *Tenant isolation*,
has the whole picture.
"""

from __future__ import annotations

import re
import weakref
from collections.abc import Callable
from typing import Any

from sqlalchemy import Connection, func, literal, select, true

from meshpoint.errors import ConfigurationError, InvalidArgumentError, TenantRoleError
from meshpoint.store import queries as q
from meshpoint.store.checks import check_id
from meshpoint.store.statement import Compiled, Statement

#: The first statement of every transaction of a tenant's store: it sets the tenant
#: the row-level security policies compare with, for that transaction only
#: (``is_local``), from a bind parameter.
SET_TENANT = Statement(
    "pg_set_tenant", "Sets the tenant of this transaction for the row-level security "
    "policies (for this transaction only).",
    select(func.set_config(literal("meshpoint.tenant_id"), q.tenant, true())),
    dialects=("postgresql",))

#: Per process: the ``CREATE FUNCTION`` of each native statement's wrapper, built from
#: the types the server reports for it (the same on every connection).
_WRAPPERS: dict[str, str] = {}
#: Per asyncpg connection: the wrappers created on it (temporary functions live as long
#: as their session).
_CREATED: weakref.WeakKeyDictionary[Any, set[str]] = weakref.WeakKeyDictionary()


async def session_function(driver: Any, statement: Statement, compiled: Compiled) -> str:
    """The name of a ``pg_temp`` function that runs ``statement`` with the tenant set
    first, created on this connection if it is not there yet.

    A native statement runs outside any transaction, as one statement, in one round
    trip; the tenant must be set inside the same transaction, before the statement
    reads a row, and from a bind parameter. So the statement runs inside a PL/pgSQL
    function of the session (``pg_temp``, which any role may create in and nobody
    else sees): ``PERFORM set_config('meshpoint.tenant_id', $1, true)``, then the
    statement with its own parameters shifted by one; called in one round trip, it is
    one implicit transaction, and the setting ends with it. PL/pgSQL keeps the
    statement's plan for the session, as asyncpg's prepared statements do."""
    name = f"mp_{statement.name}"
    created = _CREATED.setdefault(driver, set())
    if name in created:
        return name
    ddl = _WRAPPERS.get(name)
    if ddl is None:
        prepared = await driver.prepare(compiled.sql)
        params = [_type_name(t) for t in prepared.get_parameters()]
        columns = [(a.name, _type_name(a.type)) for a in prepared.get_attributes()]
        body = re.sub(r"\$(\d+)", lambda m: f"${int(m.group(1)) + 1}", compiled.sql)
        signature = ", ".join(["text", *params])
        if columns:
            returns = "TABLE (" + ", ".join(f'"{n}" {t}' for n, t in columns) + ")"
            run = f"RETURN QUERY {body};"
        else:
            returns, run = "void", f"{body};"
        ddl = _WRAPPERS[name] = (
            f"CREATE OR REPLACE FUNCTION pg_temp.{name}({signature}) RETURNS {returns} "
            f"LANGUAGE plpgsql AS $meshpoint$\n#variable_conflict use_column\nBEGIN\n"
            f"PERFORM set_config('meshpoint.tenant_id', $1, true);\n{run}\n"
            f"END $meshpoint$")
    await driver.execute(ddl)
    created.add(name)
    return name


def _type_name(kind: Any) -> str:
    """A type as DDL names it (``varchar``, ``json``, ``"myschema"."mytype"``)."""
    if kind.schema in ("pg_catalog", "", None):
        return str(kind.name)
    return f'"{kind.schema}"."{kind.name}"'


# -- the runtime roles --------------------------------------------------------------------

_ROLE = re.compile(r"[a-z_][a-z0-9_]{0,62}")

#: Whether the database isolates tenants by role (migration 0012): a role is mapped.
_ISOLATING = "SELECT EXISTS (SELECT FROM meshpoint_tenant_roles)"
#: The tenant a role is mapped to (None: none).
_MAPPED = "SELECT tenant_id FROM meshpoint_tenant_roles WHERE role_name = $1"
_MAP = "INSERT INTO meshpoint_tenant_roles (role_name, tenant_id) VALUES ($1, $2) " \
       "ON CONFLICT (role_name) DO NOTHING"
#: What the policies let the connected role see in this transaction (its tenant set
#: first, as the store sets it), and who it is.
_ALLOWED = "SELECT meshpoint_tenant(current_user) AS allowed, current_user AS role"


async def grant_runtime_role(store: Any, role: str, *, password: str | None = None) -> None:
    """Create (if it does not exist) the role ``serve`` connects as, shared by every
    tenant, and grant it what the store needs and nothing more: to read and write
    meshpoint's tables (not to own or alter them), to read the schema's version, and
    to create the temporary functions of its one-statement writes (``TEMPORARY``).
    The role owns nothing and has no BYPASSRLS, so every row it touches passes the
    tenant policies; but it names its tenant itself (``meshpoint.tenant_id``), so
    those keep a correct runtime on its tenant, not a malicious one: for that, give
    each tenant its role (:func:`grant_tenant_role`). A database that does so
    already refuses a shared role (it would see nothing). A ``password`` is sent as
    its SCRAM-SHA-256 verifier, computed here, never in clear. Run as the tables'
    owner (``meshpoint migrate --runtime-role``). An existing role that is a
    superuser, bypasses row security, or owns (or is a member of the owner of) the
    schema or a table is refused, not used."""
    def body(conn: Connection, verifier: str | None) -> None:
        if conn.exec_driver_sql(_ISOLATING).scalar():
            raise ConfigurationError(
                f"this database isolates tenants by role (meshpoint migrate --tenant-role): "
                f"a shared runtime role {role!r} would see no tenant's rows; give each "
                "tenant its own role with --tenant-role ROLE=TENANT instead")
        _grant(conn, role, verifier)

    await _granting(store, role, password, body)


async def grant_tenant_role(store: Any, role: str, tenant_id: str, *,
                            password: str | None = None) -> None:
    """Make ``role`` the role of tenant ``tenant_id``: granted as
    :func:`grant_runtime_role` grants (created if missing, refused if it could
    switch row security off), and mapped to the tenant in ``meshpoint_tenant_roles``
    (migration 0012), which only the tables' owner can read or change. From then on
    the database isolates tenants by role: a store connected as ``role`` sees and
    writes ``tenant_id``'s rows and no other's, whatever ``meshpoint.tenant_id`` it
    sets, and a role mapped to no tenant (a shared runtime role) sees nothing. A
    role already mapped to another tenant is refused (remapping it would hand that
    tenant's instances another's rows). Run as the tables' owner (``meshpoint
    migrate --tenant-role ROLE=TENANT``)."""
    check_id("tenant_id", tenant_id, max_len=64)

    def body(conn: Connection, verifier: str | None) -> None:
        mapped = conn.exec_driver_sql(_MAPPED, (role,)).scalar()
        if mapped is not None and mapped != tenant_id:
            raise ConfigurationError(
                f"role {role!r} is the role of tenant {mapped!r} already: a role is one "
                f"tenant's. "
                f"Give tenant {tenant_id!r} another role (to move this one, as the owner: "
                "DELETE FROM meshpoint_tenant_roles WHERE role_name = '...')")
        _grant(conn, role, verifier)
        conn.exec_driver_sql(_MAP, (role, tenant_id))

    await _granting(store, role, password, body)


async def _granting(store: Any, role: str, password: str | None,
                    body: Callable[[Connection, str | None], None]) -> None:
    if not _ROLE.fullmatch(role):
        raise InvalidArgumentError(f"a runtime role name is 1-63 lower-case letters, "
                                   f"digits or _, starting with a letter, got {role!r}")
    from meshpoint.store.scram import scram_verifier

    # The password leaves this process only as its SCRAM verifier (store/scram.py):
    # neither the statement's text, which the server may log, nor its parameters hold it.
    verifier = None if password is None else scram_verifier(password)
    await store.run(lambda conn: body(conn, verifier), write=True)


def _grant(conn: Connection, role: str, verifier: str | None) -> None:
    """Create ``role`` if missing (refused if it could switch row security off) and
    grant it the store's tables, in the migration owner's transaction ``conn``."""
    from meshpoint.store.schema import metadata, roles_metadata

    def run(template: str, *args: Any) -> None:
        # Identifiers and literals are quoted by the server (format %I, %L).
        ddl = conn.exec_driver_sql(f"SELECT format({template!r}, " + ", ".join(
            "$" + str(n) + "::text" for n in range(1, len(args) + 1)) + ")",
            tuple(args)).scalar()
        conn.exec_driver_sql(str(ddl))

    # Two grants at once (``migrate --runtime-role`` from two hosts) would update one
    # catalog row (the database's ACL) together, and PostgreSQL fails the second with
    # "tuple concurrently updated": one at a time, in this database.
    conn.exec_driver_sql("SELECT pg_advisory_xact_lock(hashtext('meshpoint role grants'))")
    found = conn.exec_driver_sql(
        "SELECT rolsuper, rolbypassrls FROM pg_roles WHERE rolname = $1", (role,)).first()
    if found is None:
        run("CREATE ROLE %I LOGIN NOSUPERUSER NOBYPASSRLS NOCREATEDB NOCREATEROLE", role)
    elif found.rolsuper or found.rolbypassrls:
        raise ConfigurationError(
            f"role {role!r} is a superuser or has BYPASSRLS: row-level security would "
            "not hold it; use another role for the runtime")
    schema = str(conn.exec_driver_sql("SELECT current_schema()").scalar())
    if found is not None:
        # An owner (of a table, or of the schema, which may drop them), or a
        # member of one, may switch row security off: never the runtime role.
        # (The mapping of roles to tenants, and the function the policies call,
        # count too: whoever owns them decides every role's tenant.)
        owned = conn.exec_driver_sql(
            "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = "
            "c.relnamespace WHERE n.nspname = $1 AND (c.relname = ANY($2) AND "
            "pg_has_role($3, c.relowner, 'MEMBER')) UNION ALL SELECT '(the schema)' "
            "FROM pg_namespace WHERE nspname = $1 AND pg_has_role($3, nspowner, "
            "'MEMBER') UNION ALL SELECT p.proname || '()' FROM pg_proc p JOIN "
            "pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = $1 AND "
            "p.proname = 'meshpoint_tenant' AND pg_has_role($3, p.proowner, 'MEMBER') "
            "ORDER BY 1",
            (schema, sorted([*metadata.tables, *roles_metadata.tables]), role)
        ).scalars().all()
        if owned:
            raise ConfigurationError(
                f"role {role!r} owns (or is a member of the owner of) schema "
                f"{schema!r}'s meshpoint objects {list(owned)}: it could switch "
                "row-level security off; the runtime role must own nothing (migrate "
                "as the owner, and give another role to --runtime-role)")
    if verifier is not None:
        run("ALTER ROLE %I PASSWORD %L", role, verifier)
    run("GRANT USAGE ON SCHEMA %I TO %I", schema, role)
    for table in sorted(metadata.tables):
        run("GRANT SELECT, INSERT, UPDATE, DELETE ON TABLE %I.%I TO %I", schema, table,
            role)
    run("GRANT SELECT ON TABLE %I.alembic_version TO %I", schema, role)
    run("GRANT TEMPORARY ON DATABASE %I TO %I",
        str(conn.exec_driver_sql("SELECT current_database()").scalar()), role)


#: Whether the session's role is one row-level security does not hold.
_BYPASSES = "SELECT rolsuper OR rolbypassrls FROM pg_roles WHERE rolname = current_user"


async def bypasses_row_security(store: Any) -> bool:
    """Whether ``store`` (PostgreSQL) connects as a superuser or a role with
    BYPASSRLS: row-level security does not hold it, and only the store's own
    statements keep it to its tenant (what ``meshpoint dashboard`` warns of)."""
    return bool(await store.run(lambda conn: conn.exec_driver_sql(_BYPASSES).scalar()))


def check_tenant_role(conn: Connection, tenant_id: str) -> None:
    """Refuse (TenantRoleError) to run a store of ``tenant_id`` as a role the
    policies would not let act as that tenant: in a database that isolates tenants
    by role, one mapped to another tenant, or to none. Run in a transaction of the
    tenant (its setting set first, as every transaction of the store sets it)."""
    row = conn.exec_driver_sql(_ALLOWED).first()
    assert row is not None
    if row.allowed == tenant_id:
        return
    if row.allowed is None:
        raise TenantRoleError(
            f"role {row.role!r} may act as no tenant of this database, which isolates "
            f"tenants by role: a store of tenant {tenant_id!r} cannot run as it. Connect "
            f"as the role of tenant {tenant_id!r}, or map this one to it (as the owner: "
            f"meshpoint migrate --tenant-role {row.role}={tenant_id})")
    raise TenantRoleError(
        f"role {row.role!r} is the role of tenant {row.allowed!r}: a store of tenant "
        f"{tenant_id!r} cannot run as it (this database isolates tenants by role). Open "
        f"the store with tenant_id={row.allowed!r}, or connect as the role of tenant "
        f"{tenant_id!r}")
