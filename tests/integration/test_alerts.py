"""Recovery limits, the breaker and alerts at work in a mesh (docs/runtime.md,
"Recovery limits, the circuit breaker and alerts"): on a SQLite file and on
PostgreSQL, with the in-process broker and with NATS."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any

import pytest

from meshpoint.broker.base import Delivery
from meshpoint.llm.base import ModelResponse, ToolSpec
from meshpoint.runtime import Agent
from meshpoint.runtime.agent import CheckpointPolicy, RecoveryPolicy
from meshpoint.runtime.options import AlertOptions
from meshpoint.runtime.subjects import Subjects
from meshpoint.store import SqlStore
from tests.integration.mesh import Mesh, RecordingBroker, eventually


class Webhook:
    """A local HTTP server that keeps the JSON bodies POSTed to it; the first
    ``fail_first`` requests get a 503 (the alerts must retry)."""

    def __init__(self, fail_first: int = 1) -> None:
        self.bodies: list[dict[str, Any]] = []
        self.requests = 0
        hook = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                hook.requests += 1
                if hook.requests <= fail_first:
                    self.send_response(503)
                else:
                    hook.bodies.append(json.loads(body))
                    self.send_response(204)
                self.end_headers()

            def log_message(self, *_args: Any) -> None:
                pass

        self.server = HTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/alerts"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> Webhook:
        self.thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def webhook() -> Iterator[Webhook]:
    with Webhook() as hook:
        yield hook


class KillsItsHolder:
    """A model whose every call kills the instance running the task (as a crash in
    the model call would), then never answers."""

    name = "killer"

    def __init__(self, mesh: Mesh) -> None:
        self.mesh = mesh
        self.calls = 0

    async def complete(self, messages: list[dict[str, Any]],
                       tools: list[ToolSpec]) -> ModelResponse:
        self.calls += 1
        # The instance that runs this call: the one holding a task in memory (the
        # test's only task); not merely the first alive, whose death would leave the
        # holder waiting, its lease renewed, and no failure to count.
        alive = [i for i in self.mesh.instances if i.running and i.active]
        victim = next((i for i in alive if i._in_hand.runs), alive[0])
        asyncio.get_running_loop().create_task(victim.kill())
        await asyncio.Event().wait()
        raise AssertionError("unreachable")


async def alert_subscriber(mesh: Mesh, agent: str) -> list[dict[str, Any]]:
    """Every alert published to the agent's alert subject."""
    seen: list[dict[str, Any]] = []

    async def on_alert(delivery: Delivery) -> None:
        seen.append(json.loads(delivery.message.data))
        await delivery.ack()

    subject = Subjects(mesh.options.namespace, mesh.store.tenant_id).alerts(agent)
    await mesh.broker.subscribe(subject, f"{mesh.options.namespace}-test-alerts", on_alert)
    return seen


async def test_past_max_recoveries_a_task_is_blocked_its_caller_told_and_alerted(
        broker_mesh: Mesh, live_store: SqlStore, webhook: Webhook) -> None:
    mesh = broker_mesh
    seen = await alert_subscriber(mesh, "worker")
    agent = Agent("worker", KillsItsHolder(mesh), checkpoint=CheckpointPolicy(before_llm=True),
                  recovery=RecoveryPolicy(max_recoveries=1, breaker_failures=0))
    await mesh.run(agent, 3, alerts=AlertOptions(webhook=webhook.url))
    request_id = await mesh.client.submit("worker", "never finishes")
    task_id = mesh.client.task_id("worker", request_id)

    async def blocked() -> bool:
        return [t.status for t in await live_store.list_paused_tasks()] == ["blocked"]

    await eventually(blocked, timeout_s=20, what="the task blocked")
    # Its holder died twice: one take-over was allowed (max_recoveries 1), the next blocks.
    assert agent.model.calls == 2  # type: ignore[attr-defined]
    await eventually(lambda: any(a["kind"] == "blocked" for a in seen), timeout_s=10,
                     what="the alert on the broker")
    alert = next(a for a in seen if a["kind"] == "blocked")
    assert alert["task_id"] == task_id and "max_recoveries" in alert["text"]
    await eventually(lambda: any(b["kind"] == "blocked" for b in webhook.bodies),
                     timeout_s=10, what="the alert at the webhook (after a 503)")
    assert webhook.requests >= 2
    history = await live_store.history.get_checkpoint_history(task_id)
    phases = [record.execution_state.phase for record in reversed(history)]
    # Each take-over is a record; the resumed run's checkpoint (no progress) between.
    assert phases == ["working", "recovering", "working", "recovering", "blocked"]
    if isinstance(mesh.broker, RecordingBroker):  # the caller was told, as for any block
        told = [data for subject, data in mesh.broker.published(
            f"{mesh.options.namespace}.a2a.v1.client.") if b"meshpoint_blocked" in data]
        assert told and b"max_recoveries" in told[0]
    # It stays blocked: recovery leaves it to an operator.
    await asyncio.sleep(3 * mesh.options.recovery_interval_s)
    assert await blocked()


async def test_the_breaker_opens_on_failed_resumes_holds_the_tasks_and_alerts(
        mesh: Mesh, live_store: SqlStore) -> None:
    """Take-overs are failed resumes: two open a breaker of two failures; while it is
    open no instance resumes the agent's tasks, nor takes them (they stay stored)."""
    seen = await alert_subscriber(mesh, "worker")
    policy = RecoveryPolicy(max_recoveries=0, breaker_failures=2, breaker_window_s=60,
                            breaker_cooldown_s=60)
    agent = Agent("worker", KillsItsHolder(mesh), checkpoint=CheckpointPolicy(before_llm=True),
                  recovery=policy)
    await mesh.run(agent, 4)
    request_id = await mesh.client.submit("worker", "never finishes")
    task_id = mesh.client.task_id("worker", request_id)
    await eventually(lambda: any(a["kind"] == "breaker_opened" for a in seen), timeout_s=20,
                     what="the breaker to open")
    state = await live_store.breakers.state("worker")
    assert state.state == "open"
    # A resume admitted just before the breaker opened may still be running: let it
    # end (its holder is killed, its lease expires) before counting.
    await asyncio.sleep(2 * mesh.options.lease_ttl_s)
    calls = agent.model.calls  # type: ignore[attr-defined]
    taken = len(mesh.events("recovered"))
    await asyncio.sleep(5 * mesh.options.lease_ttl_s)
    assert agent.model.calls == calls, "no resume while the breaker is open"  # type: ignore[attr-defined]
    # Recovery does not even take the task (to give it up at once) while it is open.
    assert len(mesh.events("recovered")) == taken
    assert [t.task_id for t in await live_store.list_paused_tasks()] == [task_id]


async def test_an_expired_task_and_a_dead_letter_are_alerted_and_recorded(
        mesh: Mesh, live_store: SqlStore) -> None:
    """Alerts are recorded in the event log (type ``alert``) whether or not the agent
    keeps one, for ``meshpoint alerts``."""
    from meshpoint.events.log import EventStore
    from meshpoint.llm import ScriptedModel
    from meshpoint.runtime import Peer
    from tests.integration.mesh import ManualPeer

    seen = await alert_subscriber(mesh, "coordinator")
    await ManualPeer(mesh, "researcher").start()
    agent = Agent("coordinator", ScriptedModel(), peers=[Peer("researcher", timeout_s=60)],
                  recovery=RecoveryPolicy(timeout_s=0.3))
    await mesh.run(agent)
    request_id = await mesh.client.submit("coordinator", "Look into it")
    task_id = mesh.client.task_id("coordinator", request_id)
    await mesh.client.wait(request_id, timeout_s=10)
    await mesh.broker.publish(Subjects(mesh.options.namespace).request("coordinator"),
                              b"not json")
    await eventually(lambda: {a["kind"] for a in seen} >= {"expired", "dead_lettered"},
                     what="both alerts on the broker")
    assert next(a for a in seen if a["kind"] == "expired")["task_id"] == task_id
    log = EventStore(live_store)
    recorded = await log.get_events(event_type="alert")
    assert {(e.step_name, e.thread_id) for e in recorded} >= {("expired", task_id),
                                                               ("dead_lettered", None)}


async def test_a_task_blocked_by_its_spent_budget_raises_one_alert(
        mesh: Mesh, live_store: SqlStore) -> None:
    """A handoff's block (the token budget spent) is alerted once, by the same path as
    every block (the stats' ``blocked``), not once more by the handoff."""
    from meshpoint.llm import ScriptedModel
    from meshpoint.runtime.options import HandoffPolicy
    from tests.integration.test_handoff import tools

    seen = await alert_subscriber(mesh, "worker")
    agent = Agent("worker", ScriptedModel("worker", rounds=6), tools=tools(),
                  handoff=HandoffPolicy(budget_tokens=1, context_utilization=None))
    await mesh.run(agent, 2)
    await mesh.client.submit("worker", "a long job")

    async def blocked() -> bool:
        return [t.status for t in await live_store.list_paused_tasks()] == ["blocked"]

    await eventually(blocked, timeout_s=20, what="the task blocked by its budget")
    await eventually(lambda: any(a["kind"] == "blocked" for a in seen), what="its alert")
    await asyncio.sleep(0.5)
    assert [a["kind"] for a in seen] == ["blocked"]
    assert sum(len([a for a in i.alerts.raised if a["kind"] == "blocked"])
               for i in mesh.instances) == 1


async def test_a_flood_of_bad_messages_is_one_alert_a_minute_per_subject(
        mesh: Mesh, live_store: SqlStore) -> None:
    """Anyone who may publish can send bad messages: each is dead-lettered, but they
    are alerted (recorded, published, posted) at most once a minute per subject, so a
    flood does not become a flood of writes and webhook calls."""
    from meshpoint.llm import ScriptedModel

    seen = await alert_subscriber(mesh, "worker")
    await mesh.run(Agent("worker", ScriptedModel()))
    subject = Subjects(mesh.options.namespace).request("worker")
    for _ in range(20):
        await mesh.broker.publish(subject, b"not json")
    await eventually(lambda: len(mesh.dead_letters) == 20, what="every dead letter")
    await eventually(lambda: len(seen) == 1, what="the alert")
    await asyncio.sleep(0.3)
    assert len(seen) == 1 and seen[0]["kind"] == "dead_lettered"


class HangsThenAnswers:
    """A model whose calls hang (the instance holding them is killed meanwhile) until
    ``release`` is set; after it, a scripted model's answers."""

    name = "hangs"

    def __init__(self) -> None:
        from meshpoint.llm import ScriptedModel

        self.release = asyncio.Event()
        self.inner = ScriptedModel("hangs")
        self.hung = 0

    async def complete(self, messages: list[dict[str, Any]],
                       tools: list[ToolSpec]) -> ModelResponse:
        if not self.release.is_set():
            self.hung += 1
            await asyncio.Event().wait()
        return await self.inner.complete(messages, tools)


async def test_one_instance_dying_with_many_tasks_does_not_open_the_breaker(
        mesh: Mesh, live_store: SqlStore) -> None:
    """An instance killed while it holds five tasks (a crash, a deploy) is one failed
    resume, not five: the breaker of two failures stays closed, and another instance
    takes every task over and completes it."""
    model = HangsThenAnswers()
    agent = Agent("worker", model, checkpoint=CheckpointPolicy(before_llm=True),
                  recovery=RecoveryPolicy(breaker_failures=2, breaker_window_s=60,
                                          breaker_cooldown_s=60))
    first, = await mesh.run(agent)
    requests = [await mesh.client.submit("worker", f"task {n}") for n in range(5)]
    await eventually(lambda: model.hung == 5, what="five tasks in the model call")
    await first.kill()
    model.release.set()
    await mesh.run(agent)
    answers = [await mesh.client.wait(r, timeout_s=20) for r in requests]
    assert {a.status.state.value for a in answers} == {"completed"}
    assert (await live_store.breakers.state("worker")).state == "closed"
    assert not mesh.events("breaker_opened")
