"""``make demo-llm``: the main job of ``make demo`` with a real model, offline.

The same mesh as :mod:`meshpoint.demo.scripted` (a ``coordinator`` with several instances and
the peers ``flights``, ``hotels`` and ``weather``, on a SQLite file and the in-process
broker), but every agent thinks with a real language model served by an
OpenAI-compatible endpoint: ``make demo-llm`` starts llama.cpp's ``llama-server`` with
SmolLM2-135M-Instruct on 127.0.0.1 (``scripts/llama_server.py``) and passes it here in
``MESHPOINT_LLM_BASE_URL``.

The coordinator uses the ``json`` tool mode (a 135M model makes no native tool calls):
each trip request makes it plan its peer calls under a schema, the task pauses
(checkpoint, publish, ack, forget), each peer answers with the model, and whichever
coordinator instance takes the last answer resumes the task and has the model write
the answer from the results. Meanwhile coordinator instances are killed and replaced
(each kill once the mesh made progress since the last: a checkpoint or an answer).
The coordinator's model is given a small context window (``context_window``, 512
tokens, of the server's 4096 a slot) and the coordinator a handoff policy
(docs/handoff.md): once the peers' answers are back, the prompt that would write the
answer fills more than 0.70 of that window, so the task hands off, and a fresh
iteration, on whichever instance takes it, writes the answer from the continuation
prompt alone (the model's calls and the peers' answers, listed). What is checked is
the machinery (every task completed, fan-outs planned by the model and joined, pauses
and resumes across instances, handoffs triggered by the real prompt's size, each
under 0.70 of the window, nothing left in the store), not the quality of a 135M
model's prose. The report shows tokens by model and by source and
the tokens per second the server delivered.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import random
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from meshpoint import a2a
from meshpoint.broker.inprocess import InProcessBroker
from meshpoint.demo.handoffs import handoff_figures
from meshpoint.demo.scripted import PEERS, _check_replaceable, _ms, _sidecars
from meshpoint.errors import MeshpointError
from meshpoint.llm.base import ModelResponse, ToolSpec
from meshpoint.llm.openai import OpenAIModel
from meshpoint.runtime import Agent, AgentInstance, Client, Peer, RuntimeOptions
from meshpoint.runtime.options import HandoffPolicy
from meshpoint.store import open_store

CITIES = ("Lisbon", "Porto", "Seville", "Bologna", "Krakow", "Ghent", "Lyon", "Bergen")
MONTHS = ("March", "May", "June", "September", "October")

COORDINATOR_PROMPT = (
    "You are a travel coordinator. For a trip, ask the flights, hotels and weather "
    "agents about it, all at once. When their answers are back, tell the user what "
    "they found in two short sentences.")
PEER_PROMPT = "You are the {name} agent of a travel company. Answer in one short sentence."
#: The context-utilization threshold of the coordinator's handoffs.
UTILIZATION = 0.70
#: llama.cpp's repetition penalty (sent through extra_body): without it the 135M model
#: repeated one word of its answer until the token limit cut it off.
SAMPLER = {"repeat_penalty": 1.1}


@dataclass(frozen=True)
class LlmDemoConfig:
    """What the demo runs; the defaults take a few minutes on two cores."""

    base_url: str
    model: str
    db_path: Path = Path("meshpoint-demo-llm.db")
    tasks: int = 8
    instances: int = 2
    #: Tasks in flight at once (the server decodes up to its slots at once).
    concurrency: int = 4
    #: Seconds between coordinator kills (0: none).
    kill_every_s: float = 30.0
    deadline_s: float = 900.0
    seed: int = 7
    coordinator_max_tokens: int = 300
    peer_max_tokens: int = 80
    #: Seconds one model request may take (a slow machine needs more).
    request_timeout_s: float = 180.0
    #: How long a turn's lease, and a request's ack wait, last: longer than a turn
    #: (a few model calls of seconds each), short enough that a killed instance's task
    #: is taken over within the demo.
    lease_ttl_s: float = 30.0
    #: How long an instance has to checkpoint (or finish) a new task before its request
    #: goes to another instance: a first turn plans with the model, under load.
    request_ack_wait_s: float = 60.0
    #: The coordinator model's context window as its handoff trigger sees it (tokens):
    #: small, so that the peers' answers push the next prompt past 0.70 of it (the
    #: planning prompt is about 260 tokens, a round of answers 200 to 400 more).
    #: None: no handoff policy (the conversation goes on in one context).
    context_window: int | None = 512


@dataclass
class PlanLog:
    """The coordinator's plans: how many peer calls each planning turn made."""

    calls_per_plan: list[int] = field(default_factory=list)


class Observed:
    """A model that records the size of each plan its inner model makes; everything
    else is the inner model's (its ``context_window`` too, which the handoff trigger
    measures against)."""

    def __init__(self, inner: OpenAIModel, log: PlanLog) -> None:
        self.inner = inner
        self.name = inner.name
        self.log = log

    @property
    def context_window(self) -> int | None:
        return self.inner.context_window

    async def complete(self, messages: list[dict[str, Any]],
                       tools: list[ToolSpec]) -> ModelResponse:
        response = await self.inner.complete(messages, tools)
        if response.tool_calls:
            self.log.calls_per_plan.append(len(response.tool_calls))
        return response


def _trip(number: int, rng: random.Random) -> str:
    return (f"Plan trip {number}: a weekend in {rng.choice(CITIES)} in "
            f"{rng.choice(MONTHS)} for two people.")


def _add_usage(into: dict[str, dict[str, int]], part: dict[str, Any]) -> None:
    for name, counts in (part or {}).items():
        mine = into.setdefault(name, {})
        for key, value in counts.items():
            mine[key] = mine.get(key, 0) + int(value)


async def _run(config: LlmDemoConfig,
               on_progress: Callable[[int, int], None] | None) -> dict[str, Any]:
    _check_replaceable(config.db_path)
    for path in (config.db_path, *_sidecars(config.db_path)):
        path.unlink(missing_ok=True)
    rng = random.Random(config.seed)
    # A model turn takes seconds, not milliseconds: leases and ack waits are longer
    # than in the scripted demo, so that a live instance is never taken for dead.
    options = RuntimeOptions(lease_ttl_s=config.lease_ttl_s, sweep_interval_s=0.5,
                             recovery_interval_s=0.5,
                             request_ack_wait_s=config.request_ack_wait_s,
                             response_ack_wait_s=config.lease_ttl_s, max_deliver=20)
    plans = PlanLog()
    coordinator_model = OpenAIModel(
        config.model, base_url=config.base_url, timeout_s=config.request_timeout_s,
        max_tokens=config.coordinator_max_tokens, temperature=0.0, seed=config.seed,
        tool_mode="json", tool_choice="required", max_tool_rounds=1, repair_attempts=2,
        extra_body=SAMPLER, context_window=config.context_window)
    peer_models = {name: OpenAIModel(
        config.model, base_url=config.base_url, timeout_s=config.request_timeout_s,
        max_tokens=config.peer_max_tokens, temperature=0.0, seed=config.seed,
        extra_body=SAMPLER) for name in PEERS}
    # The model's own handoff tool is not offered: a 135M model would call it at
    # random. Utilization is the trigger shown.
    handoff = None if config.context_window is None else HandoffPolicy(
        context_utilization=UTILIZATION, explicit=False)
    coordinator = Agent("coordinator", Observed(coordinator_model, plans),
                        system_prompt=COORDINATOR_PROMPT,
                        peers=[Peer(name, timeout_s=config.request_timeout_s,
                                    description=f"Ask the {name} agent about the trip.")
                               for name in PEERS], max_turns=6, handoff=handoff)
    peers = [Agent(name, peer_models[name], system_prompt=PEER_PROMPT.format(name=name))
             for name in PEERS]
    started = time.perf_counter()
    kills = 0
    async with open_store(f"sqlite:///{config.db_path}") as store:
        broker = InProcessBroker()
        every: list[AgentInstance] = []

        async def launch(agent: Agent) -> AgentInstance:
            instance = AgentInstance(agent, store, broker, options=options)
            await instance.start()
            every.append(instance)
            return instance

        live = [await launch(coordinator) for _ in range(config.instances)]
        for agent in peers:
            await launch(agent)
        async with Client(broker, namespace=options.namespace) as client:
            rids: list[str] = []
            deadline = time.monotonic() + config.deadline_s
            next_kill = time.monotonic() + (config.kill_every_s or float("inf"))

            def progress() -> int:  # what a kill must not keep from happening
                return len(client.answers) + sum(i.stats.counts["checkpoints"]
                                                 for i in every)

            at_last_kill = progress()
            while len(client.answers) < config.tasks and time.monotonic() < deadline:
                while (len(rids) < config.tasks
                       and len(rids) - len(client.answers) < config.concurrency):
                    rids.append(await client.submit("coordinator", _trip(len(rids), rng)))
                await asyncio.sleep(0.1)
                if on_progress is not None:
                    on_progress(len(client.answers), config.tasks)
                # A kill waits for progress since the last one: a turn slower than an
                # instance lives (a loaded machine) would otherwise never checkpoint.
                if time.monotonic() >= next_kill and progress() > at_last_kill:
                    at_last_kill = progress()
                    victim = live.pop(rng.randrange(len(live)))
                    await victim.kill()
                    kills += 1
                    live.append(await launch(coordinator))
                    next_kill = time.monotonic() + config.kill_every_s
            if on_progress is not None:
                on_progress(len(client.answers), config.tasks)
            await asyncio.sleep(0.5)  # the last cleanups follow the answers
            answers = {rid: client.answers.get(rid, []) for rid in rids}
        for instance in every:
            await instance.stop()
        await broker.close()
        rows_left = sum((await store.live_row_counts()).values())
        handed = await handoff_figures(store, [a[0].id for a in answers.values() if a])
    seconds = time.perf_counter() - started
    for model in (coordinator_model, *peer_models.values()):
        await model.close()
    coordinators = [i for i in every if i.agent.name == "coordinator"]

    def total(what: str) -> int:
        return sum(i.stats.counts[what] for i in coordinators)

    by_model: dict[str, dict[str, int]] = {}
    by_source: dict[str, dict[str, int]] = {}
    samples = []
    failures = [a[0].status.message.text[:200] for a in answers.values()
                if a and a[0].status.state is not a2a.TaskState.COMPLETED
                and a[0].status.message is not None]
    for got in answers.values():
        if got:
            usage = (got[0].metadata or {}).get("token_usage") or {}
            _add_usage(by_model, usage.get("by_model", {}))
            _add_usage(by_source, usage.get("by_source", {}))
            if got[0].status.message is not None and \
                    got[0].status.state is a2a.TaskState.COMPLETED:
                samples.append(got[0].status.message.text)
    stats = [coordinator_model.stats, *(m.stats for m in peer_models.values())]
    completion = sum(s.completion_tokens for s in stats)
    waited = sum(s.seconds for s in stats)
    completed = sum(1 for a in answers.values()
                    if a and a[0].status.state is a2a.TaskState.COMPLETED)
    return {
        "model": config.model, "submitted": len(rids), "completed": completed,
        "failed": config.tasks - completed,
        "duplicate_answers": sum(max(0, len(a) - 1) for a in answers.values()),
        "plans": len(plans.calls_per_plan),
        "fan_outs": sum(1 for n in plans.calls_per_plan if n >= 2),
        "calls_per_plan": dict(sorted(Counter(plans.calls_per_plan).items())),
        "checkpoints_written": total("checkpoints"), "resumed": total("resumed"),
        "resumed_elsewhere": sum(i.stats.resumed_elsewhere for i in coordinators),
        "recovered_after_kill": total("recovered"),
        "redelivered_requests": total("started") - len(rids),
        "kills": kills, "instances": config.instances, "rows_left": rows_left,
        "context_window": config.context_window, **handed,
        "model_requests": sum(s.requests for s in stats),
        "replies_handed_back": sum(s.repaired for s in stats),
        "prompt_tokens": sum(s.prompt_tokens for s in stats),
        "completion_tokens": completion,
        # Generated tokens over the run's wall time (all requests, overlapping), and over
        # the time each request waited (one request's speed).
        "tokens_per_s": round(completion / seconds, 1) if seconds else 0.0,
        "tokens_per_s_per_request": round(completion / waited, 1) if waited else 0.0,
        "tokens_by_model": by_model, "tokens_by_source": by_source,
        "pause_resume_ms": _ms([s for i in coordinators for s in i.stats.pause_resume_ms]),
        "sample_answer": samples[0] if samples else None,
        "failures": failures[:3],
        "seconds": round(seconds, 1),
    }


def run_llm_demo(config: LlmDemoConfig, *,
                 on_progress: Callable[[int, int], None] | None = None) -> dict[str, Any]:
    """Run the demo against the endpoint and return its figures."""
    logging.getLogger("meshpoint").setLevel(logging.ERROR)
    return asyncio.run(_run(config, on_progress))


def passed(figures: dict[str, Any]) -> list[str]:
    """What the demo requires of a run; the reasons it failed (empty: it passed)."""
    problems = []
    if figures["completed"] != figures["submitted"]:
        problems.append(f"{figures['failed']} of {figures['submitted']} tasks did not "
                        "complete")
    if figures["rows_left"]:
        problems.append(f"{figures['rows_left']} live rows were left in the store")
    if figures["fan_outs"] == 0:
        problems.append("the model planned no fan-out (no turn called two peers or more)")
    if figures["resumed"] < figures["completed"]:
        problems.append("some tasks completed without pausing and resuming")
    if figures["context_window"] is not None:
        if figures["handoffs_by_trigger"].get("context_utilization", 0) == 0:
            problems.append("no task handed off for its context's size")
        most = figures["max_utilization_at_handoff"]
        if most is not None and most >= UTILIZATION:
            problems.append(f"a handoff came at {most:.2f} of the context window, not "
                            f"under {UTILIZATION:g}")
    return problems


def _table(figures: dict[str, Any], db: Path) -> None:
    from rich.table import Table

    from meshpoint.cli.common import console, shown

    table = Table(title=f"meshpoint demo-llm: {shown(figures['model'])} behind an "
                        f"OpenAI-compatible server, coordinator x {figures['instances']}, "
                        f"SQLite file {shown(db)}")
    table.add_column("measure")
    table.add_column("value", justify="right")
    plans = ", ".join(f"{n} calls: {k}" for n, k in figures["calls_per_plan"].items())
    rows: list[tuple[str, Any]] = [
        ("tasks submitted", figures["submitted"]),
        ("tasks completed", figures["completed"]),
        ("tasks failed or unanswered", figures["failed"]),
        ("plans made by the model (peer calls per plan)", f"{figures['plans']} ({plans})"),
        ("  fan-outs (two peers or more at once)", figures["fan_outs"]),
        ("coordinator instances killed (and restarted)", figures["kills"]),
        ("checkpoints written", figures["checkpoints_written"]),
        ("tasks resumed", figures["resumed"]),
        ("  on an instance other than the one that paused them",
         figures["resumed_elsewhere"]),
        ("  taken over after the resuming instance died", figures["recovered_after_kill"]),
        ("requests redelivered after a kill", figures["redelivered_requests"]),
        ("iterations · handoffs (context window "
         f"{figures['context_window'] or '-'} tokens)",
         f"{figures['iterations']} · {figures['handoffs']}"),
        ("  largest context utilization at a handoff",
         "-" if figures["max_utilization_at_handoff"] is None
         else f"{figures['max_utilization_at_handoff']:.2f}"),
        ("live rows left", figures["rows_left"]),
        ("model requests (replies handed back to the model)",
         f"{figures['model_requests']} ({figures['replies_handed_back']})"),
        ("prompt / completion tokens",
         f"{figures['prompt_tokens']} / {figures['completion_tokens']}"),
        ("completion tokens/s (whole run · one request)",
         f"{figures['tokens_per_s']} · {figures['tokens_per_s_per_request']}"),
    ]
    for kind in ("model", "source"):
        for name, counts in sorted(figures[f"tokens_by_{kind}"].items()):
            rows.append((f"tokens by {kind}: {name} (prompt / completion)",
                         f"{counts.get('prompt_tokens', 0)} / "
                         f"{counts.get('completion_tokens', 0)}"))
    rows.append(("wall time (s)", figures["seconds"]))
    for name, value in rows:
        table.add_row(shown(name), shown(value))  # model names and answers: the model's
    console.print(table)
    for failure in figures["failures"]:
        console.print(f"[red]a task failed:[/red] {shown(failure)}")
    if figures["sample_answer"]:
        console.print(f"[dim]one answer, as the model wrote it:[/dim] "
                      f"{shown(figures['sample_answer'][:300])}")


def main(argv: list[str] | None = None) -> int:
    """``python -m meshpoint.demo.llm``: see the module docstring."""
    from meshpoint.cli.common import plain, shown

    parser = argparse.ArgumentParser(prog="python -m meshpoint.demo.llm",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--base-url", default=os.environ.get("MESHPOINT_LLM_BASE_URL"),
                        help="the endpoint (default: $MESHPOINT_LLM_BASE_URL)")
    parser.add_argument("--model", default=os.environ.get("MESHPOINT_LLM_MODEL",
                                                          "SmolLM2-135M-Instruct"))
    parser.add_argument("--tasks", type=int, default=8)
    parser.add_argument("--instances", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--kill-every", type=float, default=30.0,
                        help="seconds between coordinator kills (0: none); a kill "
                             "waits for a checkpoint or an answer since the last one")
    parser.add_argument("--context-window", type=int, default=512,
                        help="the coordinator model's context window as its handoff "
                             "trigger sees it, in tokens (0: no handoff)")
    parser.add_argument("--db", type=Path, default=Path("meshpoint-demo-llm.db"))
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    if not args.base_url:
        parser.error("no endpoint: pass --base-url or run `make demo-llm`, which starts "
                     "a local server and sets MESHPOINT_LLM_BASE_URL")
    for name in ("tasks", "instances", "concurrency"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1")
    if args.kill_every < 0:
        parser.error("--kill-every must be >= 0")
    if args.context_window < 0:
        parser.error("--context-window must be >= 0")
    config = LlmDemoConfig(base_url=args.base_url, model=args.model, db_path=args.db,
                           tasks=args.tasks, instances=args.instances,
                           concurrency=args.concurrency, kill_every_s=args.kill_every,
                           context_window=args.context_window or None)
    try:
        if args.json:
            figures = run_llm_demo(config)
        else:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

            with Progress("[progress.description]{task.description}", BarColumn(),
                          MofNCompleteColumn(), TimeElapsedColumn()) as bar:
                job = bar.add_task(f"tasks answered by {shown(args.model)}",
                                   total=args.tasks)
                figures = run_llm_demo(config, on_progress=lambda done, total: bar.update(
                    job, completed=done, total=total))
    except MeshpointError as error:
        print(f"error: {plain(error)}", file=sys.stderr)
        return 1
    problems = passed(figures)
    if args.json:
        print(json.dumps({**figures, "problems": problems}))
    else:
        _table(figures, args.db)
        for problem in problems:
            print(f"FAILED: {plain(problem)}", file=sys.stderr)
    return 2 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
