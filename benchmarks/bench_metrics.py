"""The pause write and the resume's restore with Prometheus metrics on and off.

    python benchmarks/bench_metrics.py --mode quick     # part of `make bench`
    python benchmarks/bench_metrics.py --mode full

A metric that costs more than noise on the hot path is not kept. Metrics are fed by
the instance's stats (``meshpoint.ops.metrics``: one more watcher of the notes it
makes anyway), so what they can cost is the note at the pause boundary and at a
resume. This times, on SQLite and PostgreSQL, what the boundary does at a pause (the
checkpoint write of a task of 20 messages of ~500 B and 3 peer calls, then its
``paused`` note) and at a resume (the restore, then its ``resumed`` note), for an
instance with metrics (``on``) and one without (``off``), interleaved run by run in
alternating order as ``bench_hooks.py`` does; and the note alone, a million times
each side. A table goes to the terminal, the figures to
``benchmarks/results/<date>-<mode>-metrics.json``. PostgreSQL is skipped, with a
message, when it is down.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import Progress

from _results import write_results
from meshpoint import open_store
from meshpoint.broker import InProcessBroker
from meshpoint.llm import ScriptedModel
from meshpoint.ops.metrics import Metrics
from meshpoint.runtime import Agent, AgentInstance
from meshpoint.store import SqlStore

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_compare import PG_DSN, POSTGRES_URL, meshpoint_context, postgres_up
from bench_hooks import interleaved

MODES = {"quick": {"runs": 2000, "notes": 200_000}, "full": {"runs": 10_000,
                                                         "notes": 1_000_000}}
console = Console(width=150)


async def pause_and_resume(stores: dict[str, SqlStore], runs: int,
                           progress: Progress) -> dict[str, Any]:
    """The pause write and the restore, each side with its own instance's stats."""
    instances = {side: AgentInstance(Agent("bench", ScriptedModel()), store,
                                     InProcessBroker()) for side, store in stores.items()}
    Metrics(instances["on"])
    sides = {id(store): side for side, store in stores.items()}
    prefix = {side: f"{side}-{uuid.uuid4().hex[:6]}" for side in stores}

    async def pause(store: SqlStore, n: int) -> None:
        side = sides[id(store)]
        ctx = meshpoint_context(f"{prefix[side]}-{n}")
        stats = instances[side].stats
        started = time.perf_counter()  # as PauseBoundary._checkpoint does
        await store.checkpoint_task(ctx, "bench", status="waiting_peers")
        write_s = time.perf_counter() - started
        stats.checkpoint_ms.append(write_s * 1000)
        stats.note("paused", ctx.task_id, status="waiting_peers",
                   items=list(ctx.active_peer_sub_tasks), write_s=write_s)

    async def restore(store: SqlStore, n: int) -> None:
        side = sides[id(store)]
        started = time.perf_counter()  # as TurnLoop.resume and _note_resumed do
        ctx = (await store.restore_task(f"{prefix[side]}-{n}")).context
        instances[side].stats.note("resumed", ctx.task_id, paused_s=1.0,
                                   restore_s=time.perf_counter() - started)

    out = {"pause write": await interleaved(stores, runs, pause, progress, "pauses"),
           "restore": await interleaved(stores, runs, restore, progress, "restores")}
    for side, store in stores.items():
        for n in range(runs):
            await store.cleanup_task(f"{prefix[side]}-{n}")
    return out


async def notes_alone(count: int) -> dict[str, float]:
    """Microseconds per ``paused`` note, without and with the metrics' watcher."""
    with tempfile.TemporaryDirectory() as folder:
        store = await open_store(f"sqlite:///{folder}/notes.db")
        try:
            out = {}
            for side in ("off", "on"):
                instance = AgentInstance(Agent("bench", ScriptedModel()), store,
                                         InProcessBroker())
                if side == "on":
                    Metrics(instance)
                stats, items = instance.stats, ["a", "b", "c"]
                started = time.perf_counter()
                for _ in range(count):
                    stats.note("paused", "task", status="waiting_peers", items=items,
                               write_s=0.001)
                out[side] = round((time.perf_counter() - started) / count * 1e6, 3)
            return out
        finally:
            await store.close()


async def run(mode: dict[str, int], progress: Progress) -> dict[str, Any]:
    results: dict[str, Any] = {"note_us": await notes_alone(mode["notes"])}
    with tempfile.TemporaryDirectory() as folder:
        url = f"sqlite:///{folder}/bench.db"
        stores = {"on": await open_store(url), "off": await open_store(url)}
        try:
            results["sqlite"] = await pause_and_resume(stores, mode["runs"], progress)
        finally:
            for store in stores.values():
                await store.close()
    missing = postgres_up()
    if missing:
        console.print(f"[yellow]skipping PostgreSQL: {missing}[/yellow]")
        return results
    import psycopg

    schema = f"bench_metrics_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(PG_DSN, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    try:
        stores = {"on": await open_store(POSTGRES_URL, schema=schema),
                  "off": await open_store(POSTGRES_URL, schema=schema)}
        try:
            results["postgresql"] = await pause_and_resume(stores, mode["runs"], progress)
        finally:
            for store in stores.values():
                await store.close()
    finally:
        with psycopg.connect(PG_DSN, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
    return results


def table(results: dict[str, Any]) -> str:
    def pair(d: dict[str, float]) -> str:
        return f"{d['p50']:.3f} / {d['p99']:.3f}"

    lines = ["| backend | operation | metrics on: p50 / p99 ms | off: p50 / p99 ms "
             "| on / off (p50, p99) |", "|---|---|---|---|---|"]
    for backend in ("sqlite", "postgresql"):
        for operation, r in results.get(backend, {}).items():
            lines.append(f"| {backend} | {operation} | {pair(r['on'])} | {pair(r['off'])} | "
                         f"{r['ratio_p50']:.2f}, {r['ratio_p99']:.2f} |")
    note = results["note_us"]
    lines.append(f"| - | the `paused` note alone (µs) | {note['on']:.2f} | {note['off']:.2f} | "
                 f"+{note['on'] - note['off']:.2f} µs |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mode", choices=sorted(MODES), default="quick")
    args = parser.parse_args()
    started = time.perf_counter()
    with Progress(console=console) as progress:
        results = asyncio.run(run(MODES[args.mode], progress))
    console.print(table(results), markup=False)
    write_results("metrics", args.mode, MODES[args.mode], results, started, console)
    return 0


if __name__ == "__main__":
    sys.exit(main())
