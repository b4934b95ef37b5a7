"""Operating a mesh: Prometheus metrics (:mod:`meshpoint.ops.metrics`)."""
