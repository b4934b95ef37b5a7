"""Traces of the paths test_tracing.py leaves out (docs/operations.md, "Traces"): a task
that waits for a human's approval and one that runs a workflow's stages are each one
trace; an answer sent outside a turn stays in it; a failed task's turn is failed; and
no span carries what the task says (its request, a tool's arguments, a model's reply),
which an operator's collector must not receive."""

from __future__ import annotations

import json
from collections.abc import Iterable

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from meshpoint import a2a
from meshpoint.ops.tracing import TRACEPARENT
from meshpoint.runtime import Agent, SequentialAgent
from tests.integration.mesh import ManualPeer, Mesh, eventually
from tests.integration.test_approvals import SideEffects, approving, paused
from tests.integration.test_runtime import coordinator
from tests.integration.test_tracing import of_task, spans  # noqa: F401 (a fixture)
from tests.integration.test_workflows import Broken, Said

#: What the task says, written where a careless span would copy it.
SECRET = "Wire 4711 EUR to IBAN DE89370400440532013000, PIN 9021"


def everything_said(found: Iterable[ReadableSpan]) -> str:
    """Every name, attribute, event, link and status of ``found``, as text."""
    return json.dumps([[s.name, dict(s.attributes or {}), s.status.description,
                        [[e.name, dict(e.attributes or {})] for e in s.events],
                        [dict(link.attributes or {}) for link in s.links]]
                       for s in found], default=str)


async def test_an_approval_is_one_trace_and_no_span_holds_what_the_task_says(
        mesh: Mesh, spans: InMemorySpanExporter) -> None:  # noqa: F811
    """The task pauses for a human, is approved and resumed on another instance: one
    trace; the resumed turn is a child of the first, linked to the pause's checkpoint
    (``input_required``); the approved tool's run is a span of the resumed turn. Not
    a span holds the request's text or the tool's arguments."""
    effects = SideEffects()
    await mesh.run(approving(effects), 2)
    request_id, task_id, pending = await paused(mesh, SECRET)
    assert pending[0]["arguments"] == {"query": SECRET}
    await mesh.client.approve(task_id, pending[0]["call_id"], by="alice")
    answer = await mesh.client.wait(request_id, timeout_s=10)
    assert answer.status.state is a2a.TaskState.COMPLETED
    assert list(effects.runs.values()) == [1]
    await eventually(lambda: any(s.name.startswith("execute_tool ")
                                 for s in spans.get_finished_spans()), what="the tool's span")
    await eventually(lambda: len([s for s in spans.get_finished_spans()
                                  if s.name == "meshpoint.turn"]) == 2, what="two turns")
    found = spans.get_finished_spans()
    assert len({s.context.trace_id for s in found}) == 1, [s.name for s in found]
    own = of_task(found, task_id)
    first, resumed = sorted((s for s in own if s.name == "meshpoint.turn"),
                            key=lambda s: s.start_time or 0)
    assert (resumed.attributes or {})["meshpoint.turn.resumed"] is True
    assert resumed.parent is not None and resumed.parent.span_id == first.context.span_id
    (pause,) = [s for s in own if s.name == "meshpoint.checkpoint"]
    assert (pause.attributes or {})["meshpoint.task.status"] == "input_required"
    assert [link.context.span_id for link in resumed.links] == [pause.context.span_id]
    (run,) = [s for s in own if s.name == "execute_tool send"]
    assert run.parent is not None and run.parent.span_id == resumed.context.span_id
    said = everything_said(found)
    assert "4711" not in said and "DE89" not in said and "9021" not in said, said


async def test_a_workflows_stages_are_one_trace(mesh: Mesh,
                                                spans: InMemorySpanExporter) -> None:  # noqa: F811
    """A sequential workflow of two stages: each stage's request is an ``invoke_agent``
    span of the workflow's task, and the stage's turn is its child; the request's and
    the stages' replies' text is in no span."""
    await mesh.run(Agent("outliner", Said("outliner", f"outline of {SECRET}")))
    await mesh.run(Agent("writer", Said("writer", f"draft of {SECRET}")))
    await mesh.run(SequentialAgent(name="pipeline", sub_agents=["outliner", "writer"]))
    request_id = await mesh.client.submit("pipeline", SECRET)
    answer = await mesh.client.wait(request_id, timeout_s=20)
    assert answer.status.state is a2a.TaskState.COMPLETED, answer
    task_id = mesh.client.task_id("pipeline", request_id)
    await eventually(lambda: len([s for s in spans.get_finished_spans()
                                  if s.name == "meshpoint.turn"]) == 5, what="five turns")
    found = spans.get_finished_spans()
    assert len({s.context.trace_id for s in found}) == 1, [s.name for s in found]
    requests = {s.name: s for s in of_task(found, task_id) if s.name.startswith("invoke_")}
    assert sorted(requests) == ["invoke_agent outliner", "invoke_agent writer"]
    for stage in ("outliner", "writer"):
        request = requests[f"invoke_agent {stage}"]
        assert request.kind is SpanKind.PRODUCER
        (turn,) = [s for s in found if s.name == "meshpoint.turn"
                   and (s.attributes or {}).get("meshpoint.agent") == stage]
        assert turn.parent is not None and turn.parent.span_id == request.context.span_id
    said = everything_said(found)
    assert "4711" not in said and "DE89" not in said and "9021" not in said, said


async def test_an_answer_sent_outside_a_turn_names_the_tasks_trace_parent(
        mesh: Mesh, spans: InMemorySpanExporter) -> None:  # noqa: F811
    """A task paused for a peer is canceled: its answer is sent by the cancel, in no
    turn, and names the task's trace parent (its first turn), so that whoever claims
    it stays in the task's trace."""
    await mesh.run(coordinator("flights"))
    peer = await ManualPeer(mesh, "flights").start()
    rid = await mesh.client.submit("coordinator", "Trip: flights to Lisbon")
    await eventually(lambda: len(peer.requests) == 1, what="the peer request")
    task_id = mesh.client.task_id("coordinator", rid)
    await eventually(lambda: any(s.name == "meshpoint.turn"
                                 for s in spans.get_finished_spans()), what="the first turn")
    (turn,) = [s for s in of_task(spans.get_finished_spans(), task_id)
               if s.name == "meshpoint.turn"]
    await mesh.client.cancel("coordinator", task_id)
    answer = await mesh.client.wait(rid, timeout_s=10)
    assert answer.status.state is a2a.TaskState.CANCELED, answer
    assert [s.name for s in of_task(spans.get_finished_spans(), task_id)
            if s.name == "meshpoint.turn"] == ["meshpoint.turn"]  # sent outside a turn
    assert (answer.metadata or {})[TRACEPARENT] == \
        f"00-{turn.context.trace_id:032x}-{turn.context.span_id:016x}-{turn.context.trace_flags:02x}"


async def test_the_turn_of_a_task_that_failed_is_failed(
        mesh: Mesh, spans: InMemorySpanExporter) -> None:  # noqa: F811
    """A task whose model fails ends ``failed``: its turn's status is an error (the
    model call's too, the exception escaping it), so a trace shows the failed task."""
    await mesh.run(Agent("solo", Broken()))
    answer = await mesh.client.ask("solo", "hello", timeout_s=10)
    assert answer.status.state is a2a.TaskState.FAILED, answer
    await eventually(lambda: any(s.name == "meshpoint.turn"
                                 for s in spans.get_finished_spans()), what="the turn")
    (turn,) = [s for s in spans.get_finished_spans() if s.name == "meshpoint.turn"]
    (call,) = [s for s in spans.get_finished_spans() if s.name == "chat broken"]
    for span in (turn, call):
        assert span.status.status_code is StatusCode.ERROR, span.name
        assert span.status.description == "RuntimeError"  # never its message: see failed()
        assert "the model is down" not in repr(span.events)
