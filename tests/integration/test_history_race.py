"""The checkpoint history under a race of real OS processes (issue 15 §2, §4): a
purge of ended chains and the checkpoints that continue them, at once.

The id of a task that ended, and whose end the ledger forgot, may be checkpointed
again: its chain goes on from where it ended. A purge of that chain moves where it
starts and signs its head anew (``last:2``), or removes it whole (``days:1``, the
purge's clock two days ahead) meanwhile. The new record must then be planned on the
head as it is now, or as a first record; before, it was written with the head's old
start under a signature for that start, and the head no longer verified (7 of 150
chains on SQLite, 8 of 150 on PostgreSQL, in a review's race). Every chain must
verify, signatures included, and every restart must have succeeded."""

from __future__ import annotations

import json
import multiprocessing
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from meshpoint.history.integrity import private_seed
from meshpoint.store import open_store
from tests.integration import history_race_worker as worker

pytestmark = [pytest.mark.race, pytest.mark.portable_too]
ROUNDS, TASKS = 12, 5


@pytest.mark.parametrize(("policy", "ahead_s"), [("last:2", 0.0), ("days:1", 2 * 86_400.0)])
async def test_a_purge_racing_the_restart_of_ended_chains_leaves_every_chain_verifiable(
        empty_database: tuple[str, dict[str, Any]], tmp_path: Path, policy: str,
        ahead_s: float) -> None:
    url, options = empty_database
    seed = private_seed(Ed25519PrivateKey.generate())
    async with open_store(url, history=worker.history(seed), **options) as store:
        for r in range(ROUNDS):  # per round, a tenant whose TASKS tasks ended
            tenant = store.for_tenant(f"r{r}")
            for n in range(TASKS):
                ctx = worker.fresh(f"t{n}")
                await tenant.checkpoint_task(ctx, worker.AGENT, status="working",
                                             holder="w")
                for k in range(3):
                    ctx.append_session_event({"role": "model", "text": str(k)})
                    await tenant.checkpoint_task(ctx, worker.AGENT, status="working",
                                                 lease_owner="w", holder="w")
                await tenant.cleanup_task(f"t{n}", lease_owner="w", ctx=ctx)  # 5 records
            await tenant.forget_ended_tasks(worker.AGENT, older_than_s=1e-9)

    spawn = multiprocessing.get_context("spawn")
    barrier = spawn.Barrier(2)
    plans = [worker.Plan(role=role, url=url, options=options, seed=seed, rounds=ROUNDS,
                         tasks=TASKS, out_path=str(tmp_path / f"{role}.json"),
                         policy=policy, ahead_s=ahead_s if role == "purge" else 0.0)
             for role in ("purge", "restart")]
    processes = [spawn.Process(target=worker.run, args=(plan, barrier)) for plan in plans]
    for process in processes:
        process.start()
    for process in processes:
        process.join(timeout=240)
    assert [p.exitcode for p in processes] == [0, 0], "a racing process failed"
    seen: Counter[str] = Counter()
    for plan in plans:
        seen.update(json.loads(Path(plan.out_path).read_text()))
    assert seen["restarted"] == ROUNDS * TASKS, seen  # every restart was written

    async with open_store(url, history=worker.history(seed), migrate=False,
                          **options) as store:
        reports = []
        for r in range(ROUNDS):
            tenant = store.for_tenant(f"r{r}")
            assert await tenant.history.headless_task_ids() == []
            reports += [await tenant.history.verify_task(task_id)
                        for task_id in await tenant.history.task_ids()]
            for n in range(TASKS):  # and each restarted task restores, verified
                assert (await tenant.restore_task(f"t{n}", lease_owner="w")).context
    bad = [(r.task_id, r.reason) for r in reports if not r.ok]
    assert len(reports) == ROUNDS * TASKS and bad == [], bad
    print(f"\nhistory race on {url.split(':')[0]} ({policy}): {ROUNDS * TASKS} ended chains "
          f"restarted while purged ({seen['purged']} purged, {seen['skipped']} skipped as "
          "changed meanwhile): every chain verifies, signatures included")
