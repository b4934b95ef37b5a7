"""A workflow's stages and its plan, read from its task's conversation (the data of
:mod:`meshpoint.runtime.workflows`, which holds the agents and the call kind)."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import field_validator
from pydantic.dataclasses import dataclass as pydantic_dataclass

from meshpoint import a2a
from meshpoint._validation import OPTIONS, Name, OutputKey, Seconds, check_output_key, checked
from meshpoint.context import TaskExecutionContext
from meshpoint.errors import InvalidArgumentError
from meshpoint.llm.base import ModelResponse, ToolCall

WorkflowKind = Literal["sequential", "parallel", "loop"]
WORKFLOW_KINDS: tuple[WorkflowKind, ...] = ("sequential", "parallel", "loop")
#: The request metadata key a stage's request carries the workflow's state in.
METADATA_KEY = "meshpoint_workflow"
#: ``ctx.flags`` key of the state a workflow answers its caller with (in the answer's
#: metadata, under :data:`ANSWER_STATE_KEY`).
ANSWER_STATE_FLAG = "workflow_answer_state"
ANSWER_STATE_KEY = "meshpoint_workflow_state"
#: ``ctx.a2a_context`` key of the state a task's request carried (for placeholders).
STATE_KEY = "workflow_state"

_PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]{0,63})(\?)?\}")


@checked
@pydantic_dataclass(frozen=True, config=OPTIONS)
class SubAgent:
    """A stage of a workflow (an item of ``sub_agents:``): the agent it calls, where
    its answer is stored (default: the agent's name, ``-`` read as ``_``), and how
    long to wait for it, from the checkpoint that records the call."""

    agent: Name
    output_key: OutputKey | None = None
    timeout_s: Seconds = 600.0

    @field_validator("agent", mode="before")
    @classmethod
    def _an_agent_by_its_name(cls, value: Any) -> Any:
        """``SubAgent(agent=writer)`` with an Agent: its name (a stage names its
        agent; the agent runs on instances of its own)."""
        name = getattr(value, "name", None)
        return name if not isinstance(value, str) and isinstance(name, str) else value


@dataclass(frozen=True)
class Stage:
    """A resolved stage: its index, agent, output key and timeout."""

    index: int
    agent: str
    output_key: str
    timeout_s: float


@dataclass(frozen=True)
class Answer:
    """A stage's answer, as the conversation holds it."""

    stage: Stage
    iteration: int
    state: str
    text: str
    #: The state a workflow that was the stage's agent answered with (its own
    #: stages' answers, by output key): ADK's state is the session's, so a later stage
    #: may name a nested stage's answer.
    nested: Mapping[str, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.state == a2a.TaskState.COMPLETED.value

    @property
    def escalates(self) -> bool:
        """ADK's ``escalate``: the answer is a JSON object whose ``escalate`` is true."""
        try:
            value = json.loads(self.text)
        except ValueError:
            return False
        return isinstance(value, dict) and value.get("escalate") is True


@dataclass(frozen=True)
class Progress:
    """Where a workflow's task stands, read from its conversation."""

    request: str
    answers: tuple[Answer, ...]
    #: The calls made and not answered yet: (stage, iteration).
    running: tuple[tuple[Stage, int], ...]
    #: The answers of the last round of calls (those the plan has not seen before).
    last_round: tuple[Answer, ...] = ()

    def state(self) -> dict[str, str]:
        """The latest answer of each stage, by output key, in stage order."""
        latest = {a.stage.output_key: a for a in self.answers}
        return {key: latest[key].text
                for key in sorted(latest, key=lambda k: latest[k].stage.index)}

    def shared_state(self) -> dict[str, str]:
        """:meth:`state` with, before each stage's own answer, the answers of the
        stages of a workflow that answered it (what placeholders may name, and what
        this workflow answers its own caller with)."""
        latest = {a.stage.output_key: a for a in self.answers}
        shared: dict[str, str] = {}
        for key in sorted(latest, key=lambda k: latest[k].stage.index):
            shared.update(latest[key].nested)
            shared[key] = latest[key].text
        return shared


@dataclass(frozen=True)
class Finished:
    """A plan's verdict: the workflow ends, in ``state``, with ``text``."""

    state: a2a.TaskState
    text: str


@dataclass(frozen=True)
class Workflow:
    """The stages of a workflow agent and how they run."""

    kind: WorkflowKind
    stages: tuple[Stage, ...]
    #: Loop only: rounds at most (None: until a sub-agent escalates).
    max_iterations: int | None = None

    @classmethod
    def of(cls, name: str, kind: WorkflowKind, sub_agents: Sequence[Any],
           max_iterations: int | None) -> Workflow:
        """Resolve ``sub_agents`` (Agents, names or :class:`SubAgent` s);
        InvalidArgumentError naming what is wrong."""
        if kind not in WORKFLOW_KINDS:
            raise InvalidArgumentError(f"agent {name!r}: kind must be one of "
                                       f"{', '.join(WORKFLOW_KINDS)}, got {kind!r}")
        if not sub_agents:
            raise InvalidArgumentError(f"{kind} agent {name!r}: sub_agents is empty")
        stages = []
        for index, item in enumerate(sub_agents):
            stage = _stage(name, index, item)
            if stage.agent == name:
                raise InvalidArgumentError(
                    f"{kind} agent {name!r}: sub_agents[{index}] is the agent itself")
            stages.append(stage)
        keys = [s.output_key for s in stages]
        twice = sorted({k for k in keys if keys.count(k) > 1})
        if twice:
            raise InvalidArgumentError(
                f"{kind} agent {name!r}: output_key {twice[0]!r} is given to two of its "
                "sub_agents (give each its own output_key)")
        if kind == "loop":
            if max_iterations is not None and (type(max_iterations) is not int
                                               or max_iterations < 1):
                raise InvalidArgumentError(f"loop agent {name!r}: max_iterations must be "
                                           f"an int >= 1 (or None), got {max_iterations!r}")
        elif max_iterations is not None:
            raise InvalidArgumentError(f"{kind} agent {name!r}: max_iterations is for loop "
                                       "agents only")
        return cls(kind, tuple(stages), max_iterations)

    def progress(self, ctx: TaskExecutionContext) -> Progress:
        """Read the conversation: the request, each answered stage, the running ones."""
        by_key = {s.output_key: s for s in self.stages}
        events = ctx.session_events
        request = str(events[0].get("content") or "") if events else ""
        calls: dict[str, tuple[Stage, int]] = {}
        answers: list[Answer] = []
        last_round: list[Answer] = []
        for event in events:
            if event.get("role") == "assistant":
                last_round = []
                for call in event.get("tool_calls") or ():
                    key, _, number = str(call.get("id", "")).rpartition(".")
                    if key in by_key and number.isdigit():
                        calls[call["id"]] = (by_key[key], int(number))
            elif event.get("role") == "tool" and event.get("tool_call_id") in calls:
                stage, iteration = calls.pop(event["tool_call_id"])
                answers.append(Answer(stage, iteration, *_stage_result(event.get("content"))))
                last_round.append(answers[-1])
        return Progress(request, tuple(answers), tuple(calls.values()), tuple(last_round))

    def started(self, response: ModelResponse) -> tuple[tuple[Stage, int], ...]:
        """The stages (and iteration) a planned response calls."""
        by_key = {s.output_key: s for s in self.stages}
        return tuple((by_key[c.name], int(c.id.rpartition(".")[2])) for c in response.tool_calls)

    def plan(self, ctx: TaskExecutionContext) -> tuple[ModelResponse | Finished, Progress]:
        """The next step of the task: the calls of the next stage (or, for a parallel
        workflow, of every branch), or how the workflow ends."""
        progress = self.progress(ctx)
        failed = [a for a in progress.answers if not a.ok]
        if failed:
            return Finished(a2a.TaskState.FAILED, "; ".join(
                f"stage {a.stage.output_key} (agent {a.stage.agent}"
                + (f", iteration {a.iteration}" if self.kind == "loop" else "")
                + f") {a.state}: {a.text}" for a in failed)), progress
        if self.kind == "parallel":
            if not progress.answers:
                return self._calls(progress, self.stages, 1), progress
            return Finished(a2a.TaskState.COMPLETED, "\n\n".join(
                f"## {a.stage.output_key}\n\n{a.text}" for a in sorted(
                    progress.answers, key=lambda a: a.stage.index))), progress
        done = len(progress.answers)
        if self.kind == "sequential":
            if done < len(self.stages):
                return self._calls(progress, self.stages[done:done + 1], 1), progress
            return Finished(a2a.TaskState.COMPLETED, progress.answers[-1].text), progress
        if progress.answers and progress.answers[-1].escalates:
            return Finished(a2a.TaskState.COMPLETED, _loop_answer(progress)), progress
        iteration, index = divmod(done, len(self.stages))
        if self.max_iterations is not None and iteration >= self.max_iterations:
            return Finished(a2a.TaskState.COMPLETED, _loop_answer(progress)), progress
        return self._calls(progress, self.stages[index:index + 1], iteration + 1), progress

    def _calls(self, progress: Progress, stages: Sequence[Stage],
               iteration: int) -> ModelResponse:
        query = ask(progress.request, {} if self.kind == "parallel" else progress.state())
        return ModelResponse(text=None, tool_calls=tuple(
            ToolCall(id=f"{s.output_key}.{iteration}", name=s.output_key,
                     arguments={"query": query}) for s in stages), model=self.model_name)

    @property
    def model_name(self) -> str:
        return f"workflow:{self.kind}"

    def describe(self, progress: Progress,
                 started: Sequence[tuple[Stage, int]] = ()) -> dict[str, Any]:
        """The workflow's state as a history record's ``execution_state`` says it
        (seed 004's fields, and each stage's state), with the ``started`` calls
        running."""
        progress = Progress(progress.request, progress.answers,
                            (*progress.running, *started))
        running = {s.output_key for s, _ in progress.running}
        answered = {a.stage.output_key: a for a in progress.answers}
        iteration = max([i for _, i in progress.running]
                        + [a.iteration for a in progress.answers] + [1])
        stages = []
        for stage in self.stages:
            latest = answered.get(stage.output_key)
            if stage.output_key in running:
                state = "running"
            elif latest is not None and (self.kind != "loop" or latest.iteration == iteration):
                state = "done" if latest.ok else "failed"
            else:
                state = "waiting"
            stages.append({"output_key": stage.output_key, "agent": stage.agent,
                           "state": state})
        described: dict[str, Any] = {"workflow_type": self.kind, "stages": stages}
        if self.kind != "parallel":  # the stage running, else the one that answered last
            described["workflow_stage"] = (
                progress.running[-1][0].index if progress.running
                else progress.answers[-1].stage.index if progress.answers else 0)
        if self.kind == "loop":
            described["loop_iteration"] = iteration
            if self.max_iterations is not None:
                described["loop_max_iterations"] = self.max_iterations
        return described


def _stage_result(content: Any) -> tuple[str, str, dict[str, str]]:
    """A stage's outcome, answer and nested state, from its conversation event."""
    try:
        value = json.loads(content) if isinstance(content, str) else content
    except ValueError:
        value = None
    if isinstance(value, dict) and isinstance(value.get("state"), str):
        nested = value.get("nested")
        return value["state"], str(value.get("text") or ""), {
            str(k): str(v) for k, v in nested.items()} if isinstance(nested, dict) else {}
    return a2a.TaskState.COMPLETED.value, str(content), {}


def _loop_answer(progress: Progress) -> str:
    """A loop's answer: the last answer that did not escalate (the work the loop
    improved), else the last one."""
    kept = [a for a in progress.answers if not a.escalates] or list(progress.answers)
    return kept[-1].text if kept else ""


def ask(request: str, state: Mapping[str, str]) -> str:
    """What a stage is asked: the request, then each answer so far in a section."""
    return "\n\n".join([request, *(f"## {key}\n\n{text}" for key, text in state.items())])


def fill_placeholders(prompt: str, state: Mapping[str, Any] | None) -> str:
    """A system prompt with ADK's ``{key}`` placeholders filled from the workflow
    state its request carried; ``{key?}`` is emptied when the state lacks the key,
    ``{key}`` is left as written (a prompt's own braces are not placeholders)."""
    values = state or {}

    def fill(match: re.Match[str]) -> str:
        key, optional = match.group(1), match.group(2)
        if key in values:
            return str(values[key])
        return "" if optional else match.group(0)

    return _PLACEHOLDER.sub(fill, prompt)


def default_output_key(agent: str, *given: str | None) -> str:
    """A stage's output key: the first of ``given`` that is set (the stage's own, then
    its agent's), else the agent's name with ``-`` written ``_``."""
    return next((key for key in given if key), agent.replace("-", "_"))


def _stage(name: str, index: int, item: Any) -> Stage:
    where = f"agent {name!r}: sub_agents[{index}]"
    if isinstance(item, str):
        item = SubAgent(agent=item)
    if isinstance(item, SubAgent):
        key = default_output_key(item.agent, item.output_key)
        return Stage(index, item.agent, check_output_key(f"{where}: output_key", key),
                     item.timeout_s)
    raise InvalidArgumentError(f"{where} must be an Agent, an agent's name or a SubAgent, "
                               f"got {type(item).__name__}")
