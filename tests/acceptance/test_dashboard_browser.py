"""The dashboard in a real browser (Debian's Chromium, driven by Playwright): an
approval given in the page completes a task a running instance paused; the pages of
a workflow's task and of a handed-off task; the live events page showing a new event
without a reload; and a write without the token refused. The dashboard (uvicorn) and
the instances run on one event loop in a thread of their own, on a SQLite file.

Each test writes a screenshot of its page: to a temporary directory, or into
``MESHPOINT_SCREENSHOTS_DIR`` (docs/dashboard/ keeps one run's). Without Chromium
the tests skip saying so (fail under MESHPOINT_REQUIRE_SERVICES=1): scripts/services.sh
installs it in CI.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import socket
import threading
import time
from collections.abc import Coroutine, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar

import pytest

from meshpoint.llm import ScriptedModel
from meshpoint.ops.dashboard import create_app
from meshpoint.runtime import Agent, SequentialAgent, SubAgent
from meshpoint.runtime.options import HandoffPolicy
from meshpoint.store import SqlStore, open_store
from tests.conftest import service_missing
from tests.integration.mesh import ManualPeer, Mesh
from tests.integration.test_approvals import SideEffects, approving
from tests.integration.test_handoff import tools
from tests.integration.test_workflows import Said

CHROMIUM = os.environ.get("MESHPOINT_CHROMIUM", "/usr/bin/chromium")
TOKEN = "browser-test-token-" + "b" * 16
R = TypeVar("R")


class Background:
    """An event loop on a thread of its own, for the dashboard and the instances
    while the test drives the browser from the main thread."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, R], timeout_s: float = 30.0) -> R:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout_s)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


class Served:
    """A store, a mesh of instances and the dashboard on it, served on 127.0.0.1."""

    def __init__(self, background: Background, store: SqlStore, mesh: Mesh,
                 server: Any, port: int) -> None:
        self.background, self.store, self.mesh = background, store, mesh
        self.server, self.url = server, f"http://127.0.0.1:{port}"

    def run(self, coro: Coroutine[Any, Any, R], timeout_s: float = 30.0) -> R:
        return self.background.run(coro, timeout_s)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """One Chromium for the module's tests."""
    if not Path(CHROMIUM).exists() or shutil.which(CHROMIUM) is None:
        service_missing(f"no Chromium at {CHROMIUM}: `apt-get install chromium` "
                        "(scripts/services.sh does in CI), or set MESHPOINT_CHROMIUM")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        service_missing("playwright is not installed (pip install 'meshpoint[test]')")
    playwright = sync_playwright().start()
    try:
        launched = playwright.chromium.launch(executable_path=CHROMIUM,
                                              args=["--no-sandbox", "--disable-gpu"])
        try:
            yield launched
        finally:
            launched.close()
    finally:
        playwright.stop()


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Served]:
    import uvicorn

    background = Background()
    port = free_port()

    async def start() -> Served:
        store = await open_store(f"sqlite:///{tmp_path / 'dashboard.db'}", migrate=True)
        mesh = await Mesh(store).start()
        app = create_app(store=store, token=TOKEN)
        server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, ws="none",
                                               lifespan="off", log_level="warning"))
        server.config.setup_event_loop = lambda: None  # type: ignore[method-assign]
        asyncio.get_running_loop().create_task(server.serve())
        while not server.started:
            await asyncio.sleep(0.01)
        return Served(background, store, mesh, server, port)

    running = background.run(start())
    try:
        yield running
    finally:
        async def stop() -> None:
            running.server.should_exit = True
            await asyncio.sleep(0.2)
            await running.mesh.close()
            await running.store.close()

        background.run(stop())
        background.close()


def screenshot(page: Any, name: str) -> Path:
    """Write the page's screenshot: into MESHPOINT_SCREENSHOTS_DIR, else a temporary
    directory."""
    folder = Path(os.environ.get("MESHPOINT_SCREENSHOTS_DIR") or
                  os.environ.get("PYTEST_TMPDIR", "/tmp") + "/meshpoint-screenshots")
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path


def reload_until(page: Any, text: str, *, timeout_s: float = 15.0) -> None:
    """Reload the page until it shows ``text``."""
    end = time.monotonic() + timeout_s
    while text not in page.content():
        assert time.monotonic() < end, f"the page never showed {text!r}"
        page.wait_for_timeout(200)
        page.reload()


def sign_in(page: Any, url: str) -> None:
    page.goto(f"{url}/login")
    page.fill("input[name=token]", TOKEN)
    page.click("text=sign in >> nth=-1")
    page.wait_for_url(f"{url}/approvals")


def test_an_approval_given_in_the_page_completes_the_paused_task(
        browser: Any, served: Served) -> None:
    effects = SideEffects()

    async def pause() -> tuple[str, str]:
        await served.mesh.run(replace(approving(effects), events=True))
        request_id = await served.mesh.client.submit("coordinator", "Send the board memo")
        pending = await served.mesh.client.wait_input(request_id, timeout_s=10)
        return served.mesh.client.task_id("coordinator", request_id), pending[0]["call_id"]

    task_id, call_id = served.run(pause())
    page = browser.new_page()
    sign_in(page, served.url)
    form = page.locator(f"#call-{call_id} form.approve")
    assert form.locator("input[name='arg.query']").input_value() == "Send the board memo"
    # A required argument cleared is refused on the form, and nothing is written.
    form.locator("input[name='arg.query']").fill("")
    form.locator("button").click()
    page.wait_for_selector(".form-error")
    assert "do not satisfy its schema" in page.inner_text(".form-error")
    screenshot(page, "approval-refused-by-schema")
    page.goto(f"{served.url}/approvals")
    form = page.locator(f"#call-{call_id} form.approve")
    form.locator("input[name='arg.query']").fill("Send the edited board memo")
    form.locator("button").click()
    page.wait_for_url(re.compile(r".*done=approved$"))
    reload_until(page, "ended <strong>completed</strong>")
    assert list(effects.arguments.values()) == [{"query": "Send the edited board memo"}]
    assert "task " + task_id in page.inner_text("h1")
    screenshot(page, "task-approved-and-completed")


def test_a_workflows_task_page_shows_each_stage(browser: Any, served: Served) -> None:
    async def pause() -> str:
        await served.mesh.run(Agent("outliner", Said("outliner", "1. moon 2. sun")))
        await ManualPeer(served.mesh, "editor").start()  # never answers: the task waits
        await served.mesh.run(SequentialAgent(name="pipeline", sub_agents=[
            SubAgent(agent="outliner", output_key="outline"),
            SubAgent(agent="editor", output_key="edited")]))
        request_id = await served.mesh.client.submit("pipeline", "Explain the tides")
        return served.mesh.client.task_id("pipeline", request_id)

    task_id = served.run(pause())
    page = browser.new_page()
    page.goto(f"{served.url}/tasks/{task_id}")
    reload_until(page, "editor: <strong>running</strong>")
    stages = page.inner_text("#workflow")
    assert "workflow (sequential" in stages
    assert "outline → outliner: done" in stages and "edited → editor: running" in stages
    assert "waiting_peers" in page.inner_text("#status")
    screenshot(page, "task-workflow")


def test_a_handed_off_tasks_page_shows_its_iterations(browser: Any, served: Served) -> None:
    async def run() -> str:
        model = ScriptedModel("worker", rounds=3, handoff_after=1)
        await served.mesh.run(Agent("worker", model, tools=tools(),
                                    handoff=HandoffPolicy(context_utilization=None)))
        answer = await served.mesh.client.ask("worker", "Survey: alpha", timeout_s=30)
        return str(answer.id)

    task_id = served.run(run(), timeout_s=60)
    page = browser.new_page()
    page.goto(f"{served.url}/tasks/{task_id}")
    reload_until(page, "ended <strong>completed</strong>")
    rows = page.locator("#iterations tr")
    assert rows.count() == 4, page.inner_text("#iterations")  # a header, three iterations
    assert page.inner_text("#iterations").count("explicit") >= 2
    assert "verifies:" in page.inner_text("#verification")
    screenshot(page, "task-handed-off")


def test_the_events_page_shows_a_new_event_without_a_reload(
        browser: Any, served: Served) -> None:
    effects = SideEffects()
    served.run(served.mesh.run(replace(approving(effects), events=True)))
    page = browser.new_page()
    page.goto(f"{served.url}/events")
    page.evaluate("window.notReloaded = true")

    async def submit() -> str:
        request_id = await served.mesh.client.submit("coordinator", "Send the late memo")
        await served.mesh.client.wait_input(request_id, timeout_s=10)
        return served.mesh.client.task_id("coordinator", request_id)

    task_id = served.run(submit())
    page.wait_for_selector(f"#events tr.new >> text={task_id}", timeout=15_000)
    assert page.evaluate("window.notReloaded") is True
    screenshot(page, "events-live")


def test_a_write_without_the_token_is_refused_and_changes_nothing(
        browser: Any, served: Served) -> None:
    effects = SideEffects()

    async def pause() -> tuple[str, str]:
        await served.mesh.run(approving(effects))
        request_id = await served.mesh.client.submit("coordinator", "Send the payroll")
        pending = await served.mesh.client.wait_input(request_id, timeout_s=10)
        return served.mesh.client.task_id("coordinator", request_id), pending[0]["call_id"]

    task_id, call_id = served.run(pause())
    page = browser.new_page()
    page.goto(f"{served.url}/approvals")
    page.locator(f"#call-{call_id} form.approve button").click()
    page.wait_for_selector("#error")
    assert "sign in with the dashboard's token first" in page.inner_text("#error")
    screenshot(page, "write-refused-without-token")

    async def status() -> str:
        return (await served.store.restore_task(task_id)).status

    assert served.run(status()) == "input_required"
    assert not effects.runs
