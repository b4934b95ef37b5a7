"""Trace export for ``meshpoint serve``, configured by OpenTelemetry's standard
environment variables, without code (docs/operations.md, "Traces").

``OTEL_TRACES_EXPORTER`` names the exporters (``otlp``, ``console``, any installed
exporter's entry point, comma-separated; unset or ``none``: no export, no SDK
loaded). The SDK reads the rest itself: ``OTEL_EXPORTER_OTLP_ENDPOINT`` and the
exporter's other settings, ``OTEL_SERVICE_NAME``, ``OTEL_RESOURCE_ATTRIBUTES``,
``OTEL_TRACES_SAMPLER``, ``OTEL_BSP_*``; ``OTEL_SDK_DISABLED=true`` turns it all off.
``otlp`` is OTLP over ``OTEL_EXPORTER_OTLP_PROTOCOL``: ``grpc`` (the default) or
``http/protobuf``.
The SDK and the OTLP exporter are the ``otel`` extra (``pip install
'meshpoint[otel]'``): asked for without them, ``serve`` stops at start saying so.

An application that runs its own instances configures its own ``TracerProvider``
instead; nothing here runs unless ``serve`` calls it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from importlib.metadata import entry_points
from typing import Any

from meshpoint.errors import ConfigurationError

#: The entry-point group OpenTelemetry's span exporters register their names in.
EXPORTERS = "opentelemetry_traces_exporter"
INSTALL = "pip install 'meshpoint[otel]'"


def exporter_names(environ: Mapping[str, str] | None = None) -> list[str]:
    """The exporters ``OTEL_TRACES_EXPORTER`` asks for (none if tracing is off)."""
    env = os.environ if environ is None else environ
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return []
    # The specification's values are case-insensitive; entry points are lower case.
    names = [n.strip().lower() for n in env.get("OTEL_TRACES_EXPORTER", "").split(",")
             if n.strip()]
    return [] if names in ([], ["none"]) else [n for n in names if n != "none"]


def trace_exporters(environ: Mapping[str, str] | None = None) -> list[Any]:
    """The span exporters ``OTEL_TRACES_EXPORTER`` asks for, made (none if it asks for
    nothing); ConfigurationError if the SDK or an exporter is missing. Called before
    ``serve`` opens anything, so that a wrong setting stops it at once."""
    env = os.environ if environ is None else environ
    names = exporter_names(env)
    if not names:
        return []
    try:
        import opentelemetry.sdk.trace  # noqa: F401 (the SDK: the exporters need it)
    except ImportError as error:
        raise ConfigurationError(
            f"tracing: OTEL_TRACES_EXPORTER={env.get('OTEL_TRACES_EXPORTER')} needs the "
            f"OpenTelemetry SDK, which is not installed ({error}): {INSTALL}, or unset "
            "OTEL_TRACES_EXPORTER") from None
    found = {ep.name: ep for ep in entry_points(group=EXPORTERS)}
    exporters = []
    for name in (_otlp(env) if n == "otlp" else n for n in names):
        if name not in found:
            hint = f" ({INSTALL} installs otlp)" if name.startswith("otlp") else ""
            raise ConfigurationError(
                f"tracing: OTEL_TRACES_EXPORTER names exporter {name!r}, which is not "
                f"installed{hint}; installed: {', '.join(sorted(found)) or 'none'}")
        exporters.append(found[name].load()())
    return exporters


def install_tracing(exporters: list[Any], agent: str, instance_id: str,
                    environ: Mapping[str, str] | None = None) -> Any | None:
    """Install a global ``TracerProvider`` handing its spans to ``exporters`` (in
    batches), its resource naming this instance (``service.instance.id``); None if
    there are none. Returns the provider: shut it down to export the spans still
    batched."""
    if not exporters:
        return None
    from opentelemetry import trace
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    env = os.environ if environ is None else environ
    attributes: dict[str, Any] = {"service.instance.id": instance_id, "meshpoint.agent": agent}
    if "OTEL_SERVICE_NAME" not in env and \
            "service.name=" not in env.get("OTEL_RESOURCE_ATTRIBUTES", ""):
        attributes["service.name"] = "meshpoint"
    provider = TracerProvider(resource=Resource.create(attributes))
    for exporter in exporters:
        provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    return provider


def configure_tracing(agent: str, instance_id: str,
                      environ: Mapping[str, str] | None = None) -> Any | None:
    """:func:`trace_exporters` then :func:`install_tracing`, in one call."""
    return install_tracing(trace_exporters(environ), agent, instance_id, environ)


def _otlp(env: Mapping[str, str]) -> str:
    """The exporter ``otlp`` means: by ``OTEL_EXPORTER_OTLP_TRACES_PROTOCOL`` (or
    ``OTEL_EXPORTER_OTLP_PROTOCOL``), ``grpc`` (the default) or ``http/protobuf``."""
    variable = next((v for v in ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
                                 "OTEL_EXPORTER_OTLP_PROTOCOL") if env.get(v, "").strip()), None)
    protocol = env[variable].strip() if variable is not None else "grpc"
    exporter = {"grpc": "otlp_proto_grpc",
                "http/protobuf": "otlp_proto_http"}.get(protocol.lower())
    if exporter is None:
        raise ConfigurationError(
            f"tracing: {variable}={protocol!r} is not an OTLP protocol meshpoint supports; "
            "expected one of: grpc, http/protobuf")
    return exporter
