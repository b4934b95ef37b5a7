"""OpenTelemetry spans of one instance's tasks, and the W3C trace context they carry
(docs/operations.md, "Traces").

Only the OpenTelemetry *API* is imported here (a core dependency): with no SDK
configured, every span is the API's non-recording one and costs a context switch.
The application (or ``meshpoint serve`` with ``OTEL_TRACES_EXPORTER``:
:mod:`meshpoint.ops.otel`) configures a ``TracerProvider``; nothing here does.

One trace per task, across every instance and peer that touches it. The task's
*trace parent* is kept in ``ctx.a2a_context["traceparent"]`` (so it is stored with every
checkpoint): the caller's span if its request carried a valid ``traceparent`` in its
A2A metadata, else the task's first turn, which then starts the trace. Every turn is a
child of it, wherever it runs; a resumed turn also links to the checkpoint span that
paused the task (``ctx.flags["paused_span"]``). Requests to peers and answers carry
the ``traceparent`` of the span that sends them. A ``traceparent`` that is missing or
not W3C's format (a forged one) is ignored: the task starts a trace of its own.

This is the one module of ``ops`` the runtime imports: it imports nothing of meshpoint.
Span attributes may name a task (``meshpoint.task_id``); metric labels never do.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import (
    Link,
    NonRecordingSpan,
    Span,
    SpanContext,
    SpanKind,
    StatusCode,
    TraceFlags,
)

#: The metadata (and ``a2a_context``) key of the W3C trace context.
TRACEPARENT = "traceparent"
#: ``ctx.flags`` key of the span that paused the task (its resumed turn links to it).
PAUSED_SPAN = "paused_span"
#: W3C trace context, version 00 (a later version is read by its first four fields).
_FORMAT = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")

_tracer = trace.get_tracer("meshpoint")


def span_context(value: Any) -> SpanContext | None:
    """The remote span a W3C ``traceparent`` names; None for anything else (not a
    string, not the format, a zero id, version ``ff``): never raises."""
    if not isinstance(value, str) or len(value) > 512:
        return None
    match = _FORMAT.match(value)
    # Version 00 is exactly 55 characters; a later one may go on, after a dash.
    if match is None or match.group(1) == "ff" or (
            len(value) != 55 and (match.group(1) == "00" or value[55] != "-")):
        return None
    context = SpanContext(int(match.group(2), 16), int(match.group(3), 16), is_remote=True,
                          trace_flags=TraceFlags(int(match.group(4), 16) & 0x01))
    return context if context.is_valid else None


def kept(value: Any) -> str | None:
    """The ``traceparent`` a task keeps of a caller's ``value``: W3C's version 00 form of
    the span it names (55 characters, whatever the caller sent), or None."""
    remote = span_context(value)
    return None if remote is None else traceparent(NonRecordingSpan(remote))


def parent_from(carrier: Mapping[str, Any] | None) -> Context | None:
    """The context whose parent is the ``traceparent`` of ``carrier`` (message
    metadata, a task's ``a2a_context``, a call's correlation data), or None."""
    remote = span_context(carrier.get(TRACEPARENT)) if carrier else None
    return None if remote is None else trace.set_span_in_context(NonRecordingSpan(remote))


def traceparent(span: Span | None = None) -> str | None:
    """``span``'s (the current span's) W3C ``traceparent``; None if it has none (no
    SDK configured and no parent)."""
    context = (span or trace.get_current_span()).get_span_context()
    if not context.is_valid:
        return None
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{int(context.trace_flags):02x}"


def with_traceparent(metadata: dict[str, Any], span: Span | None = None, *,
                     otherwise: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """``metadata`` with ``span``'s (the current span's) ``traceparent``, if any; else
    with the valid ``traceparent`` of ``otherwise`` (a task's ``a2a_context``: what is
    sent outside its turns, a cancel's or the sweeper's answer, stays in its trace)."""
    value = traceparent(span)
    if value is None and otherwise is not None and \
            span_context(stored := otherwise.get(TRACEPARENT)) is not None:
        value = stored
    if value is not None:
        metadata[TRACEPARENT] = value
    return metadata


@contextmanager
def _span(name: str, context: Context | None = None, kind: SpanKind = SpanKind.INTERNAL,
          attributes: dict[str, Any] | None = None,
          links: list[Link] | None = None) -> Iterator[Span]:
    """``start_as_current_span``, less what a span that is neither recorded nor
    carrying a context costs (the API's no-op span with no parent: no SDK configured):
    that one is not made current, so the hot path pays a call and no context switch."""
    span = _tracer.start_span(name, context=context, kind=kind, attributes=attributes,
                              links=links)
    if not span.is_recording() and not span.get_span_context().is_valid:
        yield span
        return
    token = otel_context.attach(trace.set_span_in_context(span))
    try:
        yield span
    except BaseException as error:
        if span.is_recording():
            failed(span, error)
        raise
    finally:
        otel_context.detach(token)
        span.end()


class Tracing:
    """The spans of one instance: each carries the agent and the instance id."""

    def __init__(self, agent: str = "", instance_id: str = "", backend: str = "") -> None:
        self.agent = agent
        self.instance_id = instance_id
        self.backend = backend
        self._own = {"meshpoint.agent": agent, "meshpoint.instance_id": instance_id}

    def _attributes(self, task_id: str, **more: Any) -> dict[str, Any]:
        return {**self._own, "meshpoint.task_id": task_id,
                **{k: v for k, v in more.items() if v is not None}}

    @contextmanager
    def turn(self, a2a_context: dict[str, Any], flags: dict[str, Any], task_id: str, *,
             resumed: bool) -> Iterator[Span]:
        """A turn of a task: from its start or resume until it pauses or ends. The
        first turn of a task whose request named no valid parent starts its trace and
        becomes the task's trace parent (in ``a2a_context``)."""
        parent = parent_from(a2a_context)
        paused = span_context(flags.pop(PAUSED_SPAN, None))
        with _span(
                "meshpoint.turn", context=parent, kind=SpanKind.INTERNAL,
                links=[Link(paused)] if paused is not None else None,
                attributes=self._attributes(task_id, **{
                    "gen_ai.agent.name": self.agent, "meshpoint.turn.resumed": resumed}),
                ) as span:
            if parent is None and (own := traceparent(span)) is not None:
                a2a_context[TRACEPARENT] = own
            yield span

    def model_call(self, task_id: str, model: str) -> AbstractContextManager[Span]:
        """A model call (GenAI semantic conventions: ``chat {model}``); see
        :func:`model_usage` for what it answered."""
        return _span(
                f"chat {model}", kind=SpanKind.CLIENT, attributes=self._attributes(
                    task_id, **{"gen_ai.operation.name": "chat",
                                "gen_ai.request.model": model}))

    def tool_call(self, task_id: str, tool: str, call_id: str) -> AbstractContextManager[Span]:
        """A local tool's run (``execute_tool {tool}``)."""
        return _span(
                f"execute_tool {tool}", kind=SpanKind.INTERNAL, attributes=self._attributes(
                    task_id, **{"gen_ai.operation.name": "execute_tool",
                                "gen_ai.tool.name": tool, "gen_ai.tool.call.id": call_id,
                                "gen_ai.tool.type": "function"}))

    def checkpoint(self, task_id: str, phase: str, status: str) -> AbstractContextManager[Span]:
        """A checkpoint write (``phase``: ``pause`` or ``mid_turn``), to its commit."""
        return _span(
                "meshpoint.checkpoint", kind=SpanKind.CLIENT, attributes=self._attributes(
                    task_id, **{"db.system.name": self.backend or None,
                                "meshpoint.checkpoint.phase": phase,
                                "meshpoint.task.status": status}))

    def peer_call(self, task_id: str, peer: str, sub_task_id: str,
                  correlation: Mapping[str, Any]) -> AbstractContextManager[Span]:
        """A request sent to a peer agent or a workflow's stage (``invoke_agent
        {peer}``): a child of the turn that opened the call (its correlation data
        keeps that turn's ``traceparent``, so a request published again by another
        instance stays in the trace). Its ``traceparent`` goes in the request."""
        return _span(
                f"invoke_agent {peer}", context=parent_from(correlation),
                kind=SpanKind.PRODUCER, attributes=self._attributes(
                    task_id, **{"gen_ai.operation.name": "invoke_agent",
                                "gen_ai.agent.name": peer,
                                "meshpoint.sub_task_id": sub_task_id}))

    def claim(self, sub_task_id: str,
              metadata: Mapping[str, Any] | None) -> AbstractContextManager[Span]:
        """The claim of an answer for its call: a child of the span that sent the
        answer (its ``traceparent``), so it is in the calling task's trace."""
        return _span(
                "meshpoint.claim", context=parent_from(metadata), kind=SpanKind.CONSUMER,
                attributes={**self._own, "meshpoint.sub_task_id": sub_task_id})

    def handoff(self, task_id: str, trigger: str) -> AbstractContextManager[Span]:
        """A handoff: the iteration ends and a fresh-context one carries the task on."""
        return _span(
                "meshpoint.handoff", attributes=self._attributes(
                    task_id, **{"meshpoint.handoff.trigger": trigger}))


def model_usage(span: Span, model: str | None, input_tokens: int | None,
                output_tokens: int | None) -> None:
    """What a model call answered, on its span (GenAI's usage attributes)."""
    if not span.is_recording():
        return
    if model:
        span.set_attribute("gen_ai.response.model", model)
    if input_tokens is not None:
        span.set_attribute("gen_ai.usage.input_tokens", input_tokens)
    if output_tokens is not None:
        span.set_attribute("gen_ai.usage.output_tokens", output_tokens)


def task_failed(error: BaseException) -> None:
    """Mark the current span (the turn whose task ``error`` ends as failed) failed."""
    span = trace.get_current_span()
    if span.is_recording():
        failed(span, error)


def failed(span: Span, error: BaseException) -> None:
    """Mark ``span`` failed with ``error``: its type only. Traces leave the host, and an
    error's message may hold what the task was given (a model server's error body
    quotes its input), so neither the message nor the stack is exported. A
    cancellation (a kill, a drain out of time) is not a failure: it is an attribute."""
    if isinstance(error, asyncio.CancelledError):
        span.set_attribute("meshpoint.canceled", True)
        return
    kind = type(error).__name__
    span.add_event("exception", {"exception.type": kind})
    span.set_status(StatusCode.ERROR, kind)
