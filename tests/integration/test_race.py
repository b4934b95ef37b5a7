"""Exactly-once under a race of real OS processes, counted (DESIGN.md invariants 1-3, 8).

Paused tasks each wait on peer sub-tasks whose deadlines have already passed. Every
sub-task is then hit by its answer, a duplicate of the answer (in another process,
in a random order), and by two sweeper processes that resolve expired sub-tasks
with a timeout. The process that completes a join restores the task under its
lease, checks the results, and cleans up; every process also tries to take leases
of tasks it did not complete. Afterwards the counts must match exactly.
"""

from __future__ import annotations

import json
import multiprocessing
import random
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from rich.progress import track
from sqlalchemy import func, select

from meshpoint import TaskExecutionContext
from meshpoint.store import SqlStore, open_store
from meshpoint.store.schema import ended_tasks
from tests.conftest import row_counts
from tests.integration import race_worker
from tests.integration.race_worker import LOCAL_RESULT, WorkerPlan

#: Also raced with PostgreSQL's fast paths off.
pytestmark = [pytest.mark.race, pytest.mark.portable_too]
AGENT = "coordinator"


def paused_task(task_id: str, peers: int) -> TaskExecutionContext:
    ctx = TaskExecutionContext(task_id, {"session_id": task_id})
    ctx.current_invocation_id = "inv"
    ctx.begin_parallel_calls("inv", ["local", *[f"call-{n}" for n in range(peers)]])
    ctx.record_parallel_result("inv", "local", LOCAL_RESULT)
    for n in range(peers):
        # timeout_s=0: the deadline has passed before the race starts, so the sweepers
        # compete with the answers for every single sub-task.
        ctx.register_peer_sub_task(f"{task_id}/sub-{n}", {
            "function_call_id": f"call-{n}", "peer_agent_name": f"peer-{n}", "timeout_s": 0})
    ctx.append_session_event({"role": "user", "text": f"question {task_id}"})
    return ctx


async def run_race(url: str, options: dict[str, Any], tmp_path: Path, *, tasks: int,
                   peers: int, processes: int, seed: int) -> None:
    store: SqlStore = await open_store(url, **options)
    try:
        for n in track(range(tasks), description=f"checkpointing {tasks} paused tasks"):
            await store.checkpoint_task(paused_task(f"task-{n}", peers), AGENT)
        sub_ids = [f"task-{n}/sub-{s}" for n in range(tasks) for s in range(peers)]
        rng = random.Random(seed)
        deliveries = sub_ids * 2  # every answer, and a duplicate of it
        rng.shuffle(deliveries)
        spawn = multiprocessing.get_context("spawn")
        barrier = spawn.Barrier(processes)
        plans = [WorkerPlan(name=f"worker-{w}", url=url, options=options,
                            answers=deliveries[w::processes], sweeper=w < 2, seed=seed + w,
                            out_path=str(tmp_path / f"worker-{w}.json"))
                 for w in range(processes)]
        workers = [spawn.Process(target=race_worker.run, args=(plan, barrier))
                   for plan in plans]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join(timeout=240)
        assert [w.exitcode for w in workers] == [0] * processes, "a racing process failed"
        reports = [json.loads(Path(plan.out_path).read_text()) for plan in plans]

        resolved = [entry for r in reports for entry in r["resolved"]]
        winners = Counter(sub_id for sub_id, *_ in resolved)
        # Invariant 1: every sub-task resolved exactly once, by its answer or its timeout.
        assert len(winners) == len(sub_ids) and set(winners) == set(sub_ids)
        assert max(winners.values()) == 1
        by = Counter(kind for _, kind, _, _ in resolved)
        assert by["answer"] + by["timeout"] == len(sub_ids)
        assert sum(r["lost_answers"] for r in reports) == 2 * len(sub_ids) - by["answer"]
        # The completion counter is exact: each invocation counted 2..total once each
        # (the local tool's result was 1 at checkpoint time).
        counts: dict[str, list[int]] = {}
        for sub_id, _, done, total in resolved:
            assert total == peers + 1
            counts.setdefault(sub_id.rpartition("/")[0], []).append(done)
        assert all(sorted(seen) == list(range(2, peers + 2)) for seen in counts.values())
        # Invariant 3: every join completed once and resumed once, by its completer only.
        joins = Counter(task for r in reports for task in r["joins"])
        resumed = Counter(task for r in reports for task in r["resumed"])
        assert len(joins) == tasks and max(joins.values()) == 1
        assert resumed == joins
        assert sum(r["steals"] for r in reports) == 0
        assert [task for r in reports for task in r["bad_results"]] == []
        # Invariant 8: no live row left behind; the ledger holds each task once, and
        # each task's history its checkpoint and its end, a chain that verifies.
        assert await row_counts(store) == {**dict.fromkeys(await row_counts(store), 0),
                                           "agent_ended_tasks": tasks,
                                           "agent_checkpoints": 2 * tasks,
                                           "agent_checkpoint_heads": tasks}
        for n in range(0, tasks, max(1, tasks // 50)):
            report = await store.history.verify_task(f"task-{n}")
            assert report.ok and report.records == 2, report
        print(f"\nrace on {store.dialect}: {len(sub_ids)} sub-tasks, {processes} processes: "
              f"{by['answer']} answered, {by['timeout']} timed out, "
              f"{sum(r['lost_answers'] for r in reports)} late/duplicate answers ignored, "
              f"{len(joins)} joins completed and resumed once each, 0 rows left")
    finally:
        await store.close()


@pytest.mark.parametrize("backend", [  # the portable bodies race in the smaller ones
    "sqlite", pytest.param("postgres", marks=pytest.mark.postgres)], indirect=True)
async def test_race_of_8_processes_over_5000_sub_tasks(
        empty_database: tuple[str, dict[str, Any]], tmp_path: Path) -> None:
    url, options = empty_database
    await run_race(url, options, tmp_path, tasks=1000, peers=5, processes=8, seed=2026)


@pytest.mark.parametrize("seed", range(3))
async def test_smaller_races_with_other_interleavings(
        empty_database: tuple[str, dict[str, Any]], tmp_path: Path, seed: int) -> None:
    url, options = empty_database
    await run_race(url, options, tmp_path, tasks=60, peers=4, processes=4, seed=seed)


async def _answered_by_h1(store: SqlStore, tasks: list[str], *, lease_ttl_s: float) -> None:
    """Each task paused on two peers, both answered by h1, which holds its lease."""
    from tests.integration.test_store import fan_out

    for task in tasks:
        await store.checkpoint_task(fan_out(task, peers=2), AGENT)
        for n in range(2):
            await store.resolve_peer_sub_task(f"{task}/sub-{n}", "x", lease_owner="h1",
                                              lease_ttl_s=lease_ttl_s)


async def test_a_holders_one_statement_end_against_a_take_over_of_its_expired_lease(
        empty_database: tuple[str, dict[str, Any]], tmp_path: Path) -> None:
    """The fence of a task's end, raced by two processes task by task: the holder
    (h1) ends each task (with its agent's name and context: one statement on
    PostgreSQL) while another (h2), for whom h1's lease has expired, takes it over
    (a ``recovering`` record in the same transaction). Exactly one wins each task;
    the loser changes nothing: an ended task has no row left and its chain ends
    with its end, a task taken over keeps every child row and its chain ends with
    the take-over; every chain verifies (no record on a stale head)."""

    url, options = empty_database
    tasks = [f"t{n}" for n in range(40)]
    store: SqlStore = await open_store(url, **options)
    try:
        await _answered_by_h1(store, tasks, lease_ttl_s=30)
        spawn = multiprocessing.get_context("spawn")
        barrier = spawn.Barrier(2)
        plans = [race_worker.FencePlan(role, url, options, tasks,
                                       str(tmp_path / f"{role}.json"))
                 for role in ("end", "take")]
        workers = [spawn.Process(target=race_worker.run_fence, args=(plan, barrier))
                   for plan in plans]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join(timeout=240)
        assert [w.exitcode for w in workers] == [0, 0], "a racing process failed"
        end_report, take_report = (json.loads(Path(plan.out_path).read_text())
                                   for plan in plans)
        ends, takes = end_report["outcomes"], take_report["outcomes"]
        ended = {t for t in tasks if ends[t] == "ended"}
        took = {t for t in tasks if takes[t] == "took"}
        assert ended | took == set(tasks) and not ended & took, (ends, takes)
        assert all(ends[t] == "refused" for t in took), ends
        assert all(takes[t] == "gone" for t in ended), takes
        # Each end the holder won was the one statement where the store has it.
        assert set(end_report["fast_ends"]) == (ended if store.fast_paths and
                                                 store.dialect == "postgresql" else set())
        counts = await row_counts(store)
        assert counts == {**dict.fromkeys(counts, 0), "agent_paused_tasks": len(took),
                          "agent_peer_sub_tasks": 2 * len(took),
                          "agent_parallel_invocations": len(took),
                          "agent_session_events": len(took),
                          "agent_ended_tasks": len(ended),
                          "agent_checkpoints": 2 * len(tasks),
                          "agent_checkpoint_heads": len(tasks)}, counts
        for task in tasks:
            report = await store.history.verify_task(task)
            assert report.ok and report.records == 2, (task, report)
            last = (await store.history.get_checkpoint_history(task))[0]
            assert last.execution_state.phase == (
                "completed" if task in ended else "recovering"), task
        print(f"\nfence race on {store.dialect} (fast paths {store.fast_paths}): "
              f"{len(ended)} ended by their holder, {len(took)} taken over")
    finally:
        await store.close()


@pytest.mark.parametrize("backend", [  # SQLite ends them all before the first look
    pytest.param(name, marks=pytest.mark.postgres)
    for name in ("postgres", "postgres-portable")], indirect=True)
async def test_a_holder_killed_while_ending_its_tasks_leaves_each_ended_or_whole(
        empty_database: tuple[str, dict[str, Any]], tmp_path: Path) -> None:
    """A process ending its tasks one after another (one statement each on
    PostgreSQL) is killed (SIGKILL) mid-way: every task is either ended whole (no
    row, in the ledger, its chain ending with its end) or untouched (every child
    row, its chain as it was), and every chain verifies."""
    import asyncio
    import os
    import signal

    url, options = empty_database
    tasks = [f"t{n}" for n in range(300)]
    store: SqlStore = await open_store(url, **options)
    try:
        await _answered_by_h1(store, tasks, lease_ttl_s=300)
        plan = race_worker.FencePlan("end", url, options, tasks, str(tmp_path / "end.json"))
        worker = multiprocessing.get_context("spawn").Process(
            target=race_worker.run_fence, args=(plan, None))
        worker.start()
        def ended_so_far(conn: Any) -> int:
            return int(conn.execute(select(func.count()).select_from(ended_tasks)).scalar())

        for _ in range(60000):  # until the first of them ended (at most 2 minutes)
            if await store.run(ended_so_far):  # one cheap count: the ends are fast
                break
            await asyncio.sleep(0.002)
        os.kill(worker.pid or 0, signal.SIGKILL)
        worker.join(timeout=30)
        assert worker.exitcode == -signal.SIGKILL, "the process ended before it was killed"
        counts = await row_counts(store)
        ended = counts["agent_ended_tasks"]
        assert 0 < ended < len(tasks)
        whole = len(tasks) - ended
        assert counts == {**dict.fromkeys(counts, 0), "agent_paused_tasks": whole,
                          "agent_peer_sub_tasks": 2 * whole,
                          "agent_parallel_invocations": whole,
                          "agent_session_events": whole, "agent_ended_tasks": ended,
                          "agent_checkpoints": len(tasks) + ended,
                          "agent_checkpoint_heads": len(tasks)}, counts
        for task in tasks:
            report = await store.history.verify_task(task)
            assert report.ok and report.records in (1, 2), (task, report)
        print(f"\nkilled while ending on {store.dialect}: {ended} ended, {whole} whole")
    finally:
        await store.close()
