"""A turn of 10 tool calls checkpointed after each, beside LangGraph doing the same
10 steps (issue 14 §5), in one run on one machine.

    python benchmarks/bench_turn.py --mode quick      # part of `make bench`
    python benchmarks/bench_turn.py --mode full

meshpoint: an agent whose model asks for 10 local tool calls in one response and then
answers, with ``CheckpointPolicy(after_tools=True)``: the model's plan and each
tool's result are checkpointed (status ``working``, 11 checkpoints), so a crash
repeats no completed step. The whole turn is timed from ``Client.ask`` to the
answer: broker, instance, store, and the cleanup of the task's rows.

LangGraph: a ``StateGraph`` of 10 nodes in sequence, each appending its result to a
``messages`` channel (the add reducer), compiled with ``SqliteSaver`` /
``PostgresSaver``, which checkpoints every step; ``graph.invoke`` on a new thread.

The same turn is also run by an agent that keeps an event log (``events=True``,
issue 16 §1): its cost on a turn is the ratio of the two meshpoint sides.

Each tool/node returns the same ~200 B result. Reported: p50/p99 of the whole turn
and the ratio meshpoint / LangGraph, and the bytes of data each stored for one turn
(meshpoint: at its last checkpoint, summed over its rows' data columns, before the
task ends and its rows go; LangGraph: its checkpoints, blobs and writes of the
thread, which it keeps). Runs alternate the three sides, on SQLite (a file, WAL,
synchronous=NORMAL on both) and PostgreSQL.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import operator
import os
import platform
import sqlite3
import sys
import tempfile
import time
import uuid
from dataclasses import replace
from datetime import UTC, datetime
from importlib.metadata import version
from pathlib import Path
from typing import Annotated, Any, TypedDict

from rich.console import Console
from rich.progress import Progress

from meshpoint import open_store
from meshpoint.broker import InProcessBroker
from meshpoint.llm import ScriptedModel
from meshpoint.runtime import Agent, AgentInstance, Client, LocalTool
from meshpoint.runtime.agent import CheckpointPolicy

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_store import percentiles

POSTGRES_URL = os.environ.get("MESHPOINT_BENCH_POSTGRES_URL",
                              "postgresql+asyncpg://postgres@127.0.0.1:5432/test")
PG_DSN = POSTGRES_URL.replace("postgresql+asyncpg://", "postgresql://")
RESULTS = Path(__file__).parent / "results"
MODES = {"quick": {"turns": 150}, "full": {"turns": 1000}}
STEPS = 10
RESULT = "step result: " + "x" * 186  # ~200 B
console = Console(width=150)


def step(arguments: dict[str, Any]) -> str:
    return RESULT


def meshpoint_agent(name: str = "worker", *, events: bool = False) -> Agent:
    return Agent(name, ScriptedModel("worker"), checkpoint=CheckpointPolicy(after_tools=True),
                 tools=[LocalTool(f"step_{n}", f"Step {n}.", step) for n in range(STEPS)],
                 events=events)


class State(TypedDict):
    messages: Annotated[list[str], operator.add]


def langgraph_graph(saver: Any) -> Any:
    from langgraph.graph import END, START, StateGraph

    graph = StateGraph(State)
    names = [f"step_{n}" for n in range(STEPS)]
    for name in names:
        graph.add_node(name, lambda state: {"messages": [RESULT]})
    graph.add_edge(START, names[0])
    for first, second in itertools.pairwise(names):
        graph.add_edge(first, second)
    graph.add_edge(names[-1], END)
    return graph.compile(checkpointer=saver)


async def run_backend(backend: str, turns: int, tmp: Path, progress: Progress
                      ) -> dict[str, Any]:
    if backend == "sqlite":
        from langgraph.checkpoint.sqlite import SqliteSaver

        conn = sqlite3.connect(tmp / "lg.db", check_same_thread=False)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        saver = SqliteSaver(conn)
        saver.setup()
        async with open_store(f"sqlite:///{tmp}/mp.db") as store:
            return await compare(store, saver, turns, progress, backend,
                                 lambda sql: conn.execute(sql).fetchone()[0])
    import psycopg
    from langgraph.checkpoint.postgres import PostgresSaver

    schemas = {side: f"turn_bench_{side}_{uuid.uuid4().hex[:6]}" for side in ("mp", "lg")}
    with psycopg.connect(PG_DSN, autocommit=True) as admin:
        for schema in schemas.values():
            admin.execute(f"CREATE SCHEMA {schema}")
    try:
        with PostgresSaver.from_conn_string(
                f"{PG_DSN}?options=-csearch_path%3D{schemas['lg']}") as saver:
            saver.setup()
            async with open_store(POSTGRES_URL, schema=schemas["mp"]) as store:
                return await compare(store, saver, turns, progress, backend,
                                     lambda sql: next(iter(  # rows are dicts here
                                         saver.conn.execute(sql).fetchone().values())))
    finally:
        with psycopg.connect(PG_DSN, autocommit=True) as admin:
            for schema in schemas.values():
                admin.execute(f"DROP SCHEMA {schema} CASCADE")


async def compare(store: Any, saver: Any, turns: int, progress: Progress, backend: str,
                  lg_scalar: Any) -> dict[str, Any]:
    broker = InProcessBroker()
    instance = AgentInstance(meshpoint_agent(), store, broker)
    logged = AgentInstance(meshpoint_agent("logged", events=True), store, broker)
    await instance.start()
    await logged.start()
    graph = langgraph_graph(saver)
    mp: list[float] = []
    ev: list[float] = []
    lg: list[float] = []
    job = progress.add_task(f"{backend}: {turns} turns a side, alternated", total=turns)
    try:
        async with Client(broker) as client:
            for _ in range(3):  # warm every side up
                await client.ask("worker", "Run the steps")
                await client.ask("logged", "Run the steps")
                graph.invoke({"messages": []}, {"configurable": {"thread_id": uuid.uuid4().hex}})
            for _ in range(turns):
                started = time.perf_counter()
                answer = await client.ask("worker", "Run the steps")
                mp.append((time.perf_counter() - started) * 1000)
                assert answer.status.state.value == "completed", answer
                started = time.perf_counter()
                answer = await client.ask("logged", "Run the steps")
                ev.append((time.perf_counter() - started) * 1000)
                assert answer.status.state.value == "completed", answer
                started = time.perf_counter()
                graph.invoke({"messages": []}, {"configurable": {"thread_id": uuid.uuid4().hex}})
                lg.append((time.perf_counter() - started) * 1000)
                progress.advance(job)
        checkpoints = instance.stats.counts["mid_turn_checkpoints"]
    finally:
        await instance.stop()
        await logged.stop()  # writes what its log still buffers
        await broker.close()
    assert logged.events is not None and not logged.events.dropped
    events_per_turn = round(logged.events.written / (turns + 3), 1)
    thread = uuid.uuid4().hex
    graph.invoke({"messages": []}, {"configurable": {"thread_id": thread}})
    size = "pg_column_size" if backend == "postgres" else "length"  # bytes as stored
    blobs = "checkpoint_blobs WHERE thread_id = '{t}'" if backend == "postgres" else ""
    lg_bytes = lg_scalar(
        f"SELECT (SELECT coalesce(sum({size}(checkpoint)) + sum({size}(metadata)), 0) FROM "
        f"checkpoints WHERE thread_id = '{thread}')"
        + (f" + (SELECT coalesce(sum({size}(blob)), 0) FROM {blobs.format(t=thread)})"
           if blobs else "")
        + f" + (SELECT coalesce(sum({size}({'blob' if backend == 'postgres' else 'value'})),"
          f" 0) FROM {'checkpoint_writes' if backend == 'postgres' else 'writes'} "
          f"WHERE thread_id = '{thread}')")
    return {"meshpoint_turn": percentiles(mp), "langgraph_turn": percentiles(lg),
            "meshpoint_events_turn": percentiles(ev), "events_per_turn": events_per_turn,
            "meshpoint_checkpoints_per_turn": round(checkpoints / (turns + 3), 2),
            "meshpoint_bytes": await meshpoint_bytes(store, size),
            "langgraph_bytes": int(lg_bytes)}


async def meshpoint_bytes(store: Any, size: str) -> int:
    """The data one turn's task holds at its last checkpoint: a turn whose answer
    waits until its rows are measured."""
    gate = asyncio.Event()
    held = asyncio.Event()

    class Held(ScriptedModel):
        async def complete(self, messages: list[dict[str, Any]], tools: Any) -> Any:
            if any(m.get("role") == "tool" for m in messages):
                held.set()
                await gate.wait()
            return await super().complete(messages, tools)

    agent = meshpoint_agent()
    broker = InProcessBroker()
    instance = AgentInstance(replace(agent, model=Held("worker")), store, broker)
    await instance.start()
    try:
        async with Client(broker) as client:
            request_id = await client.submit("worker", "Run the steps")
            await held.wait()

            def measure(conn: Any) -> int:
                total = 0
                for sql in (f"SELECT coalesce(sum({size}(context)), 0) FROM agent_paused_tasks",
                            f"SELECT coalesce(sum({size}(data)), 0) FROM agent_session_events",
                            f"SELECT coalesce(sum({size}(results)) + sum({size}(call_order)), 0)"
                            " FROM agent_parallel_invocations"):
                    total += int(conn.exec_driver_sql(sql).scalar())
                return total

            size = await store.run(measure)
            gate.set()
            await client.wait(request_id, timeout_s=30)
    finally:
        await instance.stop()
        await broker.close()
    return size


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mode", choices=MODES, default="quick")
    args = parser.parse_args()
    turns = MODES[args.mode]["turns"]
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp, Progress(console=console) as progress:
        results["sqlite"] = asyncio.run(run_backend("sqlite", turns, Path(tmp), progress))
        try:
            import psycopg

            with psycopg.connect(PG_DSN, connect_timeout=3):
                pass
        except Exception as error:
            console.print(f"skipping PostgreSQL: not reachable at {PG_DSN} ({error})")
        else:
            results["postgres"] = asyncio.run(run_backend("postgres", turns, Path(tmp),
                                                          progress))
    console.print()
    console.print("| backend | measure | meshpoint | LangGraph | meshpoint / LangGraph |")
    console.print("|---|---|---|---|---|")
    for backend, r in results.items():
        m, g = r["meshpoint_turn"], r["langgraph_turn"]
        console.print(f"| {backend} | turn of {STEPS} steps, p50 / p99 ms "
                      f"({r['meshpoint_checkpoints_per_turn']:g} checkpoints a turn) | "
                      f"{m['p50']:.2f} / {m['p99']:.2f} | {g['p50']:.2f} / {g['p99']:.2f} | "
                      f"{m['p50'] / g['p50']:.2f}, {m['p99'] / g['p99']:.2f} |")
        e = r["meshpoint_events_turn"]
        console.print(f"| {backend} | the same turn with the event log on (`events: true`, "
                      f"{r['events_per_turn']:g} events a turn), p50 / p99 ms | "
                      f"{e['p50']:.2f} / {e['p99']:.2f} | {g['p50']:.2f} / {g['p99']:.2f} | "
                      f"{e['p50'] / g['p50']:.2f}, {e['p99'] / g['p99']:.2f} (log on / off: "
                      f"{e['p50'] / m['p50']:.2f}, {e['p99'] / m['p99']:.2f}) |")
        console.print(f"| {backend} | bytes of data stored for one turn | "
                      f"{r['meshpoint_bytes']:,} | {r['langgraph_bytes']:,} | "
                      f"{r['meshpoint_bytes'] / max(1, r['langgraph_bytes']):.2f} |")
    stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H%M%SZ")
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"{stamp}-{args.mode}-turn.json"
    out.write_text(json.dumps({
        "date": stamp, "mode": args.mode, "cores": os.cpu_count(),
        "python": platform.python_version(),
        "versions": {p: version(p) for p in ("langgraph", "langgraph-checkpoint-sqlite",
                                              "langgraph-checkpoint-postgres")},
        "results": results}, indent=1))
    console.print(f"written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
