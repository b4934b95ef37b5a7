"""Statements use the indexes meant for them: by key the primary key, even on a
PostgreSQL table never analyzed; the sweep and recovery their partial indexes.

Without statistics (a fresh database, or a server with autovacuum off) PostgreSQL
guesses that ``tenant_id = $1`` keeps 0.5 % of the rows, so a secondary index led by
``tenant_id`` looked as cheap as the primary key: one resolution read 1,398 pages
(59 ms) through the deadline index. Migration 0004 leads every secondary index with a
column that statements by key never test, and the one-statement resolution finds
each row through a scalar subquery rather than a join (which PostgreSQL, estimating
one row on each side, ran inside out: a scan of the whole tenant per resolution).
This test runs each kind of store call on such a table, then asks PostgreSQL how it
would run every statement it saw; again once many tasks are resuming, when the
partial index of resuming tasks (0004) is no longer small.
"""

from __future__ import annotations

import contextlib
import re
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest
from sqlalchemy import Connection
from sqlalchemy.engine import make_url

from meshpoint import TaskExecutionContext
from meshpoint.store import SqlStore, open_store, postgres
from meshpoint.store.postgres_tenancy import grant_tenant_role
from meshpoint.store.schema import RESUMING_PREDICATE
from meshpoint.store.statement import Statement
from tests.conftest import fresh_pg_schema, pg_drop_roles, pg_execute_async

#: Some of its tests create and drop roles (catalog rows every role shares): on the
#: worker of a parallel run that runs all such tests, one after another.
pytestmark = pytest.mark.xdist_group("pg_roles")

#: The indexes that only the sweep and the recovery listing may use.
_SCAN_INDEXES = {"ix_agent_peer_sub_tasks_deadline": "FOR UPDATE SKIP LOCKED",
                 "ix_agent_paused_tasks_resuming": RESUMING_PREDICATE}


@pytest.fixture
async def unanalyzed_store(postgres_url: str) -> AsyncIterator[SqlStore]:
    schema = await fresh_pg_schema()
    store = await open_store(postgres_url, schema=schema)
    try:
        yield store
    finally:
        await store.close()
        await pg_execute_async(f"DROP SCHEMA {schema} CASCADE")


def _task(n: int) -> TaskExecutionContext:
    ctx = TaskExecutionContext(f"t{n}")
    ctx.current_invocation_id = f"t{n}/inv"
    ctx.append_session_event({"role": "user", "text": f"question {n}"})
    for k in range(3):
        ctx.register_peer_sub_task(f"t{n}/sub-{k}", {"peer_agent_name": f"peer-{k}"})
    return ctx


@pytest.mark.postgres
async def test_statements_by_key_use_the_primary_key_without_statistics(
        unanalyzed_store: SqlStore, monkeypatch: pytest.MonkeyPatch) -> None:
    store = unanalyzed_store
    explain = await _by_key_workload(store, monkeypatch)
    _check(await store.run(explain))
    # A mass resume (after an outage, say) fills the partial index of resuming
    # tasks; a statement by key must still not read it.
    for n in range(100, 600):
        for k in range(3):
            await store.resolve_peer_sub_task(f"t{n}/sub-{k}", {"ok": k})
    plans = await store.run(explain)
    _check(plans)
    recovery = [plan for sql, plan in plans.items() if RESUMING_PREDICATE in sql]
    assert recovery and all("ix_agent_paused_tasks_resuming" in plan for plan in recovery), \
        recovery


async def _by_key_workload(store: SqlStore, monkeypatch: pytest.MonkeyPatch
                           ) -> Callable[[Connection], dict[str, str]]:
    """Each kind of store call on an unanalyzed table of 600 paused tasks; returns
    the body that asks PostgreSQL how it would run every statement they sent."""
    for n in range(600):  # enough rows that a wrong index costs pages, not a lookup
        await store.checkpoint_task(_task(n), "agent")

    seen: dict[str, Any] = {}
    with recording(seen, monkeypatch):
        await store.resolve_peer_sub_task("t1/sub-0", {"ok": 1})
        for k in range(3):
            await store.resolve_peer_sub_task(f"t2/sub-{k}", {"ok": k}, lease_owner="i-1")
        ctx = (await store.restore_task("t2", lease_owner="i-1")).context
        ctx.append_session_event({"role": "model", "text": "more"})
        ctx.current_invocation_id = "t2/inv-2"
        ctx.register_peer_sub_task("t2/sub-again", {"peer_agent_name": "peer-0"})
        await store.checkpoint_task(ctx, "agent", lease_owner="i-1")
        await store.claim_peer_sub_task("t3/sub-0")
        await store.reset_timeout_deadline("t4/sub-0", timeout_s=30)
        await store.take_resume_lease("t5", "i-2", 30)
        await store.get_peer_sub_task("t6/sub-1")
        await store.get_peer_sub_tasks_for_task("t6")
        await store.sweep_expired_timeouts("agent")
        await store.resumable_tasks("agent")
        await store.cleanup_task("t7")
        await store.checkpoint_task(_task(900), "agent")  # a first one: the ledger's check
        await store.forget_ended_tasks("agent", older_than_s=3600)
    assert len(seen) >= 18, list(seen)

    def explain(conn: Connection) -> dict[str, str]:
        return {sql: "\n".join(row[0] for row in conn.exec_driver_sql(
            "EXPLAIN " + sql, tuple(params) if params else ()).all())
            for sql, params in seen.items()}

    return explain


@pytest.fixture
async def unanalyzed_tenant_store(postgres_url: str) -> AsyncIterator[SqlStore]:
    """``unanalyzed_store``, connected as a tenant's own role (migrate --tenant-role):
    its statements pass the row-level security policies, which the superuser of the
    other fixture bypasses."""
    schema = await fresh_pg_schema()
    role = f"mp_plans_{uuid.uuid4().hex[:8]}"
    async with open_store(postgres_url, schema=schema) as owner:
        await grant_tenant_role(owner, role, "default")
    store = await open_store(make_url(postgres_url).set(username=role), schema=schema)
    try:
        yield store
    finally:
        await store.close()
        await pg_execute_async(f"DROP SCHEMA {schema} CASCADE")
        await pg_drop_roles(role)


def _live(plan: str) -> str:
    """``plan`` without the subtrees PostgreSQL knows never run (under a ``One-Time
    Filter: false``: a first checkpoint's update of a head it has just inserted)."""
    kept: list[str] = []
    dead_at: int | None = None
    for line in plan.splitlines():
        indent = len(line) - len(line.lstrip())
        if dead_at is not None and indent >= dead_at:
            continue
        dead_at = indent if line.strip() == "One-Time Filter: false" else None
        kept.append(line)
    return "\n".join(kept)


def _indexes(plan: str) -> list[str]:
    return [using or bitmap for using, bitmap in re.findall(
        r"(?:Index Scan|Index Only Scan) using (\w+)|Bitmap Index Scan on (\w+)", plan)]


@pytest.mark.postgres
async def test_row_level_security_by_role_leaves_every_plan_as_it_was(
        unanalyzed_store: SqlStore, unanalyzed_tenant_store: SqlStore,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The policies' tenant, ``(SELECT meshpoint_tenant(current_user))``, is an
    InitPlan run once per statement, and an index condition like any bound value:
    as a tenant's role, every statement reads the same indexes, in the same order,
    as without the policies, and none scans a table."""
    bare = await unanalyzed_store.run(await _by_key_workload(unanalyzed_store, monkeypatch))
    held = await unanalyzed_tenant_store.run(
        await _by_key_workload(unanalyzed_tenant_store, monkeypatch))
    assert held.keys() == bare.keys()
    for sql, plan in held.items():
        plan, bare[sql] = _live(plan), _live(bare[sql])
        # (the policies' InitPlans: one per table the statement reads or writes)
        assert "agent_" not in sql or plan.count("InitPlan") > bare[sql].count(
            "InitPlan"), plan
        assert not re.search(r"Seq Scan on agent_", plan), plan
        assert _indexes(plan) == _indexes(bare[sql]), f"{sql}\n{plan}\n\n{bare[sql]}"


@contextlib.contextmanager
def recording(seen: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Record the SQL and bound values of every statement the store runs meanwhile,
    in a transaction (Statement.rows) or on PostgreSQL's native connection (fetch)."""
    rows, fetch = Statement.rows, postgres.fetch

    def rows_recorded(self: Statement, conn: Connection, params: Any) -> Any:
        compiled = self.compiled(conn.dialect)
        seen.setdefault(compiled.sql, self.bind(compiled, params))
        return rows(self, conn, params)

    async def fetch_recorded(statement: Statement, native: Any, dialect: Any,
                             params: Any) -> Any:
        compiled = statement.compiled(dialect)
        seen.setdefault(compiled.sql, statement.bind(compiled, params))
        return await fetch(statement, native, dialect, params)

    with monkeypatch.context() as patch:
        patch.setattr(Statement, "rows", rows_recorded)
        patch.setattr(postgres, "fetch", fetch_recorded)
        yield


def _check(plans: dict[str, str]) -> None:
    wrong = []
    for sql, plan in plans.items():
        indexes = re.findall(r"(?:Index Scan|Index Only Scan) using (\w+)|"
                             r"Bitmap Index Scan on (\w+)", plan)
        indexes = [using or bitmap for using, bitmap in indexes]
        for index in indexes:
            marker = _SCAN_INDEXES.get(index)
            if marker is not None and marker not in sql:
                wrong.append(f"{index} for: {' '.join(sql.split())[:120]}\n{plan}")
        if re.search(r"Seq Scan on agent_", plan):
            wrong.append(f"sequential scan for: {' '.join(sql.split())[:120]}\n{plan}")
        # An index scanned on the tenant alone reads every row of the tenant: the
        # shape of a join to a returned row that PostgreSQL turned inside out.
        for cond in re.findall(r"Index Cond: \((.*)\)$", plan, flags=re.MULTILINE):
            bare = cond.replace("(", "").replace(")", "")
            if re.fullmatch(r"tenant_id::text = '[^']*'::text", bare):
                wrong.append(f"scan of a whole tenant for: {' '.join(sql.split())[:120]}"
                             f"\n{plan}")
    assert not wrong, "\n\n".join(wrong)


@pytest.mark.postgres
async def test_each_fast_path_is_taken_as_one_native_statement(
        unanalyzed_store: SqlStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """A hook that always gave way to its portable body would pass every other test
    (the body is right) and only show in a benchmark: so each operation with a fast
    path is run here and must send exactly its one statement, natively, and no
    statement in a transaction. A mid-turn checkpoint is a re-checkpoint too."""
    store = unanalyzed_store
    runs: dict[str, list[str]] = {}

    rows, fetch = Statement.rows, postgres.fetch

    @contextlib.contextmanager
    def taking(label: str) -> Iterator[None]:
        runs[label] = []

        def rows_recorded(self: Statement, conn: Connection, params: Any) -> Any:
            runs[label].append(f"transaction: {self.name}")
            return rows(self, conn, params)

        async def fetch_recorded(statement: Statement, native: Any, dialect: Any,
                                 params: Any) -> Any:
            runs[label].append(f"native: {statement.name}")
            return await fetch(statement, native, dialect, params)

        with monkeypatch.context() as patch:
            patch.setattr(Statement, "rows", rows_recorded)
            patch.setattr(postgres, "fetch", fetch_recorded)
            yield

    with taking("first"):
        await store.checkpoint_task(_task(1), "agent")
    with taking("resolve"):
        for k in range(3):
            await store.resolve_peer_sub_task(f"t1/sub-{k}", {"ok": k}, lease_owner="i-1")
    with taking("restore"):
        ctx = (await store.restore_task("t1", lease_owner="i-1")).context
    ctx.append_session_event({"role": "model", "text": "more"})
    ctx.current_invocation_id = "t1/inv-2"
    ctx.begin_parallel_calls("t1/inv-2", ["tool-1", "tool-2"])
    ctx.record_parallel_result("t1/inv-2", "tool-1", "done")
    with taking("mid-turn"):
        await store.checkpoint_task(ctx, "agent", status="working", lease_owner="i-1",
                                    holder="i-1")
    ctx.record_parallel_result("t1/inv-2", "tool-2", "done too")
    ctx.append_session_event({"role": "model", "text": "asks a peer"})
    ctx.current_invocation_id = "t1/inv-3"
    ctx.register_peer_sub_task("t1/sub-again", {"peer_agent_name": "peer-0"})
    with taking("re-checkpoint"):
        await store.checkpoint_task(ctx, "agent", lease_owner="i-1")
    assert runs == {"first": ["native: pg_first_checkpoint"],
                    "resolve": ["native: pg_resolve_one"] * 3,
                    "restore": ["native: pg_restore"],
                    "mid-turn": ["native: pg_recheckpoint"],
                    "re-checkpoint": ["native: pg_recheckpoint"]}
    restored = (await store.restore_task("t1")).context
    assert restored.session_events[-1] == {"role": "model", "text": "asks a peer"}
    assert [s.sub_task_id for s in await store.get_peer_sub_tasks_for_task("t1")] == [
        "t1/sub-again"]
    assert restored.parallel_tool_calls["t1/inv-2"].results == {"tool-1": "done",
                                                                "tool-2": "done too"}


async def test_sqlite_sweep_and_recovery_use_their_partial_indexes(
        tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    async with await open_store(f"sqlite:///{tmp_path}/plans.db") as store:
        for n in range(50):
            await store.checkpoint_task(_task(n), "agent")
        for n in range(10):
            for k in range(3):
                await store.resolve_peer_sub_task(f"t{n}/sub-{k}", {"ok": k})
        seen: dict[str, Any] = {}
        with recording(seen, monkeypatch):
            assert len(await store.resumable_tasks("agent")) == 10
            await store.sweep_expired_timeouts("agent")

        def explain(conn: Connection) -> dict[str, str]:
            return {sql: "\n".join(str(row[-1]) for row in conn.exec_driver_sql(
                "EXPLAIN QUERY PLAN " + sql, tuple(params)).all())
                for sql, params in seen.items() if sql.lstrip().upper().startswith(
                    ("SELECT", "UPDATE", "WITH"))}

        plans = await store.run(explain)
        recovery = [plan for sql, plan in plans.items() if RESUMING_PREDICATE in sql]
        sweep = [plan for sql, plan in plans.items() if "timeout_deadline <=" in sql]
        assert recovery and all("USING INDEX ix_agent_paused_tasks_resuming" in plan
                                for plan in recovery), plans
        assert sweep and all("ix_agent_peer_sub_tasks_deadline" in plan for plan in sweep), \
            plans
