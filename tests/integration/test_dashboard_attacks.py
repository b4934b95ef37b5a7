"""The dashboard attacked, on a SQLite file and on PostgreSQL: markup a requester
wrote (in the request, hence the tool's arguments) is text on every page; bad ids,
cursors and filters, and form fields a decision refuses, are answered 4xx, never a
500; every response carries the security headers (a Content-Security-Policy without
inline script among them); the session cookie is HttpOnly and SameSite=Strict; a
wrong token at the login form waits before its answer."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

import pytest

from meshpoint.ops.dashboard import security
from meshpoint.store import SqlStore
from tests.integration.mesh import Mesh
from tests.integration.test_approvals import SideEffects, approving, paused
from tests.integration.test_dashboard import TOKEN, client_of, csrf_of, signed_in

MARKUP = "<script>alert(1)</script><img src=x onerror=alert(2)>"


async def test_markup_a_requester_wrote_is_text_on_every_page(mesh: Mesh) -> None:
    await mesh.run(replace(approving(SideEffects()), events=True))
    _request, task_id, pending = await paused(mesh, f"Send {MARKUP}")
    call_id = pending[0]["call_id"]
    async with client_of(mesh.store) as client:
        csrf = await signed_in(client)
        pages = [await client.get(path) for path in
                 ("/", "/tasks", f"/tasks/{task_id}", "/approvals", "/events")]
        # a refused edit shows the form as it was sent: the markup, escaped
        pages.append(await client.post(f"/tasks/{task_id}/calls/{call_id}/approve",
                                       data={"csrf": csrf, "arg.query": "",
                                             "by": MARKUP}))
        for page in pages:
            assert page.status_code in (200, 400), page.text
            assert "<script>alert" not in page.text and "<img src=x" not in page.text
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in pages[2].text
        feed = await client.get(f"/events/feed?since_us=0&task={task_id}")
        assert feed.headers["content-type"] == "application/json"
        assert feed.headers["x-content-type-options"] == "nosniff"


async def test_bad_input_is_a_4xx_never_a_500(mesh: Mesh) -> None:
    await mesh.run(approving(SideEffects()))
    _request, task_id, pending = await paused(mesh, "Send the report")
    call_id, long = pending[0]["call_id"], "x" * 5000
    async with client_of(mesh.store) as client:
        for path in ("/tasks/nope", f"/tasks/{long}", "/tasks/%00", f"/tasks?after={long}",
                     f"/tasks?q={long}", "/tasks?status=bogus", f"/approvals?after={long}",
                     f"/events?task={long}", f"/events?agent={long}",
                     "/events/feed?since_us=abc", "/events/feed?since_us=-1",
                     f"/events/feed?since_us={10 ** 30}", "/static/../app.py",
                     "/static/%2e%2e/app.py", "/logout"):
            page = await client.get(path)
            assert 400 <= page.status_code < 500, (path, page.status_code, page.text)
        csrf = await signed_in(client)
        write = f"/tasks/{task_id}/calls/{call_id}"
        for path, data in ((f"{write}/deny", {"reason": long * 3}),
                           (f"{write}/deny", {"by": long}),
                           (f"/tasks/{task_id}/calls/{long}/deny", {}),
                           (f"{write}/approve", {"by": long}),
                           (f"{write}/explode", {}),
                           (f"/tasks/{long}/reply", {"text": "t"}),
                           (f"/tasks/{task_id}/reply", {"text": long * 30}),
                           ("/tasks/nope/reply", {"text": "t"})):
            page = await client.post(path, data={"csrf": csrf, **data})
            assert 400 <= page.status_code < 500, (path, page.status_code, page.text)
    restored = await mesh.store.restore_task(task_id)
    assert restored.status == "input_required"  # nothing was written


async def test_a_second_answer_is_refused_on_the_page_and_a_banner_is_never_free_text(
        mesh: Mesh) -> None:
    await mesh.run(approving(SideEffects()))
    _request, task_id, pending = await paused(mesh, "Send the report")
    approve = f"/tasks/{task_id}/calls/{pending[0]['call_id']}/approve"
    async with client_of(mesh.store) as client:
        csrf = await signed_in(client)
        assert (await client.post(approve, data={"csrf": csrf})).status_code == 303
        again = await client.post(approve, data={"csrf": csrf})
        # the call has no form any more: the refusal is shown above the page
        assert again.status_code in (400, 409) and 'id="refused"' in again.text
        spoofed = await client.get(f"/tasks/{task_id}?done=approved+by+the+CFO")
        assert "by the CFO" not in spoofed.text


async def test_every_response_carries_the_security_headers_and_the_cookie_flags(
        live_store: SqlStore, monkeypatch: pytest.MonkeyPatch) -> None:
    waits: list[float] = []

    async def sleep(seconds: float, *args: Any) -> None:
        waits.append(seconds)

    monkeypatch.setattr(security, "_pause", sleep)
    async with client_of(live_store) as client:
        login = await client.get("/login")  # the first page sets the session cookie
        cookie = login.headers["set-cookie"].lower()
        assert "httponly" in cookie and "samesite=strict" in cookie
        for path in ("/", "/tasks", "/login", "/tasks/nope", "/static/events.js",
                     "/events/feed"):
            response = await client.get(path)
            for name, value in security.HEADERS.items():
                assert response.headers[name] == value, (path, name)
        policy = security.HEADERS["content-security-policy"]
        assert "'unsafe-inline'" not in policy and "frame-ancestors 'none'" in policy
        # A wrong token waits before its answer; the right one does not.
        wrong = await client.post("/login", data={"token": "guess-" + "g" * 20,
                                                  "csrf": csrf_of(login.text)})
        assert wrong.status_code == 403 and waits == [security.LOGIN_FAILURE_DELAY_S]
        right = await client.post("/login", data={"token": TOKEN, "csrf": csrf_of(login.text)})
        assert right.status_code == 303 and len(waits) == 1


async def test_wrong_tokens_are_judged_one_at_a_time(live_store: SqlStore,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Concurrent guesses do not wait side by side: each failure's pause starts once
    the one before has ended."""
    release = asyncio.Event()
    waiting = 0

    async def sleep(seconds: float, *args: Any) -> None:
        nonlocal waiting
        waiting += 1
        await release.wait()

    monkeypatch.setattr(security, "_pause", sleep)
    async with client_of(live_store) as client:
        csrf = csrf_of((await client.get("/login")).text)
        guesses = [asyncio.create_task(client.post(
            "/login", data={"token": f"guess-{n}-" + "g" * 20, "csrf": csrf}))
            for n in range(3)]
        for _ in range(100):
            await asyncio.sleep(0.01)
        assert waiting == 1  # the other two wait for the lock, not side by side
        release.set()
        assert [r.status_code for r in await asyncio.gather(*guesses)] == [403] * 3
        assert waiting == 3
