"""The sub-agents and workflows of the workflow crash tests
(tests/integration/test_workflow_crashes.py, tests/acceptance/test_workflow_kills.py).

Each sub-agent's model answers from its request alone, so a run with crashes must
answer what an uninterrupted one does, and counts each request it answers (by request
text: every stage of every loop iteration is asked a text of its own). That count is
the side effect that must happen once per stage and loop iteration: kept in memory
(:class:`Counting`), or, for ``meshpoint serve`` processes, as a line per answer in a
ledger file (:class:`LedgerModel`, a ``kind: python`` model).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import re
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from meshpoint.llm.base import ModelResponse, ToolSpec
from meshpoint.runtime import Agent, LoopAgent, ParallelAgent, SequentialAgent
from meshpoint.runtime.agent import RecoveryPolicy

#: Kills never block a task or open the breaker: a run may kill many holders.
NO_LIMITS = RecoveryPolicy(max_recoveries=0, breaker_failures=0)
REQUEST = "Write the launch note for the comet tracker"

Hook = Callable[[str, str], Awaitable[None]]


def answer(agent: str, request: str) -> str:
    """A sub-agent's answer, a function of its request only. The writer drafts
    version n+1 of the last draft its request holds; the critic escalates once it
    sees draft 2 (so a loop ends in its second iteration)."""
    drafts = [int(n) for n in re.findall(r"draft v(\d+)", request)]
    latest = max(drafts, default=0)
    if agent == "writer":
        return f"draft v{latest + 1}: {digest(request)}"
    if agent == "critic":
        return json.dumps({"escalate": True}) if latest >= 2 else f"revise draft v{latest}"
    return f"{agent} read {digest(request)}"


def digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:12]


class Counting:
    """A sub-agent's model: answers :func:`answer` and counts each request it answers
    in ``counts`` (by agent and request text); ``hook`` runs before it answers."""

    def __init__(self, agent: str, counts: Counter[tuple[str, str]]) -> None:
        self.name = f"counting-{agent}"
        self.agent = agent
        self.counts = counts
        self.hook: Hook | None = None

    async def complete(self, messages: list[dict[str, Any]],
                       tools: list[ToolSpec]) -> ModelResponse:
        request = str(messages[-1]["content"])
        self.counts[(self.agent, request)] += 1
        if self.hook is not None:
            await self.hook(self.agent, request)
        return ModelResponse(text=answer(self.agent, request))


#: The sub-agents the workflows call.
SUB_AGENTS = ("research", "outline", "edit", "writer", "critic")


def workflows(shape: str) -> tuple[str, list[Agent]]:
    """The workflow agent the test asks, and every workflow agent it needs."""
    def loop(name: str) -> Agent:
        return LoopAgent(name=name, sub_agents=["writer", "critic"], max_iterations=3,
                         recovery=NO_LIMITS)

    if shape == "sequential":
        return "seq", [SequentialAgent(name="seq", sub_agents=["research", "outline", "edit"],
                                       recovery=NO_LIMITS)]
    if shape == "parallel":
        return "par", [ParallelAgent(name="par", sub_agents=["research", "outline", "edit"],
                                     recovery=NO_LIMITS)]
    if shape == "loop":
        return "loop", [loop("loop")]
    # A sequential whose second stage is a parallel, one branch of which is a loop.
    return "nest", [SequentialAgent(name="nest", sub_agents=["research", "fan"],
                                    recovery=NO_LIMITS),
                    ParallelAgent(name="fan", sub_agents=["outline", "drafting"],
                                  recovery=NO_LIMITS),
                    loop("drafting")]


class LedgerModel:
    """A sub-agent's model for ``meshpoint serve`` (``kind: python``, ``factory:
    tests.integration.workflow_stages:LedgerModel``): answers :func:`answer` after
    ``delay_s`` (a stage that lasts long enough to kill a process in), appending one
    line per request it answers to the ``ledger`` file."""

    def __init__(self, agent: str, ledger: str, delay_s: float = 0.0) -> None:
        self.name = f"ledger-{agent}"
        self.agent, self.ledger, self.delay_s = agent, Path(ledger), delay_s

    async def complete(self, messages: list[dict[str, Any]],
                       tools: list[ToolSpec]) -> ModelResponse:
        request = str(messages[-1]["content"])
        line = json.dumps({"agent": self.agent, "request": digest(request)}) + "\n"
        fd = os.open(self.ledger, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, line.encode())  # one write: whole lines, whatever the writers
        finally:
            os.close(fd)
        await asyncio.sleep(self.delay_s)
        return ModelResponse(text=answer(self.agent, request))


def ledger_counts(ledger: Path) -> Counter[tuple[str, str]]:
    """How often each sub-agent answered each request, by the ledger."""
    if not ledger.exists():
        return Counter()
    return Counter((row["agent"], row["request"]) for row in map(
        json.loads, ledger.read_text().splitlines()))
