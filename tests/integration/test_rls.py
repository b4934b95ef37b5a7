"""Tenant isolation enforced by PostgreSQL (issue 15 §5, DESIGN.md invariant 10): every
table has row-level security enabled and forced, and the runtime role that ``serve``
connects as owns nothing and cannot bypass it. Every test here talks to the database
as that role, with raw SQL as well as through the store: another tenant's rows are
invisible, a write into another tenant is refused by the database, no tenant set
reads nothing, and nothing leaks across commit and rollback on a reused pooled
connection."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from sqlalchemy import Connection, event, text
from sqlalchemy.engine import make_url

from meshpoint.errors import (
    ConfigurationError,
    StoreError,
    TenantRoleError,
    UnknownTaskError,
)
from meshpoint.store import SqlStore, open_store
from meshpoint.store.postgres_tenancy import grant_runtime_role, grant_tenant_role
from meshpoint.store.schema import metadata
from tests.conftest import fresh_pg_schema, pg_drop_roles, pg_execute_async, service_missing
from tests.integration.test_store import AGENT, fan_out
from tests.pg_server import PrivatePostgres, why_not_available

#: Its tests create and drop roles, which change catalog rows every role shares (the
#: database's ACL): on one worker of a parallel run, one after another.
pytestmark = [pytest.mark.postgres, pytest.mark.xdist_group("pg_roles")]


class Tenancy:
    """A fresh schema migrated by the owner, a runtime role granted on it, and stores
    of two tenants connected as that role."""

    def __init__(self, owner_url: str, schema: str, role: str) -> None:
        self.owner_url = owner_url
        self.schema = schema
        self.role = role
        self.role_url = make_url(owner_url).set(username=role).render_as_string(
            hide_password=False)


@pytest.fixture
async def tenancy(postgres_url: str) -> AsyncIterator[Tenancy]:
    schema = await fresh_pg_schema()
    role = f"mp_rls_{uuid.uuid4().hex[:10]}"
    owner = await open_store(postgres_url, schema=schema)
    try:
        await grant_runtime_role(owner, role)
        yield Tenancy(postgres_url, schema, role)
    finally:
        await owner.close()
        await pg_execute_async(f"DROP SCHEMA {schema} CASCADE")
        await pg_drop_roles(role)


@pytest.fixture
async def acme(tenancy: Tenancy) -> AsyncIterator[SqlStore]:
    async with open_store(tenancy.role_url, schema=tenancy.schema, tenant_id="acme",
                          migrate=False, pool_size=1) as store:
        yield store


async def raw(store: SqlStore, sql: str, tenant: str | None = None,
              params: dict[str, Any] | None = None, *, write: bool = False) -> list[Any]:
    """``sql`` as the store's role, in one transaction, with ``tenant`` set first (as
    the store sets it) or none."""
    def body(conn: Connection) -> list[Any]:
        if tenant is not None:
            conn.execute(text("SELECT set_config('meshpoint.tenant_id', :t, true)"),
                         {"t": tenant})
        result = conn.execute(text(sql), params or {})
        return list(result) if result.returns_rows else []

    return await store.run(body, write=write)


async def test_every_table_has_row_security_enabled_and_forced_and_the_role_owns_nothing(
        tenancy: Tenancy, acme: SqlStore) -> None:
    tables = await raw(acme, """
        SELECT c.relname, c.relrowsecurity, c.relforcerowsecurity,
               pg_get_userbyid(c.relowner) AS owner
        FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname = :schema AND c.relkind = 'r' AND (c.relname LIKE 'agent\\_%'
              OR c.relname LIKE 'meshpoint\\_sync\\_%')""",
                       params={"schema": tenancy.schema})
    assert {t.relname for t in tables} == set(metadata.tables)
    assert all(t.relrowsecurity and t.relforcerowsecurity for t in tables), tables
    assert tenancy.role not in {t.owner for t in tables}
    policies = await raw(acme, """
        SELECT tablename, qual, with_check FROM pg_policies WHERE schemaname = :schema""",
                         params={"schema": tenancy.schema})
    assert {p.tablename for p in policies} == set(metadata.tables)
    for p in policies:
        for clause in (p.qual, p.with_check):  # once per statement: an InitPlan
            assert "= ( SELECT meshpoint_tenant(CURRENT_USER) AS meshpoint_tenant)" in \
                clause, p
    role = (await raw(acme, "SELECT rolsuper, rolbypassrls, rolcreaterole FROM pg_roles "
                            "WHERE rolname = current_user"))[0]
    assert not role.rolsuper and not role.rolbypassrls and not role.rolcreaterole


async def test_another_tenants_rows_are_invisible_to_raw_sql_and_to_the_store(
        tenancy: Tenancy, acme: SqlStore) -> None:
    globex = acme.for_tenant("globex")
    for store, task_id in ((acme, "a1"), (globex, "g1")):
        await store.checkpoint_task(fan_out(task_id), AGENT)
        await store.resolve_peer_sub_task(f"{task_id}/sub-0", "x")
    await acme.cleanup_task("a1")
    await globex.cleanup_task("g1")
    await acme.checkpoint_task(fan_out("a2"), AGENT)
    await globex.checkpoint_task(fan_out("g2"), AGENT)
    async with open_store(tenancy.owner_url, schema=tenancy.schema) as owner:
        for table in metadata.tables:
            everyone = await raw(owner, f"SELECT DISTINCT tenant_id FROM {table}")
            seen = await raw(acme, f"SELECT DISTINCT tenant_id FROM {table}", "acme")
            assert [r.tenant_id for r in seen] == (
                ["acme"] if any(r.tenant_id == "acme" for r in everyone) else []), table
            assert await raw(acme, f"SELECT * FROM {table}") == [], table  # no tenant set
        assert {r.tenant_id for r in await raw(
            owner, "SELECT tenant_id FROM agent_paused_tasks")} == {"acme", "globex"}
    # Even naming the other tenant's rows outright, under our tenant, finds nothing.
    assert await raw(acme, "SELECT * FROM agent_paused_tasks WHERE tenant_id = 'globex'",
                     "acme") == []
    with pytest.raises(UnknownTaskError):
        await acme.restore_task("g2")
    assert (await globex.restore_task("g2")).context.task_id == "g2"
    assert (await acme.history.verify_task("a1")).ok
    assert await acme.history.task_ids() == ["a1", "a2"]


async def test_a_write_into_another_tenant_is_refused_by_the_database(
        acme: SqlStore) -> None:
    await acme.checkpoint_task(fan_out("a1"), AGENT)
    with pytest.raises(StoreError, match="row-level security"):
        await raw(acme, "INSERT INTO agent_ended_tasks VALUES ('globex', 't', 'x', 0)",
                  "acme", write=True)
    with pytest.raises(StoreError, match="row-level security"):
        await raw(acme, "INSERT INTO agent_ended_tasks VALUES ('acme', 't', 'x', 0)",
                  write=True)  # no tenant set: no row may be written at all
    with pytest.raises(StoreError, match="row-level security"):
        await raw(acme, "UPDATE agent_paused_tasks SET tenant_id = 'globex'", "acme",
                  write=True)
    assert len(await raw(acme, "SELECT * FROM agent_paused_tasks", "acme")) == 1


async def test_nothing_leaks_across_commit_and_rollback_on_a_reused_connection(
        acme: SqlStore) -> None:
    """The store's pool has one connection: every transaction below reuses it."""
    await acme.checkpoint_task(fan_out("a1"), AGENT)  # a native statement, tenant set
    assert await raw(acme, "SELECT * FROM agent_paused_tasks") == []
    setting = await raw(acme, "SELECT coalesce(current_setting('meshpoint.tenant_id', "
                              "true), '') AS tenant")
    assert setting[0].tenant == ""  # the setting ended with its transaction
    with pytest.raises(StoreError):
        await raw(acme, "SELECT 1/0", "acme")  # a transaction that rolls back
    assert await raw(acme, "SELECT * FROM agent_paused_tasks") == []
    restored = await acme.restore_task("a1")  # the fast path, on the same connection
    assert restored.context.task_id == "a1"
    assert await raw(acme, "SELECT * FROM agent_paused_tasks") == []


async def test_the_store_works_whole_as_the_runtime_role(tenancy: Tenancy,
                                                          acme: SqlStore) -> None:
    """Every kind of operation, fast paths and portable bodies, under row security."""
    portable = await open_store(tenancy.role_url, schema=tenancy.schema, tenant_id="acme",
                                migrate=False, fast_paths=False)
    for store in (acme, portable):
        ctx = fan_out("t1")
        await store.checkpoint_task(ctx, AGENT)
        for n in range(3):
            await store.resolve_peer_sub_task(f"t1/sub-{n}", "x", lease_owner="i-1")
        ctx = (await store.restore_task("t1", lease_owner="i-1")).context
        ctx.current_invocation_id = "inv-2"
        ctx.register_peer_sub_task("t1/again", {"peer_agent_name": "p"})
        await store.checkpoint_task(ctx, AGENT, lease_owner="i-1")
        assert await store.reset_timeout_deadline("t1/again", timeout_s=30) is not None
        assert (await store.stats()).total == 1
        assert await store.take_resume_lease("t1", "i-2", 30,
                                             statuses=("waiting_peers",)) is not None
        await store.cleanup_task("t1", lease_owner="i-2")
        assert (await store.history.verify_task("t1")).ok
        assert await store.forget_ended_tasks(AGENT, older_than_s=0) == 1
        await store.history.purge()
    await portable.close()


async def test_a_role_that_owns_or_could_own_the_tables_is_not_made_the_runtime_role(
        postgres_url: str) -> None:
    """Row-level security binds a role only if it owns nothing: a superuser, a role
    with BYPASSRLS, the owner of a table or of the schema (which may drop them), or a
    member of such an owner could switch it off. Each is refused, and granted once it
    owns nothing."""
    schema = await fresh_pg_schema()
    role, owner_group = (f"mp_rls_{uuid.uuid4().hex[:10]}" for _ in range(2))
    owner = await open_store(postgres_url, schema=schema)
    try:
        with pytest.raises(ConfigurationError, match="superuser or has BYPASSRLS"):
            await grant_runtime_role(owner, "postgres")
        await pg_execute_async(f"CREATE ROLE {role} NOSUPERUSER; "
                               f"CREATE ROLE {owner_group} NOSUPERUSER")
        for setup, undo, named in (
                (f"ALTER TABLE {schema}.agent_events OWNER TO {role}",
                 f"ALTER TABLE {schema}.agent_events OWNER TO postgres", "'agent_events'"),
                (f"ALTER SCHEMA {schema} OWNER TO {role}",
                 f"ALTER SCHEMA {schema} OWNER TO postgres", "'(the schema)'"),
                (f"ALTER TABLE {schema}.agent_checkpoints OWNER TO {owner_group}; "
                 f"GRANT {owner_group} TO {role}",
                 f"ALTER TABLE {schema}.agent_checkpoints OWNER TO postgres; "
                 f"REVOKE {owner_group} FROM {role}", "'agent_checkpoints'"),
                # Whoever owns the mapping of roles, or the function the policies
                # call, decides every role's tenant.
                (f"ALTER TABLE {schema}.meshpoint_tenant_roles OWNER TO {role}",
                 f"ALTER TABLE {schema}.meshpoint_tenant_roles OWNER TO postgres",
                 "'meshpoint_tenant_roles'"),
                (f"ALTER FUNCTION {schema}.meshpoint_tenant(name) OWNER TO {role}",
                 f"ALTER FUNCTION {schema}.meshpoint_tenant(name) OWNER TO postgres",
                 "'meshpoint_tenant()'")):
            await pg_execute_async(setup)
            with pytest.raises(ConfigurationError,
                               match="could switch row-level security off") as refused:
                await grant_runtime_role(owner, role)
            assert named in str(refused.value)
            await pg_execute_async(undo)
        await grant_runtime_role(owner, role)  # it owns nothing now
    finally:
        await owner.close()
        await pg_execute_async(f"DROP SCHEMA {schema} CASCADE")
        await pg_drop_roles(role)
        await pg_execute_async(f"DROP ROLE {owner_group}")


# -- a role per tenant ---------------------------------------------------------------------

class Isolated:
    """A fresh schema migrated by the owner, whose tenants ``acme`` and ``globex``
    each have a role of their own (``meshpoint migrate --tenant-role``)."""

    def __init__(self, owner_url: str, schema: str, roles: dict[str, str]) -> None:
        self.owner_url = owner_url
        self.schema = schema
        self.roles = roles  # tenant -> role

    def url(self, tenant: str) -> str:
        return make_url(self.owner_url).set(username=self.roles[tenant]).render_as_string(
            hide_password=False)

    def open(self, tenant: str, **options: Any) -> Any:
        return open_store(self.url(tenant), schema=self.schema, tenant_id=tenant,
                          migrate=False, **options)


@pytest.fixture
async def isolated(postgres_url: str) -> AsyncIterator[Isolated]:
    schema = await fresh_pg_schema()
    suffix = uuid.uuid4().hex[:8]
    roles = {"acme": f"mp_acme_{suffix}", "globex": f"mp_globex_{suffix}"}
    owner = await open_store(postgres_url, schema=schema)
    try:
        for tenant, role in roles.items():
            await grant_tenant_role(owner, role, tenant)
        yield Isolated(postgres_url, schema, roles)
    finally:
        await owner.close()
        await pg_execute_async(f"DROP SCHEMA {schema} CASCADE")
        await pg_drop_roles(*roles.values())


async def globex_paused(isolated: Isolated) -> None:
    """globex's task g1, paused on three peers, with its conversation."""
    async with isolated.open("globex") as globex:
        await globex.checkpoint_task(fan_out("g1"), AGENT)
        await globex.resolve_peer_sub_task("g1/sub-1", "globex's own answer")


#: The attack of the issue, as raw SQL on the runtime's own connection: name another
#: tenant for the session, read its conversation, resolve its sub-task.
ATTACK = ("SELECT set_config('meshpoint.tenant_id', 'globex', false)",
          "SELECT * FROM agent_session_events WHERE logical_task_id = 'g1'",
          "UPDATE agent_peer_sub_tasks SET status = 'resolved', resolved_by = 'answer', "
          "result = '\"forged\"' WHERE sub_task_id = 'g1/sub-0' RETURNING sub_task_id")


async def attack(store: SqlStore) -> tuple[list[Any], list[Any]]:
    """ATTACK through ``store``'s pool (one connection): what it read, what it resolved."""
    await raw(store, ATTACK[0])  # for the session: every later transaction keeps it
    read = await raw(store, ATTACK[1])
    resolved = await raw(store, ATTACK[2], write=True)
    return read, resolved


async def test_a_tenants_role_cannot_act_as_another_tenant_whatever_it_sets(
        isolated: Isolated) -> None:
    """Connected as acme's role, setting meshpoint.tenant_id to globex (for the
    session, as the issue did) reads none of globex's conversation and resolves none
    of its sub-tasks; no write into globex is admitted; and globex's task is as it
    was. acme's store, on that same connection, still works as acme."""
    await globex_paused(isolated)
    async with isolated.open("acme", pool_size=1) as acme:
        await acme.checkpoint_task(fan_out("a1"), AGENT)
        read, resolved = await attack(acme)
        assert (read, resolved) == ([], [])
        for table in metadata.tables:  # nothing of globex's in any table, even named
            assert await raw(acme, f"SELECT * FROM {table} WHERE tenant_id = 'globex'") \
                == [], table
        with pytest.raises(StoreError, match="row-level security"):
            await raw(acme, "INSERT INTO agent_ended_tasks VALUES ('globex', 't', 'x', 0)",
                      write=True)
        assert [r.tenant_id for r in await raw(
            acme, "SELECT tenant_id FROM agent_paused_tasks")] == ["acme"]
        await acme.resolve_peer_sub_task("a1/sub-0", "acme's answer")  # still acme's
        with pytest.raises(UnknownTaskError):
            await acme.for_tenant("globex").restore_task("g1")
    async with isolated.open("globex") as globex:
        sub = await globex.get_peer_sub_task("g1/sub-0")
        assert (sub.status, sub.result) == ("pending", None)
        assert (await globex.restore_task("g1")).context.session_events == \
            fan_out("g1").session_events
        assert (await globex.history.verify_task("g1")).ok


async def test_a_shared_runtime_role_keeps_a_correct_runtime_on_its_tenant_only(
        tenancy: Tenancy, acme: SqlStore) -> None:
    """What the shared role does not guarantee, shown: the same attack through a role
    every tenant shares reads and resolves the other tenant's rows. Its policies hold
    a runtime that sets its own tenant (a mistake, a bug in a query) to that tenant;
    a runtime that names another on purpose is that tenant. (docs/store.md)"""
    globex = acme.for_tenant("globex")
    await globex.checkpoint_task(fan_out("g1"), AGENT)
    read, resolved = await attack(acme)
    assert len(read) == 1 and len(resolved) == 1
    assert (await globex.get_peer_sub_task("g1/sub-0")).status == "resolved"


async def test_a_store_refuses_to_run_as_a_tenant_its_role_is_not(
        isolated: Isolated, postgres_url: str) -> None:
    with pytest.raises(TenantRoleError, match=(
            f"role '{isolated.roles['acme']}' is the role of tenant 'acme': a store of tenant "
            "'globex' cannot run as it")):
        await open_store(isolated.url("acme"), schema=isolated.schema, tenant_id="globex",
                         migrate=False)
    with pytest.raises(TenantRoleError, match="the role of tenant 'acme'"):  # default tenant
        await open_store(isolated.url("acme"), schema=isolated.schema)
    async with open_store(postgres_url, schema=isolated.schema) as owner:
        with pytest.raises(ConfigurationError, match="isolates tenants by role"):
            await grant_runtime_role(owner, f"mp_shared_{uuid.uuid4().hex[:8]}")
        with pytest.raises(ConfigurationError, match="is the role of tenant 'acme' already"):
            await grant_tenant_role(owner, isolated.roles["acme"], "globex")
        await grant_tenant_role(owner, isolated.roles["acme"], "acme")  # the same: fine
        shared = f"mp_shared_{uuid.uuid4().hex[:8]}"
        await pg_execute_async(f"CREATE ROLE {shared} LOGIN; GRANT USAGE ON SCHEMA "
                               f"{isolated.schema} TO {shared}; GRANT SELECT ON ALL TABLES "
                               f"IN SCHEMA {isolated.schema} TO {shared}")
        try:
            with pytest.raises(TenantRoleError, match=f"role '{shared}' may act as no tenant"):
                await open_store(make_url(postgres_url).set(username=shared),
                                 schema=isolated.schema, tenant_id="acme", migrate=False)
        finally:
            await pg_drop_roles(shared)
        # The owner may switch row security off anyway: it works as any tenant.
        assert (await owner.for_tenant("acme").stats()).total == 0


async def test_the_store_works_whole_as_a_tenants_role(isolated: Isolated) -> None:
    """Every kind of operation, fast paths and portable bodies, the LangGraph saver's
    tables too, keyed on the role."""
    for fast in (True, False):
        async with isolated.open("acme", fast_paths=fast) as store:
            ctx = fan_out("t1")
            await store.checkpoint_task(ctx, AGENT)
            for n in range(3):
                await store.resolve_peer_sub_task(f"t1/sub-{n}", "x", lease_owner="i-1")
            ctx = (await store.restore_task("t1", lease_owner="i-1")).context
            ctx.current_invocation_id = "inv-2"
            ctx.register_peer_sub_task("t1/again", {"peer_agent_name": "p"})
            await store.checkpoint_task(ctx, AGENT, lease_owner="i-1")
            assert await store.reset_timeout_deadline("t1/again", timeout_s=30) is not None
            assert (await store.stats()).total == 1
            await store.cleanup_task("t1")
            assert (await store.history.verify_task("t1")).ok
            assert await store.forget_ended_tasks(AGENT, older_than_s=0) == 1
            await store.history.purge()
    from meshpoint.integrations.langgraph import MeshpointSaver

    async with isolated.open("acme") as store:
        saver = MeshpointSaver(store)
        config = {"configurable": {"thread_id": "th", "checkpoint_ns": ""}}
        from langgraph.checkpoint.base import empty_checkpoint

        checkpoint = empty_checkpoint()
        checkpoint["channel_values"] = {"messages": ["hi"]}
        checkpoint["channel_versions"] = {"messages": "1"}
        saved = await saver.aput(config, checkpoint, {}, {"messages": "1"})  # type: ignore[arg-type]
        assert (await saver.aget_tuple(saved)) is not None


# -- the runtime role's password --------------------------------------------------------

async def test_the_runtime_roles_password_never_reaches_the_server(
        postgres_url: str) -> None:
    """`migrate --runtime-role` with a password sends a SCRAM-SHA-256 verifier computed
    here: no statement or bound value the client sends holds the password (before, it
    travelled in clear, and ``ALTER ROLE ... PASSWORD 'the password'`` was a statement
    the server logs), and the server stores that verifier as it is."""
    password = f"pw-{uuid.uuid4().hex}"
    schema = await fresh_pg_schema()
    role = f"mp_rls_{uuid.uuid4().hex[:10]}"
    sent: list[str] = []

    def record(conn: Any, cursor: Any, statement: str, parameters: Any, context: Any,
               executemany: bool) -> None:
        sent.append(f"{statement} {parameters!r}")

    owner = await open_store(postgres_url, schema=schema)
    engine = owner._db.engine.sync_engine
    event.listen(engine, "before_cursor_execute", record)
    try:
        await grant_runtime_role(owner, role, password=password)
        event.remove(engine, "before_cursor_execute", record)
        assert any("ALTER ROLE" in s for s in sent), sent
        assert not [s for s in sent if password in s]
        stored = (await raw(owner, "SELECT rolpassword FROM pg_authid WHERE rolname = :r",
                            params={"r": role}))[0].rolpassword
        assert stored.startswith("SCRAM-SHA-256$4096:") and password not in stored
        assert any(stored.split("$", 1)[1].split(":", 1)[1] in s for s in sent)  # ours
    finally:
        await owner.close()
        await pg_execute_async(f"DROP SCHEMA {schema} CASCADE")
        await pg_drop_roles(role)


@pytest.fixture
def scram_postgres() -> Iterator[PrivatePostgres]:
    """A PostgreSQL of this test's own whose every login checks a SCRAM password (the
    shared server trusts 127.0.0.1, so a login there proves nothing)."""
    why = why_not_available()
    if why is not None:
        service_missing(f"a private PostgreSQL cannot be started: {why}")
    server = PrivatePostgres([], ["local all all scram-sha-256",
                                  "host all all 127.0.0.1/32 scram-sha-256"],
                             superuser_password="owner-pw")
    server.start()
    try:
        yield server
    finally:
        server.stop()


async def test_the_runtime_role_logs_in_with_its_password_under_scram(
        scram_postgres: PrivatePostgres) -> None:
    import asyncpg

    password = "correct horse \u00e9table"  # not ASCII: SASLprep'd, as clients do
    async with open_store(scram_postgres.url()) as owner:
        await grant_runtime_role(owner, "mp_runtime", password=password)
    async with open_store(scram_postgres.url("mp_runtime", password), tenant_id="acme",
                          migrate=False) as store:
        await store.checkpoint_task(fan_out("a1"), AGENT)
        assert (await store.restore_task("a1")).context.task_id == "a1"
    with pytest.raises(asyncpg.InvalidPasswordError):
        await asyncpg.connect(host="127.0.0.1", port=scram_postgres.port, user="mp_runtime",
                              password=password + "x", database="postgres")


# -- the migration's lock ------------------------------------------------------------------

async def test_the_runtime_role_holding_the_migration_lock_hangs_no_store(
        tenancy: Tenancy) -> None:
    """Any role may take an advisory lock: the runtime role takes the one migrations
    take, and keeps it. Before, every ``open_store(migrate=True)`` then waited for it
    for ever. Now a store whose schema is up to date opens without it, and a
    migration that needs it gives up after ``migration_lock_timeout_s``, naming the
    role and process that hold it."""
    import asyncpg

    from meshpoint.errors import MigrationLockError
    from meshpoint.store.engine import downgrade
    from meshpoint.store.postgres_migration_lock import MIGRATION_LOCK_KEY

    dsn = tenancy.role_url.replace("postgresql+asyncpg://", "postgresql://")
    squatter = await asyncpg.connect(dsn, server_settings={"search_path": tenancy.schema})
    try:
        await squatter.execute(f"SELECT pg_advisory_lock({MIGRATION_LOCK_KEY})")
        pid = await squatter.fetchval("SELECT pg_backend_pid()")
        store = await asyncio.wait_for(open_store(  # up to date: no lock needed
            tenancy.role_url, schema=tenancy.schema, tenant_id="acme"), 60)
        await store.checkpoint_task(fan_out("a1"), AGENT)
        await store.close()
        await squatter.execute(f"SELECT pg_advisory_unlock({MIGRATION_LOCK_KEY})")
        owner = await open_store(tenancy.owner_url, schema=tenancy.schema)
        await downgrade(owner._db, "-1")  # now a store must migrate, under the lock
        await owner.close()
        await squatter.execute(f"SELECT pg_advisory_lock({MIGRATION_LOCK_KEY})")
        with pytest.raises(MigrationLockError) as held:
            await asyncio.wait_for(open_store(tenancy.owner_url, schema=tenancy.schema,
                                              migration_lock_timeout_s=0.5), 60)
        message = str(held.value)
        assert tenancy.role in message and f"pid {pid}" in message, message
        assert "migration_lock_timeout_s" in message, message
    finally:
        await squatter.close()
    store = await open_store(tenancy.owner_url, schema=tenancy.schema)  # free again
    await store.close()


async def test_migrate_sets_up_a_role_per_tenant(postgres_url: str) -> None:
    """``meshpoint migrate --tenant-role ROLE=TENANT`` (repeatable), each role's
    password from ``--tenant-password-env ROLE=VAR``, sent as a verifier."""
    import json
    import os
    import subprocess
    import sys

    schema = await fresh_pg_schema()
    suffix = uuid.uuid4().hex[:8]
    acme, globex = f"mp_acme_{suffix}", f"mp_globex_{suffix}"
    try:
        done = await asyncio.to_thread(subprocess.run, [
            sys.executable, "-m", "meshpoint.cli", "migrate", "--url", postgres_url,
            "--schema", schema, "--tenant-role", f"{acme}=acme", "--tenant-role",
            f"{globex}=globex", "--tenant-password-env", f"{acme}=ACME_PW", "--json"],
            capture_output=True, text=True, timeout=120,
            env={**os.environ, "ACME_PW": "acme-secret"})
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["tenant_roles"] == {acme: "acme", globex: "globex"}
        async with open_store(postgres_url, schema=schema) as owner:
            mapped = await raw(owner, "SELECT role_name, tenant_id FROM "
                                      "meshpoint_tenant_roles ORDER BY tenant_id")
            assert [tuple(r) for r in mapped] == [(acme, "acme"), (globex, "globex")]
            (secret,) = await raw(owner, "SELECT rolpassword FROM pg_authid WHERE "
                                         "rolname = :r", params={"r": acme})
            assert secret.rolpassword.startswith("SCRAM-SHA-256$")
        role_url = make_url(postgres_url).set(username=acme)
        async with open_store(role_url, schema=schema, tenant_id="acme") as store:
            await store.checkpoint_task(fan_out("a1"), AGENT)
        with pytest.raises(TenantRoleError):
            await open_store(role_url, schema=schema, tenant_id="globex")
    finally:
        await pg_execute_async(f"DROP SCHEMA {schema} CASCADE")
        await pg_drop_roles(acme, globex, if_exists=True)


async def test_runtime_roles_granted_at_once_from_many_processes_all_take(
        postgres_url: str) -> None:
    """``migrate --runtime-role`` from several hosts at once: each grant updates the
    database's ACL, and PostgreSQL fails a second concurrent update of it ("tuple
    concurrently updated"); the grants take turns, and every one takes."""
    schema = await fresh_pg_schema()
    roles = [f"mp_rls_{uuid.uuid4().hex[:10]}" for _ in range(6)]
    owners = [await open_store(postgres_url, schema=schema) for _ in roles]
    try:
        for _ in range(3):
            await asyncio.gather(*(grant_runtime_role(o, r) for o, r in zip(owners, roles,
                                                                             strict=True)))
    finally:
        for owner in owners:
            await owner.close()
        await pg_execute_async(f"DROP SCHEMA {schema} CASCADE")
        await pg_drop_roles(*roles, if_exists=True)  # a failed grant made none


async def test_the_one_statement_paths_keep_to_their_tenant_on_a_shared_connection(
        acme: SqlStore) -> None:
    """A lease's renewal, the breaker's read and a lease holder's end each run as one
    statement outside any transaction (no BEGIN, no SET LOCAL around them): under row
    security, as the runtime role, on the one pooled connection two tenants share,
    with the same task ids and lease owners in both. Each takes its fast path (a
    refusal would hide behind the portable body), touches its tenant's rows only,
    and leaves no tenant set on the connection."""
    globex = acme.for_tenant("globex")
    taken: list[object] = []
    fast = acme._fast
    cleanup = fast.cleanup

    async def spied(params: dict[str, Any]) -> Any:
        taken.append(await cleanup(params))
        return taken[-1]

    fast.cleanup = spied  # type: ignore[method-assign]
    for store in (acme, globex):
        await store.checkpoint_task(fan_out("t1", peers=2), AGENT)
        for n in range(2):
            await store.resolve_peer_sub_task(f"t1/sub-{n}", "x", lease_owner="i-1")
    await globex.breakers.note(AGENT, "failure", owner="i-1", failures=3,
                               window_s=60, cooldown_s=60)
    assert (await globex.breakers.state(AGENT)).failures == 1
    assert (await acme.breakers.state(AGENT)).failures == 0  # globex's row unseen
    ctx = (await acme.restore_task("t1", lease_owner="i-1")).context
    lease = await acme.renew_resume_lease("t1", "i-1", 30)
    assert lease is not None
    globex_before = await raw(acme, "SELECT version, lease_expires_at FROM "
                                    "agent_paused_tasks", "globex")
    await acme.cleanup_task("t1", lease_owner="i-1", ctx=ctx, agent_name=AGENT)
    assert taken == [1], "the one-statement end was refused under row security"
    setting = await raw(acme, "SELECT coalesce(current_setting('meshpoint.tenant_id', "
                              "true), '') AS tenant")
    assert setting[0].tenant == ""  # the function's setting ended with its statement
    assert await raw(acme, "SELECT * FROM agent_paused_tasks", "acme") == []
    assert await raw(acme, "SELECT version, lease_expires_at FROM agent_paused_tasks",
                     "globex") == globex_before
    for table, count in (("agent_peer_sub_tasks", 2), ("agent_parallel_invocations", 1),
                         ("agent_session_events", 1), ("agent_checkpoints", 1)):
        assert len(await raw(acme, f"SELECT * FROM {table}", "globex")) == count, table
        assert len(await raw(acme, f"SELECT * FROM {table}", "acme")) == (
            2 if table == "agent_checkpoints" else 0), table
    assert (await acme.history.verify_task("t1")).ok
    assert await globex.history.get_checkpoint_history("t1") != []
    # globex's task is still its holder's: its end, as one statement, ends it alone.
    ctx = (await globex.restore_task("t1", lease_owner="i-1")).context
    await globex.cleanup_task("t1", lease_owner="i-1", ctx=ctx, agent_name=AGENT)
    assert taken == [1, 1]
    assert (await globex.history.verify_task("t1")).ok
    assert await raw(acme, "SELECT * FROM agent_ended_tasks", "globex") != []
