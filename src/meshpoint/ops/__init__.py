"""Operating a mesh: what an operator watches while it runs.

What this package owns, module by module:

* :mod:`~meshpoint.ops.metrics`: Prometheus metrics of one instance (``meshpoint serve
  --metrics-port``), fed by its stats' notes and read from the store at scrape time.

It reads the runtime and the store; nothing in them imports it. See docs/operations.md.
"""
