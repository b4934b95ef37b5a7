"""Runtime benchmark: what checkpointing costs a pause, and what it saves in memory.

    make bench
    python benchmarks/bench_runtime.py --tasks 300 --paused 10000

1. **Pause-to-resume latency**, checkpointing on vs off (the in-memory path of
   seed 002), p50/p99: one coordinator instance and one peer instance whose model
   answers at once, on a SQLite file and the in-process broker, one task at a time.
   It runs from the end of the turn that calls the peer to the start of the turn
   that reads the answer, so the difference is what the checkpoint, the
   resolution and the restore add.
2. **RSS of an instance holding paused tasks**, on vs off: ``--paused`` tasks each
   wait on a peer that never answers. Each mode runs in a fresh process; RSS is
   read after every 10 % of the tasks have paused. Besides the growth, the table
   gives the slope of the second half (MiB per 1,000 paused tasks): the instance's
   bounded buffers fill over the first ~10,000 pauses, so full mode pauses 30,000.

Results go to a table on the terminal and to ``benchmarks/results/<date>-runtime.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import logging
import multiprocessing
import os
import platform
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psutil
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from meshpoint.broker.base import Delivery
from meshpoint.broker.inprocess import InProcessBroker
from meshpoint.llm import ScriptedModel
from meshpoint.runtime import Agent, AgentInstance, Client, Peer, RuntimeOptions
from meshpoint.runtime.stats import percentile
from meshpoint.runtime.wire import request_subject, send_request
from meshpoint.store import open_store

RESULTS = Path(__file__).parent / "results"
console = Console()


async def _latency(db: Path, checkpointing: bool, tasks: int) -> list[float]:
    async with open_store(f"sqlite:///{db}") as store:
        broker = InProcessBroker()
        coordinator = Agent("coordinator", ScriptedModel(), peers=[Peer("peer")],
                            stateless_checkpointing=checkpointing)
        instances = [AgentInstance(coordinator, store, broker),
                     AgentInstance(Agent("peer", ScriptedModel(persona="peer")), store, broker)]
        for instance in instances:
            await instance.start()
        async with Client(broker) as client:
            for n in range(tasks):
                await client.ask("coordinator", f"question {n}", 30)
        for instance in instances:
            await instance.stop()
        await broker.close()
        return list(instances[0].stats.pause_resume_ms)[tasks // 10:]  # skip the warm-up


def _rss_worker(db: str, checkpointing: bool, paused: int, queue: Any) -> None:
    logging.disable(logging.WARNING)
    queue.put(asyncio.run(_rss(Path(db), checkpointing, paused)))


async def _rss(db: Path, checkpointing: bool, paused: int
               ) -> list[tuple[int, float, float]]:
    process = psutil.Process()
    async with open_store(f"sqlite:///{db}") as store:
        broker = InProcessBroker()

        async def black_hole(delivery: Delivery) -> None:  # a peer that never answers
            await delivery.ack()

        await broker.subscribe(request_subject("meshpoint", "silent"),
                               "meshpoint-silent-requests", black_hole)
        coordinator = Agent("coordinator", ScriptedModel(),
                            peers=[Peer("silent", timeout_s=3600)],
                            stateless_checkpointing=checkpointing)
        instance = AgentInstance(coordinator, store, broker,
                                 options=RuntimeOptions(request_ack_wait_s=3600))
        await instance.start()
        # (paused, RSS, RSS less file-backed pages): SQLite reads the database through
        # mmap, so RSS also counts the pages of the file it touched. Those are the OS
        # page cache, shared and reclaimable, and grow with the file, not the heap.
        samples: list[tuple[int, float, float]] = []
        # Requests are published raw, with no reply subject: a client in this process
        # would keep a future per request and blur what the instance holds.
        step = max(1, paused // 10)
        for n in range(paused):
            await broker.publish(request_subject("meshpoint", "coordinator"),
                                 send_request(f"r{n}", f"Wait for: item {n}"))
            if (n + 1) % 200 == 0:
                await _settle(instance, checkpointing, n + 1)
            if (n + 1) % step == 0:
                await _settle(instance, checkpointing, n + 1)
                gc.collect()
                memory = process.memory_info()
                samples.append((n + 1, memory.rss / 2**20,
                                (memory.rss - memory.shared) / 2**20))
        await instance.stop()
        await broker.close()
        return samples


async def _settle(instance: AgentInstance, checkpointing: bool, count: int) -> None:
    """Wait until ``count`` tasks have paused."""
    what = "paused" if checkpointing else "paused_in_memory"
    while instance.stats.counts[what] < count:
        await asyncio.sleep(0.005)


def _ms(samples: list[float]) -> dict[str, float]:
    return {"p50": round(percentile(samples, 50) or 0, 3),
            "p99": round(percentile(samples, 99) or 0, 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=300, help="tasks for the latency runs")
    parser.add_argument("--paused", type=int, default=10_000, help="tasks held paused")
    args = parser.parse_args()
    logging.disable(logging.WARNING)
    figures: dict[str, Any] = {"machine": {"cores": os.cpu_count(),
                                           "python": platform.python_version()}}
    with tempfile.TemporaryDirectory() as tmp, Progress(console=console) as bar:
        job = bar.add_task("pause-to-resume, on and off", total=2)
        latency = {}
        for mode, on in (("checkpointing on", True), ("in memory (off)", False)):
            latency[mode] = _ms(asyncio.run(_latency(Path(tmp) / f"l-{on}.db", on,
                                                     args.tasks)))
            bar.advance(job)
        figures["pause_resume_ms"] = latency
        job = bar.add_task(f"RSS with {args.paused:,} paused tasks, on and off", total=2)
        rss = {}
        context = multiprocessing.get_context("spawn")
        for mode, on in (("checkpointing on", True), ("in memory (off)", False)):
            queue = context.Queue()
            worker = context.Process(target=_rss_worker,
                                     args=(str(Path(tmp) / f"r-{on}.db"), on, args.paused,
                                           queue))
            worker.start()
            rss[mode] = queue.get()
            worker.join()
            bar.advance(job)
        figures["rss_mib"] = rss

    table = Table(title=f"pause-to-resume, {args.tasks} tasks one at a time (SQLite file)")
    for column in ("path", "p50 ms", "p99 ms"):
        table.add_column(column, justify="right" if column != "path" else "left")
    for mode, ms in latency.items():
        table.add_row(mode, f"{ms['p50']:.3f}", f"{ms['p99']:.3f}")
    on, off = latency["checkpointing on"], latency["in memory (off)"]
    table.add_row("added by the checkpoint", f"{on['p50'] - off['p50']:+.3f}",
                  f"{on['p99'] - off['p99']:+.3f}")
    console.print(table)
    table = Table(title="RSS (MiB) of one instance process by tasks paused in it "
                        "(and less file-backed pages: the mmap of the SQLite file)")
    table.add_column("paused tasks", justify="right")
    for mode in rss:
        table.add_column(f"{mode}: RSS", justify="right")
        table.add_column(f"{mode}: less file pages", justify="right")
    for row, (count, *_) in enumerate(rss["checkpointing on"]):
        table.add_row(f"{count:,}", *(f"{rss[mode][row][k]:.1f}" for mode in rss
                                      for k in (1, 2)))
    for mode, samples in rss.items():
        figures.setdefault("rss_growth_mib", {})[mode] = round(
            samples[-1][1] - samples[0][1], 1)
        figures.setdefault("rss_less_file_pages_growth_mib", {})[mode] = round(
            samples[-1][2] - samples[0][2], 1)
    table.add_row("growth, first to last sample",
                  *(f"{figures[key][mode]:+.1f}" for mode in rss
                    for key in ("rss_growth_mib", "rss_less_file_pages_growth_mib")))
    # The instance's bounded buffers (its stats keep the last 10,000 events and
    # timings, SQLite its page cache) fill during the first 10,000 pauses or so;
    # past them, what a paused task costs is the slope of the second half.
    for mode, samples in rss.items():
        half = samples[len(samples) // 2 - 1]
        per_1000 = 1000 / (samples[-1][0] - half[0])
        figures.setdefault("rss_second_half_mib_per_1000", {})[mode] = [
            round((samples[-1][k] - half[k]) * per_1000, 2) for k in (1, 2)]
    table.add_row("per 1,000 paused, second half",
                  *(f"{value:+.2f}" for mode in rss
                    for value in figures["rss_second_half_mib_per_1000"][mode]))
    console.print(table)
    RESULTS.mkdir(exist_ok=True)
    stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H%M%SZ")
    out = RESULTS / f"{stamp}-runtime.json"
    out.write_text(json.dumps(figures, indent=2))
    console.print(f"wrote {out.relative_to(Path.cwd()) if out.is_relative_to(Path.cwd()) else out}")


if __name__ == "__main__":
    sys.exit(main())
