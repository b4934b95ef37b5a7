"""``meshpoint serve`` exporting its spans over OTLP as OpenTelemetry's standard
environment variables say, without code (SQLite and NATS): a collector of the test's
own (OTLP over HTTP, decoded with OpenTelemetry's protobuf types) receives, at the
drain, one trace per task, its spans from the coordinator's and the peer's processes,
each naming its instance in its resource."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from meshpoint import a2a
from meshpoint.broker.nats import NatsBroker
from meshpoint.runtime import Client
from tests.acceptance.test_serve import meshpoint
from tests.cluster import Cluster, mesh_config

pytestmark = [pytest.mark.nats, pytest.mark.timeout(120)]


class Collector(ThreadingHTTPServer):
    """An OTLP/HTTP receiver keeping every span it is sent, with its resource."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Receive)
        self.spans: list[dict[str, Any]] = []
        self.lock = threading.Lock()


class _Receive(BaseHTTPRequestHandler):
    server: Collector

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        request = ExportTraceServiceRequest.FromString(body)
        with self.server.lock:
            for resource_spans in request.resource_spans:
                resource = {a.key: a.value.string_value
                            for a in resource_spans.resource.attributes}
                for scope in resource_spans.scope_spans:
                    for span in scope.spans:
                        self.server.spans.append({
                            "name": span.name, "trace_id": span.trace_id.hex(),
                            "span_id": span.span_id.hex(),
                            "parent_id": span.parent_span_id.hex() or None,
                            "attributes": {a.key: a.value for a in span.attributes},
                            "resource": resource})
        reply = ExportTraceServiceResponse().SerializeToString()
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def collector() -> Iterator[Collector]:
    server = Collector()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()
    thread.join(5)


async def test_serve_exports_one_trace_per_task_over_otlp(
        tmp_path: Path, namespace: str, nats_url: str, collector: Collector) -> None:
    config = mesh_config(namespace, {"url": f"sqlite:///{tmp_path / 'mesh.db'}"}, nats_url)
    cluster = Cluster.write(tmp_path / "cluster", config)
    cluster.env.update({
        "OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
        "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{collector.server_port}",
        "OTEL_SERVICE_NAME": "trips"})
    coordinator = cluster.spawn("coordinator")
    flights = cluster.spawn("flights")
    cluster.wait_ready([coordinator, flights])
    broker = await NatsBroker.connect(nats_url)
    try:
        async with Client(broker, namespace=namespace) as client:
            ids = [await client.submit("coordinator", f"Trip {n}: flights") for n in range(2)]
            answers = [await client.wait(i, 30) for i in ids]
            assert all(a.status.state == a2a.TaskState.COMPLETED for a in answers)
            task_ids = [client.task_id("coordinator", i) for i in ids]
    finally:
        await broker.close()
        codes = cluster.stop()  # SIGTERM: each drains, then exports what is batched
    assert set(codes.values()) == {0}, cluster.logs()
    spans = collector.spans
    instances = {coordinator.instance_id, flights.instance_id}
    assert {s["resource"]["service.instance.id"] for s in spans} == instances
    assert {s["resource"]["service.name"] for s in spans} == {"trips"}
    for task_id in task_ids:
        own = [s for s in spans if s["attributes"].get("meshpoint.task_id") is not None
               and s["attributes"]["meshpoint.task_id"].string_value == task_id]
        (trace_id,) = {s["trace_id"] for s in own}
        trace = [s for s in spans if s["trace_id"] == trace_id]
        names = sorted(s["name"] for s in trace)
        assert names == sorted([
            "meshpoint.turn", "meshpoint.turn", "meshpoint.turn", "chat coordinator",
            "chat coordinator", "chat flights", "invoke_agent flights",
            "meshpoint.checkpoint", "meshpoint.claim"]), names
        assert {s["resource"]["service.instance.id"] for s in trace} == instances
        ids = {s["span_id"] for s in trace}
        assert [s["name"] for s in trace if s["parent_id"] is None] == ["meshpoint.turn"]
        assert all(s["parent_id"] is None or s["parent_id"] in ids for s in trace)


def test_an_exporter_missing_stops_serve_at_start(tmp_path: Path) -> None:
    config_path = tmp_path / "mesh.yaml"
    config_path.write_text(f"store: {{url: 'sqlite:///{tmp_path / 'm.db'}'}}\n"
                           "agents: {a: {model: {kind: scripted}}}\n")
    done = meshpoint("serve", "--config", str(config_path), "--agent", "a", timeout_s=60,
                     env={**os.environ, "OTEL_TRACES_EXPORTER": "zipkin"})
    assert done.returncode == 1, done.stderr
    assert "exporter 'zipkin', which is not installed" in " ".join(done.stderr.split())
