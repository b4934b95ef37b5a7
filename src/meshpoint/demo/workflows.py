"""The demo's workflow tasks: an ``itinerary`` workflow agent (a
:class:`~meshpoint.runtime.workflows.SequentialAgent`, docs/workflows.md) whose three
stages, ``outline``, ``budget`` and ``summary``, are agents of their own, beside the
coordinator's trips.

A workflow agent has no model: each stage is a call to its agent, and each stage
boundary a checkpoint, so the task goes on at the stage in flight on whichever
instance takes the stage's answer, and a stage that answered is never asked again.
The stages' agents count the calls they get per workflow task, so the demo shows how
many stages ran (three per task) and how many ran twice (none).

The workflow's instances are killed as the coordinator's are, at every moment of a
stage boundary: a call whose publish a kill prevented is published again by the
sweeper's announcement check (docs/runtime.md, "Crashes"). Workflow instances killed
at every boundary, counted: tests/integration/test_workflow_crashes.py.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from meshpoint.llm.base import ModelResponse, ToolSpec
from meshpoint.llm.scripted import ScriptedModel
from meshpoint.runtime import Agent
from meshpoint.runtime.options import RecoveryPolicy
from meshpoint.runtime.workflows import SequentialAgent

ITINERARY = "itinerary"
STAGES = ("outline", "budget", "summary")


class StageModel(ScriptedModel):
    """A stage agent's scripted model (fast, as an LLM call) that counts the calls it
    gets, by the workflow request they are about (the first line of what it is asked:
    the stage's request starts with the workflow's)."""

    def __init__(self, name: str, calls: Counter[tuple[str, str]]) -> None:
        super().__init__(name, persona=name, delay_s=0.05)
        self.calls = calls

    async def complete(self, messages: list[dict[str, Any]],
                       tools: list[ToolSpec]) -> ModelResponse:
        asked = str(messages[-1].get("content") or "") if messages else ""
        self.calls[(self.name, asked.split("\n", 1)[0])] += 1
        return await super().complete(messages, tools)


def agents(calls: Counter[tuple[str, str]], *, recovery: RecoveryPolicy
           ) -> tuple[Agent, list[Agent]]:
    """The workflow agent, and the agents of its stages (their models count into
    ``calls``)."""
    itinerary = SequentialAgent(name=ITINERARY, sub_agents=list(STAGES), events=True,
                                recovery=recovery,
                                description="Outlines, budgets and sums up a trip.")
    return itinerary, [Agent(name, StageModel(name, calls)) for name in STAGES]


def request(number: int) -> str:
    return f"Plan itinerary {number}"


def figures(calls: Counter[tuple[str, str]], requests: list[str]) -> dict[str, int]:
    """Stages run for the workflow tasks of ``requests`` (a model call each), and how
    many of those ran again (a stage asked twice for one task)."""
    mine = {(stage, text): n for (stage, text), n in calls.items() if text in requests}
    return {"stages_run": sum(mine.values()),
            "stages_run_again": sum(n - 1 for n in mine.values() if n > 1)}
