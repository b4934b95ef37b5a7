"""Local-to-cloud sync beside a plain batched insert of the same rows, in one run.

    python benchmarks/bench_sync.py --mode quick     # part of `make bench`
    python benchmarks/bench_sync.py --mode full

A local SQLite store is filled by the embedded runtime (tasks of a coordinator and two
peers, the history hash-chained, every agent's event log on). Then, into two fresh
PostgreSQL schemas, as the tenant (under row-level security):

* **sync** pushes it with :class:`meshpoint.sync.push.Syncer` (batches of 500: each
  read from SQLite in one snapshot, applied in one transaction with its cursor, every
  chain verified before it stays: docs/sync.md, *How a batch is applied*);
* **insert** inserts the same rows (records, heads, events, ended tasks), read from
  the same file, with one ``executemany`` per table and batch of 500, in one
  transaction per batch: what a copy costs with no cursor, comparison or verification.

Both count the source rows that travel (records, events, ended tasks) per second of
wall time, reading included.

Then the **lag** of ``meshpoint sync --follow`` (its defaults, as a user runs it) at the
demo's write rate: ``meshpoint demo`` writes its SQLite file at its natural rate while
the follower, a process of its own, pushes it to a third schema. This process polls
both sides every 10 ms (the local file read-only, the cloud as the superuser): a row's
lag is the time from the first poll that sees it in the file to the first that sees it
in the cloud, so each figure is within a poll of the truth. Rows the file held before
the follower's first pass are not counted (they waited for it to start).

A table goes to the terminal, the figures to
``benchmarks/results/<date>-<mode>-sync.json`` (docs/sync.md, *Throughput*).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sqlite3
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from rich.console import Console
from sqlalchemy import insert, select

from _results import write_results
from meshpoint import a2a
from meshpoint.embedded import embedded
from meshpoint.store import open_store
from meshpoint.store.schema import checkpoint_heads, checkpoints, ended_tasks, events
from meshpoint.sync.push import Syncer

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_compare import PG_DSN, POSTGRES_URL, postgres_up

MODES = {"quick": {"tasks": 200, "demo_tasks": 200}, "full": {"tasks": 2000, "demo_tasks": 1000}}
ROOT = Path(__file__).resolve().parents[1]
#: The tables whose rows' lag is measured, and their keys.
LAGGED = {"agent_checkpoints": "checkpoint_id", "agent_events": "event_id",
          "agent_ended_tasks": "logical_task_id"}
POLL_S = 0.01
BATCH = 500
TENANT = "bench"
console = Console(width=150)
CONFIG = """\
store: {{url: "sqlite:///{db}", tenant: bench}}
broker: memory://
agents:
  coordinator:
    peers: [{{agent: flights, timeout_s: 30}}, {{agent: hotels, timeout_s: 30}}]
    events: true
  flights: {{events: true}}
  hotels: {{events: true}}
"""


async def fill(where: Path, tasks: int) -> Path:
    """A local store that ran ``tasks`` tasks; returns its file."""
    db = where / "local.db"
    config = where / "local.yaml"
    config.write_text(CONFIG.format(db=db))
    async with embedded(config) as client:
        for n in range(tasks):
            task = await client.ask("coordinator", f"Trip {n}: flights, hotels",
                                    timeout_s=60)
            assert task.status.state is a2a.TaskState.COMPLETED
    return db


async def timed_sync(db: Path, schema: str) -> tuple[float, int]:
    async with open_store(f"sqlite:///{db}", tenant_id=TENANT, migrate=False) as local, \
            open_store(POSTGRES_URL, schema=schema, tenant_id=TENANT) as cloud:
        started = time.perf_counter()
        _, reports = await Syncer(local, cloud, batch=BATCH).run()
        elapsed = time.perf_counter() - started
    assert not any(r.conflicts or r.quarantined for r in reports)
    return elapsed, sum(r.applied for r in reports)


async def timed_insert(db: Path, schema: str) -> tuple[float, int]:
    async with open_store(f"sqlite:///{db}", tenant_id=TENANT, migrate=False) as local, \
            open_store(POSTGRES_URL, schema=schema, tenant_id=TENANT) as cloud:
        started = time.perf_counter()
        travelled = 0
        for table in (checkpoints, checkpoint_heads, events, ended_tasks):
            offset = 0
            while True:
                def read(conn: Any, t: Any = table, at: int = offset) -> list[dict[str, Any]]:
                    return [r._asdict() for r in conn.execute(
                        select(t).where(t.c.tenant_id == TENANT).order_by(
                            *t.primary_key.columns).limit(BATCH).offset(at))]

                rows = await local.transaction(read)
                if not rows:
                    break
                await cloud.transaction(lambda conn, t=table, r=rows: conn.execute(
                    insert(t), r), write=True)
                offset += len(rows)
                if table is not checkpoint_heads:
                    travelled += len(rows)
        elapsed = time.perf_counter() - started
    return elapsed, travelled


async def run(mode: dict[str, int]) -> dict[str, Any]:
    import psycopg

    schemas = {side: f"bench_sync_{side}_{uuid.uuid4().hex[:8]}" for side in ("sync", "insert")}
    with psycopg.connect(PG_DSN, autocommit=True) as conn:
        for schema in schemas.values():
            conn.execute(f"CREATE SCHEMA {schema}")
    try:
        with tempfile.TemporaryDirectory() as where:
            console.print(f"running {mode['tasks']} tasks on a local store ...")
            db = await fill(Path(where), mode["tasks"])
            for schema in schemas.values():  # migrated before the clock starts
                await (await open_store(POSTGRES_URL, schema=schema, tenant_id=TENANT)).close()
            # The plain insert first, so the sync does not start on a warmer server.
            insert_s, inserted = await timed_insert(db, schemas["insert"])
            sync_s, synced = await timed_sync(db, schemas["sync"])
    finally:
        with psycopg.connect(PG_DSN, autocommit=True) as conn:
            for schema in schemas.values():
                conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
    assert synced == inserted, (synced, inserted)
    return {"rows": synced, "sync_s": round(sync_s, 3), "insert_s": round(insert_s, 3),
            "sync_rows_per_s": round(synced / sync_s),
            "insert_rows_per_s": round(inserted / insert_s),
            "sync_time_over_insert_time": round(sync_s / insert_s, 2)}


def measure_lag(tasks: int) -> dict[str, Any]:
    """The follower's lag at the demo's write rate (see the module docstring)."""
    import psycopg

    schema = f"bench_sync_follow_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(PG_DSN, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    asyncio.run(_migrate(schema))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    processes: list[subprocess.Popen[str]] = []
    try:
        with tempfile.TemporaryDirectory() as where:
            db = Path(where) / "demo.db"
            demo = subprocess.Popen(
                [sys.executable, "-m", "meshpoint.cli", "demo", "--tasks", str(tasks),
                 "--db", str(db), "--json"], cwd=where, env=env, text=True,
                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
            processes.append(demo)
            local = _wait_for_schema(db)
            passes = Path(where) / "passes.jsonl"  # a file: a pipe not read would fill
            with passes.open("w") as out:
                follower = subprocess.Popen(
                    [sys.executable, "-m", "meshpoint.cli", "sync", "--from",
                     f"sqlite:///{db}", "--to", POSTGRES_URL, "--schema", schema,
                     "--tenant", "default", "--follow", "--json"], cwd=where, env=env,
                    text=True, stdout=out, stderr=subprocess.DEVNULL)
            processes.append(follower)
            while not passes.read_text().startswith("{"):  # its first pass is done
                assert follower.poll() is None, "the follower ended"
                time.sleep(0.01)
            with psycopg.connect(PG_DSN, autocommit=True) as cloud:
                seen = _poll(local, cloud, schema, demo)
            figures = json.loads(demo.communicate()[0])
    finally:
        for process in processes:
            if process.poll() is None:
                process.terminate()
            process.wait(timeout=60)
        with psycopg.connect(PG_DSN, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
    lags = sorted(cloud_at - local_at for local_at, cloud_at in seen.values())
    span = max(t for t, _ in seen.values()) - min(t for t, _ in seen.values())
    return {"demo_tasks": tasks, "demo_completed": figures["completed"],
            "rows_timed": len(lags), "write_rate_rows_per_s": round(len(lags) / span),
            "lag_p50_s": round(_quantile(lags, 0.50), 3),
            "lag_p99_s": round(_quantile(lags, 0.99), 3), "lag_max_s": round(lags[-1], 3),
            "poll_s": POLL_S}


async def _migrate(schema: str) -> None:
    await (await open_store(POSTGRES_URL, schema=schema, tenant_id="default")).close()


def _wait_for_schema(db: Path) -> sqlite3.Connection:
    """A read-only connection to the demo's file, once it holds the tables polled."""
    deadline = time.monotonic() + 120
    while True:
        try:
            conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
            names = {r[0] for r in conn.execute("SELECT name FROM sqlite_master")}
            if set(LAGGED) <= names and "meshpoint_sync_sources" in names:
                return conn
            conn.close()
        except sqlite3.OperationalError:
            pass
        assert time.monotonic() < deadline, "the demo did not create its database"
        time.sleep(0.05)


def _poll(local: sqlite3.Connection, cloud: Any, schema: str,
          demo: subprocess.Popen[str]) -> dict[tuple[str, str], tuple[float, float]]:
    """Each new row's first sight in the file and in the cloud, until the demo ended
    and the cloud holds every row the file does."""
    after = {t: local.execute(f"SELECT coalesce(max(rowid), 0) FROM {t}").fetchone()[0]
             for t in LAGGED}
    pending: dict[tuple[str, str], float] = {}
    seen: dict[tuple[str, str], tuple[float, float]] = {}
    deadline = None
    while True:
        now = time.perf_counter()
        for table, key in LAGGED.items():
            for rowid, value in local.execute(
                    f"SELECT rowid, {key} FROM {table} WHERE rowid > ? ORDER BY rowid",
                    (after[table],)):
                pending[(table, value)] = now
                after[table] = rowid
        local.commit()  # ends the read transaction: the next poll sees new commits
        for table, key in LAGGED.items():
            ids = [v for t, v in pending if t == table]
            if not ids:
                continue
            landed = cloud.execute(f"SELECT {key} FROM {schema}.{table} WHERE {key} = ANY(%s)",
                                   (ids,)).fetchall()
            at = time.perf_counter()
            for (value,) in landed:
                seen[(table, value)] = (pending.pop((table, value)), at)
        if demo.poll() is not None:
            deadline = deadline or time.monotonic() + 120
            if not pending:
                return seen
            assert time.monotonic() < deadline, f"{len(pending)} row(s) never arrived"
        time.sleep(max(0.0, POLL_S - (time.perf_counter() - now)))


def _quantile(values: list[float], q: float) -> float:
    return values[min(len(values) - 1, int(q * len(values)))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mode", choices=sorted(MODES), default="quick")
    args = parser.parse_args()
    missing = postgres_up()
    if missing:
        console.print(f"[yellow]skipping: {missing}; start it with `make services`[/yellow]")
        return 0
    started = time.perf_counter()
    results = asyncio.run(run(MODES[args.mode]))
    console.print(f"| rows | sync rows/s | plain insert rows/s | sync time / insert time |\n"
                  f"|---|---|---|---|\n| {results['rows']} | {results['sync_rows_per_s']} | "
                  f"{results['insert_rows_per_s']} | {results['sync_time_over_insert_time']} |",
                  markup=False)
    console.print(f"following `meshpoint demo --tasks {MODES[args.mode]['demo_tasks']}` ...")
    lag = measure_lag(MODES[args.mode]["demo_tasks"])
    results["follow"] = lag
    console.print(f"| demo write rate, rows/s | rows timed | lag p50 s | lag p99 s | "
                  f"lag max s |\n|---|---|---|---|---|\n| {lag['write_rate_rows_per_s']} | "
                  f"{lag['rows_timed']} | {lag['lag_p50_s']} | {lag['lag_p99_s']} | "
                  f"{lag['lag_max_s']} |", markup=False)
    write_results("sync", args.mode, MODES[args.mode], results, started, console)
    return 0


if __name__ == "__main__":
    sys.exit(main())
