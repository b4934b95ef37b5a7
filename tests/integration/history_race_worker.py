"""One process of the history race (test_history_race.py): in each round (a tenant of
its own), either purges that tenant's ended chains or checkpoints the ended tasks'
ids anew (their chains go on from where they ended), both at once."""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

from meshpoint import TaskExecutionContext
from meshpoint.history.integrity import SigningKeys
from meshpoint.history.planning import HistoryOptions
from meshpoint.store import open_store

AGENT = "ag"


@dataclass(frozen=True)
class Plan:
    role: str  # "purge" or "restart"
    url: str
    options: dict[str, Any]
    seed: str  # the Ed25519 signing key, shared by every process
    rounds: int
    tasks: int
    out_path: str
    policy: str = "last:2"  # the retention the purge applies
    ahead_s: float = 0.0  # how far ahead of the real clock the purge's clock runs


def history(seed: str, retention: str | None = None) -> HistoryOptions:
    return HistoryOptions(signing=SigningKeys.from_config({"k1": seed}, "k1"),
                          retention=retention)


def fresh(task_id: str) -> TaskExecutionContext:
    ctx = TaskExecutionContext(task_id, {"session_id": task_id})
    ctx.append_session_event({"role": "user", "text": "again"})
    return ctx


def run(plan: Plan, barrier: Any) -> None:
    asyncio.run(_run(plan, barrier))


async def _run(plan: Plan, barrier: Any) -> None:
    seen: Counter[str] = Counter()
    rng = random.Random(plan.role)
    def clock() -> float:
        return time.time() + plan.ahead_s

    async with open_store(plan.url, history=history(plan.seed, plan.policy), pool_size=2,
                          clock=clock, **plan.options) as store:
        for r in range(plan.rounds):
            tenant = store.for_tenant(f"r{r}")
            barrier.wait()
            if plan.role == "purge":
                for purged in await tenant.history.purge():
                    seen["purged" if purged.skipped is None else "skipped"] += 1
                continue
            await asyncio.sleep(rng.uniform(0, 0.004))
            for n in reversed(range(plan.tasks)):
                try:
                    await tenant.checkpoint_task(fresh(f"t{n}"), AGENT, status="working",
                                                 holder="w")
                    seen["restarted"] += 1
                except Exception as error:  # counted: the test says which
                    seen[f"{type(error).__name__}: {error}"] += 1
    with open(plan.out_path, "w") as out:
        json.dump(dict(seen), out)
