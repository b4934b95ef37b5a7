"""Operating a mesh: what an operator watches while it runs.

What this package owns, module by module:

* :mod:`~meshpoint.ops.metrics`: Prometheus metrics of one instance (``meshpoint serve
  --metrics-port``), fed by its stats' notes and read from the store at scrape time.
* :mod:`~meshpoint.ops.tracing`: OpenTelemetry spans of one instance's tasks (on the
  API alone), and the W3C ``traceparent`` a task keeps in its checkpoint and sends.
* :mod:`~meshpoint.ops.otel`: ``meshpoint serve``'s span export from the standard
  ``OTEL_*`` environment variables (the SDK, from the ``otel`` extra, loaded only then).
* :mod:`~meshpoint.ops.dashboard`: ``meshpoint dashboard``, the web application (its
  templates/ and static/ ship in the package; the ``dashboard`` extra).

It reads the runtime and the store. The runtime imports one module of it, the seam
``tracing``, which imports nothing of meshpoint (so no cycle); nothing else in the
runtime or the store imports it. See docs/operations.md.
"""
