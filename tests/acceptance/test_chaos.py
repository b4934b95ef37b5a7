"""Chaos: real ``meshpoint serve`` processes on a real database and NATS, SIGKILLed.

3 coordinator processes and 2 processes for each of 3 peer agents. 300 tasks, each
fanning out to the 3 peers. Every 2 s a random process gets SIGKILL and is
restarted. Afterwards:

* every task was answered exactly once, ``completed`` (what the caller sees: the
  runtime may publish an answer again after a take-over, and the broker drops the
  repeat by its msg_id);
* every sub-task was resolved exactly once: each answer holds each peer's result
  once (none lost, none twice, no timeout; the database claim refuses a second
  resolution), and each sub-task's answer subject holds exactly one message;
* nothing was dead-lettered, with the default ``max_deliver`` of 5;
* no live row is left in the database, and the dead-letter subjects are empty;
* every process still running exits 0 on SIGTERM (it drains).

Variants: PostgreSQL (the main run), PostgreSQL stopped for a few seconds mid-run
(tasks stall, then all finish), and several processes on one SQLite file. A fourth
run has every task hand off to a fresh-context iteration between two fan-outs.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import re
import shutil
import sqlite3
import subprocess
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from meshpoint import a2a
from meshpoint.broker.nats import NatsBroker
from meshpoint.runtime import Client
from meshpoint.store import open_store
from tests.cluster import PEERS, Cluster, mesh_config
from tests.conftest import forget_namespace, service_missing

#: On one worker of a parallel run, one run after another (each loads both cores).
pytestmark = [pytest.mark.chaos, pytest.mark.nats, pytest.mark.timeout(420),
              pytest.mark.xdist_group("chaos")]

TASKS = 300
KILL_EVERY_S = 2.0
#: Submissions are paced so that the kills land on work in flight.
SUBMIT_PER_S = 12.0
RESULT = re.compile(r"^- ask_(\w+)\((\w+)\) = \[(\w+)\] ", re.M)


def pg_cluster_command(action: str) -> list[str]:
    versions = sorted(Path("/etc/postgresql").iterdir()) if Path(
        "/etc/postgresql").is_dir() else []
    if not versions or shutil.which("pg_ctlcluster") is None or os.geteuid() not in (
            0, *_postgres_uid()):
        service_missing("restarting PostgreSQL needs pg_ctlcluster (Debian's "
                        "postgresql-common), a local cluster, and root or the postgres user")
    return ["pg_ctlcluster", "--skip-systemctl-redirect", versions[-1].name, "main", action]


def _postgres_uid() -> list[int]:
    import pwd

    try:
        return [pwd.getpwnam("postgres").pw_uid]
    except KeyError:
        return []


async def run_chaos(cluster: Cluster, nats_url: str, namespace: str, *,
                    pg_outage_at: float | None = None, tasks: int = TASKS,
                    submit_per_s: float = SUBMIT_PER_S) -> dict[str, Any]:
    broker = await NatsBroker.connect(nats_url)
    loop = asyncio.get_running_loop()
    rng = random.Random(7)
    figures: dict[str, Any] = {"pg_outage_s": 0.0}
    try:
        async with Client(broker, namespace=namespace) as client:
            started = loop.time()
            request_ids: list[str] = []

            async def submit_all() -> None:
                for n in range(tasks):
                    request_ids.append(await client.submit(
                        "coordinator", f"Trip {n}: flights, hotels, weather"))
                    await asyncio.sleep(1 / submit_per_s)

            async def chaos() -> None:
                outage_done = pg_outage_at is None
                while True:
                    await asyncio.sleep(KILL_EVERY_S)
                    victim = rng.choice(cluster.alive())
                    await asyncio.to_thread(cluster.kill_and_restart, victim)
                    if not outage_done and loop.time() - started >= pg_outage_at:
                        outage_done = True
                        figures["pg_outage_s"] = await pg_outage()

            submitting = asyncio.create_task(submit_all())
            killing = asyncio.create_task(chaos())
            try:
                await submitting
                deadline = loop.time() + 180
                while (len(client.answers) < tasks and loop.time() < deadline
                       and not killing.done()):
                    await asyncio.sleep(0.2)
            finally:
                if killing.done():
                    killing.result()  # the chaos loop failed: say why
                killing.cancel()
                await asyncio.gather(killing, return_exceptions=True)
            figures["seconds"] = round(loop.time() - started, 1)
            # Would a duplicate still arrive? Past a lease and an ack wait, a re-run
            # would have answered by now.
            await asyncio.sleep(6.0)
            figures["answers"] = {rid: list(client.answers.get(rid, [])) for rid in request_ids}
        figures["dead_letters"] = await broker.subject_counts(namespace, "deadletter.>")
        figures["responses"] = {
            **await broker.subject_counts(namespace, "a2a.v1.agent.response.coordinator.*"),
            **await broker.subject_counts(namespace, "a2a.v1.instance.*.*.response.*")}
    finally:
        await broker.close()
    return figures


async def pg_outage() -> float:
    """Stop PostgreSQL for 3 s, then start it again; returns how long it was down."""
    began = time.monotonic()
    await asyncio.to_thread(subprocess.run, pg_cluster_command("stop"), check=True,
                            capture_output=True, timeout=60)
    await asyncio.sleep(3.0)
    await asyncio.to_thread(subprocess.run, pg_cluster_command("start"), check=True,
                            capture_output=True, timeout=60)
    return round(time.monotonic() - began, 1)


def check_exactly_once(figures: dict[str, Any], cluster: Cluster) -> None:
    answers: dict[str, list[a2a.Task]] = figures["answers"]
    unanswered = [rid for rid, got in answers.items() if not got]
    twice = {rid: len(got) for rid, got in answers.items() if len(got) > 1}
    assert not unanswered, (f"{len(unanswered)} of {TASKS} tasks unanswered after "
                            f"{figures['seconds']}s\n{cluster.logs()}")
    assert not twice, f"tasks answered more than once: {twice}"
    for rid, (task,) in answers.items():
        assert task.status.state == a2a.TaskState.COMPLETED, (rid, task.status)
        text = task.status.message.parts[0].text  # type: ignore[union-attr]
        results = RESULT.findall(text)
        # One result per peer, each from that peer: resolved once, not timed out.
        assert sorted(tool for tool, _, _ in results) == sorted(PEERS), text
        assert all(tool == topic == persona for tool, topic, persona in results), text
    # Each sub-task's answer is in the stream once (a peer's re-run after a kill sends
    # the same msg_id). Answers to tasks waiting in an instance's memory (a failed
    # checkpoint while PostgreSQL was down) went to that instance's inbox; a task
    # whose instance then died ran again with new sub-tasks, so there may be more.
    per_sub = Counter(subject.rsplit(".", 1)[-1] for subject, n in
                      figures["responses"].items() for _ in range(n))
    assert set(per_sub.values()) == {1}, Counter(per_sub.values())
    if figures["pg_outage_s"]:
        assert len(per_sub) >= TASKS * len(PEERS)
    else:
        assert len(per_sub) == TASKS * len(PEERS)
    assert figures["dead_letters"] == {}, figures["dead_letters"]


async def live_rows(url: str, schema: str | None) -> dict[str, int]:
    async with open_store(url, schema=schema, migrate=False) as store:
        return await store.live_row_counts()


def start_cluster(tmp_path: Path, namespace: str, store: dict[str, Any],
                  nats_url: str) -> Cluster:
    cluster = Cluster.write(tmp_path / "cluster", mesh_config(namespace, store, nats_url))
    cluster.migrate()
    cluster.start({"coordinator": 3, **{p: 2 for p in PEERS}})
    return cluster


@pytest.mark.parametrize("variant", [
    "postgres", pytest.param("postgres-restart", marks=pytest.mark.serial), "sqlite"])
async def test_kill_9_chaos_answers_every_task_exactly_once(
        variant: str, tmp_path: Path, nats_url: str, request: pytest.FixtureRequest) -> None:
    namespace = f"chaos{uuid.uuid4().hex[:10]}"
    schema: str | None = None
    if variant == "sqlite":
        url = f"sqlite:///{tmp_path / 'mesh.db'}"
        store: dict[str, Any] = {"url": url}
    else:
        url = request.getfixturevalue("postgres_url")
        schema = f"mp_{namespace}"
        store = {"url": url, "schema": schema}
    if variant == "postgres-restart":
        pg_cluster_command("start")  # can this machine restart PostgreSQL at all?
    cluster = start_cluster(tmp_path, namespace, store, nats_url)
    try:
        figures = await run_chaos(cluster, nats_url, namespace, pg_outage_at=(
            6.0 if variant == "postgres-restart" else None))
    finally:
        codes = cluster.stop()
    try:
        print(f"\n{variant}: {TASKS} tasks in {figures['seconds']}s, {cluster.kills} kills, "
              f"PostgreSQL down {figures['pg_outage_s']}s")
        assert cluster.kills >= 5
        check_exactly_once(figures, cluster)
        assert all(code == 0 for code in codes.values()), (codes, cluster.logs())
        assert set((await live_rows(url, schema)).values()) == {0}
        if variant == "sqlite":  # the file itself, after the kills and checkpoints
            with contextlib.closing(sqlite3.connect(tmp_path / "mesh.db")) as conn:
                assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
    finally:
        await forget_namespace(nats_url, namespace)
        if schema is not None:
            from tests.conftest import pg_execute_async

            await pg_execute_async(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


#: The handoff variant: fewer tasks, each making two rounds in two iterations.
HANDOFF_TASKS = 60
ROUND_RESULT = re.compile(r"^- ask_(\w+)\((\w+) \(round (\d)\)\) = \[(\w+)\] ", re.M)


async def test_kill_9_during_handoffs_gives_one_next_iteration_and_one_answer(
        tmp_path: Path, nats_url: str, request: pytest.FixtureRequest) -> None:
    """Every task fans out to the three peers, hands off (its model asks for a fresh
    context), and fans out again in its next iteration on any instance, while a random
    process is SIGKILLed every 2 s (PostgreSQL + NATS). Every task is answered once,
    with each peer's result once per round; each task's history holds exactly one
    handoff and one next iteration; every chain verifies; no live row is left."""
    namespace = f"chaos{uuid.uuid4().hex[:10]}"
    url = request.getfixturevalue("postgres_url")
    schema = f"mp_{namespace}"
    config = mesh_config(namespace, {"url": url, "schema": schema}, nats_url)
    coordinator = config["agents"]["coordinator"]
    coordinator["model"].update(rounds=2, handoff_after=1)
    coordinator["handoff"] = {"context_utilization": None}
    cluster = Cluster.write(tmp_path / "cluster", config)
    cluster.migrate()
    cluster.start({"coordinator": 3, **{p: 2 for p in PEERS}})
    try:
        figures = await run_chaos(cluster, nats_url, namespace, tasks=HANDOFF_TASKS,
                                  submit_per_s=3.0)
    finally:
        codes = cluster.stop()
    try:
        print(f"\nhandoffs: {HANDOFF_TASKS} tasks in {figures['seconds']}s, "
              f"{cluster.kills} kills")
        assert cluster.kills >= 5
        answers: dict[str, list[a2a.Task]] = figures["answers"]
        assert all(len(got) == 1 for got in answers.values()), {
            rid: len(got) for rid, got in answers.items() if len(got) != 1}
        async with open_store(url, schema=schema, migrate=False) as store:
            for task, in answers.values():
                assert task.status.state == a2a.TaskState.COMPLETED, task.status
                text = task.status.message.parts[0].text  # type: ignore[union-attr]
                results = ROUND_RESULT.findall(text)
                assert sorted((tool, rnd) for tool, _, rnd, _ in results) == sorted(
                    (peer, rnd) for peer in PEERS for rnd in "12"), text
                assert all(tool == topic == persona for tool, topic, _, persona in results)
                records = await store.history.get_checkpoint_history(task.id)
                phases = Counter(r.execution_state.phase for r in records)
                assert (phases["handoff"], phases["iteration"]) == (1, 1), phases
                assert (await store.history.verify_task(task.id)).ok
            assert set((await store.live_row_counts()).values()) == {0}
        per_sub = Counter(subject.rsplit(".", 1)[-1] for subject, n in
                          figures["responses"].items() for _ in range(n))
        assert set(per_sub.values()) == {1} and len(per_sub) == HANDOFF_TASKS * 6
        assert figures["dead_letters"] == {}, figures["dead_letters"]
        assert all(code == 0 for code in codes.values()), (codes, cluster.logs())
    finally:
        await forget_namespace(nats_url, namespace)
        from tests.conftest import pg_execute_async

        await pg_execute_async(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
