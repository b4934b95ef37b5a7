"""One racing approver of test_approval_race.py: answers every pending call it is given
(approve, edited or not, deny, or a reply in words) with :func:`decide`, as
``meshpoint tasks approve`` does, and writes what it won and what it was told to a
JSON file for the parent to count.
"""

from __future__ import annotations

import asyncio
import json
import random
from dataclasses import asdict, dataclass, field
from typing import Any

from meshpoint.errors import AlreadyAnsweredError, NotPendingError
from meshpoint.runtime.approvals import Answer, Approve, Deny, Reply, decide
from meshpoint.store import open_store


@dataclass
class ApproverPlan:
    name: str
    url: str
    options: dict[str, Any]
    calls: list[tuple[str, str]]  # (task id, call id), in this approver's order
    seed: int
    out_path: str


@dataclass
class ApproverReport:
    #: (call id, decision) of every answer of this approver that was recorded.
    won: list[tuple[str, str]] = field(default_factory=list)
    #: (call id, the decision it was told had won, by whom) of every approve or deny
    #: refused because the call was answered first.
    told: list[tuple[str, str, str]] = field(default_factory=list)
    #: Replies refused because every call of their task was answered first.
    replies_refused: int = 0
    #: Answers accepted (a reply may decide several calls).
    accepted: int = 0
    #: Join-completing answers, by task: each must complete its task's join once.
    completed: list[str] = field(default_factory=list)


def _answer(rng: random.Random, call_id: str, name: str) -> Answer:
    roll = rng.random()
    if roll < 0.4:
        return Approve(call_id=call_id, by=name)
    if roll < 0.6:
        return Approve(call_id=call_id, arguments={"query": f"edited by {name}"}, by=name)
    if roll < 0.9:
        return Deny(call_id=call_id, reason=f"no, says {name}", by=name)
    return Reply(text=f"ask {name} first", by=name)


async def _main(plan: ApproverPlan, barrier: Any) -> None:
    rng = random.Random(plan.seed)
    report = ApproverReport()
    async with open_store(plan.url, migrate=False, pool_size=2, **plan.options) as store:
        barrier.wait()  # every approver starts at once
        for task_id, call_id in plan.calls:
            answer = _answer(rng, call_id, plan.name)
            try:
                decided = await decide(store, task_id, answer, by=plan.name,
                                       lease_owner=plan.name)
            except (AlreadyAnsweredError, NotPendingError) as error:
                if isinstance(answer, Reply):  # the task waits for nothing any more
                    report.replies_refused += 1
                    continue
                assert isinstance(error, AlreadyAnsweredError), error
                assert error.decision is not None, error
                report.told.append((call_id, error.decision["decision"],
                                    str(error.decision.get("claimed_by"))))
                continue
            report.accepted += 1
            report.won.extend((d["call_id"], d["decision"]) for d in decided.decisions)
            if decided.completing is not None:
                report.completed.append(task_id)
    with open(plan.out_path, "w") as out:
        json.dump(asdict(report), out)


def run(plan: ApproverPlan, barrier: Any) -> None:
    """Process entry point."""
    asyncio.run(_main(plan, barrier))
