"""With the history off: the PostgreSQL fast paths' no-history statements beside
their history statements with the history's part guarded off, in one run.

    python benchmarks/bench_guards.py --mode quick     # part of `make bench`
    python benchmarks/bench_guards.py --mode full

Each fast path that touches the history (``pg_first_checkpoint``, ``pg_recheckpoint``,
``pg_restore``) is built by one function in ``store/postgres.py`` and rendered twice,
with and without the history's part (``FIRST_CHECKPOINT``, ``RECHECKPOINT``,
``RESTORE``, keyed by ``p_history``). The alternative is one statement each whose
history part runs only ``WHERE :p_history`` (the writes' record CTEs already do).
This times the two on a store that keeps no history (``history=DISABLED``), fast
paths on, with :func:`bench_hooks.pause_path`'s harness (interleaved, in
alternating order), where

* **on** runs the one guarded statement with ``p_history`` false (for the restore,
  ``pg_restore_no_history`` with the history's two columns added, each read only
  ``WHERE :p_history``);
* **off** runs the separate no-history statement (what the store runs);
* ``resolve_one`` has one statement either way: the run's noise.

A table goes to the terminal, the figures to
``benchmarks/results/<date>-<mode>-guards.json`` (docs/benchmarks.md, "The history's
part of a fast path").
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import Progress
from sqlalchemy import JSON, func, select, type_coerce

from _results import write_results
from meshpoint import open_store
from meshpoint.history.planning import DISABLED
from meshpoint.store import history_queries as hq
from meshpoint.store.hooks import PORTABLE, Portable
from meshpoint.store.postgres import (
    FIRST_CHECKPOINT,
    RECHECKPOINT,
    RESTORE,
    PostgresFastPaths,
)
from meshpoint.store.postgres_queries import ONLY
from meshpoint.store.rows import EventRow, InvocationRow, RestoreRows, SubTaskRow, TaskRow
from meshpoint.store.statement import Statement

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_compare import PG_DSN, POSTGRES_URL, postgres_up
from bench_hooks import pause_path

MODES = {"quick": {"runs": 1000}, "full": {"runs": 5000}}
console = Console(width=150)


def _guarded_restore() -> Statement:
    """pg_restore_no_history and the history's head and record, each read only
    ``WHERE :p_history``: pg_restore as one guarded statement."""
    task = RESTORE[False].clause.subquery("restored")
    head = select(func.json_build_array(*hq.HEAD_COLUMNS)).where(hq.has_record, hq.HEAD_KEY)
    latest = select(func.json_build_array(*hq.RECORD_COLUMNS)).where(
        hq.has_record, hq.OF_TASK,
        hq.C.c.seq == select(hq.H.c.records).where(hq.HEAD_KEY).scalar_subquery())
    return Statement(
        "bench_guarded_restore", "pg_restore with its history part under p_history.",
        select(*task.c, type_coerce(head.scalar_subquery(), JSON).label("head_row"),
               type_coerce(latest.scalar_subquery(), JSON).label("latest_row")),
        dialects=ONLY)


GUARDED_RESTORE = _guarded_restore()


class Guarded(PostgresFastPaths):
    """PostgreSQL's fast paths, each running the history's statement whatever
    ``p_history`` says."""

    async def first_checkpoint(self, params: dict[str, Any]) -> int | Portable:
        rows = await self._unless_head_moved(FIRST_CHECKPOINT[True], params)
        return 1 if rows is not PORTABLE and rows[0][0] else PORTABLE

    async def recheckpoint(self, params: dict[str, Any]) -> int | Portable:
        rows = await self._unless_head_moved(RECHECKPOINT[True], params)
        return PORTABLE if rows is PORTABLE or not rows else int(rows[0].version)

    async def restore(self, params: dict[str, Any]) -> RestoreRows:
        rows = await self._fetch(GUARDED_RESTORE, params)
        if not rows:
            return RestoreRows(None, [], [], [])
        row = rows[0]
        assert row.head_row is None and row.latest_row is None, "the guard held"
        return RestoreRows(TaskRow(*row[:len(TaskRow._fields)]),
                           [EventRow(*r) for r in row.event_rows],
                           [InvocationRow(*r) for r in row.invocation_rows],
                           [SubTaskRow(*r) for r in row.sub_task_rows])


async def run(mode: dict[str, int], progress: Progress) -> dict[str, Any]:
    import psycopg

    schema = f"bench_guards_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(PG_DSN, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    try:
        stores = {side: await open_store(POSTGRES_URL, schema=schema, history=DISABLED)
                  for side in ("on", "off")}
        guarded = stores["on"]
        guarded._fast = Guarded(guarded._db)  # type: ignore[attr-defined]
        try:
            out = await pause_path(stores, mode["runs"], progress)
        finally:
            for store in stores.values():
                await store.close()
    finally:
        with psycopg.connect(PG_DSN, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
    return out


def table(results: dict[str, Any]) -> str:
    def pair(d: dict[str, float]) -> str:
        return f"{d['p50']:.2f} / {d['p99']:.2f}"

    lines = ["| operation, history off | guarded: p50 / p99 ms | separate: p50 / p99 ms "
             "| guarded / separate (p50, p99) |", "|---|---|---|---|"]
    for hook, r in results.items():
        lines.append(f"| {hook} | {pair(r['on'])} | {pair(r['off'])} | "
                     f"{r['ratio_p50']:.2f}, {r['ratio_p99']:.2f} |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mode", choices=sorted(MODES), default="quick")
    args = parser.parse_args()
    missing = postgres_up()
    if missing:
        console.print(f"[yellow]skipping: {missing}; start it with `make services`[/yellow]")
        return 0
    started = time.perf_counter()
    with Progress(console=console) as progress:
        results = asyncio.run(run(MODES[args.mode], progress))
    console.print(table(results), markup=False)
    write_results("guards", args.mode, MODES[args.mode], results, started, console)
    return 0


if __name__ == "__main__":
    sys.exit(main())
