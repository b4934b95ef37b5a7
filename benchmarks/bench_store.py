"""Store latency benchmark: the pause-boundary write and the resolve, on both backends.

    make bench                      # both backends, 2,000 runs each
    python benchmarks/bench_store.py --runs 5000 --backend sqlite

Measures, per backend, p50/p99/max over ``--runs`` calls of:

* ``checkpoint_task``: a 20 KB context (20 conversation messages of ~1 KB, all new
  since the last checkpoint) and 3 peer sub-tasks, written in one transaction;
* ``resolve_peer_sub_task``: claim + record one answer (every third call completes
  a join and takes the resume lease in the same transaction);
* ``restore_task``: read a paused task back as a live context.

Durable settings throughout: PostgreSQL with its default ``synchronous_commit=on``,
SQLite in WAL mode with ``synchronous=NORMAL``. PostgreSQL is skipped with a
message when it is not reachable. Results go to a table on the terminal and to
``benchmarks/results/<date>-store.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from meshpoint import TaskExecutionContext, open_store
from meshpoint.errors import StoreUnavailableError
from meshpoint.runtime.stats import percentile
from meshpoint.store import SqlStore

POSTGRES_URL = os.environ.get("MESHPOINT_BENCH_POSTGRES_URL",
                              "postgresql+asyncpg://postgres@127.0.0.1:5432/test")
RESULTS = Path(__file__).parent / "results"
console = Console()


def context_20kb(task_id: str) -> TaskExecutionContext:
    """A paused task: 20 messages of ~1 KB and a turn that called 3 peers."""
    ctx = TaskExecutionContext(task_id, {"session_id": f"s-{task_id}", "user_id": "u-1",
                                         "reply_to": "gateway"})
    ctx.current_invocation_id = f"{task_id}/inv"
    for n in range(20):
        ctx.append_session_event({"role": "user" if n % 2 == 0 else "model",
                                  "text": f"message {n} " + "lorem ipsum dolor sit amet " * 37})
    for n in range(3):
        ctx.register_peer_sub_task(f"{task_id}/sub-{n}", {
            "peer_agent_name": f"peer-{n}", "function_call_id": f"call-{n}",
            "peer_tool": "ask", "timeout_s": 300})
    ctx.record_token_usage(model="gpt-x", source="agent", prompt_tokens=5000,
                           completion_tokens=300)
    return ctx


def percentiles(samples_ms: list[float]) -> dict[str, float]:
    """p50, p99 (the runtime's one definition, meshpoint.runtime.stats.percentile),
    max and the number of runs."""
    return {"p50": percentile(samples_ms, 50) or 0.0, "p99": percentile(samples_ms, 99) or 0.0,
            "max": max(samples_ms), "runs": len(samples_ms)}


async def timed(samples: list[float], call: Callable[[], Awaitable[Any]],
                progress: Progress) -> Any:
    start = time.perf_counter()
    result = await call()
    samples.append((time.perf_counter() - start) * 1000)
    if len(samples) % 100 == 0:
        progress.refresh()  # outside the timed region
    return result


async def bench_backend(store: SqlStore, runs: int, progress: Progress) -> dict[str, Any]:
    prefix = uuid.uuid4().hex[:8]
    tasks = [f"{prefix}-{n}" for n in range(runs)]
    size = len(json.dumps(context_20kb("size").to_checkpoint_dict()))
    out: dict[str, Any] = {"context_bytes": size}
    warm = context_20kb(f"{prefix}-warm")
    await store.checkpoint_task(warm, "bench")  # warm the pool and statement caches
    await store.cleanup_task(warm.task_id)

    samples: list[float] = []
    job = progress.add_task(f"{store.dialect}: checkpoint_task", total=runs)
    for task_id in tasks:
        # Built just before its call, as an instance builds it during the turn. Building
        # all of them first kept ~45 MB of contexts alive, and Python's full garbage
        # collections, walking them, doubled the median of the later calls.
        ctx = context_20kb(task_id)
        await timed(samples, lambda ctx=ctx: store.checkpoint_task(ctx, "bench"), progress)
        progress.advance(job)
    out["checkpoint_task"] = percentiles(samples)

    samples = []
    job = progress.add_task(f"{store.dialect}: restore_task", total=runs)
    for task_id in tasks:
        await timed(samples, lambda t=task_id: store.restore_task(t), progress)
        progress.advance(job)
    out["restore_task"] = percentiles(samples)

    samples = []
    resolves = tasks[: max(1, -(-runs // 3))]
    job = progress.add_task(f"{store.dialect}: resolve_peer_sub_task", total=3 * len(resolves))
    for task_id in resolves:
        for n in range(3):
            await timed(samples, lambda s=f"{task_id}/sub-{n}": store.resolve_peer_sub_task(
                s, {"text": "answer " * 40}, lease_owner="bench", lease_ttl_s=60), progress)
            progress.advance(job)
    out["resolve_peer_sub_task"] = percentiles(samples)

    for task_id in tasks:
        await store.cleanup_task(task_id)
    return out


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=2000, help="calls per operation")
    parser.add_argument("--backend", choices=["sqlite", "postgres", "both"], default="both")
    args = parser.parse_args()

    results: dict[str, Any] = {}
    # No auto-refresh: the refresh thread would steal the GIL in the middle of timed
    # calls and show up in p99. Bars are redrawn between calls instead.
    with tempfile.TemporaryDirectory() as tmp, Progress(console=console,
                                                       auto_refresh=False) as progress:
        if args.backend in ("sqlite", "both"):
            async with open_store(f"sqlite:///{tmp}/bench.db") as store:
                results["sqlite"] = await bench_backend(store, args.runs, progress)
        if args.backend in ("postgres", "both"):
            schema = f"mp_bench_{uuid.uuid4().hex[:8]}"
            try:
                async with open_store(POSTGRES_URL, busy_timeout_s=5) as admin:
                    await admin.run(lambda c: c.exec_driver_sql(f"CREATE SCHEMA {schema}"),
                                    write=True)
                    try:
                        async with open_store(POSTGRES_URL, schema=schema) as store:
                            results["postgresql"] = await bench_backend(store, args.runs,
                                                                        progress)
                    finally:
                        await admin.run(
                            lambda c: c.exec_driver_sql(f"DROP SCHEMA {schema} CASCADE"),
                            write=True)
            except StoreUnavailableError as error:
                console.print(f"[yellow]PostgreSQL skipped: {error}. Start it (`make "
                              "services`) or set MESHPOINT_BENCH_POSTGRES_URL.[/yellow]")

    table = Table(title=f"meshpoint store latency (ms), {os.cpu_count()} cores, "
                        f"target p99 < 2 ms")
    for column in ("backend", "operation", "runs", "p50", "p99", "max"):
        table.add_column(column, justify="left" if column in ("backend", "operation")
                         else "right")
    for backend, figures in results.items():
        for op in ("checkpoint_task", "resolve_peer_sub_task", "restore_task"):
            f = figures[op]
            style = "green" if f["p99"] < 2 else "red"
            table.add_row(backend, op, str(f["runs"]), f"{f['p50']:.3f}",
                          f"[{style}]{f['p99']:.3f}[/{style}]", f"{f['max']:.3f}")
    console.print(table)
    if results:
        size = next(iter(results.values()))["context_bytes"]
        console.print(f"context: {size:,} bytes of JSON, 3 sub-tasks, 20 new messages")
        RESULTS.mkdir(exist_ok=True)
        stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H%M%SZ")
        path = RESULTS / f"{stamp}-store.json"
        path.write_text(json.dumps({
            "date": stamp, "cores": os.cpu_count(), "python": sys.version.split()[0],
            "platform": platform.platform(), "runs": args.runs, "results": results,
        }, indent=2))
        console.print(f"written to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
