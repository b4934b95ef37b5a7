"""The web dashboard (``meshpoint dashboard``) on a SQLite file and on PostgreSQL: every
page renders what the store holds; an approval given in the page, with arguments
edited in the form built from the tool's schema, completes a task a running instance
paused; and every write the dashboard refuses (no token, no session, a bad CSRF token,
another tenant's task) changes nothing. The application runs in the test's event loop
through httpx's ASGI transport (what Starlette's TestClient wraps), beside the
instances."""

from __future__ import annotations

import re
import uuid
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import httpx
import pytest

from meshpoint.context import TaskExecutionContext
from meshpoint.history.encryption import EncryptionKeys
from meshpoint.history.planning import HistoryOptions
from meshpoint.ops.dashboard import create_app
from meshpoint.store import SqlStore, open_store
from tests.conftest import snapshot
from tests.integration.mesh import Mesh, eventually
from tests.integration.test_approvals import SideEffects, approving, paused, status_of
from tests.integration.test_rls import Isolated, globex_paused, isolated  # noqa: F401 (a fixture)

TOKEN = "dashboard-test-token-" + "x" * 16


def client_of(store: SqlStore, *, token: str | None = TOKEN) -> httpx.AsyncClient:
    app = create_app(store=store, token=token)
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                             base_url="http://127.0.0.1", follow_redirects=False)


def csrf_of(page: str) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', page)
    assert found, "the page has no form with a CSRF token"
    return found.group(1)


async def signed_in(client: httpx.AsyncClient) -> str:
    """Sign ``client`` in with the token; the session's CSRF token."""
    page = await client.get("/login")
    response = await client.post("/login", data={"token": TOKEN, "csrf": csrf_of(page.text)})
    assert response.status_code == 303, response.text
    return csrf_of((await client.get("/approvals")).text)


@pytest.fixture
async def waiting(mesh: Mesh) -> AsyncIterator[tuple[str, str, SideEffects]]:
    """A task a running instance paused on a call needing approval: (task id, call
    id, the tool's record of its runs)."""
    effects = SideEffects()
    await mesh.run(replace(approving(effects), events=True))  # with an event log
    _request, task_id, pending = await paused(mesh, "Send the quarterly report")
    yield task_id, pending[0]["call_id"], effects


async def test_every_page_renders_and_an_approval_edited_in_the_form_completes_the_task(
        live_store: SqlStore, waiting: tuple[str, str, SideEffects]) -> None:
    task_id, call_id, effects = waiting
    async with client_of(live_store) as client:
        async def logged() -> bool:  # the event log is written a flush interval later
            return task_id in (await client.get("/events")).text

        await eventually(logged, what="the task's events on the events page")
        for path, shows in (("/", "input_required"), ("/tasks", task_id),
                            (f"/tasks?status=input_required&q={task_id[:12]}", task_id),
                            (f"/tasks/{task_id}", "Send the quarterly report"),
                            ("/approvals", call_id), ("/events", task_id),
                            ("/login", "token")):
            page = await client.get(path)
            assert page.status_code == 200, (path, page.text)
            assert shows in page.text, path
        assert task_id not in (await client.get("/tasks?status=waiting_peers")).text
        overview = (await client.get("/")).text
        assert re.search(r"\d+\.\d\d ms p99 of 1<", overview), "the pause's write time"
        assert "1 of 1 chains verify" in overview
        assert re.search(r"<td>coordinator</td><td class=\"ok\">closed</td>", overview)
        task_page = (await client.get(f"/tasks/{task_id}")).text
        assert 'name="arg.query"' in task_page and 'name="arg.to"' in task_page
        assert "verifies:" in task_page  # the chain, walked
        csrf = await signed_in(client)

        # A required argument cleared: refused by the tool's schema, shown on the form.
        before = await snapshot(live_store)
        refused = await client.post(f"/tasks/{task_id}/calls/{call_id}/approve",
                                    data={"csrf": csrf, "arg.query": "", "arg.to": ""})
        assert refused.status_code == 400
        assert "do not satisfy its schema" in refused.text and "form-error" in refused.text
        assert 'name="arg.query" value=""' in refused.text  # the form as sent, to correct
        assert await snapshot(live_store) == before
        assert await status_of(live_store, task_id) == "input_required"

        approved = await client.post(f"/tasks/{task_id}/calls/{call_id}/approve",
                                     data={"csrf": csrf, "arg.query": "Send the edited report",
                                           "arg.to": "", "by": "ops"})
        assert approved.status_code == 303, approved.text
        assert approved.headers["location"] == f"/tasks/{task_id}?done=approved"
        await eventually(lambda: bool(effects.runs), what="the approved tool's run")
        assert list(effects.arguments.values()) == [{"query": "Send the edited report"}]

        async def ended() -> bool:
            page = await client.get(f"/tasks/{task_id}")
            return page.status_code == 200 and "ended <strong>completed" in page.text

        await eventually(ended, what="the task's page showing it completed")
        again = await client.post(f"/tasks/{task_id}/calls/{call_id}/approve",
                                  data={"csrf": csrf, "arg.query": "twice"})
        assert again.status_code in (400, 404, 409)  # the task moved on: nothing written
        assert list(effects.runs.values()) == [1]


async def test_a_denial_and_a_reply_are_recorded_as_the_cli_records_them(
        mesh: Mesh, live_store: SqlStore) -> None:
    effects = SideEffects()
    await mesh.run(approving(effects))
    _r1, denied_task, pending = await paused(mesh, "Send it to everyone")
    _r2, replied_task, _ = await paused(mesh, "Send the draft")
    async with client_of(live_store) as client:
        csrf = await signed_in(client)
        denied = await client.post(f"/tasks/{denied_task}/calls/{pending[0]['call_id']}/deny",
                                   data={"csrf": csrf, "reason": "too broad"})
        assert denied.status_code == 303
        replied = await client.post(f"/tasks/{replied_task}/reply",
                                    data={"csrf": csrf, "text": "not yet"})
        assert replied.status_code == 303
        for task_id in (denied_task, replied_task):
            async def ended(task_id: str = task_id) -> bool:
                return "ended <strong>completed" in (await client.get(f"/tasks/{task_id}")).text

            await eventually(ended, what=f"task {task_id} completed")
    assert not effects.runs, "a denied or replied call ran"


async def test_a_write_without_a_token_session_or_csrf_token_is_refused_and_changes_nothing(
        live_store: SqlStore, waiting: tuple[str, str, SideEffects]) -> None:
    task_id, call_id, effects = waiting
    approve = f"/tasks/{task_id}/calls/{call_id}/approve"

    async def logged() -> bool:  # the pause's events are written a flush interval later
        async with client_of(live_store) as client:
            feed = await client.get(f"/events/feed?since_us=0&task={task_id}")
            return any(e["type"] == "protocol_handoff" for e in feed.json()["events"])

    await eventually(logged, what="the pause's events")
    before = await snapshot(live_store)
    async with client_of(live_store, token=None) as read_only:
        page = await read_only.get(f"/tasks/{task_id}")
        assert page.status_code == 200 and "read-only" in page.text
        refused = await read_only.post(approve, data={"csrf": csrf_of(page.text),
                                                      "arg.query": "x"})
        assert refused.status_code == 403 and "read-only" in refused.text
        login = await read_only.post("/login", data={"token": TOKEN,
                                                     "csrf": csrf_of(page.text)})
        assert login.status_code == 403
    async with client_of(live_store) as client:
        page = await client.get(f"/tasks/{task_id}")
        no_session = await client.post(approve, data={"csrf": csrf_of(page.text)})
        assert no_session.status_code == 403 and "sign in" in no_session.text
        wrong = await client.post("/login", data={"token": TOKEN[:-1] + "y",
                                                  "csrf": csrf_of(page.text)})
        assert wrong.status_code == 403
        stale = await client.post("/login", data={"token": TOKEN, "csrf": "forged"})
        assert stale.status_code == 403
        await signed_in(client)
        for data in ({"csrf": "forged"}, {}):
            bad_csrf = await client.post(approve, data={**data, "arg.query": "x"})
            assert bad_csrf.status_code == 403 and "CSRF" in bad_csrf.text
        # A GET never writes: the path names no task's page.
        assert (await client.get(approve)).status_code == 404
        reply = await client.post(f"/tasks/{task_id}/reply", data={"text": "x"})
        assert reply.status_code == 403
    # A session cookie of another token's dashboard is not signed in here.
    async with client_of(live_store, token="another-token-" + "z" * 16) as other:
        other.cookies = client.cookies
        page = await other.get("/approvals")
        assert "sign in" in page.text
        assert (await other.post(approve, data={"csrf": csrf_of(page.text)})).status_code == 403
    assert await snapshot(live_store) == before
    assert not effects.runs


async def test_another_tenants_task_is_not_found_and_cannot_be_answered(
        live_store: SqlStore, waiting: tuple[str, str, SideEffects]) -> None:
    task_id, call_id, effects = waiting
    async with client_of(live_store) as own:
        async def logged() -> bool:  # the event log is written a flush interval later
            feed = await own.get("/events/feed", params={"since_us": 0, "task": task_id})
            return bool(feed.json()["events"])

        await eventually(logged, what="the task's events, seen by its own tenant")
    before = await snapshot(live_store)
    async with client_of(live_store.for_tenant("other-tenant")) as client:
        assert "other-tenant" in (await client.get("/")).text
        assert (await client.get(f"/tasks/{task_id}")).status_code == 404
        assert task_id not in (await client.get("/tasks")).text
        assert call_id not in (await client.get("/approvals")).text
        feed = await client.get("/events/feed", params={"since_us": 0, "task": task_id})
        assert feed.json() == {"events": []}
        csrf = await signed_in(client)
        answered = await client.post(f"/tasks/{task_id}/calls/{call_id}/approve",
                                     data={"csrf": csrf, "arg.query": "x"})
        assert answered.status_code == 404
        denied = await client.post(f"/tasks/{task_id}/calls/{call_id}/deny",
                                   data={"csrf": csrf, "reason": "x"})
        assert denied.status_code == 404
    assert await snapshot(live_store) == before
    assert not effects.runs


async def test_an_encrypted_field_is_never_shown_without_its_key(
        live_store: SqlStore) -> None:
    """A request and a tool's arguments sealed under the tenant's key: no page of a
    dashboard without the key shows them (the task's page says why it cannot be
    read, the events are shown sealed); with the key, the pages show them (which
    proves the test would see them)."""
    mark = f"mk{uuid.uuid4().hex[:12]}"
    keyed = live_store.with_history(HistoryOptions(encryption=EncryptionKeys.generate(
        "default")))
    mesh = await Mesh(keyed).start()
    try:
        await mesh.run(replace(approving(SideEffects()), events=True))
        _request, task_id, _pending = await paused(mesh, f"Send {mark}")

        async def logged() -> bool:  # the event log is written a flush interval later
            async with client_of(keyed) as client:
                return mark in (await client.get("/events")).text

        await eventually(logged, what="the task's events")
        pages = ("/", "/tasks", f"/tasks/{task_id}", "/approvals", "/events",
                 f"/events/feed?since_us=0&task={task_id}")

        async def texts(store: SqlStore) -> str:
            async with client_of(store) as client:
                return "\n".join([(await client.get(path)).text for path in pages])

        assert mark in await texts(keyed)
        assert mark not in await texts(live_store)
        async with client_of(live_store) as keyless:
            # The task's page still renders what is stored in clear (its status,
            # agent, deadlines, history chain and events), the checkpoint marked
            # sealed and why; the event log shows its events, their payloads sealed.
            page = await keyless.get(f"/tasks/{task_id}")
            assert page.status_code == 200, page.text
            assert 'id="sealed"' in page.text and "no encryption key ring" in page.text
            assert "input_required" in page.text and _pending[0]["call_id"] in page.text
            assert 'id="verification"' in page.text and 'id="task-events"' in page.text
            assert "(sealed: no key to read it)" in page.text
            # the inbox says a sealed call waits, rather than that none does
            inbox = await keyless.get("/approvals")
            assert inbox.status_code == 200 and 'id="empty"' not in inbox.text
            assert _pending[0]["call_id"] in inbox.text and "sealed" in inbox.text
            # and an answer given there is refused on the page, never a 500
            csrf = await signed_in(keyless)
            refused = await keyless.post(
                f"/tasks/{task_id}/calls/{_pending[0]['call_id']}/deny",
                data={"csrf": csrf, "reason": "no"})
            assert 400 <= refused.status_code < 500 and mark not in refused.text
            feed = (await keyless.get(pages[-1])).json()["events"]
            assert any("(sealed: no key to read it)" in (e["input"] + e["output"])
                       for e in feed)
    finally:
        await mesh.close()


async def test_the_task_list_pages_by_id_with_filters(live_store: SqlStore) -> None:
    ids = [f"page-{n:03d}" for n in range(120)] + ["other-1", "other-2"]
    for n, task_id in enumerate(ids):
        ctx = TaskExecutionContext(task_id)
        ctx.current_invocation_id = "inv"
        ctx.register_peer_sub_task(f"{task_id}/s", {"peer_agent_name": "p", "timeout_s": 60})
        await live_store.checkpoint_task(ctx, "lister" if n % 2 else "other-agent")
    seen: list[str] = []
    after = ""
    async with client_of(live_store) as client:
        while True:
            page = await client.get("/tasks", params={"q": "page-", "after": after})
            assert page.status_code == 200
            found = re.findall(r'href="/tasks/(page-\d+)"', page.text)
            seen += found
            following = re.search(r'id="next" href="[^"]*after=([^"&]+)"', page.text)
            if following is None:
                break
            after = following.group(1)
        assert seen == sorted(ids[:120])
        agent_page = await client.get("/tasks", params={"agent": "lister"})
        assert "other-agent" not in agent_page.text
        assert (await client.get("/tasks?status=nonsense")).status_code == 400
    rows = await live_store.tasks_page(prefix="page-", after="page-049", limit=3)
    assert [r.task_id for r in rows] == ["page-050", "page-051", "page-052"]
    assert all(r.pending_sub_tasks == 1 for r in rows)
    assert [r.task_id for r in await live_store.tasks_page(prefix="other-")] == ids[120:]


async def _explain_plan(store: SqlStore, params: dict[str, Any]) -> str:
    """PostgreSQL's plan of the store's ``tasks_page`` statement with ``params``."""
    from meshpoint.store import queries as q

    def explain(conn: Any) -> str:
        sql = q.TASKS_PAGE.clause.params(**params).compile(
            dialect=conn.dialect, compile_kwargs={"literal_binds": True})
        return "\n".join(r[0] for r in conn.exec_driver_sql(f"EXPLAIN {sql}").all())

    return await store.run(explain)


@pytest.mark.parametrize("backend", [pytest.param("postgres", marks=pytest.mark.postgres)],
                         indirect=True)
async def test_a_page_of_100000_paused_tasks_is_read_by_the_primary_key(
        live_store: SqlStore, backend: str) -> None:
    """EXPLAIN on PostgreSQL, over 100,000 paused tasks: the page, its prefix search
    and its status filter read the primary key's index in id order (no sort of every
    task, no scan of the table), and the count of open sub-tasks is read per row by
    the sub-tasks' index."""
    await live_store.run(lambda conn: conn.exec_driver_sql(
        "INSERT INTO agent_paused_tasks (tenant_id, logical_task_id, agent_name, status, "
        "context, context_encoding, context_sha256, session_event_count, version, "
        "created_at, checkpointed_at) SELECT 'default', 'task-' || lpad(n::text, 6, '0'), "
        "'agent-' || (n % 7), CASE WHEN n % 3 = 0 THEN 'input_required' ELSE "
        "'waiting_peers' END, '\\x7b7d'::bytea, 'json', '', 0, 1, n, n "
        "FROM generate_series(1, 100000) AS n"), write=True)
    await live_store.run(lambda conn: conn.exec_driver_sql(
        "INSERT INTO agent_peer_sub_tasks (tenant_id, sub_task_id, logical_task_id, "
        "agent_name, invocation_id, function_call_id, correlation_data, timeout_s, "
        "timeout_deadline, status, created_at) SELECT 'default', 'sub-' || n, "
        "'task-' || lpad(n::text, 6, '0'), 'agent-' || (n % 7), 'inv', 'c', '{}', 60, "
        "n + 60, 'pending', n FROM generate_series(1, 100000) AS n"), write=True)
    for table in ("agent_paused_tasks", "agent_peer_sub_tasks"):
        await live_store.run(lambda conn, t=table: conn.exec_driver_sql(f"ANALYZE {t}"),
                             write=True)
    base = {"p_tenant": "default", "p_after": "", "p_from": "", "p_to": "\U0010ffff",
            "p_agent": None, "p_any_agent": True, "p_status": None, "p_any_status": True,
            "p_limit": 51}
    for params in (base, {**base, "p_after": "task-050000"},
                   {**base, "p_from": "task-0123", "p_to": "task-0123\U0010ffff"},
                   {**base, "p_status": "input_required", "p_any_status": False,
                    "p_agent": "agent-3", "p_any_agent": False}):
        plan = await _explain_plan(live_store, params)
        assert "agent_paused_tasks_pkey" in plan, plan
        assert "Seq Scan on agent_paused_tasks" not in plan, plan
        assert "Sort" not in plan, plan
        assert "ix_agent_peer_sub_tasks_task" in plan, plan
    rows = await live_store.tasks_page(prefix="task-0123", limit=50)
    assert [r.task_id for r in rows][:2] == ["task-012300", "task-012301"]
    assert len(rows) == 50 and all(r.pending_sub_tasks == 1 for r in rows)


@pytest.mark.parametrize("backend", [pytest.param("postgres", marks=pytest.mark.postgres)],
                         indirect=True)
async def test_as_a_tenants_role_under_row_security_another_tenants_task_is_not_there(
        backend: str, isolated: Isolated) -> None:  # noqa: F811 (the fixture)
    """The dashboard of tenant acme, connected as acme's role (row-level security,
    nothing owned, no bypass) the way ``meshpoint dashboard --url … --tenant acme``
    opens it: globex's paused task is in no page and its page is not found."""
    from meshpoint.cli.common import store_opener

    await globex_paused(isolated)
    async with store_opener(isolated.url("acme"), None, schema=isolated.schema,
                            tenant="acme") as acme, client_of(acme) as client:
        overview = await client.get("/")
        assert overview.status_code == 200 and "acme" in overview.text
        assert "paused tasks: 0" in overview.text
        assert "role-warning" not in overview.text  # the tenant's role: held by RLS
        assert "g1" not in (await client.get("/tasks")).text
        assert (await client.get("/tasks/g1")).status_code == 404
    async with isolated.open("globex") as globex, client_of(globex) as client:
        assert 'href="/tasks/g1"' in (await client.get("/tasks")).text  # it is there
    # As the tables' owner (a superuser here), every page warns that RLS does not hold.
    async with open_store(isolated.owner_url, schema=isolated.schema, tenant_id="acme",
                          migrate=False) as owner, client_of(owner) as client:
        assert "row-level security does not hold" in (await client.get("/tasks")).text
