"""Workflow agents: sequential, parallel and loop agents whose stages are peer calls.

A workflow agent has no model: its turns are planned, deterministically, from its
task's conversation. Each stage is a call to a sub-agent (an ordinary agent, or
another workflow), made as a peer call, so every stage boundary is the pause
checkpoint that any instance resumes exactly once (docs/workflows.md):

* ``sequential`` calls its sub-agents one after another; stage k's answer is stored
  under its ``output_key`` and given to the later stages;
* ``parallel`` calls them all in one fan-out and answers with their answers, in
  branch order, once all have answered; after a crash only the unanswered branches
  are waited for;
* ``loop`` calls them in order, again and again, until one of them escalates (its
  answer is a JSON object with ``"escalate": true``) or ``max_iterations`` rounds
  ran.

Everything a plan needs is in the conversation (each stage's call and its answer),
so the plan after a crash is the plan before it, and the workflow's progress
(``workflow_type``, ``workflow_stage``, ``loop_iteration``, each stage's state) is
written into every history record of the task.

Each stage is asked the workflow's request followed by the answers so far, one
``## <output_key>`` section each; a meshpoint sub-agent's system prompt may also
name them as ``{output_key}`` (ADK's placeholders; ``{output_key?}`` when it may be
missing).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from meshpoint import a2a
from meshpoint.context import TaskExecutionContext
from meshpoint.errors import InvalidArgumentError
from meshpoint.llm.base import Model, ModelResponse, ToolCall, ToolSpec
from meshpoint.runtime.agent import Agent, Peer
from meshpoint.runtime.calls import Opened
from meshpoint.runtime.peers import PeerCalls
from meshpoint.runtime.stages import (
    METADATA_KEY,
    STATE_KEY,
    WORKFLOW_KINDS,
    SubAgent,
    Workflow,
    WorkflowKind,
    fill_placeholders,
)


def stage_peers(workflow: Workflow) -> tuple[Peer, ...]:
    """One peer per stage; its tool is named by the stage's output key."""
    return tuple(Peer(agent=s.agent, timeout_s=s.timeout_s, tool_name=s.output_key,
                      description=f"stage {s.index + 1}: the {s.agent} agent")
                 for s in workflow.stages)


def as_sub_agent(item: Any) -> Any:
    """An Agent given as a sub-agent, as the SubAgent it stands for (its name and
    output key)."""
    if isinstance(item, Agent):
        return SubAgent(agent=item.name, output_key=item.output_key)
    return item


@dataclass(frozen=True)
class StageCalls(PeerCalls):
    """The :class:`~meshpoint.runtime.calls.CallKind` of a workflow's stages: peer
    calls whose request carries the workflow's state (for the sub-agent's
    placeholders) and whose answer keeps its outcome, which the plan reads."""

    async def open(self, ctx: TaskExecutionContext, invocation_id: str,
                   call: ToolCall) -> Opened:
        opened = await super().open(ctx, invocation_id, call)
        workflow = self.agent.workflow
        assert workflow is not None and opened.sub_task_id is not None
        key, _, iteration = call.id.rpartition(".")
        # A nested workflow passes on the state it was given (ADK's state is the
        # session's): its stages' placeholders may name an outer stage's answer.
        inherited = ctx.a2a_context.get(STATE_KEY)
        state = {**(inherited if isinstance(inherited, dict) else {}),
                 **({} if workflow.kind == "parallel" else
                    workflow.progress(ctx).shared_state())}
        ctx.active_peer_sub_tasks[opened.sub_task_id]["metadata"] = {METADATA_KEY: {
            "workflow": self.agent.name, "type": workflow.kind, "stage": key,
            "iteration": int(iteration) if iteration.isdigit() else 1, "state": state}}
        return opened

    async def settle(self, ctx: TaskExecutionContext, call: ToolCall, result: Any) -> Any:
        text = await super().settle(ctx, call, result)
        state = str(result.get("status")) if isinstance(result, dict) and "status" in result \
            else a2a.TaskState.COMPLETED.value
        if state != a2a.TaskState.COMPLETED.value and isinstance(result, dict):
            text = result.get("text") or result.get("error") or state
        nested = result.get("workflow_state") if isinstance(result, dict) else None
        return json.dumps({"state": state, "text": text,
                           **({"nested": nested} if isinstance(nested, dict) else {})})


class NoModel:
    """What a workflow agent has for a model: none (its turns are planned)."""

    def __init__(self, kind: str) -> None:
        self.name = f"workflow:{kind}"

    async def complete(self, messages: list[dict[str, Any]],
                       tools: list[ToolSpec]) -> ModelResponse:
        raise AssertionError("a workflow agent's turns are planned, never a model's")


@dataclass(frozen=True)
class _WorkflowAgent(Agent):
    """An agent without a model whose stages are ``sub_agents`` (Agents, their
    names, or :class:`SubAgent` s)."""

    kind: ClassVar[WorkflowKind]
    model: Model = field(default_factory=lambda: NoModel("workflow"))
    sub_agents: Sequence[Agent | str | SubAgent] = ()

    def __post_init__(self) -> None:
        kind = self.kind
        if not isinstance(self.model, NoModel):
            raise InvalidArgumentError(f"{kind} agent {self.name!r}: a workflow agent has "
                                       "no model (its stages are its sub_agents' turns)")
        # dataclasses.replace() gives back the peers its stages made: not the user's.
        derived = self.workflow is not None and tuple(self.peers) == stage_peers(self.workflow)
        for what, given in (("tools", self.tools), ("peers", () if derived else self.peers),
                            ("handoff", self.handoff), ("system_prompt", self.system_prompt)):
            if given:
                raise InvalidArgumentError(
                    f"{kind} agent {self.name!r}: a workflow agent has no {what} of its "
                    "own (its sub_agents have theirs)")
        if not self.stateless_checkpointing:
            raise InvalidArgumentError(f"{kind} agent {self.name!r}: every stage boundary is "
                                       "a checkpoint: stateless_checkpointing must be on")
        workflow = Workflow.of(self.name, kind, [as_sub_agent(a) for a in self.sub_agents],
                               getattr(self, "max_iterations", None))
        object.__setattr__(self, "sub_agents", tuple(self.sub_agents))
        object.__setattr__(self, "workflow", workflow)
        object.__setattr__(self, "model", NoModel(kind))
        object.__setattr__(self, "peers", stage_peers(workflow))
        super().__post_init__()


@dataclass(frozen=True)
class SequentialAgent(_WorkflowAgent):
    """Calls its ``sub_agents`` one after another (ADK's ``SequentialAgent``): each
    is asked the request and the answers before it; the last one's answer is the
    workflow's."""

    kind: ClassVar[WorkflowKind] = "sequential"


@dataclass(frozen=True)
class ParallelAgent(_WorkflowAgent):
    """Calls all its ``sub_agents`` at once (ADK's ``ParallelAgent``); answers with
    their answers in branch order, a ``## <output_key>`` section each."""

    kind: ClassVar[WorkflowKind] = "parallel"


@dataclass(frozen=True)
class LoopAgent(_WorkflowAgent):
    """Calls its ``sub_agents`` in order, again and again (ADK's ``LoopAgent``),
    until one escalates (answers a JSON object with ``"escalate": true``) or
    ``max_iterations`` rounds ran (None: no limit); answers with the last answer that
    did not escalate."""

    kind: ClassVar[WorkflowKind] = "loop"
    max_iterations: int | None = None


#: The agent class of each workflow kind (the config file's ``kind:``).
WORKFLOW_AGENTS: dict[str, type[_WorkflowAgent]] = {
    "sequential": SequentialAgent, "parallel": ParallelAgent, "loop": LoopAgent}


__all__ = ["METADATA_KEY", "STATE_KEY", "WORKFLOW_AGENTS", "WORKFLOW_KINDS", "LoopAgent", "NoModel",
           "ParallelAgent", "SequentialAgent", "StageCalls", "SubAgent", "Workflow",
           "WorkflowKind", "fill_placeholders"]
