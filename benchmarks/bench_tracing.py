"""The pause write with OpenTelemetry tracing off (the API alone, no SDK: what every
user pays) and on (an SDK configured), and the span alone.

    python benchmarks/bench_tracing.py --mode quick     # part of `make bench`
    python benchmarks/bench_tracing.py --mode full

The runtime always calls the OpenTelemetry API (``meshpoint.ops.tracing``); with no
SDK configured its spans are no-ops and must cost nothing measurable on the hot path.
This times, on SQLite and PostgreSQL, the pause write as the boundary makes it (the
checkpoint span around the write of a task of 20 messages of ~500 B and 3 peer calls,
the span's ``traceparent`` put in the task's flags first) with the API's no-op tracer
(``off``) and with an SDK's tracer (``on``: a ``TracerProvider`` whose batch processor
hands the spans to an exporter that drops them, so that only meshpoint's and the SDK's
own work is timed), interleaved run by run in alternating order as ``bench_hooks.py``
does; and the span alone, each side, a given number of times. A table goes to the
terminal, the figures to ``benchmarks/results/<date>-<mode>-tracing.json``. PostgreSQL
is skipped, with a message, when it is down.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from rich.console import Console
from rich.progress import Progress

from _results import write_results
from meshpoint import open_store
from meshpoint.ops import tracing
from meshpoint.store import SqlStore

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_compare import PG_DSN, POSTGRES_URL, meshpoint_context, postgres_up
from bench_hooks import interleaved

MODES = {"quick": {"runs": 2000, "spans": 200_000},
         "full": {"runs": 10_000, "spans": 1_000_000}}
console = Console(width=150)


class Dropped(SpanExporter):
    """An exporter that drops what it is given (the network is not what is timed)."""

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return SpanExportResult.SUCCESS


def tracers() -> tuple[dict[str, Any], TracerProvider]:
    """The two sides' tracers: the API's own (no SDK: a no-op), and an SDK's."""
    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(Dropped()))
    return {"off": trace.get_tracer("meshpoint"),
            "on": provider.get_tracer("meshpoint")}, provider


async def pause_writes(stores: dict[str, SqlStore], runs: int, sides: dict[str, Any],
                       progress: Progress) -> dict[str, Any]:
    """The pause's checkpoint span and write, each side with its own tracer."""
    side_of = {id(store): side for side, store in stores.items()}
    prefix = {side: f"{side}-{uuid.uuid4().hex[:6]}" for side in stores}
    spans = tracing.Tracing("bench", "bench-1", "bench")

    async def pause(store: SqlStore, n: int) -> None:
        side = side_of[id(store)]
        tracing._tracer = sides[side]
        ctx = meshpoint_context(f"{prefix[side]}-{n}")
        with spans.checkpoint(ctx.task_id, "pause", "waiting_peers") as span:
            if (paused := tracing.traceparent(span)) is not None:  # as the boundary does
                ctx.flags[tracing.PAUSED_SPAN] = paused
            await store.checkpoint_task(ctx, "bench", status="waiting_peers")

    out = await interleaved(stores, runs, pause, progress, "pauses")
    for side, store in stores.items():
        for n in range(runs):
            await store.cleanup_task(f"{prefix[side]}-{n}")
    return out


def spans_alone(count: int, sides: dict[str, Any]) -> dict[str, float]:
    """Microseconds per checkpoint span (started, its traceparent read, ended)."""
    spans = tracing.Tracing("bench", "bench-1", "bench")
    out = {}
    for side in ("off", "on"):
        tracing._tracer = sides[side]
        started = time.perf_counter()
        for _ in range(count):
            with spans.checkpoint("task", "pause", "waiting_peers") as span:
                tracing.traceparent(span)
        out[side] = round((time.perf_counter() - started) / count * 1e6, 3)
    return out


async def run(mode: dict[str, int], progress: Progress) -> dict[str, Any]:
    sides, provider = tracers()
    kept = tracing._tracer
    try:
        results: dict[str, Any] = {"span_us": spans_alone(mode["spans"], sides)}
        with tempfile.TemporaryDirectory() as folder:
            url = f"sqlite:///{folder}/bench.db"
            stores = {"on": await open_store(url), "off": await open_store(url)}
            try:
                results["sqlite"] = await pause_writes(stores, mode["runs"], sides, progress)
            finally:
                for store in stores.values():
                    await store.close()
        missing = postgres_up()
        if missing:
            console.print(f"[yellow]skipping PostgreSQL: {missing}[/yellow]")
            return results
        import psycopg

        schema = f"bench_tracing_{uuid.uuid4().hex[:8]}"
        with psycopg.connect(PG_DSN, autocommit=True) as conn:
            conn.execute(f"CREATE SCHEMA {schema}")
        try:
            stores = {"on": await open_store(POSTGRES_URL, schema=schema),
                      "off": await open_store(POSTGRES_URL, schema=schema)}
            try:
                results["postgresql"] = await pause_writes(stores, mode["runs"], sides,
                                                           progress)
            finally:
                for store in stores.values():
                    await store.close()
        finally:
            with psycopg.connect(PG_DSN, autocommit=True) as conn:
                conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
        return results
    finally:
        tracing._tracer = kept
        provider.shutdown()


def table(results: dict[str, Any]) -> str:
    def pair(d: dict[str, float]) -> str:
        return f"{d['p50']:.3f} / {d['p99']:.3f}"

    lines = ["| backend | operation | SDK tracer: p50 / p99 ms | no SDK: p50 / p99 ms "
             "| on / off (p50, p99) |", "|---|---|---|---|---|"]
    for backend in ("sqlite", "postgresql"):
        if backend in results:
            r = results[backend]
            lines.append(f"| {backend} | pause write | {pair(r['on'])} | {pair(r['off'])} | "
                         f"{r['ratio_p50']:.2f}, {r['ratio_p99']:.2f} |")
    span = results["span_us"]
    lines.append(f"| - | the checkpoint span alone (µs) | {span['on']:.2f} | {span['off']:.2f} "
                 f"| +{span['on'] - span['off']:.2f} µs |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mode", choices=sorted(MODES), default="quick")
    args = parser.parse_args()
    started = time.perf_counter()
    with Progress(console=console) as progress:
        results = asyncio.run(run(MODES[args.mode], progress))
    console.print(table(results), markup=False)
    write_results("tracing", args.mode, MODES[args.mode], results, started, console)
    return 0


if __name__ == "__main__":
    sys.exit(main())
