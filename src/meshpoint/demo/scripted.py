"""``meshpoint demo``: a coordinator keeps answering while its instances are killed.

On the embedded default (a SQLite file and the in-process broker) the demo runs a
``coordinator`` agent with ``instances`` instances and three peer agents
(``flights``, ``hotels``, ``weather``, two instances each). A client submits
``tasks`` trip requests; each makes the coordinator fan out ``fan_out`` peer calls,
pause (checkpoint, publish, ack, forget), and resume on whichever instance takes
the last answer. Meanwhile coordinator instances are killed at random moments, as
a crash would (nothing in hand is acknowledged, no lease released), and replaced.
A few peer calls stall past their deadline, so timeouts and cancels happen too.
Every trip is booked with a local tool, ``book``, and a share of the bookings
(``approval_rate``) need a human's approval: those tasks pause as ``input_required``
until an approver (a separate client that watches the store, as an operator's
console would) answers through the broker: most are approved, some with edited
arguments, some denied. Whichever instance takes the answer resumes the task.

A share of the tasks (``long_rate``) are long ones, a ``researcher``'s
(:mod:`meshpoint.demo.handoffs`): each runs as a chain of fresh-context iterations,
handed off at least twice, from one instance to whichever takes it, while the
researcher's instances are killed as the coordinator's are.

Another share (``workflow_rate``) are workflow tasks (:mod:`meshpoint.demo.workflows`):
an ``itinerary`` sequential workflow of three stages, each a checkpoint, on
``instances`` instances, whose stages' agents count how often each stage ran.

The demo ends when every task is answered (or ``deadline_s`` passes) and reports
what happened: every task must be completed, each answered once, no row left, and
every task's checkpoint history (a record per checkpoint, handoff, iteration and end,
priced with :data:`DEMO_PRICES`) must verify, and every long task must have handed off
at least twice, never past 0.70 of its model's context window. The coordinator and
the researcher keep an event log of their steps (``events=True``). ``meshpoint verify
--all``, ``meshpoint tasks cost ID``, ``meshpoint events`` (``--type agent_handoff``
too) and ``meshpoint tasks reconstruct ID`` then work on the demo's database.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import random
import sqlite3
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

from meshpoint import a2a
from meshpoint.broker.inprocess import InProcessBroker
from meshpoint.demo import handoffs, workflows
from meshpoint.errors import AlreadyAnsweredError, ConfigurationError, MeshpointError
from meshpoint.history.costs import Prices
from meshpoint.history.planning import HistoryOptions
from meshpoint.llm.base import ModelResponse, ToolSpec
from meshpoint.llm.scripted import ScriptedModel
from meshpoint.runtime import Agent, AgentInstance, Client, LocalTool, Peer, RuntimeOptions
from meshpoint.runtime.options import RecoveryPolicy
from meshpoint.runtime.stats import percentile
from meshpoint.store import open_store

PEERS = ("flights", "hotels", "weather")
#: What recovery does in the demo: its instances die about once a second, which the
#: agents' circuit breakers take for a failing agent. The cool-down is a lease's time
#: (the demo's leases last a second), so that a trip of the breaker holds the agent's
#: tasks briefly, is counted and alerted, and the demo goes on.
DEMO_RECOVERY = RecoveryPolicy(breaker_cooldown_s=1.0)
#: Illustrative prices per million tokens, so that the cost attribution has numbers:
#: the coordinator's scripted model, and each peer agent's.
DEMO_PRICES = {"scripted": {"prompt_tokens": 0.15, "completion_tokens": 0.60},
               **{peer: {"prompt_tokens": 0.10, "completion_tokens": 0.40} for peer in PEERS}}


@dataclass(frozen=True)
class DemoConfig:
    db_path: Path
    tasks: int = 200
    instances: int = 3
    fan_out: int = 3
    #: Tasks in flight at once (the client submits the next as one is answered).
    concurrency: int = 16
    #: Coordinator kills per second (0 = none).
    kill_rate: float = 1.0
    #: Share of peer calls that stall past their deadline (they time out).
    stall_rate: float = 0.02
    peer_timeout_s: float = 2.0
    deadline_s: float = 120.0
    seed: int = 7
    #: Share of bookings that need a human's approval.
    approval_rate: float = 0.25
    #: Share of the tasks that are long ones (a researcher's, handed off to fresh
    #: contexts), rounded down; they run beside the trips, outside ``concurrency``.
    long_rate: float = 0.05
    #: Share of the tasks that are workflow tasks, rounded down (also outside
    #: ``concurrency``).
    workflow_rate: float = 0.05


class StallingPeerModel(ScriptedModel):
    """A peer's scripted model that, for a fixed share of requests (chosen by a hash
    of the request, so a retried request stalls again), thinks for too long."""

    def __init__(self, persona: str, stall_rate: float, stall_s: float) -> None:
        super().__init__(persona, persona=persona, delay_s=0.05)  # a fast LLM call
        self.stall_rate = stall_rate
        self.stall_s = stall_s

    async def complete(self, messages: list[dict[str, Any]],
                       tools: list[ToolSpec]) -> ModelResponse:
        request = str(messages[-1].get("content", "")) if messages else ""
        share = int(hashlib.sha256(request.encode()).hexdigest()[:8], 16) / 0xFFFFFFFF
        if share < self.stall_rate:
            await asyncio.sleep(self.stall_s)
        return await super().complete(messages, tools)


def _share(text: str) -> float:
    """A number in [0, 1] fixed by ``text`` (so a re-run decides the same way)."""
    return int(hashlib.sha256(text.encode()).hexdigest()[:8], 16) / 0xFFFFFFFF


def book(arguments: dict[str, Any]) -> str:
    """Book the trip (the demo's tool that may need approval)."""
    return f"booked {arguments.get('query')}"


class Approver:
    """A human at an operator's console: watches the store for calls waiting for
    approval and answers each through the broker, as ``Client.approve`` does from any
    process. 60 % are approved as asked, 20 % with edited arguments, 20 % denied."""

    def __init__(self, store: Any, client: Client) -> None:
        self.store = store
        self.client = client
        self.seen: set[str] = set()
        self.decided: dict[str, str] = {}

    async def run(self) -> None:
        while True:
            for summary in await self.store.list_paused_tasks(status="input_required",
                                                              limit=1000):
                try:
                    subs = await self.store.get_peer_sub_tasks_for_task(summary.task_id)
                except MeshpointError:
                    continue  # it ended meanwhile
                for sub in subs:
                    if sub.status == "pending" and "approval" in sub.correlation_data \
                            and sub.sub_task_id not in self.seen:
                        # Answers go by the order calls are seen: every run of 5 has
                        # 3 approved as asked, 1 edited and 1 denied.
                        turn = len(self.seen) % 5
                        self.seen.add(sub.sub_task_id)
                        asyncio.get_running_loop().create_task(self._answer(sub, turn))
            await asyncio.sleep(0.05)

    async def _answer(self, sub: Any, turn: int) -> None:
        arguments = sub.correlation_data["approval"]["arguments"]
        try:
            if turn in (0, 1, 2):
                await self.client.approve(sub.task_id, sub.sub_task_id, timeout_s=20)
                self.decided[sub.sub_task_id] = "approved"
            elif turn == 3:
                await self.client.approve(sub.task_id, sub.sub_task_id, {
                    "query": f"{arguments.get('query')} (economy)"}, timeout_s=20)
                self.decided[sub.sub_task_id] = "edited"
            else:
                await self.client.deny(sub.task_id, sub.sub_task_id, "over budget",
                                       timeout_s=20)
                self.decided[sub.sub_task_id] = "denied"
        except AlreadyAnsweredError as error:
            # The instance that took our answer died before replying; its copy was
            # taken again and found our own decision.
            if error.decision and error.decision.get("claimed_by") == self.client.client_id:
                self.decided[sub.sub_task_id] = {"approved": "approved", "denied": "denied"}[
                    error.decision["decision"]]
        except MeshpointError:
            self.seen.discard(sub.sub_task_id)  # try again on the next look


#: The first four bytes of a SQLite write-ahead log (big-endian; the last bit says
#: which byte order its checksums use).
_WAL_MAGIC = (b"\x37\x7f\x06\x82", b"\x37\x7f\x06\x83")
#: The version a SQLite shared-memory index starts with (native byte order), and the
#: size its file grows by.
_SHM_VERSION = 3_007_000
_SHM_PAGE = 32_768


def _sidecars(path: Path) -> list[Path]:
    """The files SQLite keeps beside the database ``path`` in WAL mode."""
    return [Path(f"{path}{suffix}") for suffix in ("-wal", "-shm")]


def _check_sidecars(path: Path) -> None:
    """Refuse to delete a ``-wal`` or ``-shm`` file that is not SQLite's for the
    demo's database: beside no database at all (a new database would even replay a
    stray log), or not in SQLite's format. (Beside a database, SQLite's own log is
    read with it when the database is checked, so its tables and rows count there.)"""
    for sidecar in _sidecars(path):
        if not sidecar.exists():
            continue
        if not path.exists():
            raise ConfigurationError(
                f"{sidecar} exists but {path} does not, so it is not the demo's; the "
                "demo would delete it: name a new file with --db, or delete it yourself")
        with sidecar.open("rb") as file:
            head = file.read(4)
        size = sidecar.stat().st_size
        if sidecar.name.endswith("-wal"):
            ours = size == 0 or head in _WAL_MAGIC
            kind = "a SQLite write-ahead log"
        else:
            ours = size % _SHM_PAGE == 0 and (
                size == 0 or int.from_bytes(head, sys.byteorder) == _SHM_VERSION)
            kind = "a SQLite shared-memory index"
        if not ours:
            raise ConfigurationError(
                f"{sidecar} is not {kind}, so it is not the demo's; the demo would delete "
                "it with its database: name a new file with --db, or delete it yourself")


def _check_replaceable(path: Path) -> None:
    """Refuse to delete a file that is not a previous demo's database (a typo in
    --db): one with tables meshpoint does not have, or with rows of agents other
    than the demo's, or of LangGraph's saver; and its ``-wal`` and ``-shm`` files
    unless they are SQLite's, beside it (:func:`_check_sidecars`)."""
    _check_sidecars(path)
    if not path.exists():
        return
    from meshpoint.store.schema import metadata

    try:
        with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as conn:
            tables = {row[0] for row in conn.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table'")}
            foreign = tables - set(metadata.tables) - {"alembic_version"}
            others = set() if foreign else _other_agents(conn, tables)
    except sqlite3.DatabaseError:
        foreign, others = {"(not a SQLite database)"}, set()
    if foreign:
        raise ConfigurationError(
            f"{path} exists and is not a meshpoint database (it has {sorted(foreign)}); "
            "the demo recreates its file, so name a new one with --db")
    if others:
        raise ConfigurationError(
            f"{path} is a meshpoint database with data the demo did not write (of "
            f"{', '.join(sorted(others))}); the demo recreates its file, so name a new "
            "one with --db, or delete this one yourself")


def _other_agents(conn: sqlite3.Connection, tables: set[str]) -> set[str]:
    """The agents and tenants (and LangGraph's saver) a meshpoint database has rows
    of, other than the demo's (its agents, as the default tenant)."""
    from meshpoint.store.schema import metadata

    demo = ("coordinator", handoffs.RESEARCHER, *PEERS, workflows.ITINERARY,
            *workflows.STAGES)
    marks = ", ".join("?" * len(demo))
    found: set[str] = set()
    for name in sorted(tables & set(metadata.tables)):
        table = metadata.tables[name]
        if name.startswith("agent_langgraph_"):
            if conn.execute(f"SELECT 1 FROM {name} LIMIT 1").fetchone():
                found.add("LangGraph's saver")
            continue
        if "agent_name" in table.c:
            found.update(row[0] for row in conn.execute(
                f"SELECT DISTINCT agent_name FROM {name} WHERE agent_name NOT IN ({marks}) "
                "LIMIT 5", demo))
        if "tenant_id" in table.c:  # the demo writes as the default tenant only
            found.update(f"tenant {row[0]}" for row in conn.execute(
                f"SELECT DISTINCT tenant_id FROM {name} WHERE tenant_id != 'default' "
                "LIMIT 5"))
    return found


def _ms(samples: list[float]) -> dict[str, float | None]:
    p50, p99 = percentile(samples, 50), percentile(samples, 99)
    return {"p50": None if p50 is None else round(p50, 3),
            "p99": None if p99 is None else round(p99, 3)}


class Killer:
    """Kills one agent's instances at random moments (``rate`` a second, exponential
    gaps drawn from ``rng``), as a crash would, and starts a replacement each time."""

    def __init__(self, live: list[AgentInstance], rate: float, rng: random.Random,
                 launch: Callable[[Agent], Any]) -> None:
        self.live, self.rate, self.rng, self.launch = live, rate, rng, launch
        self.kills = 0
        self.next_at = time.monotonic() + (rng.expovariate(rate) if rate > 0
                                           else float("inf"))

    async def step(self) -> None:
        if time.monotonic() < self.next_at:
            return
        victim = self.live.pop(self.rng.randrange(len(self.live)))
        await victim.kill()
        self.kills += 1
        self.live.append(await self.launch(victim.agent))  # a restarted instance
        self.next_at = time.monotonic() + self.rng.expovariate(self.rate)


async def _run(config: DemoConfig, on_progress: Callable[[int, int], None] | None
               ) -> dict[str, Any]:
    _check_replaceable(config.db_path)
    for path in (config.db_path, *_sidecars(config.db_path)):
        path.unlink(missing_ok=True)
    options = RuntimeOptions(lease_ttl_s=1.0, sweep_interval_s=0.2, recovery_interval_s=0.25,
                             request_ack_wait_s=1.5, response_ack_wait_s=1.5, max_deliver=50,
                             announce_check_s=1.0)
    rate = config.approval_rate
    coordinator = Agent("coordinator", ScriptedModel(delay_s=0.01), peers=[
        Peer(name, timeout_s=config.peer_timeout_s) for name in PEERS], tools=[
        LocalTool("book", "Book the trip.", book, approval_timeout_s=60.0,
                  needs_approval=lambda args: _share(str(args.get("query"))) < rate)],
        events=True, recovery=DEMO_RECOVERY)
    researcher = handoffs.researcher(peer_timeout_s=config.peer_timeout_s,
                                     recovery=DEMO_RECOVERY)
    peers = [Agent(name, StallingPeerModel(name, config.stall_rate,
                                           config.peer_timeout_s * 2)) for name in PEERS]
    n_long = handoffs.long_task_count(config.tasks, config.long_rate)
    n_flows = min(config.tasks - n_long,
                  handoffs.long_task_count(config.tasks, config.workflow_rate))
    n_trips = config.tasks - n_long - n_flows
    stage_calls: Counter[tuple[str, str]] = Counter()
    itinerary, stage_agents = workflows.agents(stage_calls, recovery=DEMO_RECOVERY)
    started = time.perf_counter()
    history = HistoryOptions(prices=Prices(DEMO_PRICES))
    async with open_store(f"sqlite:///{config.db_path}", history=history) as store:
        broker = InProcessBroker()
        every: list[AgentInstance] = []

        async def launch(agent: Agent) -> AgentInstance:
            instance = AgentInstance(agent, store, broker, options=options)
            await instance.start()
            every.append(instance)
            return instance

        killers = [Killer([await launch(coordinator) for _ in range(config.instances)],
                          config.kill_rate, random.Random(config.seed), launch)]
        if n_long:
            killers.append(Killer([await launch(researcher) for _ in range(config.instances)],
                                  config.kill_rate, random.Random(config.seed + 1), launch))
        flow_killers = [Killer([await launch(itinerary) for _ in range(config.instances)],
                               config.kill_rate, random.Random(config.seed + 2), launch)
                        ] if n_flows else []
        for agent in [*peers, *(stage_agents if n_flows else [])]:
            for _ in range(2):
                await launch(agent)
        async with Client(broker, namespace=options.namespace) as client, \
                Client(broker, namespace=options.namespace, client_id="approver") as desk:
            approver = Approver(store, desk)
            watching = asyncio.get_running_loop().create_task(approver.run())
            long_ids: list[str] = []
            flow_ids: list[str] = []
            rids: list[str] = []
            deadline = time.monotonic() + config.deadline_s
            while len(client.answers) < config.tasks and time.monotonic() < deadline:
                # Keep `concurrency` trips in flight, as a steady stream of users would.
                in_flight = len(rids) - sum(1 for rid in rids if rid in client.answers)
                while len(rids) < n_trips and in_flight < config.concurrency:
                    trip = len(rids)
                    legs = ", ".join(f"leg {n + 1} of trip {trip}" for n in range(config.fan_out))
                    rids.append(await client.submit("coordinator", f"Plan trip {trip}: {legs}"))
                    in_flight += 1
                # The long tasks run beside the trips, spread over the first three
                # quarters of them (so that they end before the trips do).
                while len(long_ids) < n_long and \
                        len(rids) >= len(long_ids) * n_trips * 3 // (4 * n_long):
                    long_ids.append(await client.submit(
                        handoffs.RESEARCHER, handoffs.long_request(len(long_ids))))
                while len(flow_ids) < n_flows and \
                        len(rids) >= len(flow_ids) * n_trips * 3 // (4 * n_flows):
                    flow_ids.append(await client.submit(
                        workflows.ITINERARY, workflows.request(len(flow_ids))))
                await asyncio.sleep(0.02)
                if on_progress is not None:
                    on_progress(len(client.answers), config.tasks)
                for killer in [*killers, *flow_killers]:
                    await killer.step()
            if on_progress is not None:
                on_progress(len(client.answers), config.tasks)
            # Let the last cleanups (they follow the answers) commit, then count.
            await asyncio.sleep(0.5)
            watching.cancel()
            answers = {rid: client.answers.get(rid, [])
                       for rid in (*long_ids, *flow_ids, *rids)}
        for instance in every:
            await instance.stop()
        await broker.close()
        rows_left = sum((await store.live_row_counts()).values())
        with_history = await store.history.task_ids(limit=config.tasks + 1)
        chains = [await store.history.verify_task(task_id) for task_id in with_history]
        costs = [Decimal(str(record.metrics.cost["total"])) for task_id in with_history
                 if (record := await store.history.get_latest_checkpoint(task_id))]
        long_figures = await handoffs.handoff_figures(
            store, [a[0].id for rid in long_ids if (a := answers[rid])])
    seconds = time.perf_counter() - started
    coordinators = [i for i in every if i.agent.name == "coordinator"]
    researchers = [i for i in every if i.agent.name == handoffs.RESEARCHER]
    itineraries = [i for i in every if i.agent.name == workflows.ITINERARY]

    mesh = coordinators + researchers + itineraries

    def total(what: str, instances: list[AgentInstance] = mesh) -> int:
        return sum(i.stats.counts[what] for i in instances)

    def taken_over(instances: list[AgentInstance] = mesh) -> int:
        # Recovery takes nothing while the breaker is open; a take-over the half-open
        # breaker holds (it gives the one trial) is given up at once: not counted.
        return max(0, total("recovered", instances) - total("breaker_held", instances))

    def completed(rids: list[str]) -> int:
        return sum(1 for rid in rids if answers[rid]
                   and answers[rid][0].status.state is a2a.TaskState.COMPLETED)

    done = completed([*long_ids, *flow_ids, *rids])
    return {
        "submitted": len(rids) + len(long_ids) + len(flow_ids), "completed": done,
        "failed": config.tasks - done,
        "duplicate_answers": sum(max(0, len(a) - 1) for a in answers.values()),
        "checkpoints_written": total("checkpoints"),
        "resumed": total("resumed"),
        "resumed_elsewhere": sum(i.stats.resumed_elsewhere for i in mesh),
        "recovered_after_kill": taken_over(),
        "redelivered_requests": total("started") - len(rids) - len(long_ids)
        - len(flow_ids),
        "timeouts": total("timeout"),
        "approvals_requested": len(approver.seen | set(approver.decided)),
        "approved": sum(d == "approved" for d in approver.decided.values()),
        "approved_edited": sum(d == "edited" for d in approver.decided.values()),
        "denied": sum(d == "denied" for d in approver.decided.values()),
        "kills": killers[0].kills, "instances": config.instances, "fan_out": config.fan_out,
        "long_tasks": len(long_ids), "long_completed": completed(long_ids),
        "researcher_kills": sum(k.kills for k in killers[1:]),
        "workflow_tasks": len(flow_ids), "workflow_completed": completed(flow_ids),
        "workflow_kills": sum(k.kills for k in flow_killers),
        "workflow_stages": len(workflows.STAGES),
        **workflows.figures(stage_calls, [workflows.request(n) for n in range(n_flows)]),
        **long_figures,
        # Of the long tasks: take-overs after their instance died (its lease expired,
        # or its handoff message was lost), and requests delivered again.
        "long_recoveries": taken_over(researchers) + total("handoff_swept", researchers)
        + max(0, total("started", researchers) - len(long_ids)),
        "resumes_held_by_the_breaker": total("breaker_held"),
        # The agents' circuit breakers opening (each instance counts what it opened),
        # and the alerts the instances raised (blocked, expired, breaker, dead letter).
        "breaker_trips": total("breaker_opened"),
        "alerts": sum(len(i.alerts.raised) for i in mesh),
        "rows_left": rows_left,
        "history_records": sum(c.records for c in chains),
        "chains_verified": sum(c.ok for c in chains),
        "chains_failed": sum(not c.ok for c in chains),
        "cost_usd": round(float(sum(costs, Decimal(0))), 6),  # summed exactly
        "a_task": with_history[0] if with_history else None,
        "checkpoint_write_ms": _ms([s for i in mesh for s in i.stats.checkpoint_ms]),
        "pause_resume_ms": _ms([s for i in mesh for s in i.stats.pause_resume_ms]),
        "seconds": round(seconds, 2),
    }


def shortfalls(figures: dict[str, Any]) -> list[str]:
    """What the demo's figures show went wrong (nothing, for a run that proves its
    claims): a task not completed, a row left, a chain that fails verification, a
    workflow stage that ran twice, a long task handed off fewer than twice, or past
    the utilization threshold."""
    found = []
    if figures["completed"] != figures["submitted"]:
        found.append(f"{figures['submitted'] - figures['completed']} task(s) not completed")
    if figures["rows_left"]:
        found.append(f"{figures['rows_left']} live row(s) left behind")
    if figures["chains_failed"]:
        found.append(f"{figures['chains_failed']} history chain(s) fail verification")
    if figures.get("stages_run_again"):
        found.append(f"{figures['stages_run_again']} workflow stage(s) ran twice")
    if figures["long_tasks"]:
        fewest, most = figures["fewest_handoffs_per_long_task"], \
            figures["max_utilization_at_handoff"]
        if fewest is None or fewest < 2:
            found.append(f"a long task handed off {fewest or 0} time(s), not at least twice")
        if most is not None and most >= figures["utilization_threshold"]:
            found.append(f"a handoff came at {most:.2f} of the context window, not under "
                         f"{figures['utilization_threshold']:.2f}")
    return found


def run_demo(config: DemoConfig, *,
             on_progress: Callable[[int, int], None] | None = None) -> dict[str, Any]:
    """Run the demo and return its figures (see the module docstring)."""
    # Instances log every kill's consequences at WARNING; the table tells the story.
    logging.getLogger("meshpoint").setLevel(logging.ERROR)
    return asyncio.run(_run(config, on_progress))
