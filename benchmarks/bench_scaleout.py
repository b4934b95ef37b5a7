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
* CPU per task: user + system CPU of every serve process (coordinators and peers;
  not the client) over the tasks, divided by the tasks;
* beside it, unless ``--sides meshpoint``, DBOS Transact on the same workload: a
  durable workflow fanning out to three steps and joining, on the same PostgreSQL (a
  schema of its own), the same number of worker processes dequeuing from one queue, the
  same window (``benchmarks/_dbos_side.py``; DBOS runs from a virtual environment of
  its own under ``~/.cache/meshpoint``, made on first use). The two sides alternate;
* the ceiling: pgbench running a single-statement ``DELETE ... RETURNING`` by
  primary key on a table shaped like ``agent_peer_sub_tasks``, with as many
  clients as there are coordinator processes. A claim does more (it records the
  result, advances the join and may take the lease in the same transaction), so
  the ratio says how close to the raw database the runtime gets.

Results go to tables on the terminal and to ``benchmarks/results/<date>-full-scaleout.json``.
Needs PostgreSQL and NATS (``make services``); without them it says so and exits 0.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from _dbos_side import DBOS_VERSION, READY, ServerCpu, cpu_seconds, ensure_env
from _results import write_results

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # for tests.cluster

from tests.cluster import PEERS, Cluster, mesh_config

from meshpoint.broker.nats import NatsBroker
from meshpoint.errors import BrokerError
from meshpoint.runtime import Client
from meshpoint.runtime.stats import percentile
from meshpoint.store import open_store

# The same server as the other benchmarks (bench_claims takes its pgbench ceiling
# from here), so MESHPOINT_BENCH_POSTGRES_URL moves them all.
POSTGRES_URL = os.environ.get("MESHPOINT_BENCH_POSTGRES_URL", os.environ.get(
    "MESHPOINT_TEST_POSTGRES_URL", "postgresql+asyncpg://postgres@127.0.0.1:5432/test"))
NATS_URL = os.environ.get("MESHPOINT_TEST_NATS_URL", "nats://127.0.0.1:4222")
console = Console(width=170)  # the tables have 11 columns


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


async def drive(namespace: str, tasks: int, window: int, pids: list[int],
                progress: Progress) -> dict[str, Any]:
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

            cpu_before = cpu_seconds(pids)
            postgres, nats_server = ServerCpu("postgres"), ServerCpu("nats-server")
            started = loop.time()
            await asyncio.gather(*(one(n) for n in range(tasks)))
            seconds = loop.time() - started
            cpu = cpu_seconds(pids) - cpu_before
            postgres_cpu, nats_cpu = postgres.since(), nats_server.since()
    finally:
        await broker.close()
        progress.remove_task(job)
    return {"seconds": seconds, "failed": failed, "cpu_s": cpu,
            "postgres_cpu_s": postgres_cpu, "nats_cpu_s": nats_cpu,
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
        pids = [proc.popen.pid for proc in cluster.procs]
        figures = asyncio.run(drive(namespace, tasks, window, pids, progress))
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
        "side": "meshpoint", "coordinators": coordinators, "tasks": tasks, "window": window,
        "failed": figures["failed"],
        "cpu_ms_per_task": round(figures["cpu_s"] * 1000 / tasks, 2),
        "postgres_cpu_ms_per_task": round(figures["postgres_cpu_s"] * 1000 / tasks, 2),
        "nats_cpu_ms_per_task": round(figures["nats_cpu_s"] * 1000 / tasks, 2),
        "seconds": round(figures["seconds"], 2), "tasks_per_s": round(rate, 1),
        "claims_per_s": round(rate * len(PEERS), 1),
        "pause_resume_ms": {"p50": percentile(pause, 50), "p99": percentile(pause, 99)},
        "checkpoint_ms": {"p50": percentile(writes, 50), "p99": percentile(writes, 99)},
        "end_to_end_ms": figures["end_to_end_ms"],
        "clean_exits": sum(1 for c in codes.values() if c == 0), "processes": len(codes),
    }


def run_dbos(workers: int, tasks: int, window: int, workdir: Path, poll_s: float,
             progress: Progress) -> dict[str, Any]:
    """DBOS Transact on the same workload: ``workers`` DBOS processes dequeuing from one
    queue, a driver keeping ``window`` workflows in flight (``_dbos_side.py``)."""
    python = str(ensure_env())
    side = str(Path(__file__).with_name("_dbos_side.py"))
    schema = f"dbos_bench{uuid.uuid4().hex[:8]}"
    common = ["--url", POSTGRES_URL, "--schema", schema, "--poll-s", str(poll_s)]
    procs: list[subprocess.Popen[bytes]] = []
    job = progress.add_task(f"DBOS, {workers} worker(s), {tasks} tasks", total=None)
    try:
        for n in range(workers):  # the first one alone: it migrates the schema
            log = (workdir / f"{schema}-w{n}.log").open("wb")
            proc = subprocess.Popen([python, side, "worker", *common, "--executor", f"w{n}"],
                                    stdout=subprocess.PIPE, stderr=log)
            procs.append(proc)
            assert proc.stdout is not None
            if not proc.stdout.readline().decode().startswith(READY):
                raise RuntimeError(f"a DBOS worker did not start: see {log.name}")
        done = subprocess.run(
            [python, side, "drive", *common, "--tasks", str(tasks), "--window", str(window),
             "--pids", ",".join(str(p.pid) for p in procs)],
            capture_output=True, text=True, timeout=max(600, tasks))
        if done.returncode:
            raise RuntimeError(f"the DBOS driver failed:\n{done.stderr[-2000:]}")
        figures = json.loads(done.stdout.strip().splitlines()[-1])
    finally:
        for proc in procs:
            proc.terminate()
        codes = [proc.wait(60) for proc in procs]
        progress.remove_task(job)
        psql(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
    rate = tasks / figures["seconds"]
    return {
        "side": "dbos", "coordinators": workers, "tasks": tasks, "window": window,
        "failed": figures["failed"],
        "cpu_ms_per_task": round(figures["cpu_s"] * 1000 / tasks, 2),
        "postgres_cpu_ms_per_task": round(figures["postgres_cpu_s"] * 1000 / tasks, 2),
        "seconds": round(figures["seconds"], 2), "tasks_per_s": round(rate, 1),
        "end_to_end_ms": figures["end_to_end_ms"],
        "clean_exits": sum(1 for c in codes if c == 0), "processes": len(codes),
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


def span(values: list[float], digits: int = 1) -> str:
    """One figure, or the range of the rounds' figures."""
    low, high = min(values), max(values)
    return f"{low:,.{digits}f}" if low == high else f"{low:,.{digits}f}-{high:,.{digits}f}"


def pair(runs: list[dict[str, Any]], key: str) -> str:
    return " / ".join(span([r[key][q] for r in runs]) if all(r[key][q] is not None
                                                                  for r in runs) else "-"
                      for q in ("p50", "p99"))


def mesh_table(runs: list[dict[str, Any]], ceiling: dict[int, float]) -> Table:
    table = Table(title=f"meshpoint serve processes on PostgreSQL + NATS, fan-out 3, "
                        f"{os.cpu_count()} cores")
    for column in ("coordinator processes", "tasks in flight", "tasks/s", "claims/s",
                   "CPU ms / task", "PostgreSQL / NATS server CPU ms / task",
                   "pgbench DELETE tps", "claims / pgbench",
                   "pause-to-resume p50/p99 ms", "checkpoint p50/p99 ms",
                   "end-to-end p50/p99 ms"):
        table.add_column(column, justify="right")
    for run in runs:
        tps = ceiling.get(run["coordinators"])
        if tps:
            run["pgbench_tps"] = tps
            run["claims_vs_pgbench"] = round(run["claims_per_s"] / tps, 3)
        table.add_row(str(run["coordinators"]), str(run["window"]), f"{run['tasks_per_s']:.1f}",
                      f"{run['claims_per_s']:.1f}", f"{run['cpu_ms_per_task']:.1f}",
                      f"{run['postgres_cpu_ms_per_task']:.1f} / "
                      f"{run['nats_cpu_ms_per_task']:.1f}",
                      f"{tps:.0f}" if tps else "-",
                      f"{run['claims_vs_pgbench']:.1%}" if tps else "-",
                      pair([run], "pause_resume_ms"), pair([run], "checkpoint_ms"),
                      pair([run], "end_to_end_ms"))
    return table


def versus_table(runs: list[dict[str, Any]]) -> Table:
    """meshpoint beside DBOS, each cell the range over the rounds, with the ratios."""
    table = Table(title=f"meshpoint beside DBOS Transact {DBOS_VERSION}: the same fan-out-3 "
                        f"workload on one PostgreSQL")
    for column in ("processes", "in flight", "meshpoint tasks/s", "DBOS tasks/s",
                   "tasks/s ratio", "meshpoint CPU ms/task", "DBOS CPU ms/task",
                   "CPU ratio", "PostgreSQL CPU ms/task, meshpoint / DBOS",
                   "meshpoint p50/p99 ms", "DBOS p50/p99 ms"):
        table.add_column(column, justify="right")
    keys = sorted({(r["window"], r["coordinators"]) for r in runs})
    for window, n in keys:
        mesh = [r for r in runs if r["side"] == "meshpoint" and
                (r["window"], r["coordinators"]) == (window, n)]
        dbos = [r for r in runs if r["side"] == "dbos" and
                (r["window"], r["coordinators"]) == (window, n)]
        if not mesh or not dbos:
            continue
        rate = [m["tasks_per_s"] / d["tasks_per_s"] for m, d in zip(mesh, dbos, strict=False)]
        cpu = [m["cpu_ms_per_task"] / d["cpu_ms_per_task"] for m, d in zip(mesh, dbos,
                                                                             strict=False)]
        table.add_row(str(n), str(window), span([r["tasks_per_s"] for r in mesh]),
                      span([r["tasks_per_s"] for r in dbos]), span(rate, 2),
                      span([r["cpu_ms_per_task"] for r in mesh]),
                      span([r["cpu_ms_per_task"] for r in dbos]), span(cpu, 2),
                      f"{span([r['postgres_cpu_ms_per_task'] for r in mesh])} / "
                      f"{span([r['postgres_cpu_ms_per_task'] for r in dbos])}",
                      pair(mesh, "end_to_end_ms"), pair(dbos, "end_to_end_ms"))
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=600)
    parser.add_argument("--window", type=int, default=64, help="tasks in flight at once")
    parser.add_argument("--coordinators", default="1,2,4",
                        help="coordinator processes (DBOS: worker processes) per run")
    parser.add_argument("--sides", default="meshpoint,dbos",
                        help="meshpoint, dbos or both (they alternate)")
    parser.add_argument("--rounds", type=int, default=1,
                        help="each run this many times; tables show the range")
    parser.add_argument("--dbos-poll-s", type=float, default=0.01,
                        help="DBOS queue polling interval (its default is 1 s)")
    parser.add_argument("--pgbench-seconds", type=int, default=5, help="0: no ceiling")
    parser.add_argument("--latency-tasks", type=int, default=100,
                        help="tasks sent one at a time to 1 coordinator (unloaded latency)")
    args = parser.parse_args()
    sides = [side.strip() for side in args.sides.split(",") if side.strip()]
    if not sides or set(sides) - {"meshpoint", "dbos"}:
        parser.error(f"--sides takes meshpoint, dbos or both, not {args.sides!r}")
    missing = services_missing()
    if missing:
        console.print(f"[yellow]skipping the scale-out benchmark: {missing}. Start the "
                      f"services with `make services`.[/yellow]")
        return
    if "dbos" in sides:
        try:
            ensure_env()
        except (OSError, subprocess.CalledProcessError) as error:
            console.print(f"[yellow]no DBOS side: its environment could not be made "
                          f"({error})[/yellow]")
            sides.remove("dbos")
            if not sides:
                return
    counts = [int(n) for n in args.coordinators.split(",")]
    plan = ([(1, args.latency_tasks, 1)] if args.latency_tasks else []) + [
        (n, args.tasks, args.window) for n in counts]
    runs = []
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp, Progress(console=console) as progress:
        for _ in range(args.rounds):
            for n, tasks, window in plan:
                for side in sides:
                    if side == "meshpoint":
                        runs.append(run_mesh(n, tasks, window, Path(tmp), progress))
                    else:
                        runs.append(run_dbos(n, tasks, window, Path(tmp), args.dbos_poll_s,
                                             progress))
    ceiling: dict[int, float] = {}
    if args.pgbench_seconds and "meshpoint" in sides:
        console.print("pgbench ceiling ...")
        ceiling = pgbench_ceiling(sorted({1, *counts}), args.pgbench_seconds, rows=300_000)
    mesh = [r for r in runs if r["side"] == "meshpoint"]
    if mesh:
        console.print(mesh_table(mesh, ceiling))
    if len(sides) == 2:
        console.print(versus_table(runs))
    for run in (r for r in runs if r["side"] == "dbos"):
        console.print(f"DBOS, {run['coordinators']} worker(s), {run['window']} in flight: "
                      f"{run['tasks_per_s']:.1f} tasks/s, {run['cpu_ms_per_task']:.1f} ms "
                      f"CPU/task, p50/p99 {pair([run], 'end_to_end_ms')} ms")
    write_results("scaleout", "full", {**vars(args), "dbos": DBOS_VERSION,
                                       "postgres": psql("SHOW server_version")},
                  {"runs": runs, "pgbench_tps": ceiling}, started, console)
    if any(run["failed"] or run["clean_exits"] != run["processes"] for run in runs):
        console.print("[red]some tasks failed or a process did not exit cleanly[/red]")
        sys.exit(2)


if __name__ == "__main__":
    main()
