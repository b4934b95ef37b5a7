"""One instance of test_tracing.py's kill test, in an OS process of its own (the test
kills it with SIGKILL): it serves ``coordinator`` (which asks ``flights``) or
``flights`` on PostgreSQL and NATS, with an OpenTelemetry SDK whose exporter writes
each span to a file, a JSON line, as the span ends: a SIGKILL loses only the spans
not ended yet. Prints ``ready`` once the instance takes work."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Sequence
from dataclasses import replace
from typing import IO

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

from meshpoint.broker.nats import NatsBroker
from meshpoint.llm import ScriptedModel
from meshpoint.runtime import Agent, AgentInstance, Peer
from meshpoint.store import open_store
from tests.integration.mesh import FAST


class FileSpanExporter(SpanExporter):
    """Each span as one JSON line, flushed to the OS at once."""

    def __init__(self, out: IO[str]) -> None:
        self.out = out

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        for span in spans:
            self.out.write(json.dumps(as_dict(span)) + "\n")
        self.out.flush()
        return SpanExportResult.SUCCESS


def as_dict(span: ReadableSpan) -> dict[str, object]:
    context = span.get_span_context()
    assert context is not None
    return {"name": span.name, "trace_id": f"{context.trace_id:032x}",
            "span_id": f"{context.span_id:016x}",
            "parent_id": None if span.parent is None else f"{span.parent.span_id:016x}",
            "links": [f"{link.context.span_id:016x}" for link in span.links],
            "attributes": dict(span.attributes or {}),
            "resource": dict(span.resource.attributes)}


async def main(role: str, instance_id: str, url: str, schema: str, nats_url: str,
               namespace: str, spans_path: str) -> None:
    provider = TracerProvider(resource=Resource.create({
        "service.name": "meshpoint-test", "service.instance.id": instance_id}))
    provider.add_span_processor(SimpleSpanProcessor(FileSpanExporter(
        open(spans_path, "a", encoding="utf-8"))))  # open until killed
    trace.set_tracer_provider(provider)
    agent = Agent("coordinator", ScriptedModel(), peers=[Peer("flights", timeout_s=60)]) \
        if role == "coordinator" else Agent("flights", ScriptedModel(persona="flights"))
    async with open_store(url, schema=schema, migrate=False, pool_size=2) as store:
        broker = await NatsBroker.connect(nats_url, pull_expires_s=0.3)
        instance = AgentInstance(agent, store, broker, instance_id=instance_id,
                                 options=replace(FAST, namespace=namespace))
        await instance.start()
        print("ready", flush=True)
        await asyncio.Event().wait()  # until killed


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:8]))
