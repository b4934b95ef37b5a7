"""Traces (docs/operations.md, "Traces"): one trace per task, across the instances and
peers that touch it, read from the OpenTelemetry SDK's in-memory exporter. The task's
``traceparent`` is stored with its checkpoint; one that is malformed or forged in a
request is ignored (the task starts a trace of its own)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from meshpoint.context import TaskExecutionContext
from meshpoint.ops import tracing
from meshpoint.runtime import wire
from meshpoint.store import SqlStore
from tests.integration.mesh import Mesh, eventually
from tests.integration.test_runtime import TRIP2, coordinator, simple
from tests.integration.test_store import fan_out

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT = f"00-{TRACE}-00f067aa0ba902b7-01"


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


FORGED = ["garbage", 42, {"trace_id": TRACE}, f"00-{'0' * 32}-00f067aa0ba902b7-01",
          f"00-{TRACE}-{'0' * 16}-01", f"ff-{TRACE}-00f067aa0ba902b7-01",
          f"00-{TRACE.upper()}-00f067aa0ba902b7-01", f"00-{TRACE}-00f067aa0ba902b7-01-x",
          PARENT + "9" * 10_000]


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


def test_only_w3c_traceparents_are_read() -> None:
    for value in FORGED:
        assert tracing.span_context(value) is None, value
        assert tracing.parent_from({tracing.TRACEPARENT: value}) is None
    remote = tracing.span_context(PARENT)
    assert remote is not None and remote.is_remote and remote.trace_flags.sampled
    assert tracing.parent_from(None) is None and tracing.parent_from({}) is None


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
