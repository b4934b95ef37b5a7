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
   I/O), on and off, counted from an emptied log with the store's checkpointer
   thread stopped, the sides taking turns in batches of 100.
3. **PostgreSQL**: the one-statement write (``pg_first_checkpoint``) under EXPLAIN
   (ANALYZE, WAL), on and off, interleaved: its execution time inside the server
   (planning excluded), the WAL its inserts wrote, and the history record's insert.
   The record's insert is also timed on a second schema migrated only to 0010 (its
   indexes and compression), to show what 0011 changed. Run on a connection
   of the tables' owner (by default a superuser, which row-level security does not
   hold), with the tenant set.

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
from meshpoint.history.planning import DISABLED, HistoryOptions
from meshpoint.store import SqlStore, open_database
from meshpoint.store.engine import migrate
from meshpoint.store.postgres import FIRST_CHECKPOINT, _children_as_text

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_compare import PG_DSN, POSTGRES_URL, meshpoint_context, plan, postgres_up
from bench_store import percentiles

RESULTS = Path(__file__).parent / "results"
MODES = {"quick": {"plans": 3000, "writes": 300, "explains": 300},
         "full": {"plans": 20_000, "writes": 1000, "explains": 1000}}
SIDES = {"on": HistoryOptions(), "off": DISABLED}
console = Console(width=150)


# -- 1. Python ------------------------------------------------------------------------------

def python_planning(runs: int, progress: Progress) -> dict[str, Any]:
    job = progress.add_task("Python: planning a first checkpoint", total=runs)
    samples: dict[str, list[float]] = {side: [] for side in SIDES}
    order = list(SIDES)
    for n in range(runs):
        for side in order[n % 2:] + order[:n % 2]:
            ctx = meshpoint_context(f"plan-{n}")
            start = time.perf_counter()
            plan(SIDES[side], ctx)
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
    """WAL frames per first checkpoint, in batches of 100 written into an emptied log,
    the sides taking turns so that both write into a database of the same size. The
    store's checkpointer thread is stopped first: a pass of it would let SQLite start
    the log over in the middle of a batch."""
    path = tmp / "frames.db"
    batches = max(1, writes // 100)
    job = progress.add_task("SQLite: WAL frames", total=2 * batches * 100)
    frames = dict.fromkeys(SIDES, 0)
    async with open_store(f"sqlite:///{path}") as store:
        store._db._wal_checkpointer.stop()  # (the store's own, for this measurement)
        counter = sqlite3.connect(path)
        try:
            order = list(SIDES)
            for batch in range(batches):
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
    return {side: round(count / (batches * 100), 2) for side, count in frames.items()}


# -- 3. PostgreSQL --------------------------------------------------------------------------

async def postgres(runs: int, progress: Progress) -> dict[str, Any]:
    """Two schemas of the tables' owner: one at this version's head, one migrated only
    to 0010 (the statement is the same on both: 0011 changed indexes and compression
    only)."""
    import psycopg

    schemas = {name: f"mp_bench_history_{name}_{uuid.uuid4().hex[:6]}"
               for name in ("head", "0010")}
    with psycopg.connect(PG_DSN, autocommit=True) as conn:
        for schema in schemas.values():
            conn.execute(f"CREATE SCHEMA {schema}")
        try:
            async with open_store(POSTGRES_URL, schema=schemas["head"]) as store:
                db = open_database(POSTGRES_URL, busy_timeout_s=5, schema=schemas["0010"],
                                   pool_size=1)
                try:
                    await migrate(db, "0010")
                finally:
                    await db.dispose()
                return await _explained(store, schemas, runs, progress)
        finally:
            for schema in schemas.values():
                conn.execute(f"DROP SCHEMA {schema} CASCADE")


def _wal_bytes(plan: dict[str, Any]) -> int:
    """The WAL the statement's inserts wrote: the sum over its ModifyTable nodes (each
    a CTE of its own, none inside another)."""
    own = int(plan.get("WAL Bytes", 0)) if plan.get("Node Type") == "ModifyTable" else 0
    return own + sum(_wal_bytes(child) for child in plan.get("Plans", ()))


def _node_ms(plan: dict[str, Any], relation: str) -> float | None:
    """The total time of the insert into ``relation``."""
    if plan.get("Node Type") == "ModifyTable" and plan.get("Relation Name") == relation:
        return float(plan["Actual Total Time"])
    for child in plan.get("Plans", ()):
        found = _node_ms(child, relation)
        if found is not None:
            return found
    return None


async def _explained(store: SqlStore, schemas: dict[str, str], runs: int,
                     progress: Progress) -> dict[str, Any]:
    """EXPLAIN (ANALYZE, WAL) of the one-statement first checkpoint, interleaved: on
    and off on the head's schema, on on 0010's."""
    import asyncpg

    dialect = store._db.engine.dialect  # the statement as the store compiles it
    conns = {name: await asyncpg.connect(PG_DSN, server_settings={
        "search_path": schema, "meshpoint.tenant_id": "default"})
        for name, schema in schemas.items()}
    sides = {"on": ("head", SIDES["on"]), "off": ("head", SIDES["off"]),
             "on_0010": ("0010", SIDES["on"])}
    job = progress.add_task("PostgreSQL: EXPLAIN (ANALYZE, WAL)", total=len(sides) * runs)
    execution: dict[str, list[float]] = {side: [] for side in sides}
    wal: dict[str, list[int]] = {side: [] for side in sides}
    record: dict[str, list[float]] = {"on": [], "on_0010": []}
    try:
        order = list(sides)
        for n in range(runs):
            shift = n % len(order)
            for side in order[shift:] + order[:shift]:
                where, history = sides[side]
                params = plan(history).params
                statement = FIRST_CHECKPOINT[params["p_history"]]
                compiled = statement.compiled(dialect)
                args = statement.bind(compiled, _children_as_text(params))
                raw = await conns[where].fetchval(
                    "EXPLAIN (ANALYZE, WAL, FORMAT JSON) " + compiled.sql, *args)
                explained = (json.loads(raw) if isinstance(raw, str) else raw)[0]
                execution[side].append(float(explained["Execution Time"]))
                wal[side].append(_wal_bytes(explained["Plan"]))
                if side in record:
                    inserted = _node_ms(explained["Plan"], "agent_checkpoints")
                    if inserted is None:
                        raise RuntimeError(f"no insert into agent_checkpoints in {raw}")
                    record[side].append(inserted)
                progress.advance(job)
    finally:
        for conn in conns.values():
            await conn.close()
        progress.remove_task(job)
    return {"execution_ms": {side: percentiles(v) for side, v in execution.items()},
            "wal_bytes": {side: round(sum(v) / len(v)) for side, v in wal.items()},
            "record_insert_ms": {side: percentiles(v) for side, v in record.items()}}


# -- the table --------------------------------------------------------------------------------

def _on_off(timings: dict[str, Any], digits: int, unit: str) -> str:
    """The cells of a timed row: on and off as p50 / p99, and the difference at p50."""
    on, off = timings["on"], timings["off"]
    return (f"{on['p50']:.{digits}f} / {on['p99']:.{digits}f} | "
            f"{off['p50']:.{digits}f} / {off['p99']:.{digits}f} | "
            f"+{on['p50'] - off['p50']:.{digits}f} {unit} at p50 |")


def table(results: dict[str, Any]) -> str:
    lines = ["| measure | history on | history off | the history's part |", "|---|---|---|---|"]
    lines.append("| Python: planning a first checkpoint, p50 / p99 µs | "
                 + _on_off(results["python_us"], 0, "µs"))
    frames = results["sqlite_wal_frames"]
    lines.append(f"| SQLite: WAL frames (4 KiB pages) per first checkpoint | {frames['on']} | "
                 f"{frames['off']} | +{frames['on'] - frames['off']:.1f} |")
    pg = results.get("postgres") or {}
    if "skipped" in pg or "failed" in pg:
        why = f"skipped: {pg['skipped']}" if "skipped" in pg else f"**failed**: {pg['failed']}"
        lines.append(f"| PostgreSQL | {why} | | |")
        return "\n".join(lines)
    wal = pg["wal_bytes"]
    lines.append(f"| PostgreSQL: WAL bytes the statement's inserts write | {wal['on']:,} | "
                 f"{wal['off']:,} | +{wal['on'] - wal['off']:,} |")
    ex = pg["execution_ms"]
    lines.append("| PostgreSQL: the statement inside the server (EXPLAIN ANALYZE, planning "
                 "excluded), p50 / p99 ms | " + _on_off(ex, 3, "ms"))
    rec = pg["record_insert_ms"]
    lines.append(f"| PostgreSQL: of it, the record's insert, p50 / p99 ms | "
                 f"{rec['on']['p50']:.3f} / {rec['on']['p99']:.3f} | | |")
    old, old_ex = rec["on_0010"], ex["on_0010"]
    lines.append(f"| PostgreSQL at migration 0010 (GIN jsonb_ops, pglz, the heads' index): "
                 f"the record's insert / the statement, p50 ms | "
                 f"{old['p50']:.3f} / {old_ex['p50']:.3f} | | |")
    return "\n".join(lines)


def main() -> int:
    """Run every part; 1 if the PostgreSQL part failed on a server that is up (after
    printing and writing what the other parts measured), else 0."""
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
            try:
                results["postgres"] = asyncio.run(postgres(mode["explains"], progress))
            except Exception as error:  # keep what was measured; fail the run below
                console.print(f"[red]PostgreSQL part failed: {error!r}[/red]")
                results["postgres"] = {"failed": repr(error)}
    console.print(table(results), markup=False)
    stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H%M%SZ")
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"{stamp}-{args.mode}-history.json"
    out.write_text(json.dumps({
        "when": stamp, "mode": args.mode, "settings": mode, "cores": os.cpu_count(),
        "python": platform.python_version(), "sqlite": sqlite3.sqlite_version,
        "seconds": round(time.perf_counter() - started), "results": results}, indent=2))
    console.print(f"written to {out} ({time.perf_counter() - started:.0f} s)")
    return 1 if "failed" in results["postgres"] else 0


if __name__ == "__main__":
    sys.exit(main())
