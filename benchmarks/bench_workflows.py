"""A 5-stage sequential workflow beside a LangGraph graph of 5 nodes, in one run on
one machine: end to end, each stage boundary, and the stages run again after a kill.

    python benchmarks/bench_workflows.py --mode quick      # part of `make bench`
    python benchmarks/bench_workflows.py --mode full

meshpoint: a ``SequentialAgent`` of 5 sub-agents, each an agent whose model answers a
fixed text at once, each on its own instance; the workflow on one more. Every stage
is a peer call, so every stage boundary is the workflow's pause checkpoint (the
planned call, with its history record), the request published, the sub-agent's turn
opened, and, after its answer, the answer published, the workflow's task taken,
restored (verifying its chain), planned again and checkpointed at the next call. A
*stage boundary* is timed from the end of stage k's model call to the start of stage
k+1's; *end to end* from ``Client.ask`` to the answer.

LangGraph: a ``StateGraph`` of 5 nodes in sequence, each appending the same fixed text
to a ``messages`` channel, compiled with ``SqliteSaver`` / ``PostgresSaver`` on the
same database; ``graph.invoke`` on a new thread. Its *step boundary* is timed from
the end of node k to the start of node k+1 (the step's checkpoint and Pregel's
scheduling); end to end is ``invoke``.

The sides run interleaved, in rotating order, on SQLite (a file, WAL,
``synchronous=NORMAL`` on both) and on PostgreSQL (meshpoint with the in-process
broker and with NATS JetStream).

Stages run again after a kill: meshpoint's workflow instance is killed while stage 4
runs (stages 1-3 answered, the workflow paused at its call to stage 4); another
instance of the workflow takes the answer over; counted is how many times each
stage's model ran. LangGraph: a process running the graph is SIGKILLed at the start
of node 4, and the graph is resumed from its checkpoint (``invoke(None, ...)`` on the
same thread) in another; counted is each node's runs, with the default durability
(``async``: a step's checkpoint is written while the next step runs) and with
``sync``.

The goal: each stage boundary costs no more than LangGraph's step at p99.
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
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from datetime import UTC, datetime
from importlib.metadata import version
from pathlib import Path
from typing import Annotated, Any, TypedDict

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from meshpoint import open_store
from meshpoint.broker import InProcessBroker
from meshpoint.llm import ToolSpec
from meshpoint.llm.base import ModelResponse
from meshpoint.runtime import Agent, AgentInstance, Client, RuntimeOptions, SequentialAgent

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_handoff import NATS_URL, PG_DSN, POSTGRES_URL, TimedStore, reachable
from bench_store import percentiles

RESULTS = Path(__file__).parent / "results"
MODES = {"quick": {"runs": 60, "kills": 1}, "full": {"runs": 500, "kills": 10}}
STAGES = 5
#: The stage (1-based) during which the workflow's instance is killed.
KILLED_AT = 4
ANSWER = "stage answer: " + "x" * 186  # ~200 B
#: The store's operations of a stage boundary, each timed (each once a boundary): the
#: workflow's checkpoint at its call to the next stage (with its history record), the
#: answer's claim (its sub-task resolved), the circuit breaker's admission of the
#: resume (a read while it is closed), the restore verifying the chain. (The cleanup
#: of the workflow's rows comes after its answer, off the path.)
OPS = ("checkpoint_task", "resolve_peer_sub_task", "breakers.admit", "restore_task")
console = Console(width=150)


class Clock:
    """When each stage (or node) of the current run started and ended; runs are one
    at a time, so a run's stages are the last :data:`STAGES` entries."""

    def __init__(self) -> None:
        self.spans: list[tuple[float, float]] = []
        self.boundaries_ms: list[float] = []

    def run_done(self) -> None:
        spans, self.spans = self.spans, []
        assert len(spans) == STAGES, spans
        self.boundaries_ms += [(b[0] - a[1]) * 1000 for a, b in itertools.pairwise(spans)]


class Fixed:
    """A stage's model: the same text at once, timed on ``clock``; ``hold`` (if set)
    is awaited before answering, once (the kill test's stage 4)."""

    def __init__(self, name: str, clock: Clock) -> None:
        self.name = name
        self.clock = clock
        self.calls = 0
        self.hold: asyncio.Event | None = None
        self.entered = asyncio.Event()

    async def complete(self, messages: list[dict[str, Any]],
                       tools: list[ToolSpec]) -> ModelResponse:
        started = time.perf_counter()
        self.calls += 1
        self.entered.set()
        if self.hold is not None:
            hold, self.hold = self.hold, None
            await hold.wait()
        self.clock.spans.append((started, time.perf_counter()))
        return ModelResponse(text=ANSWER)


def stage_names() -> list[str]:
    return [f"stage{n + 1}" for n in range(STAGES)]


class Mesh:
    """The workflow's mesh on one store and broker: a model and an instance per stage,
    and an instance of the workflow."""

    def __init__(self, store: Any, broker: Any, namespace: str) -> None:
        self.store, self.broker = TimedStore(store, OPS), broker
        self.store.breakers = TimedStore(store.breakers, ("admit",))
        self.store.ms["breakers.admit"] = self.store.breakers.ms["admit"]
        self.options = RuntimeOptions(namespace=namespace)
        self.clock = Clock()
        self.models = [Fixed(name, self.clock) for name in stage_names()]
        self.workflow = SequentialAgent(name="pipeline", sub_agents=stage_names())
        self.instances: list[AgentInstance] = []
        self.client = Client(broker, namespace=namespace)

    async def start(self) -> Mesh:
        for model in self.models:
            await self.start_instance(Agent(model.name, model))
        await self.start_workflow()
        await self.client.start()
        return self

    async def start_workflow(self) -> None:
        await self.start_instance(self.workflow)

    async def start_instance(self, agent: Agent) -> None:
        instance = AgentInstance(agent, self.store, self.broker, options=self.options)
        await instance.start()
        self.instances.append(instance)

    async def run(self, n: int) -> float:
        started = time.perf_counter()
        answer = await self.client.ask("pipeline", f"Run the pipeline #{n}", timeout_s=60)
        took = (time.perf_counter() - started) * 1000
        assert answer.status.state.value == "completed", answer
        assert answer.status.message is not None and answer.status.message.text == ANSWER
        return took

    async def close(self) -> None:
        for instance in self.instances:
            await instance.stop()
        await self.client.close()


async def killed_once(store: Any, broker: Any, namespace: str) -> list[int]:
    """The workflow's instance killed while stage :data:`KILLED_AT` runs (stages before
    it answered, the workflow paused at its call); a new instance of the workflow
    started; the stages' model calls counted once the workflow has answered."""
    mesh = await Mesh(store, broker, namespace).start()
    try:
        held = mesh.models[KILLED_AT - 1]
        gate = held.hold = asyncio.Event()
        request_id = await mesh.client.submit("pipeline", "Run the pipeline (killed)")
        await held.entered.wait()
        task_id = mesh.client.task_id("pipeline", request_id)
        (dying,) = [i for i in mesh.instances if i.agent.name == "pipeline"]
        while task_id in dying.active:  # the pause acknowledged what it answered
            await asyncio.sleep(0.001)
        await dying.kill()
        mesh.instances.remove(dying)
        await mesh.start_workflow()
        gate.set()
        answer = await mesh.client.wait(request_id, timeout_s=60)
        assert answer.status.state.value == "completed", answer
        return [m.calls for m in mesh.models]
    finally:
        await mesh.close()


def tally(runs: list[list[int]], first_runs: int) -> dict[str, Any]:
    """Each stage's runs summed over the kills, and the runs beyond ``first_runs`` a
    kill (a stage's run cut short by the kill is not a re-run)."""
    calls = [sum(column) for column in zip(*runs, strict=True)]
    return {"kills": len(runs), "stage_calls": calls,
            "reruns": sum(calls) - first_runs * len(runs)}


async def meshpoint_reruns(store: Any, make_broker: Callable[[], Any], kills: int
                           ) -> dict[str, Any]:
    """:func:`killed_once`, ``kills`` times, each on a fresh broker and namespace."""
    runs = []
    for _ in range(kills):
        broker = await make_broker()
        namespace = f"wfkill{uuid.uuid4().hex[:6]}"
        try:
            runs.append(await killed_once(store, broker, namespace))
        finally:
            if make_broker is nats:
                await broker.delete_namespace(namespace)
            await broker.close()
    return tally(runs, STAGES)


# -- LangGraph --------------------------------------------------------------------------

class State(TypedDict):
    messages: Annotated[list[str], operator.add]


def langgraph_graph(saver: Any, node: Callable[[str], Callable[[State], dict[str, Any]]]
                    ) -> Any:
    from langgraph.graph import END, START, StateGraph

    graph = StateGraph(State)
    names = stage_names()
    for name in names:
        graph.add_node(name, node(name))
    graph.add_edge(START, names[0])
    for first, second in itertools.pairwise(names):
        graph.add_edge(first, second)
    graph.add_edge(names[-1], END)
    return graph.compile(checkpointer=saver)


def timed_node(clock: Clock) -> Callable[[str], Callable[[State], dict[str, Any]]]:
    def node(name: str) -> Callable[[State], dict[str, Any]]:
        def run(state: State) -> dict[str, Any]:
            started = time.perf_counter()
            out = {"messages": [ANSWER]}
            clock.spans.append((started, time.perf_counter()))
            return out
        return run
    return node


#: Run in a child process: the graph on the given database; each node appends its name
#: to the count file; node KILLED_AT SIGKILLs the process on the first run. That run
#: comes after a warm-up run on another thread (not counted), as in a process that has
#: run graphs before.
KILLED_GRAPH = """
import os, signal, sqlite3, sys, uuid
sys.path.insert(0, {bench!r})
from bench_workflows import langgraph_graph, ANSWER
backend, db, counts, thread, durability, resume = sys.argv[1:7]
counting = False
def node(name):
    def run(state):
        if counting:
            with open(counts, "a") as f:
                f.write(name + "\\n")
            if name == "stage{killed}" and resume == "0":
                os.kill(os.getpid(), signal.SIGKILL)
        return {{"messages": [ANSWER]}}
    return run
def invoke(saver):
    global counting
    graph = langgraph_graph(saver, node)
    if resume == "0":
        graph.invoke({{"messages": []}}, {{"configurable": {{"thread_id": uuid.uuid4().hex}}}},
                     durability=durability)
    counting = True
    graph.invoke(None if resume == "1" else {{"messages": []}},
                 {{"configurable": {{"thread_id": thread}}}}, durability=durability)
if backend == "sqlite":
    from langgraph.checkpoint.sqlite import SqliteSaver
    conn = sqlite3.connect(db, check_same_thread=False)
    conn.execute("PRAGMA journal_mode=WAL"); conn.execute("PRAGMA synchronous=NORMAL")
    saver = SqliteSaver(conn); saver.setup()
    invoke(saver)
else:
    from langgraph.checkpoint.postgres import PostgresSaver
    with PostgresSaver.from_conn_string(db) as saver:
        saver.setup()
        invoke(saver)
"""


def langgraph_reruns(backend: str, db: str, tmp: Path, kills: int) -> dict[str, Any]:
    """Each node's runs when a process running the graph is SIGKILLed in node
    :data:`KILLED_AT` and another resumes the thread, per durability mode."""
    script = KILLED_GRAPH.format(bench=str(Path(__file__).resolve().parent),
                                 killed=KILLED_AT)
    out: dict[str, Any] = {}
    for durability in ("async", "sync"):
        runs = []
        for _ in range(kills):
            counts = tmp / f"counts-{uuid.uuid4().hex}"
            counts.write_text("")
            thread = uuid.uuid4().hex
            for resume in ("0", "1"):
                subprocess.run([sys.executable, "-c", script, backend, db, str(counts),
                                thread, durability, resume], check=resume == "1")
            ran = counts.read_text().split()
            runs.append([ran.count(name) for name in stage_names()])
        # node KILLED_AT ran once before the kill: not a re-run
        out[durability] = tally(runs, STAGES + 1)
    return out


# -- the comparison ---------------------------------------------------------------------

class Graph:
    """The LangGraph side: the graph on ``saver``, run with a ``durability`` mode."""

    def __init__(self, saver: Any, durability: str) -> None:
        self.clock = Clock()
        self.graph = langgraph_graph(saver, timed_node(self.clock))
        self.durability = durability

    async def run(self, n: int) -> float:
        started = time.perf_counter()
        self.graph.invoke({"messages": []}, {"configurable": {"thread_id": uuid.uuid4().hex}},
                          durability=self.durability)
        return (time.perf_counter() - started) * 1000


def graphs(saver: Any) -> dict[str, Graph]:
    """LangGraph with its default durability (a step's checkpoint written while the
    next step runs) and with ``sync`` (written before it)."""
    return {"langgraph": Graph(saver, "async"), "langgraph_sync": Graph(saver, "sync")}


async def compare(sides: dict[str, Mesh | Graph], runs: int, label: str,
                  progress: Progress) -> dict[str, Any]:
    e2e: dict[str, list[float]] = {side: [] for side in sides}
    order = list(sides)

    async def one(side: str, n: int) -> None:
        e2e[side].append(await sides[side].run(n))
        sides[side].clock.run_done()

    for n in range(3):  # warm every side up
        for side in order:
            await one(side, n)
    for side in order:
        sides[side].clock.boundaries_ms.clear()
        e2e[side].clear()
        if isinstance(sides[side], Mesh):
            for samples in sides[side].store.ms.values():
                samples.clear()
    job = progress.add_task(f"{label}: {runs} workflows a side, interleaved", total=runs)
    for n in range(runs):
        for k in range(len(order)):
            await one(order[(n + k) % len(order)], n)
        progress.advance(job)
    progress.remove_task(job)
    out = {side: {"end_to_end": percentiles(e2e[side]),
                  "boundary": percentiles(sides[side].clock.boundaries_ms)}
           for side in order}
    for side, mesh in sides.items():
        if isinstance(mesh, Mesh):
            out[side]["store"] = {op: {**percentiles(ms), "per_workflow": len(ms) / runs}
                                  for op, ms in mesh.store.ms.items()}
    return out


@asynccontextmanager
async def meshes_on(url: str, brokers: dict[str, Callable[[], Any]],
                    **store_options: Any) -> AsyncIterator[dict[str, Mesh]]:
    """A started mesh per broker on one store (each its own namespace)."""
    async with open_store(url, **store_options) as store:
        started: dict[str, Mesh] = {}
        made: list[tuple[Any, str, bool]] = []
        try:
            for side, make in brokers.items():
                broker = await make()
                namespace = f"wf{uuid.uuid4().hex[:8]}"
                made.append((broker, namespace, make is nats))
                started[side] = await Mesh(store, broker, namespace).start()
            yield started
        finally:
            for mesh in started.values():
                await mesh.close()
            for broker, namespace, on_nats in made:
                if on_nats:
                    await broker.delete_namespace(namespace)
                await broker.close()


async def in_process() -> Any:
    return InProcessBroker()


async def nats() -> Any:
    from meshpoint.broker.nats import NatsBroker

    return await NatsBroker.connect(NATS_URL, connect_timeout_s=3)


async def on_sqlite(tmp: Path, runs: int, kills: int, progress: Progress) -> dict[str, Any]:
    from langgraph.checkpoint.sqlite import SqliteSaver

    conn = sqlite3.connect(tmp / "lg.db", check_same_thread=False)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    saver = SqliteSaver(conn)
    saver.setup()
    async with meshes_on(f"sqlite:///{tmp}/mp.db", {"meshpoint": in_process}) as meshes:
        result = await compare({**meshes, **graphs(saver)}, runs, "SQLite", progress)
        kill = {"meshpoint": await meshpoint_reruns(meshes["meshpoint"].store._store, in_process,
                                                    kills)}
    conn.close()
    kill["langgraph"] = langgraph_reruns("sqlite", str(tmp / "lg-kill.db"), tmp, kills)
    return {"sides": result, "kill": kill}


@contextmanager
def pg_schemas(*sides: str) -> Iterator[dict[str, str]]:
    """A fresh schema per side, dropped afterwards."""
    import psycopg

    schemas = {side: f"wf_bench_{side}_{uuid.uuid4().hex[:6]}" for side in sides}
    with psycopg.connect(PG_DSN, autocommit=True) as admin:
        for schema in schemas.values():
            admin.execute(f"CREATE SCHEMA {schema}")
    try:
        yield schemas
    finally:
        with psycopg.connect(PG_DSN, autocommit=True) as admin:
            for schema in schemas.values():
                admin.execute(f"DROP SCHEMA {schema} CASCADE")


async def on_postgres(tmp: Path, runs: int, kills: int, progress: Progress, *,
                      with_nats: bool) -> dict[str, Any]:
    from langgraph.checkpoint.postgres import PostgresSaver

    brokers: dict[str, Callable[[], Any]] = {"meshpoint": in_process}
    if with_nats:
        brokers["meshpoint_nats"] = nats
    with pg_schemas("mp", "lg") as schemas:
        lg_url = f"{PG_DSN}?options=-csearch_path%3D{schemas['lg']}"
        with PostgresSaver.from_conn_string(lg_url) as saver:
            saver.setup()
            async with meshes_on(POSTGRES_URL, brokers, schema=schemas["mp"]) as meshes:
                result = await compare({**meshes, **graphs(saver)}, runs, "PostgreSQL",
                                       progress)
                kill = {side: await meshpoint_reruns(meshes["meshpoint"].store._store, make,
                                                     kills)
                        for side, make in brokers.items()}
        kill["langgraph"] = langgraph_reruns("postgres", lg_url, tmp, kills)
    return {"sides": result, "kill": kill}


NAMES = {"meshpoint": "meshpoint (in-process broker)",
         "meshpoint_nats": "meshpoint (NATS JetStream)",
         "langgraph": "LangGraph (durability async, its default)",
         "langgraph_sync": "LangGraph (durability sync)"}


def ratio(side: dict[str, float], peer: dict[str, float]) -> str:
    return f"{side['p50'] / peer['p50']:.2f}, {side['p99'] / peer['p99']:.2f}"


def report(results: dict[str, Any], mode: str, runs: int) -> None:
    table = Table(title=f"a {STAGES}-stage sequential workflow beside a LangGraph graph of "
                        f"{STAGES} nodes ({mode} mode, {runs} workflows a side, "
                        f"{runs * (STAGES - 1)} boundaries; goal: boundary p99 <= "
                        "LangGraph's step p99)")
    for column in ("backend", "side", "end to end p50 / p99 ms", "boundary p50 / p99 ms",
                   "÷ LangGraph: end to end p50, p99", "boundary p50, p99",
                   "÷ LangGraph sync: boundary p50, p99", "goal"):
        table.add_column(column, justify="left" if column in ("backend", "side") else "right")
    for backend, r in results.items():
        sides = r["sides"]
        lg, lg_sync = sides["langgraph"], sides["langgraph_sync"]
        for side, s in sides.items():
            e, b = s["end_to_end"], s["boundary"]
            ratios = ("", "", "", "")
            if not side.startswith("langgraph"):
                met = b["p99"] <= lg["boundary"]["p99"]
                ratios = (ratio(e, lg["end_to_end"]), ratio(b, lg["boundary"]),
                          ratio(b, lg_sync["boundary"]),
                          "[green]met[/green]" if met else "[red]missed[/red]")
            table.add_row(backend, NAMES[side], f"{e['p50']:.2f} / {e['p99']:.2f}",
                          f"{b['p50']:.2f} / {b['p99']:.2f}", *ratios)
    console.print(table)
    kills = Table(title=f"stages run again after a kill in stage {KILLED_AT}: each stage's "
                        "runs summed over the kills (LangGraph: its node 4's run cut short "
                        "by the kill not counted as a re-run)")
    for column in ("backend", "side", "kills", "runs of stages 1-5", "re-runs"):
        kills.add_column(column)
    for backend, r in results.items():
        for side, k in r["kill"].items():
            done = k.items() if side == "langgraph" else [("", k)]
            for durability, d in done:
                name = side if durability in ("", "async") else "langgraph_sync"
                kills.add_row(backend, NAMES[name], str(d["kills"]),
                              " ".join(map(str, d["stage_calls"])), str(d["reruns"]))
    console.print(kills)
    where = Table(title="where a meshpoint stage boundary goes: its store operations, p50 / "
                        "p99 ms (calls a workflow); the rest is the broker's four messages, "
                        "the two turn loops and the A2A parsing")
    where.add_column("backend")
    where.add_column("side")
    for op in OPS:
        where.add_column(op, justify="right")
    where.add_column("boundary p50 less their p50s", justify="right")
    for backend, r in results.items():
        for side, s in r["sides"].items():
            if "store" in s:
                ops = s["store"]
                rest = s["boundary"]["p50"] - sum(ops[op]["p50"] for op in OPS)
                where.add_row(backend, NAMES[side], *(
                    f"{ops[op]['p50']:.2f} / {ops[op]['p99']:.2f} "
                    f"({ops[op]['per_workflow']:g})" for op in OPS), f"{rest:.2f}")
    console.print(where)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mode", choices=MODES, default="quick")
    args = parser.parse_args()
    runs, kills = MODES[args.mode]["runs"], MODES[args.mode]["kills"]
    why = reachable()
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp, Progress(console=console) as progress:
        results["SQLite"] = asyncio.run(on_sqlite(Path(tmp), runs, kills, progress))
        if why["postgres"] is None:
            results["PostgreSQL"] = asyncio.run(on_postgres(
                Path(tmp), runs, kills, progress, with_nats=why["nats"] is None))
    for service, reason in why.items():
        if reason is not None:
            console.print(f"skipping {service}: {reason}")
    report(results, args.mode, runs)
    stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H%M%SZ")
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"{stamp}-{args.mode}-workflows.json"
    out.write_text(json.dumps({
        "date": stamp, "mode": args.mode, "cores": os.cpu_count(),
        "python": platform.python_version(), "stages": STAGES, "killed_at": KILLED_AT,
        "versions": {p: version(p) for p in ("langgraph", "langgraph-checkpoint-sqlite",
                                              "langgraph-checkpoint-postgres")},
        "results": results}, indent=1))
    console.print(f"written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
