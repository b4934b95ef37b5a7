"""meshpoint's store beside LangGraph's checkpoint savers, in one run on one machine.

    python benchmarks/bench_compare.py --mode quick      # under 3 minutes
    python benchmarks/bench_compare.py --mode full

For SQLite (a file, WAL, synchronous=NORMAL on both sides) and PostgreSQL:

1. **Write and read of one pause.** The payload is a conversation of 20 messages
   of about 500 B and 3 pending sub-tasks. meshpoint writes it with
   ``checkpoint_task`` (with the checkpoint history, the default; without it; with
   it signed; and with the tenant's encryption at rest on, every column carrying
   user content sealed) and reads it with ``restore_task`` (verified against the
   history, the default, and not; and encrypted); LangGraph's ``SqliteSaver`` / ``PostgresSaver``
   with ``put`` (channels ``messages`` and ``sub_tasks``) and ``get_tuple``. Each
   run is a new task / thread. On PostgreSQL meshpoint connects as a runtime role
   held by row-level security, as ``serve`` does. Reported: p50/p99/max and the
   ratio meshpoint / LangGraph, and what encryption adds (encrypted / not, both with
   the history). Also timed in the same turns: the Python part of a write with the
   history on alone (``plan_checkpoint``: the context copied and checked, the join,
   the record's document, its RFC 8785 form, hash and snapshot; no I/O), and with
   encryption on, against the whole of LangGraph's ``put``.
2. **Storage of a growing conversation.** One task, 500 turns; each turn adds one
   message (~500 B) and pauses. meshpoint appends the new event; LangGraph stores a
   new version of the ``messages`` channel. Reported: the tables' size after the
   last turn, on both sides.
3. **At scale.** ``--paused`` tasks paused at once (100,000 in full mode), 1 %% of
   them past their deadline: the sweep that resolves them (per call, 100 rows a
   call), an idle sweep, and restore latency with 100 paused (a database of their
   own) vs with all of them, timed in turns once the load has settled (SQLite's
   log copied into the file; PostgreSQL vacuumed and checkpointed).

A markdown table goes to the terminal; the same figures, with the machine's core
count and the versions compared, to ``benchmarks/results/<date>-<mode>-compare.json``.
PostgreSQL parts are skipped, with a message, when it is down.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import json
import os
import platform
import random
import sqlite3
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from importlib.metadata import version
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import Progress
from sqlalchemy.engine import make_url

from meshpoint import TaskExecutionContext, open_store
from meshpoint.compression import DEFAULT_MAX_DECOMPRESSED_BYTES
from meshpoint.history.encryption import EncryptionKeys
from meshpoint.history.integrity import SigningKeys
from meshpoint.history.planning import DISABLED, HistoryOptions
from meshpoint.store import SqlStore
from meshpoint.store.checkpoints import plan_checkpoint
from meshpoint.store.postgres_tenancy import grant_runtime_role
from meshpoint.store.sealing import Sealer

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_store import percentiles

POSTGRES_URL = os.environ.get("MESHPOINT_BENCH_POSTGRES_URL",
                              "postgresql+asyncpg://postgres@127.0.0.1:5432/test")
PG_DSN = POSTGRES_URL.replace("postgresql+asyncpg://", "postgresql://")
RESULTS = Path(__file__).parent / "results"
# Enough runs that a p99 is not three samples (runs are cheap: under 1 ms a side).
MODES = {
    "quick": {"runs": 2000, "turns": 500, "paused": 10_000},
    "full": {"runs": 10_000, "turns": 500, "paused": 100_000},
}
#: Restores timed at each scale: a p99 of a 0.1 ms operation needs thousands.
RESTORES = 2000
console = Console(width=150)


_WORDS = ("flight hotel weather lisbon porto budget window aisle breakfast museum "
          "tram river sunset rain forecast booking night train coast beach dinner "
          "tickets early late transfer airport luggage quiet view centre walk").split()


@functools.lru_cache(maxsize=1024)
def _message(n: int) -> str:
    rng = random.Random(n)
    words: list[str] = []
    while sum(len(w) + 1 for w in words) < 480:
        words.append(rng.choice(_WORDS))
    return f"message {n}: " + " ".join(words)


def message(n: int) -> dict[str, Any]:
    """A conversation message of about 500 bytes of varied words (compressible about
    as much as prose, unlike a repeated phrase)."""
    return {"role": "user" if n % 2 == 0 else "assistant", "content": _message(n)}


def sub_tasks(prefix: str) -> list[dict[str, Any]]:
    return [{"sub_task_id": f"{prefix}/sub-{n}", "peer_agent_name": f"peer-{n}",
             "function_call_id": f"call-{n}", "timeout_s": 300} for n in range(3)]


def meshpoint_context(task_id: str, messages: int = 20) -> TaskExecutionContext:
    ctx = TaskExecutionContext(task_id, {"reply_to": "gateway"})
    ctx.current_invocation_id = f"{task_id}/inv"
    for n in range(messages):
        ctx.append_session_event(message(n))
    for sub in sub_tasks(task_id):
        ctx.register_peer_sub_task(sub["sub_task_id"], {
            k: v for k, v in sub.items() if k != "sub_task_id"})
    return ctx


def plan(history: HistoryOptions, ctx: TaskExecutionContext | None = None) -> Any:
    """Plan a first checkpoint of the benchmark's pause (of ``ctx``, or of a new task),
    as ``checkpoint_task`` does."""
    return plan_checkpoint(
        ctx or meshpoint_context(uuid.uuid4().hex), "bench", keys={"p_tenant": "default"},
        status="waiting_peers", default_timeout_s=600.0, expires_at=None, lease_owner=None,
        holder=None, hold_lease_s=30.0, now=time.time(), history=history,
        sealer=Sealer("default", history.encryption, history.encrypt_exclude),
        compress_threshold=16_384, max_inflate=DEFAULT_MAX_DECOMPRESSED_BYTES)


#: The tenant's encryption at rest on (a key ring for the stores' tenant).
ENCRYPTED = HistoryOptions(encryption=EncryptionKeys.generate("default"))


# -- LangGraph -------------------------------------------------------------------------

class LangGraphSide:
    """One LangGraph saver, driven as a graph would drive it."""

    def __init__(self, saver: Any) -> None:
        from langgraph.checkpoint.base import empty_checkpoint

        self.saver = saver
        self.empty = empty_checkpoint

    def put(self, thread: str, messages: list[dict[str, Any]], subs: list[dict[str, Any]],
            step: int, parent: dict[str, Any] | None = None) -> dict[str, Any]:
        from langgraph.checkpoint.base import create_checkpoint

        checkpoint = create_checkpoint(self.empty(), None, step)
        checkpoint["channel_values"] = {"messages": messages, "sub_tasks": subs}
        checkpoint["channel_versions"] = {"messages": step + 1, "sub_tasks": step + 1}
        config = parent or {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}
        result: dict[str, Any] = self.saver.put(
            config, checkpoint, {"source": "loop", "step": step, "parents": {}},
            {"messages": step + 1, "sub_tasks": step + 1})
        return result

    def get(self, thread: str) -> Any:
        return self.saver.get_tuple({"configurable": {"thread_id": thread,
                                                      "checkpoint_ns": ""}})


def timed(samples: list[float], call: Callable[[], Any]) -> Any:
    start = time.perf_counter()
    result = call()
    samples.append((time.perf_counter() - start) * 1000)
    return result


async def atimed(samples: list[float], call: Callable[[], Any]) -> Any:
    start = time.perf_counter()
    result = await call()
    samples.append((time.perf_counter() - start) * 1000)
    return result


# -- 1. write and read -------------------------------------------------------------------

async def write_read(store: SqlStore, lg: LangGraphSide, runs: int,
                     progress: Progress, label: str) -> dict[str, Any]:
    """Pause writes on four meshpoint stores of one database, interleaved with
    LangGraph's ``put``: with the checkpoint history (the default), without it, with
    it signed (Ed25519), and with the tenant's encryption at rest on; then reads:
    ``restore_task`` verified against the history (the default), not, and of the
    encrypted tasks, interleaved with ``get_tuple``."""
    prefix = uuid.uuid4().hex[:8]
    sides: dict[str, SqlStore] = {
        "meshpoint_write": store,
        "meshpoint_write_no_history": store.with_history(DISABLED),
        "meshpoint_write_signed": store.with_history(HistoryOptions(
            signing=SigningKeys.generate("bench"))),
        "meshpoint_write_encrypted": store.with_history(ENCRYPTED)}
    job = progress.add_task(f"{label}: write and read, every side", total=11 * runs)
    samples: dict[str, list[float]] = {name: [] for name in (
        *sides, "langgraph_put", "meshpoint_plan", "meshpoint_plan_encrypted",
        "meshpoint_restore", "meshpoint_restore_unverified", "meshpoint_restore_encrypted",
        "langgraph_get_tuple")}
    warm = meshpoint_context(f"{prefix}-warm")
    for name, side in sides.items():
        await side.checkpoint_task(meshpoint_context(f"{prefix}-warm-{name}"), "bench")
    lg.put(f"{prefix}-warm", [message(n) for n in range(20)], sub_tasks("w"), 0)
    # Interleaved, so that every side sees the same machine weather, and in turns
    # going first, so that none always runs right after another's write.
    order = [*sides, "langgraph_put", "meshpoint_plan", "meshpoint_plan_encrypted"]
    plans = {"meshpoint_plan": HistoryOptions(), "meshpoint_plan_encrypted": ENCRYPTED}
    for n in range(runs):
        msgs, subs = [message(i) for i in range(20)], sub_tasks(f"{prefix}-{n}")
        shift = n % len(order)
        for name in order[shift:] + order[:shift]:
            if name in plans:
                ctx = meshpoint_context(f"{prefix}-{n}-{name}")
                timed(samples[name], lambda ctx=ctx, name=name: plan(plans[name], ctx))
                continue
            if name == "langgraph_put":
                timed(samples[name], lambda n=n, msgs=msgs, subs=subs: lg.put(
                    f"{prefix}-{n}", msgs, subs, 0))
                continue
            ctx = meshpoint_context(f"{prefix}-{n}-{name}")
            await atimed(samples[name], lambda ctx=ctx, side=sides[name]: (
                side.checkpoint_task(ctx, "bench")))
        progress.advance(job, len(order))
    reads = ["meshpoint_restore", "meshpoint_restore_unverified",
             "meshpoint_restore_encrypted", "langgraph_get_tuple"]
    for n in range(runs):
        task_id = f"{prefix}-{n}-meshpoint_write"
        shift = n % len(reads)
        for name in reads[shift:] + reads[:shift]:
            if name == "langgraph_get_tuple":
                got = timed(samples[name], lambda n=n: lg.get(f"{prefix}-{n}"))
                assert len(got.checkpoint["channel_values"]["messages"]) == 20
            elif name == "meshpoint_restore_encrypted":
                await atimed(samples[name], lambda n=n: sides[
                    "meshpoint_write_encrypted"].restore_task(
                        f"{prefix}-{n}-meshpoint_write_encrypted"))
            else:
                await atimed(samples[name], lambda t=task_id, v=name == "meshpoint_restore": (
                    store.restore_task(t, verify=v)))
        progress.advance(job, len(reads))
    for n in range(runs):
        for name, side in sides.items():
            await side.cleanup_task(f"{prefix}-{n}-{name}")
    for name, side in sides.items():
        await side.cleanup_task(f"{prefix}-warm-{name}")
    del warm
    progress.remove_task(job)
    out: dict[str, Any] = {name: percentiles(values) for name, values in samples.items()}
    for what, ours, theirs in (
            ("write", "meshpoint_write", "langgraph_put"),
            ("write_no_history", "meshpoint_write_no_history", "langgraph_put"),
            ("write_signed", "meshpoint_write_signed", "langgraph_put"),
            ("write_encrypted", "meshpoint_write_encrypted", "langgraph_put"),
            ("plan", "meshpoint_plan", "langgraph_put"),
            ("plan_encrypted", "meshpoint_plan_encrypted", "langgraph_put"),
            ("read", "meshpoint_restore", "langgraph_get_tuple"),
            ("read_unverified", "meshpoint_restore_unverified", "langgraph_get_tuple"),
            ("read_encrypted", "meshpoint_restore_encrypted", "langgraph_get_tuple"),
            # what encryption at rest adds, everything else alike
            ("encryption_write", "meshpoint_write_encrypted", "meshpoint_write"),
            ("encryption_plan", "meshpoint_plan_encrypted", "meshpoint_plan"),
            ("encryption_read", "meshpoint_restore_encrypted", "meshpoint_restore")):
        out[f"{what}_ratio_p50"] = round(out[ours]["p50"] / out[theirs]["p50"], 3)
        out[f"{what}_ratio_p99"] = round(out[ours]["p99"] / out[theirs]["p99"], 3)
    return out


# -- 2. storage --------------------------------------------------------------------------

async def grow_meshpoint(store: SqlStore, turns: int) -> None:
    task_id = f"grow-{uuid.uuid4().hex[:8]}"
    ctx = TaskExecutionContext(task_id, {"reply_to": "gateway"})
    for turn in range(turns):
        ctx.append_session_event(message(turn))
        ctx.current_invocation_id = f"{task_id}/inv-{turn}"
        ctx.register_peer_sub_task(f"{task_id}/sub-{turn}", {
            "peer_agent_name": "peer", "function_call_id": f"call-{turn}", "timeout_s": 300})
        await store.checkpoint_task(ctx, "bench", lease_owner="grower" if turn else None)
        await store.resolve_peer_sub_task(f"{task_id}/sub-{turn}", {"text": "ok"},
                                          lease_owner="grower", lease_ttl_s=600)
        ctx.active_peer_sub_tasks.clear()
        ctx.parallel_tool_calls.clear()


def grow_langgraph(lg: LangGraphSide, turns: int) -> None:
    thread = f"grow-{uuid.uuid4().hex[:8]}"
    messages: list[dict[str, Any]] = []
    parent = None
    for turn in range(turns):
        messages = [*messages, message(turn)]
        parent = lg.put(thread, messages, sub_tasks(f"{thread}-{turn}")[:1], turn, parent)


def sqlite_bytes(path: Path) -> int:
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.execute("VACUUM")
    pages, size = (conn.execute("PRAGMA page_count").fetchone()[0],
                   conn.execute("PRAGMA page_size").fetchone()[0])
    conn.close()
    return int(pages * size)


def pg_bytes(schema: str) -> int:
    import psycopg

    with psycopg.connect(PG_DSN, autocommit=True) as conn:
        row = conn.execute(
            "SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0) FROM pg_class c "
            "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = %s "
            "AND c.relkind = 'r'", (schema,)).fetchone()
    return int(row[0]) if row else 0


# -- 3. at scale -------------------------------------------------------------------------

async def at_scale(store: SqlStore, small: SqlStore, paused: int, progress: Progress,
                   label: str, settle: Callable[[], None]) -> dict[str, Any]:
    """``paused`` tasks in ``store``, 100 in ``small`` (a database of its own): restores
    of both are timed in turns, so that both see the same machine weather (a p99 of
    a 0.1 ms read is otherwise the weather's). ``settle`` runs between the load and
    the timing: see :func:`settle_sqlite` and :func:`settle_postgres`."""
    prefix = uuid.uuid4().hex[:8]
    expired_every = 100  # 1 %
    job = progress.add_task(f"{label}: pausing {paused:,} tasks", total=paused)
    out: dict[str, Any] = {"paused": paused}

    async def pause(into: SqlStore, n: int) -> None:
        ctx = TaskExecutionContext(f"{prefix}-{n}", {"reply_to": "gateway"})
        ctx.current_invocation_id = f"{prefix}-{n}/inv"
        ctx.append_session_event(message(n))
        ctx.register_peer_sub_task(f"{prefix}-{n}/sub", {
            "peer_agent_name": "peer", "function_call_id": "call",
            "timeout_s": 0.05 if n % expired_every == 0 else 3600})
        await into.checkpoint_task(ctx, "scale")

    for n in range(100):
        await pause(small, n)
    for n in range(paused):
        await pause(store, n)
        if n % 500 == 0:
            progress.update(job, completed=n)
    progress.remove_task(job)
    # What autovacuum does within a minute of such a load on PostgreSQL: without
    # fresh statistics the planner still sees the 100-row tables it analysed first.
    for each in (small, store):
        await each.run(lambda conn: conn.exec_driver_sql("ANALYZE"), write=True)
    settle()
    await asyncio.sleep(0.2)  # the 1 % are past their deadline now
    restore_small: list[float] = []
    restore_large: list[float] = []
    picks = zip(random.Random(1).choices(range(100), k=RESTORES),
                random.Random(2).sample(range(paused), RESTORES), strict=True)
    for turn, (few, many) in enumerate(picks):
        for side in ((0, 1) if turn % 2 else (1, 0)):
            if side == 0:
                await atimed(restore_small, lambda m=few: small.restore_task(f"{prefix}-{m}"))
            else:
                await atimed(restore_large, lambda m=many: store.restore_task(f"{prefix}-{m}"))
    out["restore_100"] = percentiles(restore_small)
    out["restore_all"] = percentiles(restore_large)
    out["restore_p99_growth"] = round(out["restore_all"]["p99"] / out["restore_100"]["p99"]
                                      - 1, 3)
    sweeps: list[float] = []
    resolved = 0
    while True:
        got = await atimed(sweeps, lambda: store.sweep_expired_timeouts("scale", limit=100))
        resolved += len(got)
        if not got:
            sweeps.pop()
            break
    idle: list[float] = []
    for _ in range(50):
        await atimed(idle, lambda: store.sweep_expired_timeouts("scale", limit=100))
    out["expired"] = resolved
    out["sweep_per_call_100_rows"] = percentiles(sweeps) if sweeps else None
    out["idle_sweep"] = percentiles(idle)
    return out


def settle_sqlite(*paths: Path) -> None:
    """Wait until the load's write-ahead log is copied into each database file.

    Loading 100,000 tasks as fast as possible writes a few hundred MB of log, which
    meshpoint's checkpointer thread copies over the following seconds; meanwhile
    every read searches the log's index and shares the disk with the copy. Timed
    right away, the restores measured the tail of the load, not the paused tasks."""
    for path in paths:
        with contextlib.closing(sqlite3.connect(path, timeout=30)) as conn:
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")


def settle_postgres(*schemas: str) -> None:
    """What a server does within minutes of a bulk load: VACUUM (hint bits and the
    visibility map, which the first reader of each fresh row otherwise sets, dirtying
    its page) and a CHECKPOINT (so the restores do not share the disk with it)."""
    import psycopg

    with psycopg.connect(PG_DSN, autocommit=True) as conn:
        for schema in schemas:
            for table in ("agent_paused_tasks", "agent_peer_sub_tasks",
                          "agent_parallel_invocations", "agent_session_events"):
                conn.execute(f"VACUUM {schema}.{table}")
        conn.execute("CHECKPOINT")


# -- the run -----------------------------------------------------------------------------

def postgres_up() -> str | None:
    try:
        import psycopg

        with psycopg.connect(PG_DSN, connect_timeout=3):
            return None
    except Exception as error:
        return f"PostgreSQL is not reachable at {PG_DSN} ({error})"


async def run_backend(backend: str, mode: dict[str, int], tmp: Path,
                      progress: Progress) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if backend == "sqlite":
        from langgraph.checkpoint.sqlite import SqliteSaver

        def lg_conn(path: Path) -> sqlite3.Connection:
            conn = sqlite3.connect(path, check_same_thread=False)
            conn.execute("PRAGMA journal_mode=WAL")  # the same durability as meshpoint's
            conn.execute("PRAGMA synchronous=NORMAL")
            return conn

        async with open_store(f"sqlite:///{tmp}/mp.db") as store:
            saver = SqliteSaver(lg_conn(tmp / "lg.db"))
            saver.setup()
            out["write_read"] = await write_read(store, LangGraphSide(saver), mode["runs"],
                                                 progress, backend)
        async with open_store(f"sqlite:///{tmp}/mp-grow.db") as store:
            await grow_meshpoint(store, mode["turns"])
        saver = SqliteSaver(lg_conn(tmp / "lg-grow.db"))
        saver.setup()
        grow_langgraph(LangGraphSide(saver), mode["turns"])
        saver.conn.close()
        out["storage_bytes"] = {"meshpoint": sqlite_bytes(tmp / "mp-grow.db"),
                                "langgraph": sqlite_bytes(tmp / "lg-grow.db")}
        async with open_store(f"sqlite:///{tmp}/mp-scale.db") as store, \
                open_store(f"sqlite:///{tmp}/mp-small.db") as small:
            out["at_scale"] = await at_scale(
                store, small, mode["paused"], progress, backend,
                functools.partial(settle_sqlite, tmp / "mp-scale.db", tmp / "mp-small.db"))
        out["at_scale"]["bytes_per_paused_task"] = round(
            sqlite_bytes(tmp / "mp-scale.db") / mode["paused"])
        return out

    from langgraph.checkpoint.postgres import PostgresSaver

    schemas = {name: f"mp_bench_{name}_{uuid.uuid4().hex[:6]}"
               for name in ("mp", "lg", "mpgrow", "lggrow", "scale", "small")}
    import psycopg

    with psycopg.connect(PG_DSN, autocommit=True) as conn:
        for schema in schemas.values():
            conn.execute(f"CREATE SCHEMA {schema}")
    try:
        def lg_saver(schema: str) -> Any:
            return PostgresSaver.from_conn_string(f"{PG_DSN}?options=-csearch_path%3D{schema}")

        # meshpoint as it runs in production: as a runtime role that row-level security
        # holds to one tenant per transaction (migration 0009).
        role = f"mp_bench_app_{uuid.uuid4().hex[:8]}"
        async with open_store(POSTGRES_URL, schema=schemas["mp"]) as owner:
            await grant_runtime_role(owner, role)
        role_url = make_url(POSTGRES_URL).set(username=role).render_as_string(
            hide_password=False)
        try:
            async with open_store(role_url, schema=schemas["mp"], migrate=False) as store:
                with lg_saver(schemas["lg"]) as saver:
                    saver.setup()
                    out["write_read"] = await write_read(store, LangGraphSide(saver),
                                                         mode["runs"], progress, backend)
        finally:
            with psycopg.connect(PG_DSN, autocommit=True) as conn:
                conn.execute(f"DROP OWNED BY {role}")  # its grants; it owns nothing
                conn.execute(f"DROP ROLE {role}")
        async with open_store(POSTGRES_URL, schema=schemas["mpgrow"]) as store:
            await grow_meshpoint(store, mode["turns"])
        with lg_saver(schemas["lggrow"]) as saver:
            saver.setup()
            grow_langgraph(LangGraphSide(saver), mode["turns"])
        with psycopg.connect(PG_DSN, autocommit=True) as conn:
            conn.execute("VACUUM")
        # Only the tables a turn writes to; LangGraph's migrations table is tiny either way.
        out["storage_bytes"] = {"meshpoint": pg_bytes(schemas["mpgrow"]),
                                "langgraph": pg_bytes(schemas["lggrow"])}
        async with open_store(POSTGRES_URL, schema=schemas["scale"]) as store, \
                open_store(POSTGRES_URL, schema=schemas["small"]) as small:
            out["at_scale"] = await at_scale(
                store, small, mode["paused"], progress, backend,
                functools.partial(settle_postgres, schemas["scale"], schemas["small"]))
        data = pg_bytes(schemas["scale"])
        out["at_scale"]["bytes_per_paused_task"] = round(data / mode["paused"])
        # A restore reads a few random pages of this data: once it outgrows the
        # server's buffer cache, they come from the OS (the restore's growth).
        with psycopg.connect(PG_DSN, autocommit=True) as conn:
            row = conn.execute("SHOW shared_buffers").fetchone()
        out["at_scale"]["data_mib"] = round(data / 2**20)
        out["at_scale"]["shared_buffers"] = row[0] if row else "?"
    finally:
        with psycopg.connect(PG_DSN, autocommit=True) as conn:
            for schema in schemas.values():
                conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
    return out


def table(results: dict[str, Any], turns: int) -> str:
    def pair(d: dict[str, float]) -> str:
        return f"{d['p50']:.2f} / {d['p99']:.2f}"

    lines = ["| backend | measure | meshpoint | LangGraph | meshpoint / LangGraph (p50, p99) |",
             "|---|---|---|---|---|"]
    for backend, r in results.items():
        if "skipped" in r:
            lines.append(f"| {backend} | skipped: {r['skipped']} | | | |")
            continue
        w = r["write_read"]
        for what, key, ratio in (
                ("pause write, history on (default)", "meshpoint_write", "write"),
                ("pause write, history off", "meshpoint_write_no_history",
                 "write_no_history"),
                ("pause write, history signed", "meshpoint_write_signed", "write_signed"),
                ("pause write, history on, encrypted at rest", "meshpoint_write_encrypted",
                 "write_encrypted"),
                ("of a write (history on), planning alone: Python, no I/O",
                 "meshpoint_plan", "plan"),
                ("of a write (history on, encrypted), planning alone",
                 "meshpoint_plan_encrypted", "plan_encrypted")):
            lines.append(f"| {backend} | {what} p50 / p99 ms | {pair(w[key])} | "
                         f"{pair(w['langgraph_put'])} | {w[f'{ratio}_ratio_p50']:.2f}, "
                         f"{w[f'{ratio}_ratio_p99']:.2f} |")
        for what, key, ratio in (("read, verified (default)", "meshpoint_restore", "read"),
                                 ("read, not verified", "meshpoint_restore_unverified",
                                  "read_unverified"),
                                 ("read, verified, encrypted at rest",
                                  "meshpoint_restore_encrypted", "read_encrypted")):
            lines.append(f"| {backend} | {what} p50 / p99 ms | {pair(w[key])} | "
                         f"{pair(w['langgraph_get_tuple'])} | {w[f'{ratio}_ratio_p50']:.2f}, "
                         f"{w[f'{ratio}_ratio_p99']:.2f} |")
        for what, ours, theirs, ratio in (
                ("pause write", "meshpoint_write_encrypted", "meshpoint_write",
                 "encryption_write"),
                ("planning (Python)", "meshpoint_plan_encrypted", "meshpoint_plan",
                 "encryption_plan"),
                ("read", "meshpoint_restore_encrypted", "meshpoint_restore",
                 "encryption_read")):
            lines.append(f"| {backend} | encryption at rest: {what}, on vs off p50 / p99 ms | "
                         f"{pair(w[ours])} vs {pair(w[theirs])} | | "
                         f"on / off {w[f'{ratio}_ratio_p50']:.2f}, "
                         f"{w[f'{ratio}_ratio_p99']:.2f} |")
        s = r["storage_bytes"]
        lines.append(f"| {backend} | storage after {turns} turns | "
                     f"{s['meshpoint'] / 2**20:.1f} MiB | {s['langgraph'] / 2**20:.1f} MiB | "
                     f"{s['meshpoint'] / s['langgraph']:.3f} |")
        a = r["at_scale"]
        cache = (f" (data {a['data_mib']} MiB, shared_buffers {a['shared_buffers']})"
                 if "shared_buffers" in a else "")
        lines.append(f"| {backend} | restore p50 / p99 ms, 100 vs {a['paused']:,} paused"
                     f"{cache} | {pair(a['restore_100'])} vs {pair(a['restore_all'])} | | "
                     f"p99 growth {a['restore_p99_growth']:+.0%} |")
        if a["sweep_per_call_100_rows"]:
            lines.append(f"| {backend} | sweep of {a['expired']:,} expired (100 a call) p50 / "
                         f"p99 ms | {pair(a['sweep_per_call_100_rows'])} | | |")
        lines.append(f"| {backend} | idle sweep, {a['paused']:,} paused, p50 / p99 ms | "
                     f"{pair(a['idle_sweep'])} | | |")
        lines.append(f"| {backend} | bytes per paused task (1 message, 1 sub-task; 1 % "
                     f"resolved) | {a['bytes_per_paused_task']:,} | | |")
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
        for backend in ("sqlite", "postgres"):
            if args.backend not in (backend, "both"):
                continue
            missing = postgres_up() if backend == "postgres" else None
            if missing:
                console.print(f"[yellow]skipping PostgreSQL: {missing}; start it with "
                              f"`make services`[/yellow]")
                results[backend] = {"skipped": missing}
                continue
            results[backend] = asyncio.run(run_backend(backend, mode, Path(tmp), progress))
    console.print(table(results, mode["turns"]), markup=False)
    stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H%M%SZ")
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"{stamp}-{args.mode}-compare.json"
    out.write_text(json.dumps({
        "when": stamp, "mode": args.mode, "settings": mode, "cores": os.cpu_count(),
        "python": platform.python_version(), "seconds": round(time.perf_counter() - started),
        "versions": {p: version(p) for p in ("meshpoint", "langgraph-checkpoint",
                                             "langgraph-checkpoint-sqlite",
                                             "langgraph-checkpoint-postgres", "sqlalchemy",
                                             "asyncpg", "psycopg")},
        "sqlite": sqlite3.sqlite_version, "results": results}, indent=2))
    console.print(f"written to {out} ({time.perf_counter() - started:.0f} s)")


if __name__ == "__main__":
    sys.exit(main())
