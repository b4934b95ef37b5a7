"""One racing process of test_race.py: resolves answers, sweeps, resumes and cleans up.

Runs in a spawned OS process with its own store (its own connection pool), and
writes what it won to a JSON file for the parent to count.
"""

from __future__ import annotations

import asyncio
import json
import random
from dataclasses import asdict, dataclass, field
from typing import Any

from meshpoint.errors import NotFoundError, UnknownTaskError
from meshpoint.store import Resolution, SqlStore, open_store

LOCAL_RESULT = {"local": True}


@dataclass
class WorkerPlan:
    name: str
    url: str
    options: dict[str, Any]
    answers: list[str]          # sub-task ids to answer, duplicates included
    sweeper: bool
    seed: int
    out_path: str


@dataclass
class WorkerReport:
    resolved: list[tuple[str, str, int, int]] = field(default_factory=list)  # id, by, done, total
    joins: list[str] = field(default_factory=list)
    resumed: list[str] = field(default_factory=list)
    lost_answers: int = 0       # answers that found the sub-task already resolved
    steals: int = 0             # leases taken on a task someone else was resuming
    bad_results: list[str] = field(default_factory=list)


async def _resume(store: SqlStore, me: str, resolution: Resolution, report: WorkerReport) -> None:
    """Resume a task whose join this worker completed: restore under the lease, check
    every result is there in call order, then remove the task's rows."""
    task_id = resolution.sub_task.task_id
    report.joins.append(task_id)
    restored = await store.restore_task(task_id, lease_owner=me)
    calls = restored.context.parallel_tool_calls[resolution.sub_task.invocation_id]
    ordered = calls.ordered_results()
    expected_order = ["local", *[f"call-{n}" for n in range(len(calls.call_order) - 1)]]
    if [call for call, _ in ordered] != expected_order or ordered[0][1] != LOCAL_RESULT:
        report.bad_results.append(task_id)
    for call, value in ordered[1:]:
        if value != {"answer": f"{task_id}/{call}"} and value.get("status") != "timeout":
            report.bad_results.append(task_id)
    if int(task_id.rpartition("-")[2]) % 2:
        # As the runtime ends a task: its context and agent named (one statement on
        # PostgreSQL); the others through the body.
        await store.cleanup_task(task_id, lease_owner=me, ctx=restored.context,
                                 agent_name="coordinator")
    else:
        await store.cleanup_task(task_id, lease_owner=me)
    report.resumed.append(task_id)


def _record(resolution: Resolution, report: WorkerReport) -> None:
    sub = resolution.sub_task
    report.resolved.append((sub.sub_task_id, sub.resolved_by or "", resolution.completed,
                            resolution.total))


async def _main(plan: WorkerPlan, barrier: Any) -> None:
    rng = random.Random(plan.seed)
    report = WorkerReport()
    async with open_store(plan.url, migrate=False, pool_size=2, **plan.options) as store:
        barrier.wait()  # every process starts racing at once
        for index, sub_task_id in enumerate(plan.answers):
            task_id, _, sub = sub_task_id.rpartition("/")
            call = f"call-{sub.removeprefix('sub-')}"
            answer = {"answer": f"{task_id}/{call}"}
            try:
                if rng.random() < 0.25:
                    # Seed 000's two-step path must be exactly-once as well.
                    claimed = await store.claim_peer_sub_task(sub_task_id)
                    resolution = None if claimed is None else await store.record_parallel_result(
                        task_id, claimed.invocation_id, claimed.function_call_id, answer,
                        lease_owner=plan.name, lease_ttl_s=120)
                else:
                    resolution = await store.resolve_peer_sub_task(
                        sub_task_id, answer, lease_owner=plan.name, lease_ttl_s=120)
            except NotFoundError:
                resolution = None  # late: the task already finished and was cleaned up
            if resolution is None:
                report.lost_answers += 1
            else:
                _record(resolution, report)
                if resolution.join_complete:
                    await _resume(store, plan.name, resolution, report)
            if rng.random() < 0.2:
                # Try to resume a task this worker did not complete: must never succeed.
                try:
                    if await store.take_resume_lease(task_id, plan.name, 120) is not None:
                        if task_id not in report.joins:
                            report.steals += 1
                except UnknownTaskError:
                    pass  # already resumed and cleaned up by its winner
            if plan.sweeper and index % 7 == 0:
                await _sweep(store, plan, report, limit=rng.randint(1, 25))
        while plan.sweeper and await _sweep(store, plan, report, limit=50):
            pass
    with open(plan.out_path, "w") as out:
        json.dump(asdict(report), out)


async def _sweep(store: SqlStore, plan: WorkerPlan, report: WorkerReport, *, limit: int) -> int:
    swept = await store.sweep_expired_timeouts("coordinator", limit, lease_owner=plan.name,
                                               lease_ttl_s=120)
    for resolution in swept:
        _record(resolution, report)
        if resolution.join_complete:
            await _resume(store, plan.name, resolution, report)
    return len(swept)


def run(plan: WorkerPlan, barrier: Any) -> None:
    """Process entry point."""
    asyncio.run(_main(plan, barrier))


# -- test_race.py's fence race: a lease holder's end against a take-over ----------------

@dataclass
class FencePlan:
    role: str  # "end": the holder h1 ends each task; "take": h2 takes each over
    url: str
    options: dict[str, Any]
    tasks: list[str]
    out_path: str


async def _fence(plan: FencePlan, barrier: Any) -> None:
    import time

    from meshpoint.errors import LeaseNotHeldError

    # The taker's clock runs ahead: for it, h1's lease has expired.
    ahead = 1000.0 if plan.role == "take" else 0.0
    outcomes: dict[str, str] = {}
    async with open_store(plan.url, migrate=False, pool_size=2,
                          clock=lambda: time.time() + ahead, **plan.options) as store:
        ctxs = {task: (await store.restore_task(task, lease_owner="h1")).context
                for task in plan.tasks} if plan.role == "end" else {}
        rng = random.Random(plan.role)
        one_statement = store._fast.cleanup
        fast_ends: list[str] = []

        async def counted(params: dict[str, Any]) -> Any:
            done = await one_statement(params)
            if isinstance(done, int):
                fast_ends.append(params["p_task"])
            return done

        store._fast.cleanup = counted  # type: ignore[method-assign]
        for task in plan.tasks:
            if barrier is None:  # ending alone, until killed
                await store.cleanup_task(task, lease_owner="h1", ctx=ctxs[task],
                                         agent_name="coordinator")
                continue
            barrier.wait()  # both processes act on this task at once
            await asyncio.sleep(rng.uniform(0, 0.002))
            try:
                if plan.role == "end":
                    await store.cleanup_task(task, lease_owner="h1", ctx=ctxs[task],
                                             agent_name="coordinator")
                    outcomes[task] = "ended"
                else:
                    lease = await store.recovery.take_over_task(task, "h2", 30,
                                                                agent_name="coordinator")
                    outcomes[task] = "held" if lease is None else "took"
            except LeaseNotHeldError:
                outcomes[task] = "refused"
            except UnknownTaskError:
                outcomes[task] = "gone"
    with open(plan.out_path, "w") as out:
        json.dump({"outcomes": outcomes, "fast_ends": fast_ends}, out)


def run_fence(plan: FencePlan, barrier: Any) -> None:
    """Process entry point of the fence race."""
    asyncio.run(_fence(plan, barrier))
