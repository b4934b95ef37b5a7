"""The DBOS Transact side of the scale-out benchmark (``bench_scaleout.py --sides dbos``).

The same workload as meshpoint's side: a durable workflow that fans out to three steps
(the peers' trivial work: each returns a string at once) and joins, on the same
PostgreSQL, in a schema of the run's own, ``--window`` workflows in flight. Workers are
DBOS processes dequeuing from one queue; a driver enqueues through ``DBOSClient`` and
polls the outstanding workflows' status in one query per tick.

This module runs in two interpreters. ``bench_scaleout.py`` imports it for
:func:`ensure_env` and :func:`cpu_seconds` (standard library only); the worker and driver
commands run under the Python of a virtual environment of DBOS's own
(``~/.cache/meshpoint/dbos-<version>``, made on first use): DBOS is not a dependency of
meshpoint.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

DBOS_VERSION = "3.4.0"
ENV = Path.home() / ".cache" / "meshpoint" / f"dbos-{DBOS_VERSION}"
READY = "dbos-side: ready"
QUEUE = "trips"
TICKS = os.sysconf("SC_CLK_TCK")


def ensure_env() -> Path:
    """The Python of DBOS's own virtual environment, made (with pip) if missing."""
    python = ENV / "bin" / "python"
    marker = ENV / ".installed"
    if not marker.exists():
        subprocess.run([sys.executable, "-m", "venv", str(ENV)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", f"dbos=={DBOS_VERSION}"],
                       check=True)
        marker.write_text(DBOS_VERSION)
    return python


def cpu_seconds(pids: list[int]) -> float:
    """user + system CPU seconds of these processes (all their threads) so far."""
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except FileNotFoundError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / TICKS


class ServerCpu:
    """user + system CPU seconds of every process named ``name`` (PostgreSQL's server
    and its backends are all ``postgres``) from now on; a backend that starts in
    between counts from its start, one that exits in between is missed (both sides
    keep their pools' connections open)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.before = self.by_pid()

    def by_pid(self) -> dict[int, float]:
        found = {}
        for entry in Path("/proc").iterdir():
            try:
                if entry.name.isdigit() and (entry / "comm").read_text().strip() == self.name:
                    found[int(entry.name)] = cpu_seconds([int(entry.name)])
            except OSError:
                continue
        return found

    def since(self) -> float:
        return sum(cpu - self.before.get(pid, 0.0) for pid, cpu in self.by_pid().items())


def percentile(samples: list[float], pct: float) -> float | None:
    if not samples:
        return None
    ordered = sorted(samples)
    return round(ordered[min(len(ordered) - 1, int(len(ordered) * pct / 100))], 2)


def pg_url(url: str) -> str:
    """DBOS takes a plain postgresql:// URL (it picks psycopg itself)."""
    return url.replace("postgresql+asyncpg://", "postgresql://")


def worker(url: str, schema: str, executor: str, poll_s: float) -> None:
    from dbos import DBOS, DBOSConfig

    @DBOS.step()
    async def peer(name: str, query: str) -> str:
        return f"{name}: {query} done"

    @DBOS.workflow(name="trip")
    async def trip(query: str) -> str:
        answers = await asyncio.gather(*(peer(name, query)
                                         for name in ("flights", "hotels", "weather")))
        return " | ".join(answers)

    config: DBOSConfig = {"name": "meshpoint-bench", "system_database_url": pg_url(url),
                          "dbos_system_schema": schema, "executor_id": executor,
                          "application_version": "bench", "log_level": "WARNING"}
    DBOS(config=config)
    DBOS.launch()
    DBOS.register_queue(QUEUE, polling_interval_sec=poll_s)
    stop = False

    def on_term(*_: Any) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_term)
    print(READY, flush=True)
    while not stop:
        time.sleep(0.1)
    DBOS.destroy()


async def drive(url: str, schema: str, tasks: int, window: int, pids: list[int],
                poll_s: float) -> dict[str, Any]:
    from dbos import DBOSClient, EnqueueOptions

    client = DBOSClient(system_database_url=pg_url(url), dbos_system_schema=schema)
    options: EnqueueOptions = {"queue_name": QUEUE, "workflow_name": "trip",
                               "app_version": "bench"}
    loop = asyncio.get_running_loop()
    waiting: dict[str, asyncio.Future[None]] = {}
    latencies: list[float] = []
    failed = 0
    done_all = False

    async def poller() -> None:
        while not done_all:
            if waiting:
                rows = await asyncio.to_thread(
                    client.list_workflows, workflow_ids=list(waiting),
                    status=["SUCCESS", "ERROR", "CANCELLED"], load_input=False,
                    load_output=False)
                for row in rows:
                    future = waiting.pop(row.workflow_id, None)
                    if future is not None and not future.done():
                        future.set_result(None)
                        nonlocal failed
                        failed += row.status != "SUCCESS"
            await asyncio.sleep(poll_s)

    slots = asyncio.Semaphore(window)

    async def one(n: int) -> None:
        async with slots:
            began = loop.time()
            workflow_id = uuid.uuid4().hex
            future: asyncio.Future[None] = loop.create_future()
            waiting[workflow_id] = future
            await asyncio.to_thread(client.enqueue, {**options, "workflow_id": workflow_id},
                                    f"Trip {n}: flights, hotels, weather")
            await future
            latencies.append((loop.time() - began) * 1000)

    polling = asyncio.create_task(poller())
    cpu_before = cpu_seconds(pids)
    postgres = ServerCpu("postgres")
    started = loop.time()
    await asyncio.gather(*(one(n) for n in range(tasks)))
    seconds = loop.time() - started
    cpu = cpu_seconds(pids) - cpu_before
    postgres_cpu = postgres.since()
    done_all = True
    await polling
    client.destroy()
    return {"seconds": seconds, "failed": failed, "cpu_s": cpu, "postgres_cpu_s": postgres_cpu,
            "end_to_end_ms": {"p50": percentile(latencies, 50),
                              "p99": percentile(latencies, 99)}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=("worker", "drive"))
    parser.add_argument("--url", required=True)
    parser.add_argument("--schema", required=True)
    parser.add_argument("--executor", default="w0")
    parser.add_argument("--poll-s", type=float, default=0.01)
    parser.add_argument("--tasks", type=int, default=100)
    parser.add_argument("--window", type=int, default=64)
    parser.add_argument("--pids", default="")
    args = parser.parse_args()
    if args.command == "worker":
        worker(args.url, args.schema, args.executor, args.poll_s)
    else:
        pids = [int(p) for p in args.pids.split(",") if p]
        figures = asyncio.run(drive(args.url, args.schema, args.tasks, args.window, pids,
                                    args.poll_s))
        print(json.dumps(figures), flush=True)


if __name__ == "__main__":
    main()
