"""Scale-out benchmark: real ``meshpoint serve`` processes on PostgreSQL + NATS JetStream.

    make bench
    python benchmarks/bench_scaleout.py --tasks 600 --coordinators 1,2,4

For 1, 2 and 4 coordinator processes (and one process per peer agent: flights,
hotels, weather, whose scripted models answer at once), a client keeps
``--window`` tasks in flight until ``--tasks`` are answered; first, one coordinator
gets ``--latency-tasks`` tasks one at a time (latency without queueing). Each task fans out to
the 3 peers, so it pauses once (a checkpoint), and its join is claimed 3 times
(one resolution per answer). Reported:

* completed tasks per second, and claims (resolutions) per second;
* pause-to-resume p50/p99, pooled from every coordinator process (each writes its
  samples when it is stopped with SIGTERM), and the checkpoint write p50/p99;
* the ceiling: pgbench running a single-statement ``DELETE ... RETURNING`` by
  primary key on a table shaped like ``agent_peer_sub_tasks``, with as many
  clients as there are coordinator processes. A claim does more (it records the
  result, advances the join and may take the lease in the same transaction), so
  the ratio says how close to the raw database the runtime gets.

Results go to a table on the terminal and to ``benchmarks/results/<date>-scaleout.json``.
Needs PostgreSQL and NATS (``make services``); without them it says so and exits 0.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # for tests.cluster

from tests.cluster import PEERS, Cluster, mesh_config

from meshpoint.broker.nats import NatsBroker
from meshpoint.errors import BrokerError
from meshpoint.runtime import Client
from meshpoint.runtime.stats import percentile
from meshpoint.store import open_store

RESULTS = Path(__file__).parent / "results"
# The same server as the other benchmarks (bench_claims takes its pgbench ceiling
# from here), so MESHPOINT_BENCH_POSTGRES_URL moves them all.
POSTGRES_URL = os.environ.get("MESHPOINT_BENCH_POSTGRES_URL", os.environ.get(
    "MESHPOINT_TEST_POSTGRES_URL", "postgresql+asyncpg://postgres@127.0.0.1:5432/test"))
NATS_URL = os.environ.get("MESHPOINT_TEST_NATS_URL", "nats://127.0.0.1:4222")
console = Console(width=150)  # the table has 8 columns


def psql(sql: str) -> str:
    dsn = POSTGRES_URL.replace("postgresql+asyncpg://", "postgresql://")
    done = subprocess.run(["psql", dsn, "-v", "ON_ERROR_STOP=1", "-qAtc", sql],
                          capture_output=True, text=True, timeout=300)
    if done.returncode:
        raise RuntimeError(done.stderr.strip())
    return done.stdout.strip()


def services_missing() -> str | None:
    if shutil.which("psql") is None:
        return "psql is not installed"
    try:
        psql("SELECT 1")
    except RuntimeError as error:
        return f"PostgreSQL is not reachable at {POSTGRES_URL} ({error})"

    async def probe() -> None:
        broker = await NatsBroker.connect(NATS_URL, connect_timeout_s=3)
        await broker.close()

    try:
        asyncio.run(probe())
    except BrokerError as error:
        return str(error)
    return None


async def drive(namespace: str, tasks: int, window: int, progress: Progress) -> dict[str, Any]:
    broker = await NatsBroker.connect(NATS_URL)
    latencies: list[float] = []
    job = progress.add_task(f"tasks answered ({namespace})", total=tasks)
    try:
        async with Client(broker, namespace=namespace) as client:
            loop = asyncio.get_running_loop()
            slots = asyncio.Semaphore(window)
            failed = 0

            async def one(n: int) -> None:
                nonlocal failed
                async with slots:
                    began = loop.time()
                    answer = await client.ask("coordinator",
                                              f"Trip {n}: flights, hotels, weather", 300)
                    latencies.append((loop.time() - began) * 1000)
                    failed += answer.status.state.value != "completed"
                    progress.advance(job)

            started = loop.time()
            await asyncio.gather(*(one(n) for n in range(tasks)))
            seconds = loop.time() - started
    finally:
        await broker.close()
        progress.remove_task(job)
    return {"seconds": seconds, "failed": failed,
            "end_to_end_ms": {"p50": percentile(latencies, 50),
                              "p99": percentile(latencies, 99)}}


def run_mesh(coordinators: int, tasks: int, window: int, workdir: Path,
             progress: Progress) -> dict[str, Any]:
    namespace = f"bench{uuid.uuid4().hex[:8]}"
    schema = f"mp_{namespace}"
    config = mesh_config(namespace, {"url": POSTGRES_URL, "schema": schema}, NATS_URL,
                         peer_delay_s=0.0, lease_ttl_s=30.0, request_ack_wait_s=60.0,
                         response_ack_wait_s=30.0, max_deliver=5)
    cluster = Cluster.write(workdir / namespace, config)
    cluster.migrate()
    try:
        cluster.start({"coordinator": coordinators, **{p: 1 for p in PEERS}})
        figures = asyncio.run(drive(namespace, tasks, window, progress))
    finally:
        codes = cluster.stop()
        psql(f"DROP SCHEMA IF EXISTS {schema} CASCADE")

        async def cleanup() -> None:
            broker = await NatsBroker.connect(NATS_URL)
            await broker.delete_namespace(namespace)
            await broker.close()

        asyncio.run(cleanup())
    stats = cluster.stats("coordinator")
    pause = [s for st in stats for s in st["pause_resume_ms"]["samples"]]
    writes = [s for st in stats for s in st["checkpoint_ms"]["samples"]]
    rate = tasks / figures["seconds"]
    return {
        "coordinators": coordinators, "tasks": tasks, "window": window,
        "failed": figures["failed"],
        "seconds": round(figures["seconds"], 2), "tasks_per_s": round(rate, 1),
        "claims_per_s": round(rate * len(PEERS), 1),
        "pause_resume_ms": {"p50": percentile(pause, 50), "p99": percentile(pause, 99)},
        "checkpoint_ms": {"p50": percentile(writes, 50), "p99": percentile(writes, 99)},
        "end_to_end_ms": figures["end_to_end_ms"],
        "clean_exits": sum(1 for c in codes.values() if c == 0), "processes": len(codes),
    }


def pgbench_ceiling(clients: list[int], seconds: int, rows: int) -> dict[int, float]:
    """tps of a single-statement DELETE ... RETURNING by primary key on a table
    shaped like agent_peer_sub_tasks (the same columns, keys and indexes)."""
    schema = f"mp_pgbench{uuid.uuid4().hex[:6]}"
    dsn = POSTGRES_URL.replace("postgresql+asyncpg://", "postgresql://")

    async def migrate() -> None:  # the real table, in a schema of this run's own
        store = await open_store(POSTGRES_URL, schema=schema)
        await store.close()

    asyncio.run(migrate())
    psql(f"CREATE TABLE {schema}.claims (LIKE {schema}.agent_peer_sub_tasks INCLUDING ALL)")
    tps: dict[int, float] = {}
    try:
        for n in clients:
            psql(f"TRUNCATE {schema}.claims; INSERT INTO {schema}.claims SELECT 'default', "
                 f"'s' || i, 't' || i, 'coordinator', 'inv' || i, 'call' || i, 'flights', "
                 f"NULL, '{{\"query\": \"flights\"}}', 60, extract(epoch from now()) + 60, "
                 f"'pending', NULL, NULL, NULL, extract(epoch from now()) "
                 f"FROM generate_series(1, {rows}) i; ANALYZE {schema}.claims")
            script = Path(tempfile.mkstemp(suffix=".sql")[1])
            script.write_text(f"\\set id random(1, {rows})\n"
                              f"DELETE FROM {schema}.claims WHERE tenant_id = 'default' "
                              f"AND sub_task_id = 's' || :id RETURNING *;\n")
            done = subprocess.run(["pgbench", "-n", "-T", str(seconds), "-c", str(n), "-j",
                                   str(n), "-f", str(script), dsn],
                                  capture_output=True, text=True, timeout=seconds + 120)
            script.unlink()
            found = re.search(r"tps = ([\d.]+)", done.stdout)
            if not found:
                raise RuntimeError(f"pgbench failed: {done.stderr or done.stdout}")
            tps[n] = float(found.group(1))
    finally:
        psql(f"DROP SCHEMA {schema} CASCADE")
    return tps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=600)
    parser.add_argument("--window", type=int, default=64, help="tasks in flight at once")
    parser.add_argument("--coordinators", default="1,2,4")
    parser.add_argument("--pgbench-seconds", type=int, default=5)
    parser.add_argument("--latency-tasks", type=int, default=100,
                        help="tasks sent one at a time to 1 coordinator (unloaded latency)")
    args = parser.parse_args()
    missing = services_missing()
    if missing:
        console.print(f"[yellow]skipping the scale-out benchmark: {missing}. Start the "
                      f"services with `make services`.[/yellow]")
        return
    counts = [int(n) for n in args.coordinators.split(",")]
    runs = []
    with tempfile.TemporaryDirectory() as tmp, Progress(console=console) as progress:
        if args.latency_tasks:
            runs.append(run_mesh(1, args.latency_tasks, 1, Path(tmp), progress))
        for n in counts:
            runs.append(run_mesh(n, args.tasks, args.window, Path(tmp), progress))
    console.print("pgbench ceiling ...")
    ceiling = pgbench_ceiling(sorted({1, *counts}), args.pgbench_seconds, rows=300_000)

    def pair(ms: dict[str, float | None]) -> str:
        return " / ".join("-" if v is None else f"{v:.1f}" for v in (ms["p50"], ms["p99"]))

    table = Table(title=f"meshpoint serve processes on PostgreSQL + NATS, fan-out 3, "
                        f"{os.cpu_count()} cores")
    for column in ("coordinator processes", "tasks in flight", "tasks/s", "claims/s",
                   "pgbench DELETE tps", "claims / pgbench", "pause-to-resume p50/p99 ms",
                   "checkpoint p50/p99 ms", "end-to-end p50/p99 ms"):
        table.add_column(column, justify="right")
    for run in runs:
        run["pgbench_tps"] = ceiling[run["coordinators"]]
        run["claims_vs_pgbench"] = round(run["claims_per_s"] / run["pgbench_tps"], 3)
        table.add_row(str(run["coordinators"]), str(run["window"]), f"{run['tasks_per_s']:.1f}",
                      f"{run['claims_per_s']:.1f}", f"{run['pgbench_tps']:.0f}",
                      f"{run['claims_vs_pgbench']:.1%}", pair(run["pause_resume_ms"]),
                      pair(run["checkpoint_ms"]), pair(run["end_to_end_ms"]))
    console.print(table)
    RESULTS.mkdir(exist_ok=True)
    stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H%M%SZ")
    out = RESULTS / f"{stamp}-scaleout.json"
    out.write_text(json.dumps({
        "when": stamp, "cores": os.cpu_count(), "python": platform.python_version(),
        "postgres": psql("SHOW server_version"), "runs": runs,
        "pgbench_tps": ceiling}, indent=2))
    console.print(f"written to {out}")
    if any(run["failed"] or run["clean_exits"] != run["processes"] for run in runs):
        console.print("[red]some tasks failed or a process did not exit cleanly[/red]")
        sys.exit(2)


if __name__ == "__main__":
    main()
