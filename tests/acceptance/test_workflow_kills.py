"""A nested workflow (a sequential of a parallel of a loop) served by ``meshpoint
serve`` processes on PostgreSQL + NATS: two processes of each workflow agent, one of
each sub-agent. While a stage runs, the workflow process that asked for it (the one
that ran the task's last turn, by the event log) gets SIGKILL and is replaced, at four
stages of the three workflow agents. Each sub-agent answers each stage of each loop
iteration once (its ledger file counts them), and the caller gets one answer, the one
an uninterrupted run gives.

The in-process kills at every boundary are in tests/integration/test_workflow_crashes.py.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from meshpoint import a2a
from meshpoint.broker.nats import NatsBroker
from meshpoint.events.log import EventStore
from meshpoint.runtime import Agent, Client
from meshpoint.store import SqlStore, open_store
from tests.cluster import Cluster
from tests.conftest import pg_execute_async
from tests.integration.mesh import Mesh, eventually
from tests.integration.workflow_stages import (
    REQUEST,
    Counting,
    digest,
    ledger_counts,
    workflows,
)

pytestmark = [pytest.mark.nats, pytest.mark.postgres, pytest.mark.timeout(180),
              pytest.mark.xdist_group("chaos")]

ROOT = Path(__file__).parents[2]
STAGES = ("research", "outline", "writer", "critic")
#: Where the kills come: as the n-th call of a sub-agent starts (a loop's stage: its
#: n-th iteration), the process of the workflow agent that asked for it (the step
#: ``stage:<key>`` of iteration n) dies.
KILLS = {("research", 1): ("nest", "research"),     # the sequential's first stage
         ("outline", 1): ("fan", "outline"),        # the parallel's branches
         ("critic", 1): ("drafting", "critic"),     # mid-iteration of the loop
         ("writer", 2): ("drafting", "writer")}     # between the loop's iterations


def mesh_yaml(namespace: str, store: dict[str, Any], nats_url: str,
              ledger: Path) -> dict[str, Any]:
    stage_model = {"kind": "python",
                   "factory": "tests.integration.workflow_stages:LedgerModel"}
    return {
        "namespace": namespace, "store": store, "broker": {"url": nats_url},
        "runtime": {"lease_ttl_s": 2.0, "recovery_interval_s": 0.3, "sweep_interval_s": 0.5,
                    "request_ack_wait_s": 2.0, "response_ack_wait_s": 2.0,
                    "drain_timeout_s": 10.0},
        "agents": {
            "nest": {"kind": "sequential", "sub_agents": ["research", "fan"], "events": True},
            "fan": {"kind": "parallel", "sub_agents": ["outline", "drafting"], "events": True},
            "drafting": {"kind": "loop", "sub_agents": ["writer", "critic"],
                         "max_iterations": 3, "events": True},
            **{name: {"model": {**stage_model, "options": {
                "agent": name, "ledger": str(ledger), "delay_s": 1.0}}} for name in STAGES},
        },
    }


async def uninterrupted(tmp_path: Path) -> tuple[str, Counter[tuple[str, str]]]:
    """The nested workflow's answer and sub-agent calls, run in one process."""
    async with await open_store(f"sqlite:///{tmp_path / 'reference.db'}") as store:
        mesh = await Mesh(store).start()
        try:
            counts: Counter[tuple[str, str]] = Counter()
            for name in STAGES:
                await mesh.run(Agent(name, Counting(name, counts)))
            asked, agents = workflows("nested")
            for agent in agents:
                await mesh.run(agent)
            task = await mesh.client.ask(asked, REQUEST, timeout_s=30)
        finally:
            await mesh.close()
    assert task.status.state is a2a.TaskState.COMPLETED and task.status.message is not None
    return task.status.message.text, Counter({(agent, digest(request)): n
                                              for (agent, request), n in counts.items()})


async def asked_by(events: EventStore, agent: str, stage: str, iteration: int) -> str:
    """The instance of ``agent`` that asked for ``stage`` in ``iteration`` (its
    step_start, once its event log wrote it)."""
    found: list[str] = []

    async def logged() -> bool:
        for event in await events.get_events(agent_id=agent, event_type="step_start",
                                             newest_first=True, limit=20):
            if event.step_name == f"stage:{stage}" and \
                    event.input_data.get("iteration") == iteration:
                found.append(event.state_snapshot["instance_id"])
                return True
        return False

    await eventually(logged, timeout_s=10,
                     what=f"{agent}'s step_start of stage:{stage} ({iteration})")
    return found[0]


async def run_with_kills(cluster: Cluster, client: Client, store: SqlStore,
                         ledger: Path) -> tuple[a2a.Task, str, list[tuple[str, str, str]]]:
    """Submit the workflow; kill at :data:`KILLS` as the ledger shows each call start."""
    events = EventStore(store)
    rid = await client.submit("nest", REQUEST)
    answered = asyncio.ensure_future(client.wait(rid, 90))
    calls: Counter[str] = Counter()
    lines = 0
    killed: list[tuple[str, str, str]] = []
    while not answered.done():
        rows = ledger.read_text().splitlines() if ledger.exists() else []
        for row in rows[lines:]:
            agent = json.loads(row)["agent"]
            calls[agent] += 1
            if (agent, calls[agent]) in KILLS:
                workflow, stage = KILLS[agent, calls[agent]]
                instance = await asked_by(events, workflow, stage, calls[agent])
                # A replacement started since says its id when it is ready.
                await asyncio.to_thread(cluster.wait_ready,
                                        [p for p in cluster.alive() if not p.instance_id])
                (proc,) = [p for p in cluster.alive() if p.instance_id == instance]
                cluster.kill_and_restart(proc)
                killed.append((workflow, stage, instance))
        lines = len(rows)
        await asyncio.wait([answered], timeout=0.05)
    return answered.result(), rid, killed


async def test_kill_9_of_workflow_processes_mid_stage_runs_no_stage_twice(
        tmp_path: Path, postgres_url: str, nats_url: str, namespace: str) -> None:
    expected, once = await uninterrupted(tmp_path)
    schema = f"mp_{namespace}"
    store_config = {"url": postgres_url, "schema": schema}
    ledger = tmp_path / "ledger.jsonl"
    cluster = Cluster.write(tmp_path / "cluster", mesh_yaml(namespace, store_config, nats_url,
                                                             ledger))
    cluster.env["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT / "src"), str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
    broker = await NatsBroker.connect(nats_url)
    client = Client(broker, namespace=namespace)
    try:
        cluster.migrate()
        cluster.start({"nest": 2, "fan": 2, "drafting": 2, **dict.fromkeys(STAGES, 1)})
        await client.start()
        async with await open_store(postgres_url, schema=schema, migrate=False) as store:
            try:
                task, rid, killed = await run_with_kills(cluster, client, store, ledger)
            finally:
                codes = cluster.stop()
            assert set((await store.live_row_counts()).values()) == {0}
        assert task.status.state is a2a.TaskState.COMPLETED, (task.status, cluster.logs())
        assert task.status.message is not None and task.status.message.text == expected
        assert [(w, s) for w, s, _ in killed] == list(KILLS.values()), killed
        assert ledger_counts(ledger) == once, "a stage ran again (or never)"
        assert all(code == 0 for code in codes.values()), (codes, cluster.logs())
        assert len(client.answers[rid]) == 1
    finally:
        await client.close()
        await broker.close()
        await pg_execute_async(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
