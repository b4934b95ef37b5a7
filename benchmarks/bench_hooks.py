"""Each PostgreSQL fast path beside the portable body it replaces, in one run.

    python benchmarks/bench_hooks.py --mode quick     # part of `make bench`
    python benchmarks/bench_hooks.py --mode full

A fast path (``store/hooks.py``) is kept only while it pays for itself. This
measures every operation that has one, on one database, with the hook on
(``open_store(url)``) and off (``open_store(url, fast_paths=False)``), interleaved
run by run and in alternating order, so both sides see the same machine weather:

* ``first_checkpoint``: a first checkpoint (20 messages of ~500 B, 3 sub-tasks);
* ``resolve_one``: an answer resolved (every third completes its join and takes
  the resume lease);
* ``restore``: a paused task read back;
* ``recheckpoint``: a resumed task checkpointed again (2 new events, 3 new
  sub-tasks), its old children replaced.

SQLite has no fast paths: its portable bodies are all it runs. A table goes to the
terminal, the figures to ``benchmarks/results/<date>-<mode>-hooks.json``.
PostgreSQL is skipped, with a message, when it is down.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import Progress

from meshpoint import TaskExecutionContext, open_store
from meshpoint.store import SqlStore

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_compare import PG_DSN, POSTGRES_URL, meshpoint_context, message, postgres_up
from bench_store import percentiles

RESULTS = Path(__file__).parent / "results"
MODES = {"quick": {"runs": 1000}, "full": {"runs": 5000}}
#: A hook pays if it takes at most this share of its portable body's time, at p50 or
#: at p99 (differences smaller than this are within this machine's noise).
PAYS = 0.9
console = Console(width=150)

Call = Callable[[SqlStore, int], Awaitable[Any]]


async def interleaved(stores: dict[str, SqlStore], runs: int, call: Call,
                      progress: Progress, label: str) -> dict[str, Any]:
    """``call(store, n)`` for n in range(runs) on both stores, timed, alternating which
    goes first; percentiles of each side and their ratio."""
    samples: dict[str, list[float]] = {"on": [], "off": []}
    job = progress.add_task(label, total=runs)
    for n in range(runs):
        for side in (("on", "off") if n % 2 else ("off", "on")):
            started = time.perf_counter()
            await call(stores[side], n)
            samples[side].append((time.perf_counter() - started) * 1000)
        progress.advance(job)
    progress.remove_task(job)
    on, off = percentiles(samples["on"]), percentiles(samples["off"])
    return {"on": on, "off": off, "ratio_p50": round(on["p50"] / off["p50"], 3),
            "ratio_p99": round(on["p99"] / off["p99"], 3)}


async def pause_path(stores: dict[str, SqlStore], runs: int,
                     progress: Progress) -> dict[str, Any]:
    """The four hooks of the pause boundary, on tasks of the benchmark's payload
    (``stores``: the two sides, ``"on"`` and ``"off"``)."""
    prefix = {side: f"{side}-{uuid.uuid4().hex[:6]}" for side in stores}
    sides = {id(store): side for side, store in stores.items()}
    out: dict[str, Any] = {}
    tasks = runs // 3 + 1  # resolutions: 3 per task

    async def first(store: SqlStore, n: int) -> None:
        await store.checkpoint_task(meshpoint_context(f"{prefix[side_of(store)]}-{n}"),
                                    "bench")

    def side_of(store: SqlStore) -> str:
        return sides[id(store)]

    out["first_checkpoint"] = await interleaved(stores, tasks, first, progress,
                                                "first checkpoints")

    async def resolve(store: SqlStore, n: int) -> None:
        task, sub = divmod(n, 3)
        side = side_of(store)
        got = await store.resolve_peer_sub_task(
            f"{prefix[side]}-{task}/sub-{sub}", {"text": f"answer {n}"},
            lease_owner=f"bench-{side}")
        assert got is not None

    out["resolve_one"] = await interleaved(stores, tasks * 3, resolve, progress, "resolutions")

    async def restore(store: SqlStore, n: int) -> None:
        await store.restore_task(f"{prefix[side_of(store)]}-{n % tasks}")

    out["restore"] = await interleaved(stores, runs, restore, progress, "restores")
    # Every task's join completed and its lease is the side's: check each in again.
    contexts: dict[str, list[TaskExecutionContext]] = {}
    for side, store in stores.items():
        contexts[side] = []
        for n in range(tasks):
            ctx = (await store.restore_task(f"{prefix[side]}-{n}",
                                            lease_owner=f"bench-{side}")).context
            ctx.append_session_event(message(20))
            ctx.append_session_event(message(21))
            ctx.current_invocation_id = f"{ctx.task_id}/inv-2"
            for k in range(3):
                ctx.register_peer_sub_task(f"{ctx.task_id}/again-{k}", {
                    "peer_agent_name": f"peer-{k}", "function_call_id": f"again-{k}"})
            contexts[side].append(ctx)

    async def again(store: SqlStore, n: int) -> None:
        side = side_of(store)
        await store.checkpoint_task(contexts[side][n], "bench", lease_owner=f"bench-{side}")

    out["recheckpoint"] = await interleaved(stores, tasks, again, progress,
                                            "re-checkpoints")
    for side, store in stores.items():
        for n in range(tasks):
            await store.cleanup_task(f"{prefix[side]}-{n}")
    return out


async def run(mode: dict[str, int], progress: Progress) -> dict[str, Any]:
    import psycopg

    schema = f"bench_hooks_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(PG_DSN, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    try:
        stores = {"on": await open_store(POSTGRES_URL, schema=schema),
                  "off": await open_store(POSTGRES_URL, schema=schema, fast_paths=False)}
        try:
            out = await pause_path(stores, mode["runs"], progress)
        finally:
            for store in stores.values():
                await store.close()
    finally:
        with psycopg.connect(PG_DSN, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
    return out


#: What each measured hook replaces, for the table.
REPLACES = {
    "first_checkpoint": "insert_task + 3 child inserts in BEGIN ... COMMIT",
    "resolve_one": "resolve_pending, advance_invocation, mark_resuming in BEGIN ... COMMIT",
    "restore": "4 SELECTs in a REPEATABLE READ transaction",
    "recheckpoint": "recheckpoint_task, count_open_sub_tasks, 2 deletes, 3 child inserts "
                    "in BEGIN ... COMMIT",
}


def table(results: dict[str, Any]) -> str:
    def pair(d: dict[str, float]) -> str:
        return f"{d['p50']:.2f} / {d['p99']:.2f}"

    lines = ["| hook | replaces | on: p50 / p99 ms | off: p50 / p99 ms | on / off (p50, p99) "
             "| pays? |", "|---|---|---|---|---|---|"]
    for hook, r in results.items():
        pays = "yes" if min(r["ratio_p50"], r["ratio_p99"]) <= PAYS else "**no**"
        lines.append(f"| {hook} | {REPLACES[hook]} | {pair(r['on'])} | {pair(r['off'])} | "
                     f"{r['ratio_p50']:.2f}, {r['ratio_p99']:.2f} | {pays} |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mode", choices=sorted(MODES), default="quick")
    args = parser.parse_args()
    missing = postgres_up()
    if missing:
        console.print(f"[yellow]skipping the PostgreSQL fast paths: {missing}; start it "
                      f"with `make services`[/yellow]")
        return 0
    started = time.perf_counter()
    with Progress(console=console) as progress:
        results = asyncio.run(run(MODES[args.mode], progress))
    console.print(table(results), markup=False)
    stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H%M%SZ")
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"{stamp}-{args.mode}-hooks.json"
    out.write_text(json.dumps({
        "when": stamp, "mode": args.mode, "settings": MODES[args.mode],
        "cores": os.cpu_count(), "python": platform.python_version(),
        "seconds": round(time.perf_counter() - started), "pays_below": PAYS,
        "results": results}, indent=2))
    console.print(f"written to {out} ({time.perf_counter() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
