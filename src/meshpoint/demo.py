"""``meshpoint demo``: paused tasks resumed exactly once by racing instances.

On the embedded default (a SQLite file) the demo checkpoints ``tasks`` paused
tasks, each waiting on ``fan_out`` peer answers, then starts ``instances`` OS
processes that compete for every event the way agent instances behind a queue
group would: each answer is delivered twice (at-least-once delivery), some peers
never answer so their deadlines expire, and every instance also sweeps expired
deadlines. The instance whose event completes a join resumes the task under its
lease and removes its rows. The result table shows that every sub-task was
resolved once, every task resumed once, and no row was left behind.

The agent runtime (models, brokers, peers that really run) replaces this demo's
simulated answers in a later release; the store underneath is the same.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import random
import sqlite3
import statistics
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from meshpoint import TaskExecutionContext
from meshpoint.errors import ConfigurationError, UnknownSubTaskError
from meshpoint.store import Resolution, SqlStore, open_store

AGENT = "coordinator"


@dataclass(frozen=True)
class DemoConfig:
    db_path: Path
    tasks: int = 300
    fan_out: int = 3
    instances: int = 3
    silent_peer_rate: float = 0.1   # share of peers that never answer
    timeout_s: float = 3.0
    seed: int = 7


def _paused_task(task_id: str, fan_out: int, timeout_s: float) -> TaskExecutionContext:
    ctx = TaskExecutionContext(task_id, {"session_id": f"session-{task_id}"})
    ctx.current_invocation_id = f"{task_id}/turn-1"
    ctx.append_session_event({"role": "user", "text": f"Research question {task_id}"})
    ctx.append_session_event({"role": "model", "calls": [f"peer-{n}" for n in range(fan_out)]})
    for n in range(fan_out):
        ctx.register_peer_sub_task(f"{task_id}/ask-{n}", {
            "peer_agent_name": f"researcher-{n}", "function_call_id": f"call-{n}",
            "timeout_s": timeout_s})
    return ctx


async def _instance(name: str, config: DemoConfig, deliveries: list[str], progress: Any,
                    results: Any) -> None:
    """One agent instance: handle its share of deliveries, sweep, resume what completes."""
    rng = random.Random(f"{config.seed}-{name}")
    stats: Counter[str] = Counter()
    resolve_ms: list[float] = []
    async with open_store(f"sqlite:///{config.db_path}", migrate=False) as store:

        async def handle(resolution: Resolution) -> None:
            stats[f"resolved_by_{resolution.sub_task.resolved_by}"] += 1
            with progress.get_lock():
                progress.value += 1
            if resolution.join_complete:
                task_id = resolution.sub_task.task_id
                restored = await store.restore_task(task_id, lease_owner=name)
                calls = restored.context.parallel_tool_calls[resolution.sub_task.invocation_id]
                assert calls.completed == calls.total  # every result is there to resume with
                await store.cleanup_task(task_id, lease_owner=name)
                stats["resumed"] += 1

        for sub_task_id in deliveries:
            started = time.perf_counter()
            try:
                resolution = await store.resolve_peer_sub_task(
                    sub_task_id, {"text": f"findings for {sub_task_id}"}, lease_owner=name)
            except UnknownSubTaskError:
                resolution = None  # its task already finished: a late duplicate
            resolve_ms.append((time.perf_counter() - started) * 1000)
            if resolution is None:
                stats["ignored"] += 1
            else:
                await handle(resolution)
            if rng.random() < 0.05:
                for swept in await store.sweep_expired_timeouts(AGENT, 20, lease_owner=name):
                    await handle(swept)
        # Keep sweeping until the silent peers' deadlines have all passed and resolved.
        while (await store.stats()).pending_sub_tasks:
            for swept in await store.sweep_expired_timeouts(AGENT, 50, lease_owner=name):
                await handle(swept)
            await asyncio.sleep(0.05)
    results.put((name, dict(stats), resolve_ms))


def _instance_process(name: str, config: DemoConfig, deliveries: list[str], progress: Any,
                      results: Any) -> None:
    asyncio.run(_instance(name, config, deliveries, progress, results))


def _check_replaceable(path: Path) -> None:
    """Refuse to delete a file that is not a meshpoint database (a typo in --db)."""
    if not path.exists():
        return
    from meshpoint.store.schema import metadata

    try:
        with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as conn:
            tables = {row[0] for row in conn.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table'")}
    except sqlite3.DatabaseError:
        tables = {"(not a SQLite database)"}
    foreign = tables - set(metadata.tables) - {"alembic_version"}
    if foreign:
        raise ConfigurationError(
            f"{path} exists and is not a meshpoint database (it has {sorted(foreign)}); "
            "the demo recreates its file, so name a new one with --db")


async def _prepare(config: DemoConfig) -> tuple[list[str], int, list[float]]:
    _check_replaceable(config.db_path)
    for suffix in ("", "-wal", "-shm"):
        Path(f"{config.db_path}{suffix}").unlink(missing_ok=True)
    rng = random.Random(config.seed)
    deliveries: list[str] = []
    checkpoint_ms: list[float] = []
    async with open_store(f"sqlite:///{config.db_path}") as store:
        for n in range(config.tasks):
            ctx = _paused_task(f"task-{n:05d}", config.fan_out, config.timeout_s)
            started = time.perf_counter()
            await store.checkpoint_task(ctx, AGENT)
            checkpoint_ms.append((time.perf_counter() - started) * 1000)
            for sub_task_id in ctx.active_peer_sub_tasks:
                if rng.random() >= config.silent_peer_rate:
                    deliveries += [sub_task_id, sub_task_id]  # at-least-once: twice
    rng.shuffle(deliveries)
    return deliveries, config.tasks * config.fan_out, checkpoint_ms


async def _rows_left(config: DemoConfig) -> int:
    async with open_store(f"sqlite:///{config.db_path}", migrate=False) as store:
        return await _count_rows(store)


async def _count_rows(store: SqlStore) -> int:
    from meshpoint.store.schema import LIVE_TABLES

    def count(conn: Any) -> int:
        return sum(conn.exec_driver_sql(f"SELECT count(*) FROM {t.name}").scalar() or 0
                   for t in LIVE_TABLES)

    return await store.run(count)


def run_demo(config: DemoConfig, *, on_progress: Any = None) -> dict[str, Any]:
    """Run the demo and return its figures; ``on_progress(done, total)`` is polled."""
    deliveries, sub_tasks, checkpoint_ms = asyncio.run(_prepare(config))
    spawn = multiprocessing.get_context("spawn")
    progress = spawn.Value("i", 0)
    results = spawn.Queue()
    processes = [spawn.Process(target=_instance_process, args=(
        f"instance-{i}", config, deliveries[i::config.instances], progress, results))
        for i in range(config.instances)]
    started = time.perf_counter()
    for process in processes:
        process.start()
    reports: list[tuple[str, dict[str, int], list[float]]] = []
    while len(reports) < config.instances:
        if on_progress is not None:
            on_progress(progress.value, sub_tasks)
        try:
            reports.append(results.get(timeout=0.1))
        except Exception:  # queue.Empty: nobody finished yet
            if any(p.exitcode not in (None, 0) for p in processes):
                raise RuntimeError("a demo instance crashed; see its traceback above") from None
    for process in processes:
        process.join()
    elapsed = time.perf_counter() - started
    if on_progress is not None:
        on_progress(progress.value, sub_tasks)
    totals: Counter[str] = Counter()
    resolve_ms: list[float] = []
    per_instance = {}
    for name, stats, samples in sorted(reports):
        totals.update(stats)
        resolve_ms += samples
        per_instance[name] = stats.get("resumed", 0)
    return {
        "tasks": config.tasks, "sub_tasks": sub_tasks, "instances": config.instances,
        "deliveries": len(deliveries),
        "answered": totals["resolved_by_answer"], "timed_out": totals["resolved_by_timeout"],
        "duplicates_ignored": totals["ignored"], "resumed": totals["resumed"],
        "resumed_by_instance": per_instance, "rows_left": asyncio.run(_rows_left(config)),
        "checkpoint_write_ms": _percentiles(checkpoint_ms),
        "resolve_ms": _percentiles(resolve_ms), "seconds": round(elapsed, 2),
    }


def _percentiles(samples: list[float]) -> dict[str, float]:
    if len(samples) < 2:
        return {"p50": samples[0] if samples else 0.0, "p99": samples[0] if samples else 0.0}
    cut = statistics.quantiles(samples, n=100, method="inclusive")
    return {"p50": round(cut[49], 3), "p99": round(cut[98], 3)}
