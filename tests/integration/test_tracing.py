"""Traces (docs/operations.md, "Traces"): one trace per task, across the instances and
peers that touch it, read from the OpenTelemetry SDK's in-memory exporter. The task's
``traceparent`` is stored with its checkpoint; one that is malformed or forged in a
request is ignored (the task starts a trace of its own)."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from meshpoint import a2a
from meshpoint.broker.nats import NatsBroker
from meshpoint.context import TaskExecutionContext
from meshpoint.llm import ScriptedModel
from meshpoint.ops import tracing
from meshpoint.runtime import Agent, Client, wire
from meshpoint.runtime.options import CheckpointPolicy, HandoffPolicy
from meshpoint.store import SqlStore, open_store
from tests.conftest import fresh_pg_schema, pg_execute_async
from tests.integration.mesh import Mesh, eventually
from tests.integration.test_handoff import tools
from tests.integration.test_runtime import TRIP2, coordinator, simple
from tests.integration.test_store import fan_out
from tests.unit.test_tracing import FORGED, PARENT, TRACE


@pytest.fixture
def spans(monkeypatch: pytest.MonkeyPatch) -> Iterator[InMemorySpanExporter]:
    """Every span meshpoint ends, from an SDK of this test's own (the process-wide
    provider is left alone)."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    monkeypatch.setattr(tracing, "_tracer", provider.get_tracer("meshpoint"))
    yield exporter
    provider.shutdown()


def hexid(value: int) -> str:
    return f"{value:016x}"


def of_task(found: tuple[ReadableSpan, ...], task_id: str) -> list[ReadableSpan]:
    return [s for s in found if (s.attributes or {}).get("meshpoint.task_id") == task_id]


async def test_a_task_paused_for_a_peer_and_resumed_is_one_trace(
        mesh: Mesh, spans: InMemorySpanExporter) -> None:
    """Turns, model calls, the pause's checkpoint, the request to the peer, the peer's
    own turn and the claim of its answer are one trace: the resumed turn is a child of
    the task's trace parent (its first turn) and links to the span that paused it."""
    await mesh.run(coordinator("flights"), 2)
    await mesh.run(simple("flights"))
    rid = await mesh.client.submit("coordinator", "Plan a trip: flights")
    await mesh.client.wait(rid, 10)
    task_id = mesh.client.task_id("coordinator", rid)
    await eventually(lambda: any(s.name == "meshpoint.turn" and (s.attributes or {}).get(
        "meshpoint.agent") == "coordinator" and s.attributes.get("meshpoint.turn.resumed")
        for s in spans.get_finished_spans()), what="the resumed turn's span")
    found = spans.get_finished_spans()
    assert len({s.context.trace_id for s in found}) == 1, [s.name for s in found]
    by_id = {s.context.span_id: s for s in found}
    own = of_task(found, task_id)
    first, resumed = sorted((s for s in own if s.name == "meshpoint.turn"),
                            key=lambda s: s.start_time or 0)
    assert first.parent is None and resumed.parent is not None
    assert resumed.parent.span_id == first.context.span_id  # the task's trace parent
    (pause,) = [s for s in own if s.name == "meshpoint.checkpoint"
                and (s.attributes or {}).get("meshpoint.checkpoint.phase") == "pause"]
    assert pause.parent is not None and pause.parent.span_id == first.context.span_id
    assert [link.context.span_id for link in resumed.links] == [pause.context.span_id]
    assert (pause.attributes or {})["meshpoint.task.status"] == "waiting_peers"
    (request,) = [s for s in own if s.name == "invoke_agent flights"]
    assert request.kind is SpanKind.PRODUCER and request.parent is not None
    assert request.parent.span_id == first.context.span_id
    # The peer's turn is a child of the request that reached it; the claim of its
    # answer, of the peer's turn (the span that sent the answer).
    (peer_turn,) = [s for s in found if s.name == "meshpoint.turn"
                    and (s.attributes or {}).get("meshpoint.agent") == "flights"]
    assert peer_turn.parent is not None and peer_turn.parent.span_id == request.context.span_id
    (claim,) = [s for s in found if s.name == "meshpoint.claim"]
    assert claim.parent is not None and claim.parent.span_id == peer_turn.context.span_id
    assert (claim.attributes or {})["meshpoint.claim.outcome"] == "won"
    assert (claim.attributes or {})["meshpoint.task_id"] == task_id
    models = [s for s in own if s.name.startswith("chat ")]
    assert len(models) == 2
    for model in models:
        attributes = model.attributes or {}
        assert attributes["gen_ai.operation.name"] == "chat"
        assert attributes["gen_ai.request.model"]
        assert isinstance(attributes["gen_ai.usage.input_tokens"], int)
        assert model.parent is not None and by_id[model.parent.span_id].name == "meshpoint.turn"
    ids = {i.instance_id for i in mesh.instances}
    for span in found:
        assert (span.attributes or {})["meshpoint.instance_id"] in ids
    # Every span's parent is a span of the trace, ended: the tree is whole.
    assert all(s.parent is None or s.parent.span_id in by_id for s in found)


async def test_tool_calls_checkpoints_and_handoffs_are_spans_of_the_tasks_trace(
        mesh: Mesh, spans: InMemorySpanExporter) -> None:
    """A task that runs local tools and hands off twice (the model asks) is one trace
    across its iterations: each tool run, mid-turn checkpoint and handoff is a span of
    it, named as the conventions say."""
    model = ScriptedModel("worker", rounds=3, handoff_after=1)
    await mesh.run(Agent("worker", model, tools=tools(), handoff=HandoffPolicy(
        context_utilization=None), checkpoint=CheckpointPolicy(after_tools=True)), 2)
    answer = await mesh.client.ask("worker", "Survey: alpha", timeout_s=30)
    assert answer.status.state is a2a.TaskState.COMPLETED, answer
    await eventually(lambda: len([s for s in spans.get_finished_spans()
                                  if s.name == "meshpoint.turn"]) == 3, what="three turns")
    found = spans.get_finished_spans()
    assert len({s.context.trace_id for s in found}) == 1
    assert [s.name for s in found if s.parent is None] == ["meshpoint.turn"]
    handoffs = [s for s in found if s.name == "meshpoint.handoff"]
    assert [(s.attributes or {})["meshpoint.handoff.trigger"] for s in handoffs] == \
        ["explicit", "explicit"]
    tool_runs = [s for s in found if s.name.startswith("execute_tool ")]
    for run in tool_runs:
        attributes = run.attributes or {}
        assert attributes["gen_ai.operation.name"] == "execute_tool"
        assert run.name == f"execute_tool {attributes['gen_ai.tool.name']}"
        assert attributes["gen_ai.tool.call.id"]
    assert tool_runs
    assert any((s.attributes or {}).get("meshpoint.checkpoint.phase") == "mid_turn"
               for s in found if s.name == "meshpoint.checkpoint")
    assert {(s.attributes or {})["meshpoint.task_id"] for s in found} == {answer.id}


async def test_a_traceparent_survives_a_checkpoint_round_trip(store: SqlStore) -> None:
    """The task's trace parent and the pause's span are stored with the checkpoint
    and read back by the instance that restores it."""
    ctx = fan_out("t-trace", peers=1)
    ctx.a2a_context[tracing.TRACEPARENT] = PARENT
    ctx.flags[tracing.PAUSED_SPAN] = paused = f"00-{TRACE}-{hexid(7)}-01"
    ctx.active_peer_sub_tasks["t-trace/sub-0"][tracing.TRACEPARENT] = PARENT
    await store.checkpoint_task(ctx, "a")
    (call,) = await store.get_peer_sub_tasks_for_task("t-trace")
    assert call.correlation_data[tracing.TRACEPARENT] == PARENT  # the request's parent
    restored = (await store.restore_task("t-trace")).context
    assert restored.a2a_context[tracing.TRACEPARENT] == PARENT
    assert restored.flags[tracing.PAUSED_SPAN] == paused
    assert isinstance(restored, TaskExecutionContext)


async def test_a_bad_or_forged_traceparent_is_ignored_and_a_trace_started(
        mesh: Mesh, spans: InMemorySpanExporter) -> None:
    """A request whose metadata holds a traceparent that is not W3C's runs as any
    other: its task starts a trace of its own. A valid one is the task's parent."""
    (solo,) = await mesh.run(simple("solo"))
    subject = mesh.client.subjects.request("solo")
    for n, value in enumerate([*FORGED, PARENT]):
        await mesh.broker.publish(subject, wire.send_request(
            f"r{n}", "hello", metadata={tracing.TRACEPARENT: value}))
    await eventually(lambda: len(solo.stats.tasks("completed")) == len(FORGED) + 1,
                     what="every request answered")
    turns = [s for s in spans.get_finished_spans() if s.name == "meshpoint.turn"]
    assert len(turns) == len(FORGED) + 1
    started = [t for t in turns if t.parent is None]
    assert len(started) == len(FORGED)
    assert len({t.context.trace_id for t in started}) == len(FORGED)
    assert all(f"{t.context.trace_id:032x}" != TRACE for t in started)
    (joined,) = [t for t in turns if t.parent is not None]
    assert f"{joined.context.trace_id:032x}" == TRACE and joined.parent.is_remote
    assert not mesh.dead_letters


async def test_a_span_open_at_submit_is_the_tasks_parent(
        mesh: Mesh, spans: InMemorySpanExporter) -> None:
    """An application's span open when it submits a task is the task's parent; the
    answer names the task's last turn."""
    await mesh.run(simple("solo"))
    with tracing._tracer.start_as_current_span("app") as app:
        rid = await mesh.client.submit("solo", "hello")
    answer = await mesh.client.wait(rid, 10)
    await eventually(lambda: any(s.name == "meshpoint.turn"
                                 for s in spans.get_finished_spans()), what="the turn")
    (turn,) = [s for s in spans.get_finished_spans() if s.name == "meshpoint.turn"]
    assert turn.parent is not None and turn.parent.span_id == app.get_span_context().span_id
    assert turn.context.trace_id == app.get_span_context().trace_id
    assert (answer.metadata or {})[tracing.TRACEPARENT] == \
        f"00-{turn.context.trace_id:032x}-{turn.context.span_id:016x}-01"


async def test_without_an_sdk_nothing_is_stored_or_sent(mesh: Mesh) -> None:
    """No SDK configured: the API's spans are no-ops; no traceparent is stored with
    the task, kept with its calls, or sent to its peer."""
    await mesh.run(coordinator("flights"))
    await mesh.run(simple("flights"))
    rid = await mesh.client.submit("coordinator", TRIP2.replace(", hotels", ""))
    await mesh.client.wait(rid, 10)
    assert mesh.broker.published  # type: ignore[attr-defined]
    for _, data in mesh.broker.published(""):  # type: ignore[attr-defined]
        assert b"traceparent" not in data


class Worker:
    """A trace_worker.py process: one instance, its spans in a file of its own."""

    def __init__(self, role: str, name: str, tmp_path: Path, *args: str) -> None:
        self.name = name
        self.spans_path = tmp_path / f"{name}.jsonl"
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.integration.trace_worker", role, name, *args,
             str(self.spans_path)], stdout=subprocess.PIPE, text=True,
            cwd=Path(__file__).parents[2])

    async def ready(self) -> Worker:
        assert self.process.stdout is not None
        line = await asyncio.wait_for(asyncio.to_thread(self.process.stdout.readline), 30)
        assert line.strip() == "ready", f"{self.name} did not start: {line!r}"
        return self

    def spans(self) -> list[dict[str, Any]]:
        if not self.spans_path.exists():
            return []
        return [json.loads(line) for line in self.spans_path.read_text().splitlines()]

    def kill(self) -> None:
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(10)
        assert self.process.stdout is not None
        self.process.stdout.close()


@pytest.mark.postgres
@pytest.mark.nats
async def test_one_trace_across_three_processes_one_of_them_killed(
        postgres_url: str, nats_url: str, tmp_path: Path) -> None:
    """A task pauses for a peer on instance A (a real process), which is then killed
    with SIGKILL; the peer's instance B answers and instance C claims the answer and
    resumes the task. Every span the three wrote is of one trace, each names its
    instance (attribute and resource), and the tree is sound: C's resumed turn is a
    child of A's first turn and links to A's pause; B's turn is a child of A's
    request to it; C's claim, of B's turn."""
    schema = await fresh_pg_schema()
    namespace = f"t{uuid.uuid4().hex[:12]}"
    workers: list[Worker] = []
    try:
        async with open_store(postgres_url, schema=schema):
            pass  # migrated
        where = (postgres_url, schema, nats_url, namespace)
        a = await Worker("coordinator", "coordinator-a", tmp_path, *where).ready()
        workers.append(a)
        broker = await NatsBroker.connect(nats_url, pull_expires_s=0.3)
        async with Client(broker, namespace=namespace) as client:
            rid = await client.submit("coordinator", "Plan a trip: flights")
            await eventually(lambda: any(s["name"] == "meshpoint.turn" for s in a.spans()),
                             timeout_s=30, what="A's turn to pause")
            a.kill()
            assert a.process.returncode == -signal.SIGKILL
            b = await Worker("flights", "flights-b", tmp_path, *where).ready()
            c = await Worker("coordinator", "coordinator-c", tmp_path, *where).ready()
            workers += [b, c]
            task = await client.wait(rid, 60)
            assert task.status.state.value == "completed"
            await eventually(lambda: any(s["name"] == "meshpoint.turn" for s in c.spans()),
                             timeout_s=10, what="C's turn span")
        await broker.close()
    finally:
        for worker in workers:
            if worker.process.stdout is not None and not worker.process.stdout.closed:
                worker.kill()
        cleanup = await NatsBroker.connect(nats_url)
        await cleanup.delete_namespace(namespace)
        await cleanup.close()
        await pg_execute_async(f"DROP SCHEMA {schema} CASCADE")
    spans = {w.name: w.spans() for w in (a, b, c)}
    every = [s for found in spans.values() for s in found]
    assert {s["trace_id"] for s in every} == {every[0]["trace_id"]}
    for name, found in spans.items():
        assert found, f"{name} wrote no span"
        for span in found:
            assert span["attributes"]["meshpoint.instance_id"] == name
            assert span["resource"]["service.instance.id"] == name
    by_id = {s["span_id"]: s for s in every}
    assert len(by_id) == len(every)
    assert [s["name"] for s in every if s["parent_id"] is None] == ["meshpoint.turn"]
    assert all(s["parent_id"] is None or s["parent_id"] in by_id for s in every)

    def one(name: str, where: str, **attributes: Any) -> dict[str, Any]:
        (found,) = [s for s in spans[where] if s["name"] == name and all(
            s["attributes"].get(k) == v for k, v in attributes.items())]
        return found

    first = one("meshpoint.turn", "coordinator-a")
    pause = one("meshpoint.checkpoint", "coordinator-a", **{"meshpoint.checkpoint.phase": "pause"})
    request = one("invoke_agent flights", "coordinator-a")
    assert pause["parent_id"] == request["parent_id"] == first["span_id"]
    peer_turn = one("meshpoint.turn", "flights-b")
    assert peer_turn["parent_id"] == request["span_id"]
    claim = one("meshpoint.claim", "coordinator-c")
    assert claim["parent_id"] == peer_turn["span_id"]
    resumed = one("meshpoint.turn", "coordinator-c")
    assert resumed["attributes"]["meshpoint.turn.resumed"] is True
    assert resumed["parent_id"] == first["span_id"] and resumed["links"] == [pause["span_id"]]
    assert one("chat scripted", "coordinator-c")["parent_id"] == resumed["span_id"]
    task_ids = {s["attributes"].get("meshpoint.task_id") for s in spans["coordinator-a"]}
    assert task_ids == {one("meshpoint.turn", "coordinator-a")["attributes"]["meshpoint.task_id"]}
