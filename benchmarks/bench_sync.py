"""Local-to-cloud sync beside a plain batched insert of the same rows, in one run.

    python benchmarks/bench_sync.py --mode quick     # part of `make bench`
    python benchmarks/bench_sync.py --mode full

A local SQLite store is filled by the embedded runtime (tasks of a coordinator and two
peers, the history hash-chained, every agent's event log on). Then, into two fresh
PostgreSQL schemas, as the tenant (under row-level security):

* **sync** pushes it with :class:`meshpoint.sync.push.Syncer` (batches of 500: each
  read from SQLite in one snapshot, applied in one transaction with its cursor, every
  chain read back and verified before it stays);
* **insert** inserts the same rows (records, heads, events, ended tasks), read from
  the same file, with one ``executemany`` per table and batch of 500, in one
  transaction per batch: what a copy costs with no cursor, comparison or verification.

Both count the source rows that travel (records, events, ended tasks) per second of
wall time, reading included. A table goes to the terminal, the figures to
``benchmarks/results/<date>-<mode>-sync.json`` (docs/sync.md, *Throughput*).
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
from sqlalchemy import insert, select

from _results import write_results
from meshpoint import a2a
from meshpoint.embedded import embedded
from meshpoint.store import open_store
from meshpoint.store.schema import checkpoint_heads, checkpoints, ended_tasks, events
from meshpoint.sync.push import Syncer

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_compare import PG_DSN, POSTGRES_URL, postgres_up

MODES = {"quick": {"tasks": 200}, "full": {"tasks": 2000}}
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
    write_results("sync", args.mode, MODES[args.mode], results, started, console)
    return 0


if __name__ == "__main__":
    sys.exit(main())
