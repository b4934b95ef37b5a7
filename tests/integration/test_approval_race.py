"""Racing approvers in real OS processes, counted (issue 14 §6: "two approvers racing,
exactly one wins, N runs"; DESIGN.md invariants 1 and 3 for the human's items).

Tasks wait on two approvals each. Several processes answer every call, each in its
own order and each its own way (approve as given, approve with edited arguments,
deny, or a reply in words, which answers every pending call of the task), as
several humans with ``meshpoint tasks approve`` would. Afterwards: each call has
exactly one recorded decision, every refused approve or deny was told the decision
that won and who made it, and each task's join completed once.
"""

from __future__ import annotations

import json
import multiprocessing
import random
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from meshpoint import TaskExecutionContext
from meshpoint.runtime.approvals import APPROVAL, as_decision
from meshpoint.store import SqlStore, open_store
from tests.integration import approval_race_worker
from tests.integration.approval_race_worker import ApproverPlan

pytestmark = [pytest.mark.race, pytest.mark.portable_too]
AGENT = "coordinator"
CALLS = 2
SCHEMA = {"type": "object", "properties": {"query": {"type": "string"}},
          "required": ["query"], "additionalProperties": False}


def waiting_for_approval(task_id: str) -> TaskExecutionContext:
    """A task whose turn ran a local tool and waits for a human on two more calls."""
    ctx = TaskExecutionContext(task_id, {"session_id": task_id})
    ctx.current_invocation_id = "inv"
    ctx.begin_parallel_calls("inv", ["local", *[f"call-{n}" for n in range(CALLS)]])
    ctx.record_parallel_result("inv", "local", {"local": True})
    for n in range(CALLS):
        ctx.register_peer_sub_task(f"{task_id}/approval-{n}", {
            "function_call_id": f"call-{n}", "timeout_s": 600,
            APPROVAL: {"tool": "send", "description": "Send it.",
                       "arguments": {"query": f"{task_id} #{n}"}, "parameters": SCHEMA}})
    return ctx


async def race(url: str, options: dict[str, Any], tmp_path: Path, *, tasks: int,
               processes: int, seed: int) -> None:
    store: SqlStore = await open_store(url, **options)
    try:
        task_ids = [f"task-{n}" for n in range(tasks)]
        for task_id in task_ids:
            await store.checkpoint_task(waiting_for_approval(task_id), AGENT,
                                        status="input_required")
        calls = [(t, f"{t}/approval-{n}") for t in task_ids for n in range(CALLS)]
        spawn = multiprocessing.get_context("spawn")
        barrier = spawn.Barrier(processes)
        plans = []
        for w in range(processes):
            mine = list(calls)  # every approver answers every call, in its own order
            random.Random(seed * 100 + w).shuffle(mine)
            plans.append(ApproverPlan(name=f"approver-{w}", url=url, options=options,
                                      calls=mine, seed=seed * 100 + w,
                                      out_path=str(tmp_path / f"approver-{w}.json")))
        workers = [spawn.Process(target=approval_race_worker.run, args=(plan, barrier))
                   for plan in plans]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join(timeout=240)
        assert [w.exitcode for w in workers] == [0] * processes, "an approver failed"
        reports = {plan.name: json.loads(Path(plan.out_path).read_text()) for plan in plans}

        # Exactly one decision recorded per call, and it is the one stored.
        won = {(call_id, name): decision for name, r in reports.items()
               for call_id, decision in r["won"]}
        winners = Counter(call_id for call_id, _ in won)
        assert set(winners) == {call_id for _, call_id in calls}
        assert max(winners.values()) == 1
        stored = {}
        for task_id in task_ids:
            for sub in await store.get_peer_sub_tasks_for_task(task_id):
                assert sub.status == "resolved" and sub.resolved_by == "human"
                stored[sub.sub_task_id] = as_decision(sub.result)
        for (call_id, name), decision in won.items():
            assert (stored[call_id]["decision"], stored[call_id]["claimed_by"]) == (decision,
                                                                                  name)
        # Each refused approve or deny was told the decision that stands, and by whom.
        told = [entry for r in reports.values() for entry in r["told"]]
        for call_id, decision, by in told:
            assert (decision, by) == (stored[call_id]["decision"],
                                      stored[call_id]["claimed_by"])
        # Every answer given was accepted, or refused with a reason: none vanished.
        replies_refused = sum(r["replies_refused"] for r in reports.values())
        accepted = sum(r["accepted"] for r in reports.values())
        assert accepted + len(told) + replies_refused == processes * len(calls)
        # Each task's join completed once, by the answer that won its last call.
        completed = Counter(task for r in reports.values() for task in r["completed"])
        assert set(completed) == set(task_ids) and max(completed.values()) == 1
        resumable = {t.task_id for t in await store.list_paused_tasks(limit=tasks + 1)
                     if t.status == "resuming"}
        assert resumable == set(task_ids)
        kinds = Counter(decision for decision in won.values())
        print(f"\napproval race on {store.dialect}: {len(calls)} calls, {processes} "
              f"approvers: {dict(kinds)} recorded once each, {len(told)} answers told "
              f"who won, {replies_refused} replies too late, {len(completed)} joins "
              "completed once each")
    finally:
        await store.close()


@pytest.mark.parametrize("seed", range(2))
async def test_racing_approvers_in_separate_processes_exactly_one_wins(
        empty_database: tuple[str, dict[str, Any]], tmp_path: Path, seed: int) -> None:
    url, options = empty_database
    await race(url, options, tmp_path, tasks=100, processes=4, seed=seed)
