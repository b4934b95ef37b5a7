"""meshpoint's LangGraph saver beside LangGraph's own savers, in one run on one machine.

    python benchmarks/bench_saver.py --mode quick      # a minute or two
    python benchmarks/bench_saver.py --mode full       # more threads per side

For SQLite (a file, WAL, synchronous=NORMAL on both sides) and PostgreSQL, a thread
of 500 steps on each side: at every step the ``messages`` channel gains one message
(a LangChain message of about 500 bytes, alternately human and AI, as
``add_messages`` grows a conversation), and a ``step`` channel changes. Each side
``put``s the checkpoint (the new versions of both channels) and reads the thread's
latest checkpoint back with ``get_tuple``, as a graph does between steps. The two
sides run interleaved, step by step, each going first every other step, so that both
see the same machine weather. meshpoint's saver is awaited (``aput``/``aget_tuple``,
on the loop its store runs on); ``SqliteSaver``/``PostgresSaver`` are called
(``put``/``get_tuple``). On PostgreSQL meshpoint connects as a runtime role held by
row-level security, as ``serve`` does. After the last step: each side's tables'
bytes (SQLite: the file, after a WAL checkpoint and VACUUM; PostgreSQL: the schema's
relations with their TOAST and indexes, after VACUUM).

The process's objects from imports are frozen out of the garbage collector first
(``gc.freeze()``), for both sides alike: on this 2-core machine a full collection of
them took 60-120 ms and fell into whichever side's call happened to allocate when it
was due, which alone decided that side's p99. The full collections that still fall
into each side's calls are counted and reported.

Reported: put and get_tuple p50/p99/max, ratio meshpoint / LangGraph, and bytes
(PostgreSQL: the saver's three tables; the rest of meshpoint's empty schema apart).
Targets (issue 16 §4): p99 ratio at most 1 for both, bytes at most 0.1x. A markdown
table goes to the terminal, the figures with the versions compared to
``benchmarks/results/<date>-<mode>-saver.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import platform
import sqlite3
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime
from importlib.metadata import version
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import Progress
from sqlalchemy.engine import make_url

from meshpoint.integrations.langgraph import MeshpointSaver
from meshpoint.store import open_store
from meshpoint.store.postgres_tenancy import grant_runtime_role

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_compare import (
    PG_DSN,
    POSTGRES_URL,
    RESULTS,
    _message,
    pg_bytes,
    postgres_up,
    sqlite_bytes,
)
from bench_store import percentiles

MODES = {"quick": {"threads": 1, "steps": 500}, "full": {"threads": 4, "steps": 500}}
console = Console(width=150)


def conversation(steps: int) -> list[Any]:
    from langchain_core.messages import AIMessage, HumanMessage

    return [(HumanMessage if n % 2 == 0 else AIMessage)(content=_message(n), id=f"m{n}")
            for n in range(steps)]


def checkpoint(step: int, messages: list[Any]) -> tuple[Any, dict[str, Any], dict[str, Any]]:
    """The checkpoint of ``step`` (both channels at version step + 1), its metadata and
    the new versions, as a graph's loop builds them."""
    from langgraph.checkpoint.base import empty_checkpoint
    from langgraph.checkpoint.base.id import uuid6

    cp = empty_checkpoint()
    cp["id"] = str(uuid6(clock_seq=step))
    cp["channel_values"] = {"messages": messages, "step": step}
    versions = {"messages": f"{step + 1:032}.0", "step": f"{step + 1:032}.0"}
    cp["channel_versions"] = versions
    cp["versions_seen"] = {"agent": dict(versions)}
    return cp, {"source": "loop", "step": step, "parents": {}}, dict(versions)


async def grow(ours: MeshpointSaver, theirs: Any, steps: int, threads: int,
               progress: Progress, label: str) -> dict[str, Any]:
    samples: dict[str, list[float]] = {name: [] for name in (
        "meshpoint_put", "langgraph_put", "meshpoint_get_tuple", "langgraph_get_tuple")}
    messages = conversation(steps)
    # The process's 150,000-odd objects from imports moved out of the collector's
    # reach, for both sides alike, as a latency-minded service does (gc.freeze): on
    # this machine a full collection of them took 60-120 ms, landing in whichever
    # side's call allocated when it fell due and deciding its p99 alone. Full
    # collections during each side's calls are still counted and reported.
    gc.collect()
    gc.freeze()
    current = [""]
    full_collections: dict[str, int] = {name: 0 for name in samples}

    def count(phase: str, info: dict[str, Any]) -> None:
        if phase == "start" and info["generation"] == 2 and current[0]:
            full_collections[current[0]] += 1

    gc.callbacks.append(count)
    job = progress.add_task(f"{label}: {threads} x {steps} steps, both sides",
                            total=threads * steps)
    for _ in range(threads):
        thread = uuid.uuid4().hex[:12]
        parents: dict[str, Any] = {
            side: {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}
            for side in ("meshpoint", "langgraph")}
        latest = {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}
        for step in range(steps):
            for side in (("meshpoint", "langgraph") if step % 2 else ("langgraph", "meshpoint")):
                cp, meta, new = checkpoint(step, messages[:step + 1])
                current[0] = f"{side}_put"
                start = time.perf_counter()
                if side == "meshpoint":
                    parents[side] = await ours.aput(parents[side], cp, meta, new)
                else:
                    parents[side] = theirs.put(parents[side], cp, meta, new)
                samples[f"{side}_put"].append((time.perf_counter() - start) * 1000)
                current[0] = f"{side}_get_tuple"
                start = time.perf_counter()
                got = await ours.aget_tuple(latest) if side == "meshpoint" \
                    else theirs.get_tuple(latest)
                samples[f"{side}_get_tuple"].append((time.perf_counter() - start) * 1000)
                current[0] = ""
                assert got is not None and len(got.checkpoint["channel_values"]["messages"]) \
                    == step + 1
            progress.advance(job)
    progress.remove_task(job)
    gc.callbacks.remove(count)
    gc.unfreeze()
    out: dict[str, Any] = {name: percentiles(values) for name, values in samples.items()}
    out["full_collections"] = full_collections
    for what in ("put", "get_tuple"):
        for p in ("p50", "p99"):
            out[f"{what}_ratio_{p}"] = round(
                out[f"meshpoint_{what}"][p] / out[f"langgraph_{what}"][p], 3)
    return out


async def run_sqlite(mode: dict[str, int], tmp: Path, progress: Progress) -> dict[str, Any]:
    from langgraph.checkpoint.sqlite import SqliteSaver

    conn = sqlite3.connect(tmp / "lg.db", check_same_thread=False)
    conn.execute("PRAGMA journal_mode=WAL")  # the same durability as meshpoint's
    conn.execute("PRAGMA synchronous=NORMAL")
    theirs = SqliteSaver(conn)
    theirs.setup()
    async with await MeshpointSaver.open(f"sqlite:///{tmp}/mp.db") as ours:
        out = await grow(ours, theirs, mode["steps"], mode["threads"], progress, "sqlite")
    conn.close()
    out["bytes"] = {"meshpoint": sqlite_bytes(tmp / "mp.db"),
                    "langgraph": sqlite_bytes(tmp / "lg.db")}
    return out


async def run_postgres(mode: dict[str, int], progress: Progress) -> dict[str, Any]:
    import psycopg
    from langgraph.checkpoint.postgres import PostgresSaver

    schemas = {side: f"mp_bench_saver_{side}_{uuid.uuid4().hex[:6]}"
               for side in ("mp", "lg")}
    role = f"mp_bench_app_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(PG_DSN, autocommit=True) as conn:
        for schema in schemas.values():
            conn.execute(f"CREATE SCHEMA {schema}")
    try:
        async with open_store(POSTGRES_URL, schema=schemas["mp"]) as owner:
            await grant_runtime_role(owner, role)
        role_url = make_url(POSTGRES_URL).set(username=role).render_as_string(
            hide_password=False)
        async with await MeshpointSaver.open(role_url, schema=schemas["mp"],
                                             migrate=False) as ours:
            with PostgresSaver.from_conn_string(
                    f"{PG_DSN}?options=-csearch_path%3D{schemas['lg']}") as theirs:
                theirs.setup()
                out = await grow(ours, theirs, mode["steps"], mode["threads"], progress,
                                 "postgres")
        with psycopg.connect(PG_DSN, autocommit=True) as conn:
            conn.execute("VACUUM")
        out["bytes"] = {"meshpoint": saver_bytes(schemas["mp"]),
                        "langgraph": pg_bytes(schemas["lg"]),
                        "meshpoint_schema": pg_bytes(schemas["mp"])}
    finally:
        with psycopg.connect(PG_DSN, autocommit=True) as conn:
            for schema in schemas.values():
                conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
            conn.execute(f"DROP OWNED BY {role}")
            conn.execute(f"DROP ROLE IF EXISTS {role}")
    return out


def saver_bytes(schema: str) -> int:
    """The saver's three tables, with their TOAST and indexes (the rest of meshpoint's
    schema is empty here, and reported apart as ``meshpoint_schema``)."""
    import psycopg

    with psycopg.connect(PG_DSN, autocommit=True) as conn:
        row = conn.execute(
            "SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0) FROM pg_class c "
            "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = %s "
            "AND c.relkind = 'r' AND c.relname LIKE 'agent_langgraph_%%'",
            (schema,)).fetchone()
    return int(row[0]) if row else 0


def table(results: dict[str, Any], steps: int, threads: int) -> str:
    def pair(d: dict[str, float]) -> str:
        return f"{d['p50']:.2f} / {d['p99']:.2f} (max {d['max']:.1f})"

    lines = ["| backend | measure | meshpoint | LangGraph | meshpoint / LangGraph |",
             "|---|---|---|---|---|"]
    for backend, r in results.items():
        if "skipped" in r:
            lines.append(f"| {backend} | skipped: {r['skipped']} | | | |")
            continue
        for what in ("put", "get_tuple"):
            lines.append(
                f"| {backend} | {what} p50 / p99 ms | {pair(r[f'meshpoint_{what}'])} | "
                f"{pair(r[f'langgraph_{what}'])} | p50 {r[f'{what}_ratio_p50']:.2f}, "
                f"p99 {r[f'{what}_ratio_p99']:.2f} |")
        b = r["bytes"]
        lines.append(f"| {backend} | bytes after {threads} x {steps} steps | "
                     f"{b['meshpoint'] / 2**20:.2f} MiB"
                     f" | {b['langgraph'] / 2**20:.2f} MiB | "
                     f"{b['meshpoint'] / b['langgraph']:.3f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mode", choices=sorted(MODES), default="quick")
    parser.add_argument("--backend", choices=["sqlite", "postgres", "both"], default="both")
    args = parser.parse_args()
    mode = MODES[args.mode]
    results: dict[str, Any] = {}
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp, Progress(console=console) as progress:
        if args.backend in ("sqlite", "both"):
            results["sqlite"] = asyncio.run(run_sqlite(mode, Path(tmp), progress))
        if args.backend in ("postgres", "both"):
            missing = postgres_up()
            if missing:
                console.print(f"[yellow]skipping PostgreSQL: {missing}[/yellow]")
                results["postgres"] = {"skipped": missing}
            else:
                results["postgres"] = asyncio.run(run_postgres(mode, progress))
    console.print(table(results, mode["steps"], mode["threads"]), markup=False)
    stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H%M%SZ")
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"{stamp}-{args.mode}-saver.json"
    out.write_text(json.dumps({
        "when": stamp, "mode": args.mode, "settings": mode, "cores": os.cpu_count(),
        "python": platform.python_version(), "seconds": round(time.perf_counter() - started),
        "versions": {p: version(p) for p in (
            "meshpoint", "langgraph", "langgraph-checkpoint", "langgraph-checkpoint-sqlite",
            "langgraph-checkpoint-postgres", "sqlalchemy", "asyncpg", "psycopg")},
        "sqlite": sqlite3.sqlite_version, "results": results}, indent=2))
    console.print(f"written to {out} ({time.perf_counter() - started:.0f} s)")


if __name__ == "__main__":
    sys.exit(main())
