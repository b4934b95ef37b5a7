"""``meshpoint serve``'s trace export from OpenTelemetry's standard environment
variables (ops/otel.py): what it asks for, what it installs, and the error that
says what is missing. The process-wide provider is never set here (it is captured)."""

from __future__ import annotations

import sys
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.grpc import trace_exporter as grpc
from opentelemetry.exporter.otlp.proto.http import trace_exporter as http
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter

from meshpoint.errors import ConfigurationError
from meshpoint.ops.otel import configure_tracing, exporter_names


@pytest.fixture
def installed(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The providers configure_tracing would install process-wide."""
    providers: list[Any] = []
    monkeypatch.setattr(trace, "set_tracer_provider", providers.append)
    return providers


@pytest.mark.parametrize(("env", "names"), [
    ({}, []), ({"OTEL_TRACES_EXPORTER": "none"}, []), ({"OTEL_TRACES_EXPORTER": " "}, []),
    ({"OTEL_TRACES_EXPORTER": "otlp"}, ["otlp"]),
    ({"OTEL_TRACES_EXPORTER": "otlp, console"}, ["otlp", "console"]),
    ({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_SDK_DISABLED": "true"}, []),
    ({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_SDK_DISABLED": "false"}, ["otlp"])])
def test_the_exporters_asked_for(env: dict[str, str], names: list[str]) -> None:
    assert exporter_names(env) == names


def test_nothing_asked_for_installs_nothing(installed: list[Any]) -> None:
    assert configure_tracing("a", "a-1", {}) is None
    assert installed == []


def test_otlp_installs_a_provider_naming_the_instance(installed: list[Any]) -> None:
    provider = configure_tracing("coordinator", "coordinator-1", {
        "OTEL_TRACES_EXPORTER": "otlp,console"})
    try:
        assert installed == [provider] and isinstance(provider, TracerProvider)
        attributes = provider.resource.attributes
        assert attributes["service.instance.id"] == "coordinator-1"
        assert attributes["meshpoint.agent"] == "coordinator"
        processors = provider._active_span_processor._span_processors
        assert [type(p) for p in processors] == [BatchSpanProcessor, BatchSpanProcessor]
        assert [type(p.span_exporter) for p in processors] == [
            grpc.OTLPSpanExporter, ConsoleSpanExporter]
    finally:
        provider.shutdown()


def test_otlp_over_http_as_the_standard_variable_says(installed: list[Any]) -> None:
    provider = configure_tracing("a", "a-1", {"OTEL_TRACES_EXPORTER": "otlp",
                                              "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"})
    try:
        (processor,) = provider._active_span_processor._span_processors
        assert type(processor.span_exporter) is http.OTLPSpanExporter
    finally:
        provider.shutdown()


def test_the_standard_service_name_wins(installed: list[Any],
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_SERVICE_NAME", "trips")
    provider = configure_tracing("a", "a-1", {"OTEL_TRACES_EXPORTER": "console",
                                              "OTEL_SERVICE_NAME": "trips"})
    try:
        assert provider.resource.attributes["service.name"] == "trips"
    finally:
        provider.shutdown()


@pytest.mark.parametrize("variable", ["OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
                                      "OTEL_EXPORTER_OTLP_PROTOCOL"])
def test_an_otlp_protocol_not_supported_names_its_variable(installed: list[Any],
                                                           variable: str) -> None:
    with pytest.raises(ConfigurationError, match=rf"tracing: {variable}='http/json' is not an "
                       r"OTLP protocol meshpoint supports; expected one of: grpc, http/protobuf"):
        configure_tracing("a", "a-1", {"OTEL_TRACES_EXPORTER": "otlp", variable: "http/json"})
    assert installed == []


def test_the_variables_values_are_case_insensitive(installed: list[Any]) -> None:
    """As the specification says of its enumerations: ``OTLP``, ``HTTP/Protobuf``."""
    assert exporter_names({"OTEL_TRACES_EXPORTER": "OTLP, Console"}) == ["otlp", "console"]
    assert exporter_names({"OTEL_TRACES_EXPORTER": "None"}) == []
    provider = configure_tracing("a", "a-1", {"OTEL_TRACES_EXPORTER": "OTLP",
                                              "OTEL_EXPORTER_OTLP_PROTOCOL": "HTTP/Protobuf"})
    try:
        (processor,) = provider._active_span_processor._span_processors
        assert type(processor.span_exporter) is http.OTLPSpanExporter
    finally:
        provider.shutdown()


def test_an_exporter_not_installed_is_named(installed: list[Any]) -> None:
    with pytest.raises(ConfigurationError, match=r"'zipkin', which is not installed; "
                       r"installed: console, otlp"):
        configure_tracing("a", "a-1", {"OTEL_TRACES_EXPORTER": "zipkin"})
    assert installed == []


def test_without_the_sdk_the_error_says_to_install_the_extra(
        installed: list[Any], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "opentelemetry.sdk.trace", None)
    with pytest.raises(ConfigurationError, match=r"OTEL_TRACES_EXPORTER=otlp needs the "
                       r"OpenTelemetry SDK.*pip install 'meshpoint\[otel\]'"):
        configure_tracing("a", "a-1", {"OTEL_TRACES_EXPORTER": "otlp"})
    assert installed == []
