"""Where the checkpoint history's cost goes on the pause path (issue 15 §6).

    python benchmarks/bench_history.py --mode quick     # part of `make bench`
    python benchmarks/bench_history.py --mode full

``bench_compare`` times a pause write with the history on and off beside
LangGraph's ``put``; this says what the difference is made of, for the same first
checkpoint (20 messages of ~500 B, 3 sub-tasks):

1. **Python**: ``plan_checkpoint`` (the context copied and checked, the join, and
   with the history its record: the document, its RFC 8785 form and hash, the
   snapshot), on and off, interleaved, each on a context built outside the timing.
2. **SQLite**: WAL frames a first checkpoint writes (each a 4 KiB page: a commit's
   I/O), on and off, counted from an emptied log.
3. **PostgreSQL**: WAL bytes a first checkpoint writes, and the one-statement write
   (``pg_first_checkpoint``) inside the server: EXPLAIN ANALYZE's execution time,
   and of it the insert of the history record. Run as the tables' owner (EXPLAIN
   of the statement itself; row-level security adds no measurable cost to it).

A table goes to the terminal, the figures to
``benchmarks/results/<date>-<mode>-history.json``. PostgreSQL is skipped, with a
message, when it is down.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import re
import sqlite3
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import Progress

from meshpoint import open_store
from meshpoint.history import DISABLED, HistoryOptions
from meshpoint.store import SqlStore
from meshpoint.store.checkpoints import plan_checkpoint
from meshpoint.store.postgres import FIRST_CHECKPOINT, _children_as_text

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_compare import PG_DSN, POSTGRES_URL, meshpoint_context, postgres_up
from bench_store import percentiles

RESULTS = Path(__file__).parent / "results"
MODES = {"quick": {"plans": 3000, "writes": 300, "explains": 300},
         "full": {"plans": 20_000, "writes": 1000, "explains": 1000}}
SIDES = {"on": HistoryOptions(), "off": DISABLED}
console = Console(width=150)


def plan(history: HistoryOptions, task_id: str | None = None) -> Any:
    """Plan a first checkpoint of the benchmark's pause, as ``checkpoint_task`` does."""
    return plan_checkpoint(
        meshpoint_context(task_id or uuid.uuid4().hex), "bench", keys={"p_tenant": "default"},
        status="waiting_peers", default_timeout_s=600.0, expires_at=None, lease_owner=None,
        holder=None, hold_lease_s=30.0, now=time.time(), history=history,
        compress_threshold=16_384)


# -- 1. Python ------------------------------------------------------------------------------

def python_planning(runs: int, progress: Progress) -> dict[str, Any]:
    job = progress.add_task("Python: planning a first checkpoint", total=runs)
    samples: dict[str, list[float]] = {side: [] for side in SIDES}
    order = list(SIDES)
    for n in range(runs):
        for side in order[n % 2:] + order[:n % 2]:
            ctx = meshpoint_context(f"plan-{n}")
            start = time.perf_counter()
            plan_checkpoint(ctx, "bench", keys={"p_tenant": "default"},
                            status="waiting_peers", default_timeout_s=600.0, expires_at=None,
                            lease_owner=None, holder=None, hold_lease_s=30.0, now=time.time(),
                            history=SIDES[side], compress_threshold=16_384)
            samples[side].append((time.perf_counter() - start) * 1e6)  # µs
        progress.advance(job)
    progress.remove_task(job)
    return {side: percentiles(values) for side, values in samples.items()}


# -- 2. SQLite ------------------------------------------------------------------------------

def _empty_log(conn: sqlite3.Connection) -> None:
    """Copy the log into the database and cut it to nothing (again while the store's
    checkpointer thread, passing by, keeps it busy)."""
    for _ in range(100):
        busy, log, _copied = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
        if not busy and log == 0:
            return
        time.sleep(0.01)
    raise RuntimeError("the SQLite log could not be emptied")


def _log_frames(conn: sqlite3.Connection) -> int:
    """The frames in the log (asked again while another checkpoint holds it)."""
    for _ in range(100):
        busy, log, _copied = conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
        if not busy and log >= 0:
            return int(log)
        time.sleep(0.01)
    raise RuntimeError("the SQLite log could not be read")


async def sqlite_frames(tmp: Path, writes: int, progress: Progress) -> dict[str, float]:
    """WAL frames per first checkpoint, in batches of 100 written into an emptied log
    (the store's checkpointer starts the log over only past 4,096 frames), the sides
    taking turns so that both write into a database of the same size."""
    path = tmp / "frames.db"
    job = progress.add_task("SQLite: WAL frames", total=2 * writes)
    frames = dict.fromkeys(SIDES, 0)
    async with open_store(f"sqlite:///{path}") as store:
        counter = sqlite3.connect(path)
        try:
            order = list(SIDES)
            for batch in range(writes // 100):
                for side in order[batch % 2:] + order[:batch % 2]:
                    writer = store.with_history(SIDES[side])
                    _empty_log(counter)
                    for _ in range(100):
                        await writer.checkpoint_task(meshpoint_context(uuid.uuid4().hex),
                                                     "bench")
                    frames[side] += _log_frames(counter)
                    progress.advance(job, 100)
        finally:
            counter.close()
    progress.remove_task(job)
    return {side: round(count / (writes // 100 * 100), 2) for side, count in frames.items()}


# -- 3. PostgreSQL --------------------------------------------------------------------------

def _lsn(conn: Any) -> str:
    return str(conn.execute("SELECT pg_current_wal_insert_lsn()").fetchone()[0])


async def postgres(writes: int, explains: int, progress: Progress) -> dict[str, Any]:
    import psycopg

    schema = f"mp_bench_history_{uuid.uuid4().hex[:6]}"
    out: dict[str, Any] = {"wal_bytes": {}, "execution_ms": {}, "record_insert_ms": {}}
    with psycopg.connect(PG_DSN, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
        try:
            async with open_store(POSTGRES_URL, schema=schema) as store:
                job = progress.add_task("PostgreSQL: WAL bytes", total=2 * writes)
                for side, options in SIDES.items():
                    writer = store.with_history(options)
                    await writer.checkpoint_task(meshpoint_context(uuid.uuid4().hex), "bench")
                    start = _lsn(conn)
                    for _ in range(writes):
                        await writer.checkpoint_task(meshpoint_context(uuid.uuid4().hex),
                                                     "bench")
                        progress.advance(job)
                    size = conn.execute("SELECT pg_wal_lsn_diff(%s, %s)",
                                        (_lsn(conn), start)).fetchone()[0]
                    out["wal_bytes"][side] = round(float(size) / writes)
                progress.remove_task(job)
                out.update(await _explained(store, schema, explains, progress))
        finally:
            conn.execute(f"DROP SCHEMA {schema} CASCADE")
    return out


async def _explained(store: SqlStore, schema: str, runs: int,
                     progress: Progress) -> dict[str, Any]:
    """EXPLAIN ANALYZE of the one-statement first checkpoint, on and off, interleaved:
    its execution time, and the history record's insert (its node's total time)."""
    import asyncpg

    dialect = store._db.engine.dialect  # the statement as the store compiles it
    conn = await asyncpg.connect(PG_DSN, server_settings={"search_path": schema})
    job = progress.add_task("PostgreSQL: EXPLAIN ANALYZE", total=2 * runs)
    execution: dict[str, list[float]] = {side: [] for side in SIDES}
    record: list[float] = []
    node = re.compile(r"Insert on agent_checkpoints .*?actual time=[\d.]+\.\.([\d.]+)")
    try:
        order = list(SIDES)
        for n in range(runs):
            for side in order[n % 2:] + order[:n % 2]:
                params = plan(SIDES[side]).params
                statement = FIRST_CHECKPOINT[params["p_history"]]
                compiled = statement.compiled(dialect)
                args = statement.bind(compiled, _children_as_text(params))
                text = "\n".join(row[0] for row in await conn.fetch(
                    "EXPLAIN (ANALYZE) " + compiled.sql, *args))
                found = re.search(r"Execution Time: ([\d.]+)", text)
                assert found is not None, text
                execution[side].append(float(found.group(1)))
                if side == "on":
                    inserted = node.search(text)
                    assert inserted is not None, text
                    record.append(float(inserted.group(1)))
                progress.advance(job)
    finally:
        await conn.close()
        progress.remove_task(job)
    return {"execution_ms": {side: percentiles(v) for side, v in execution.items()},
            "record_insert_ms": percentiles(record)}


# -- the table --------------------------------------------------------------------------------

def table(results: dict[str, Any]) -> str:
    lines = ["| measure | history on | history off | the history's part |", "|---|---|---|---|"]
    py = results["python_us"]
    lines.append(f"| Python: planning a first checkpoint, p50 / p99 µs | "
                 f"{py['on']['p50']:.0f} / {py['on']['p99']:.0f} | "
                 f"{py['off']['p50']:.0f} / {py['off']['p99']:.0f} | "
                 f"+{py['on']['p50'] - py['off']['p50']:.0f} µs at p50 |")
    frames = results["sqlite_wal_frames"]
    lines.append(f"| SQLite: WAL frames (4 KiB pages) per first checkpoint | {frames['on']} | "
                 f"{frames['off']} | +{frames['on'] - frames['off']:.1f} |")
    pg = results.get("postgres") or {}
    if "skipped" in pg or not pg:
        lines.append(f"| PostgreSQL | skipped: {pg.get('skipped', 'not run')} | | |")
        return "\n".join(lines)
    wal = pg["wal_bytes"]
    lines.append(f"| PostgreSQL: WAL bytes per first checkpoint | {wal['on']:,} | "
                 f"{wal['off']:,} | +{wal['on'] - wal['off']:,} |")
    ex = pg["execution_ms"]
    lines.append(f"| PostgreSQL: the statement inside the server (EXPLAIN ANALYZE), p50 / p99 "
                 f"ms | {ex['on']['p50']:.3f} / {ex['on']['p99']:.3f} | "
                 f"{ex['off']['p50']:.3f} / {ex['off']['p99']:.3f} | "
                 f"+{ex['on']['p50'] - ex['off']['p50']:.3f} ms at p50 |")
    rec = pg["record_insert_ms"]
    lines.append(f"| PostgreSQL: of it, the record's insert, p50 / p99 ms | "
                 f"{rec['p50']:.3f} / {rec['p99']:.3f} | | |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mode", choices=sorted(MODES), default="quick")
    args = parser.parse_args()
    mode = MODES[args.mode]
    started = time.perf_counter()
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp, Progress(console=console) as progress:
        results["python_us"] = python_planning(mode["plans"], progress)
        results["sqlite_wal_frames"] = asyncio.run(
            sqlite_frames(Path(tmp), mode["writes"], progress))
        missing = postgres_up()
        if missing:
            console.print(f"[yellow]skipping PostgreSQL: {missing}; start it with "
                          f"`make services`[/yellow]")
            results["postgres"] = {"skipped": missing}
        else:
            results["postgres"] = asyncio.run(
                postgres(mode["writes"], mode["explains"], progress))
    console.print(table(results), markup=False)
    stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H%M%SZ")
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"{stamp}-{args.mode}-history.json"
    out.write_text(json.dumps({
        "when": stamp, "mode": args.mode, "settings": mode, "cores": os.cpu_count(),
        "python": platform.python_version(), "sqlite": sqlite3.sqlite_version,
        "seconds": round(time.perf_counter() - started), "results": results}, indent=2))
    console.print(f"written to {out} ({time.perf_counter() - started:.0f} s)")


if __name__ == "__main__":
    main()
