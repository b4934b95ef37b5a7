"""The trace context a task keeps and sends (meshpoint.ops.tracing), without I/O: only
W3C ``traceparent`` s are read, never raising on anything else; the task's trace parent
and its pause's span go through the checkpoint document; with no SDK, a turn stores
nothing."""

from __future__ import annotations

import json

import pytest
from opentelemetry.sdk.trace import TracerProvider

from meshpoint.context import TaskExecutionContext
from meshpoint.ops import tracing

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT = f"00-{TRACE}-00f067aa0ba902b7-01"
#: Not W3C's traceparent: not a string, zero ids, version ff, upper case, a tail, 10 kB.
FORGED = ["garbage", 42, {"trace_id": TRACE}, f"00-{'0' * 32}-00f067aa0ba902b7-01",
          f"00-{TRACE}-{'0' * 16}-01", f"ff-{TRACE}-00f067aa0ba902b7-01",
          f"00-{TRACE.upper()}-00f067aa0ba902b7-01", f"00-{TRACE}-00f067aa0ba902b7-01-x",
          PARENT + "9" * 10_000, f"01-{TRACE}-00f067aa0ba902b7-01x"]


@pytest.mark.parametrize("value", FORGED, ids=range(len(FORGED)))
def test_anything_but_a_w3c_traceparent_is_ignored(value: object) -> None:
    assert tracing.span_context(value) is None
    assert tracing.parent_from({tracing.TRACEPARENT: value}) is None


def test_a_w3c_traceparent_names_a_remote_parent() -> None:
    remote = tracing.span_context(PARENT)
    assert remote is not None and remote.is_remote and remote.trace_flags.sampled
    assert f"{remote.trace_id:032x}" == TRACE
    assert tracing.span_context(PARENT[:-2] + "00").trace_flags.sampled is False  # type: ignore[union-attr]
    assert tracing.parent_from(None) is None and tracing.parent_from({}) is None


def test_a_task_keeps_a_callers_traceparent_in_version_00s_form() -> None:
    """A later version may carry more after a dash (W3C): what the task keeps and
    stores is the 55 characters of the span it names, nothing the caller added."""
    later = f"01-{TRACE}-00f067aa0ba902b7-01-{'x' * 400}"
    assert tracing.kept(later) == PARENT
    assert tracing.kept(PARENT) == PARENT
    assert all(tracing.kept(value) is None for value in FORGED)


def test_the_trace_context_goes_through_the_checkpoint_document() -> None:
    ctx = TaskExecutionContext("t1", {"agent": "a", tracing.TRACEPARENT: PARENT})
    ctx.flags[tracing.PAUSED_SPAN] = PARENT
    document = json.loads(json.dumps(ctx.to_checkpoint_dict()))
    back = TaskExecutionContext.from_checkpoint_dict(document)
    assert back.a2a_context[tracing.TRACEPARENT] == PARENT
    assert back.flags[tracing.PAUSED_SPAN] == PARENT


def test_with_no_sdk_a_turn_stores_nothing_and_a_remote_parent_passes_through() -> None:
    spans = tracing.Tracing("a", "a-1")
    a2a_context: dict[str, object] = {}
    with spans.turn(a2a_context, {}, "t1", resumed=False) as span:
        assert not span.is_recording() and tracing.traceparent() is None
    assert a2a_context == {}
    a2a_context = {tracing.TRACEPARENT: PARENT}
    with spans.turn(a2a_context, {}, "t1", resumed=False):
        # the API's no-op span carries its parent on, so a peer's request names it
        assert tracing.with_traceparent({}) == {tracing.TRACEPARENT: PARENT}
    assert a2a_context == {tracing.TRACEPARENT: PARENT}


def test_with_an_sdk_the_first_turn_becomes_the_tasks_trace_parent(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tracing, "_tracer", TracerProvider().get_tracer("meshpoint"))
    spans = tracing.Tracing("a", "a-1")
    a2a_context: dict[str, object] = {}
    with spans.turn(a2a_context, {}, "t1", resumed=False) as first:
        pass
    assert a2a_context[tracing.TRACEPARENT] == tracing.traceparent(first)
    flags = {tracing.PAUSED_SPAN: "not one"}
    with spans.turn(a2a_context, flags, "t1", resumed=True) as again:
        pass
    assert flags == {}  # read once, and a malformed one is no link
    assert a2a_context[tracing.TRACEPARENT] == tracing.traceparent(first)
    assert again.get_span_context().trace_id == first.get_span_context().trace_id
