"""What every benchmark does with its figures once printed: one JSON file per run in
``benchmarks/results/`` (ignored by git unless a docs page cites it; docs/benchmarks.md)."""

from __future__ import annotations

import json
import os
import platform
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rich.console import Console

RESULTS = Path(__file__).resolve().parent / "results"


def write_results(name: str, mode: str, settings: Any, results: Any, started: float,
                  console: Console) -> Path:
    """Write ``results`` of a ``mode`` run begun at ``started`` (``time.perf_counter()``)
    as ``<UTC time>-<mode>-<name>.json``, with the machine's facts, and say where."""
    stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H%M%SZ")
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"{stamp}-{mode}-{name}.json"
    out.write_text(json.dumps({
        "when": stamp, "mode": mode, "settings": settings,
        "cores": os.cpu_count(), "python": platform.python_version(),
        "seconds": round(time.perf_counter() - started), "results": results}, indent=2))
    console.print(f"written to {out} ({time.perf_counter() - started:.0f} s)")
    return out
