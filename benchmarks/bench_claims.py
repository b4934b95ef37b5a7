"""Claim throughput: ``resolve_peer_sub_task`` from 1, 2 and 4 processes at once.

    python benchmarks/bench_claims.py --mode quick     # or full

Paused tasks (3 sub-tasks each) are written first; then N processes, started
together, each resolve their share of the sub-tasks (claim and record in one
transaction; every third resolution completes a join and takes the resume lease).
Reported: resolutions per second for N = 1, 2, 4, on a SQLite file and on
PostgreSQL, and for PostgreSQL the ceiling: pgbench running a single-statement
``DELETE ... RETURNING`` by primary key on a table shaped like the sub-task table,
with N clients. Results: a table, and ``benchmarks/results/<date>-<mode>-claims.json``.

Two ways of sharing the sub-tasks out:

* **by task**: each process resolves whole tasks, so no two processes touch one
  join, as no two pgbench clients touch one row: the comparison with the ceiling;
* **striped**: sub-task *i* goes to process *i mod N*, so the answers of one join
  reach different processes at the same moment and queue on its invocation row
  (each resolution waits for the previous one's commit). That is what a fan-out's
  answers do to a mesh; pgbench has no such case.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_compare import POSTGRES_URL, postgres_up
from bench_scaleout import pgbench_ceiling
from meshpoint import TaskExecutionContext, open_store

RESULTS = Path(__file__).parent / "results"
MODES = {"quick": {"tasks": 1500, "pgbench_s": 3}, "full": {"tasks": 10_000, "pgbench_s": 10}}
PROCESSES = (1, 2, 4)
console = Console(width=150)


async def prefill(url: str, schema: str | None, prefix: str, tasks: int) -> list[str]:
    async with open_store(url, schema=schema) as store:
        subs: list[str] = []
        for n in range(tasks):
            ctx = TaskExecutionContext(f"{prefix}-{n}", {"reply_to": "gateway"})
            ctx.current_invocation_id = f"{prefix}-{n}/inv"
            for k in range(3):
                ctx.register_peer_sub_task(f"{prefix}-{n}/sub-{k}", {
                    "peer_agent_name": f"peer-{k}", "function_call_id": f"call-{k}",
                    "timeout_s": 3600})
                subs.append(f"{prefix}-{n}/sub-{k}")
            await store.checkpoint_task(ctx, "bench")
        return subs


def worker(url: str, schema: str | None, subs: list[str], start: Any, done: Any) -> None:
    async def run() -> int:
        async with open_store(url, schema=schema, migrate=False) as store:
            await store.stats()  # connected and warm before the start
            start.wait()
            resolved = 0
            for sub in subs:
                got = await store.resolve_peer_sub_task(
                    sub, {"text": "answer " * 40}, lease_owner=f"w{os.getpid()}",
                    lease_ttl_s=60)
                resolved += got is not None
            return resolved

    done.put(asyncio.run(run()))


def race(url: str, schema: str | None, subs: list[str], processes: int,
         layout: str) -> dict[str, Any]:
    ctx = multiprocessing.get_context("spawn")
    start, done = ctx.Event(), ctx.Queue()
    if layout == "by task":
        tasks = [subs[k:k + 3] for k in range(0, len(subs), 3)]
        shares = [[s for t in tasks[i::processes] for s in t] for i in range(processes)]
    else:
        shares = [subs[i::processes] for i in range(processes)]
    procs = [ctx.Process(target=worker, args=(url, schema, share, start, done))
             for share in shares]
    for proc in procs:
        proc.start()
    time.sleep(3.0)  # every worker connected and waiting
    began = time.perf_counter()
    start.set()
    resolved = sum(done.get(timeout=600) for _ in procs)
    seconds = time.perf_counter() - began
    for proc in procs:
        proc.join(60)
    return {"processes": processes, "layout": layout, "resolved": resolved,
            "seconds": round(seconds, 3), "per_s": round(resolved / seconds, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mode", choices=sorted(MODES), default="quick")
    args = parser.parse_args()
    mode = MODES[args.mode]
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        backends = {"sqlite": (f"sqlite:///{tmp}/claims.db", None)}
        missing = postgres_up()
        if missing:
            console.print(f"[yellow]skipping PostgreSQL: {missing}; start it with "
                          f"`make services`[/yellow]")
        else:
            backends["postgres"] = (POSTGRES_URL, f"mp_claims_{uuid.uuid4().hex[:6]}")
        for backend, (url, schema) in backends.items():
            runs = []
            for n, layout in [(n, "by task") for n in PROCESSES] + [
                    (n, "striped") for n in PROCESSES if n > 1]:
                console.print(f"{backend}: pausing {mode['tasks']:,} tasks, then {n} "
                              f"process(es) resolve their {3 * mode['tasks']:,} sub-tasks "
                              f"({layout})")
                subs = asyncio.run(prefill(url, schema, uuid.uuid4().hex[:6], mode["tasks"]))
                runs.append(race(url, schema, subs, n, layout))
            results[backend] = {"runs": runs}
            if schema is not None:
                import psycopg

                with psycopg.connect(POSTGRES_URL.replace("+asyncpg", ""),
                                     autocommit=True) as conn:
                    conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
    if "postgres" in results:
        ceiling = pgbench_ceiling(list(PROCESSES), mode["pgbench_s"], rows=300_000)
        for run in results["postgres"]["runs"]:
            run["pgbench_tps"] = ceiling[run["processes"]]
            run["vs_pgbench"] = round(run["per_s"] / run["pgbench_tps"], 3)
    table = Table(title=f"resolve_peer_sub_task throughput ({args.mode} mode, "
                        f"{os.cpu_count()} cores)")
    for column in ("backend", "processes", "sub-tasks shared", "resolutions/s",
                   "pgbench DELETE tps", "meshpoint / pgbench"):
        table.add_column(column, justify="right")
    for backend, r in results.items():
        for run in r["runs"]:
            table.add_row(backend, str(run["processes"]), run["layout"], f"{run['per_s']:.0f}",
                          f"{run.get('pgbench_tps', 0):.0f}" if "pgbench_tps" in run else "-",
                          f"{run['vs_pgbench']:.1%}" if "vs_pgbench" in run else "-")
    console.print(table)
    RESULTS.mkdir(exist_ok=True)
    stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H%M%SZ")
    out = RESULTS / f"{stamp}-{args.mode}-claims.json"
    out.write_text(json.dumps({"when": stamp, "mode": args.mode, "settings": mode,
                               "cores": os.cpu_count(), "results": results}, indent=2))
    console.print(f"written to {out}")


if __name__ == "__main__":
    main()
