"""Workflow agents without a mesh: the plan read from hand-built conversations (the
next stage, a parallel fan-out, loop rounds, escalate, max_iterations, a failed
stage), what ``describe()`` writes into the history records, the mistakes the Python
API and the config file refuse, and ADK's ``{key}`` placeholders."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from meshpoint import a2a
from meshpoint.config import load_config
from meshpoint.context import TaskExecutionContext
from meshpoint.errors import ConfigurationError, InvalidArgumentError
from meshpoint.llm import ScriptedModel
from meshpoint.llm.base import ModelResponse
from meshpoint.runtime import (
    Agent,
    LocalTool,
    LoopAgent,
    ParallelAgent,
    Peer,
    SequentialAgent,
    SubAgent,
)
from meshpoint.runtime.stages import Finished, Workflow, fill_placeholders

REQUEST = "Write about tides"
COMPLETED = a2a.TaskState.COMPLETED.value


def workflow(agent: Agent) -> Workflow:
    assert agent.workflow is not None
    return agent.workflow


def conversation() -> TaskExecutionContext:
    ctx = TaskExecutionContext("wf-task")
    ctx.append_session_event({"role": "user", "content": REQUEST})
    return ctx


def plan(flow: Workflow, ctx: TaskExecutionContext) -> ModelResponse | Finished:
    return flow.plan(ctx)[0]


def calls(planned: ModelResponse | Finished) -> list[tuple[str, str, str]]:
    """The ``(id, tool name, query)`` of each call a plan makes."""
    assert isinstance(planned, ModelResponse), planned
    return [(c.id, c.name, c.arguments["query"]) for c in planned.tool_calls]


def step(flow: Workflow, ctx: TaskExecutionContext, answers: dict[str, Any],
         order: list[str] | None = None) -> ModelResponse:
    """Plan the next step and append it and its answers to the conversation as the
    turn loop does: ``answers`` by call id, each a text (completed) or ``(state,
    text)``; ``order`` the order the answers come in (default: the calls')."""
    planned = plan(flow, ctx)
    assert isinstance(planned, ModelResponse), planned
    ctx.append_session_event({"role": "assistant", "content": None, "tool_calls": [
        {"id": c.id, "name": c.name, "arguments": c.arguments} for c in planned.tool_calls]})
    assert sorted(answers) == sorted(c.id for c in planned.tool_calls)
    for call_id in order or [c.id for c in planned.tool_calls]:
        answer = answers[call_id]
        state, text = answer if isinstance(answer, tuple) else (COMPLETED, answer)
        ctx.append_session_event({"role": "tool", "tool_call_id": call_id,
                                  "name": call_id.rpartition(".")[0],
                                  "content": json.dumps({"state": state, "text": text})})
    return planned


def finished(planned: ModelResponse | Finished) -> tuple[a2a.TaskState, str]:
    assert isinstance(planned, Finished), planned
    return planned.state, planned.text


def described(flow: Workflow, ctx: TaskExecutionContext) -> dict[str, Any]:
    """What the turn loop writes into the record of the step it plans now."""
    planned, progress = flow.plan(ctx)
    started = flow.started(planned) if isinstance(planned, ModelResponse) else ()
    return flow.describe(progress, started)


def stage_states(description: dict[str, Any]) -> dict[str, str]:
    return {s["output_key"]: s["state"] for s in description["stages"]}


# -- the plan -------------------------------------------------------------------------------

def test_a_sequential_asks_each_stage_in_turn_with_the_answers_before_it() -> None:
    flow = workflow(SequentialAgent(name="pipeline", sub_agents=[
        "outliner", SubAgent(agent="writer", output_key="draft"), "fact-checker"]))
    ctx = conversation()
    assert calls(step(flow, ctx, {"outliner.1": "1. moon"})) == [
        ("outliner.1", "outliner", REQUEST)]
    assert calls(step(flow, ctx, {"draft.1": "Tides follow the moon."})) == [
        ("draft.1", "draft", f"{REQUEST}\n\n## outliner\n\n1. moon")]
    assert calls(step(flow, ctx, {"fact_checker.1": "checked"})) == [
        ("fact_checker.1", "fact_checker",
         f"{REQUEST}\n\n## outliner\n\n1. moon\n\n## draft\n\nTides follow the moon.")]
    assert finished(plan(flow, ctx)) == (a2a.TaskState.COMPLETED, "checked")


def test_a_parallel_calls_every_branch_at_once_and_merges_in_branch_order() -> None:
    flow = workflow(ParallelAgent(name="fan", sub_agents=["north", "east", "south"]))
    ctx = conversation()
    first = step(flow, ctx, {"north.1": "N", "east.1": "E", "south.1": "S"},
                 order=["south.1", "north.1", "east.1"])
    assert calls(first) == [("north.1", "north", REQUEST), ("east.1", "east", REQUEST),
                            ("south.1", "south", REQUEST)]
    assert first.model == "workflow:parallel"
    assert finished(plan(flow, ctx)) == (
        a2a.TaskState.COMPLETED, "## north\n\nN\n\n## east\n\nE\n\n## south\n\nS")


def test_a_loop_counts_its_rounds_and_stops_at_max_iterations() -> None:
    flow = workflow(LoopAgent(name="refine", sub_agents=["writer", "critic"],
                              max_iterations=2))
    ctx = conversation()
    assert calls(step(flow, ctx, {"writer.1": "draft 1"}))[0][0] == "writer.1"
    assert calls(step(flow, ctx, {"critic.1": "longer"})) == [
        ("critic.1", "critic", f"{REQUEST}\n\n## writer\n\ndraft 1")]
    # Round 2 is asked the latest answer of each stage.
    assert calls(step(flow, ctx, {"writer.2": "draft 2"})) == [
        ("writer.2", "writer", f"{REQUEST}\n\n## writer\n\ndraft 1\n\n## critic\n\nlonger")]
    assert calls(step(flow, ctx, {"critic.2": "fine"})) == [
        ("critic.2", "critic", f"{REQUEST}\n\n## writer\n\ndraft 2\n\n## critic\n\nlonger")]
    assert finished(plan(flow, ctx)) == (a2a.TaskState.COMPLETED, "fine")


def test_a_loop_stops_when_an_answer_escalates() -> None:
    flow = workflow(LoopAgent(name="refine", sub_agents=["writer", "critic"]))
    ctx = conversation()
    step(flow, ctx, {"writer.1": "draft 1"})
    step(flow, ctx, {"critic.1": json.dumps({"escalate": False})})
    step(flow, ctx, {"writer.2": "draft 2"})
    step(flow, ctx, {"critic.2": '{"escalate": "yes"}'})  # only true escalates
    step(flow, ctx, {"writer.3": "draft 3"})
    step(flow, ctx, {"critic.3": json.dumps({"escalate": True, "why": "done"})})
    assert finished(plan(flow, ctx)) == (a2a.TaskState.COMPLETED, "draft 3")



def test_an_escalation_ends_the_loop_before_the_stages_after_it() -> None:
    flow = workflow(LoopAgent(name="refine", sub_agents=["writer", "critic", "polisher"],
                              max_iterations=5))
    ctx = conversation()
    step(flow, ctx, {"writer.1": "draft 1"})
    step(flow, ctx, {"critic.1": json.dumps({"escalate": True})})
    assert finished(plan(flow, ctx)) == (a2a.TaskState.COMPLETED, "draft 1")
    assert stage_states(described(flow, ctx)) == {
        "writer": "done", "critic": "done", "polisher": "waiting"}
    assert described(flow, ctx)["workflow_stage"] == 1  # the stage that escalated

def test_a_loop_whose_first_answer_escalates_answers_with_it() -> None:
    flow = workflow(LoopAgent(name="refine", sub_agents=["judge"], max_iterations=3))
    ctx = conversation()
    escalation = json.dumps({"escalate": True})
    step(flow, ctx, {"judge.1": escalation})
    assert finished(plan(flow, ctx)) == (a2a.TaskState.COMPLETED, escalation)


@pytest.mark.parametrize("state", ["failed", "canceled", "timeout"])
def test_a_failed_stage_fails_the_workflow_naming_it(state: str) -> None:
    flow = workflow(SequentialAgent(name="pipeline", sub_agents=[
        "outliner", SubAgent(agent="writer", output_key="draft"), "editor"]))
    ctx = conversation()
    step(flow, ctx, {"outliner.1": "1. moon"})
    step(flow, ctx, {"draft.1": (state, "the model is down")})
    assert finished(plan(flow, ctx)) == (
        a2a.TaskState.FAILED, f"stage draft (agent writer) {state}: the model is down")
    assert stage_states(described(flow, ctx)) == {
        "outliner": "done", "draft": "failed", "editor": "waiting"}
    assert described(flow, ctx)["workflow_stage"] == 1  # the stage that failed


def test_failed_branches_and_loop_rounds_are_named() -> None:
    fan = workflow(ParallelAgent(name="fan", sub_agents=["north", "east", "south"]))
    ctx = conversation()
    step(fan, ctx, {"north.1": ("failed", "no"), "east.1": "E", "south.1": ("timeout", "")})
    assert finished(plan(fan, ctx)) == (
        a2a.TaskState.FAILED,
        "stage north (agent north) failed: no; stage south (agent south) timeout: ")
    loop = workflow(LoopAgent(name="refine", sub_agents=["writer", "critic"]))
    ctx = conversation()
    step(loop, ctx, {"writer.1": "draft 1"})
    step(loop, ctx, {"critic.1": "more"})
    step(loop, ctx, {"writer.2": ("failed", "boom")})
    assert finished(plan(loop, ctx)) == (
        a2a.TaskState.FAILED, "stage writer (agent writer, iteration 2) failed: boom")


def test_an_answer_that_is_not_a_stage_result_is_read_as_completed_text() -> None:
    """A tool result without a ``state`` (a plain peer answer) is the stage's text."""
    flow = workflow(SequentialAgent(name="pipeline", sub_agents=["a", "b"]))
    ctx = conversation()
    step(flow, ctx, {"a.1": "x"})
    ctx.session_events[-1]["content"] = "plain text"
    assert calls(plan(flow, ctx))[0][2] == f"{REQUEST}\n\n## a\n\nplain text"


# -- describe() -----------------------------------------------------------------------------

def test_describe_says_where_a_sequential_stands() -> None:
    flow = workflow(SequentialAgent(name="pipeline", sub_agents=[
        "outliner", SubAgent(agent="writer", output_key="draft")]))
    ctx = conversation()
    assert described(flow, ctx) == {
        "workflow_type": "sequential", "workflow_stage": 0, "stages": [
            {"output_key": "outliner", "agent": "outliner", "state": "running"},
            {"output_key": "draft", "agent": "writer", "state": "waiting"}]}
    step(flow, ctx, {"outliner.1": "1. moon"})
    assert described(flow, ctx)["workflow_stage"] == 1
    assert stage_states(described(flow, ctx)) == {"outliner": "done", "draft": "running"}
    step(flow, ctx, {"draft.1": "text"})
    assert described(flow, ctx)["workflow_stage"] == 1  # the last stage, done
    assert stage_states(described(flow, ctx)) == {"outliner": "done", "draft": "done"}


def test_describe_a_parallel_has_no_stage_number() -> None:
    flow = workflow(ParallelAgent(name="fan", sub_agents=["north", "east"]))
    ctx = conversation()
    first = described(flow, ctx)
    assert first == {"workflow_type": "parallel", "stages": [
        {"output_key": "north", "agent": "north", "state": "running"},
        {"output_key": "east", "agent": "east", "state": "running"}]}
    step(flow, ctx, {"north.1": "N", "east.1": "E"})
    assert stage_states(described(flow, ctx)) == {"north": "done", "east": "done"}


def test_describe_a_loop_numbers_its_round() -> None:
    flow = workflow(LoopAgent(name="refine", sub_agents=["writer", "critic"],
                              max_iterations=3))
    ctx = conversation()
    assert described(flow, ctx) == {
        "workflow_type": "loop", "workflow_stage": 0, "loop_iteration": 1,
        "loop_max_iterations": 3, "stages": [
            {"output_key": "writer", "agent": "writer", "state": "running"},
            {"output_key": "critic", "agent": "critic", "state": "waiting"}]}
    step(flow, ctx, {"writer.1": "draft 1"})
    step(flow, ctx, {"critic.1": "more"})
    second = described(flow, ctx)
    assert (second["loop_iteration"], second["workflow_stage"]) == (2, 0)
    # The critic's answer is of the last round: in this round it has not run yet.
    assert stage_states(second) == {"writer": "running", "critic": "waiting"}
    step(flow, ctx, {"writer.2": "draft 2"})
    third = described(flow, ctx)
    assert (third["loop_iteration"], third["workflow_stage"]) == (2, 1)
    assert stage_states(third) == {"writer": "done", "critic": "running"}
    step(flow, ctx, {"critic.2": "fine"})
    step(flow, ctx, {"writer.3": "draft 3"})
    step(flow, ctx, {"critic.3": "fine"})
    last = described(flow, ctx)  # ended after max_iterations: the last stage ran last
    assert (last["loop_iteration"], last["workflow_stage"]) == (3, 1)
    assert stage_states(last) == {"writer": "done", "critic": "done"}
    unbounded = workflow(LoopAgent(name="refine", sub_agents=["writer"]))
    assert "loop_max_iterations" not in described(unbounded, conversation())


# -- the Python API's mistakes --------------------------------------------------------------

def mistake(match: str, build: Any) -> None:
    with pytest.raises(InvalidArgumentError, match=match):
        build()


def test_the_python_api_refuses_a_workflow_it_could_not_run() -> None:
    model = ScriptedModel()
    mistake("sequential agent 'wf': sub_agents is empty",
            lambda: SequentialAgent(name="wf"))
    mistake("parallel agent 'wf': output_key 'a' is given to two",
            lambda: ParallelAgent(name="wf", sub_agents=[
                "a", SubAgent(agent="b", output_key="a")]))
    mistake("output_key 'x' is given to two", lambda: SequentialAgent(
        name="wf", sub_agents=[Agent("a", model, output_key="x"),
                               Agent("b", model, output_key="x")]))
    mistake(re.escape("loop agent 'wf': max_iterations must be an int >= 1 (or None), got 0"),
            lambda: LoopAgent(name="wf", sub_agents=["a"], max_iterations=0))
    mistake("got 1.5", lambda: LoopAgent(name="wf", sub_agents=["a"],
                                         max_iterations=1.5))  # type: ignore[arg-type]
    mistake("sequential agent 'wf': max_iterations is for loop agents only",
            lambda: Workflow.of("wf", "sequential", ["a"], 2))
    with pytest.raises(TypeError, match="max_iterations"):
        SequentialAgent(name="wf", sub_agents=["a"], max_iterations=2)  # type: ignore[call-arg]
    mistake("sub_agents\\[0\\] is the agent itself",
            lambda: SequentialAgent(name="wf", sub_agents=["wf"]))
    mistake("kind must be one of", lambda: Workflow.of("wf", "race", ["a"], None))  # type: ignore[arg-type]
    mistake(r"sub_agents\[1\] must be an Agent, an agent's name or a SubAgent, got int",
            lambda: SequentialAgent(name="wf", sub_agents=["a", 7]))  # type: ignore[list-item]


def test_a_workflow_has_no_model_tools_or_peers_of_its_own() -> None:
    tool = LocalTool("clock", "The time.", lambda args: "noon")
    mistake("a workflow agent has no model", lambda: SequentialAgent(
        name="wf", sub_agents=["a"], model=ScriptedModel()))
    mistake("a workflow agent has no tools", lambda: ParallelAgent(
        name="wf", sub_agents=["a"], tools=[tool]))
    mistake("a workflow agent has no peers", lambda: LoopAgent(
        name="wf", sub_agents=["a"], peers=[Peer("b")]))
    mistake("a workflow agent has no system_prompt", lambda: SequentialAgent(
        name="wf", sub_agents=["a"], system_prompt="Be brief."))
    mistake("stateless_checkpointing must be on", lambda: SequentialAgent(
        name="wf", sub_agents=["a"], stateless_checkpointing=False))


def test_a_bad_output_key_is_refused_wherever_it_is_given() -> None:
    for key in ("has-dash", "1st", "", "with space", "x" * 65):
        mistake("output_key", lambda key=key: SubAgent(agent="a", output_key=key))
        mistake("output_key", lambda key=key: Agent("a", ScriptedModel(), output_key=key))
        mistake("output_key", lambda key=key: SequentialAgent(
            name="wf", sub_agents=["a"], output_key=key))
    # An agent name with '-' becomes a key with '_'; a name that cannot be a key is named.
    assert workflow(SequentialAgent(name="wf", sub_agents=["fact-checker"])).stages[
        0].output_key == "fact_checker"
    mistake(re.escape("agent 'wf': sub_agents[0]: output_key must be"),
            lambda: SequentialAgent(name="wf", sub_agents=["9lives"]))


def test_an_agent_given_as_a_stage_keeps_its_output_key() -> None:
    model = ScriptedModel()
    flow = workflow(SequentialAgent(name="wf", sub_agents=[
        Agent("writer", model, output_key="draft"), Agent("editor", model),
        SubAgent(agent="critic", output_key="review", timeout_s=5)]))
    assert [(s.agent, s.output_key, s.timeout_s) for s in flow.stages] == [
        ("writer", "draft", 600.0), ("editor", "editor", 600.0), ("critic", "review", 5.0)]
    wf = SequentialAgent(name="wf", sub_agents=["writer", "editor"])
    assert [(p.agent, p.tool_name) for p in wf.peers] == [
        ("writer", "writer"), ("editor", "editor")]


# -- placeholders ---------------------------------------------------------------------------

def test_fill_placeholders() -> None:
    state = {"outline": "1. moon", "draft": "Tides.", "n": 3}
    assert fill_placeholders("Expand {outline} into {draft}", state) == \
        "Expand 1. moon into Tides."
    assert fill_placeholders("n={n}", state) == "n=3"
    assert fill_placeholders("Notes: {notes?}.", state) == "Notes: ."
    assert fill_placeholders("Given {outline?}", state) == "Given 1. moon"
    assert fill_placeholders("Keep {notes} as written", state) == "Keep {notes} as written"
    for literal in ('{"a": 1}', "{ outline }", "{1st}", "{out-line}", "{{outline}"):
        assert fill_placeholders(literal, {}) == literal
    assert fill_placeholders("{{outline}}", state) == "{1. moon}"
    assert fill_placeholders("{outline} {notes?}", None) == "{outline} "
    # An answer's own braces are its text, not placeholders filled in turn.
    assert fill_placeholders("{a} {b}", {"a": "{b}", "b": "x"}) == "{b} x"


# -- the config file's mistakes -------------------------------------------------------------

CONFIG = """
store: sqlite:///mesh.db
broker: memory://
agents:
  writer: {}
  critic: {}
"""


def refused(tmp_path: Path, agents: str, *expected: str) -> None:
    path = tmp_path / "mesh.yaml"
    path.write_text(CONFIG + agents)
    with pytest.raises(ConfigurationError) as caught:
        load_config(path)
    for words in expected:
        assert words in str(caught.value), str(caught.value)


def test_a_workflow_in_a_config_file(tmp_path: Path) -> None:
    path = tmp_path / "mesh.yaml"
    path.write_text(CONFIG + """
  pipeline:
    kind: sequential
    description: Write, then review.
    sub_agents: [writer, {agent: refine, output_key: final, timeout_s: 30}]
  refine:
    kind: loop
    max_iterations: 3
    sub_agents: [critic, {agent: editor}]
  editor:
    output_key: edited
""")
    config = load_config(path)
    pipeline = config.build_agent("pipeline")
    assert isinstance(pipeline, SequentialAgent) and pipeline.description == "Write, then review."
    assert [(s.agent, s.output_key, s.timeout_s) for s in workflow(pipeline).stages] == [
        ("writer", "writer", 600.0), ("refine", "final", 30.0)]
    refine = config.build_agent("refine")
    assert isinstance(refine, LoopAgent) and refine.max_iterations == 3
    assert [s.output_key for s in workflow(refine).stages] == ["critic", "edited"]
    assert config.build_agent("editor").output_key == "edited"


def test_each_bad_workflow_config_is_refused_naming_it(tmp_path: Path) -> None:
    refused(tmp_path, "  wf: {kind: sequential, sub_agents: [writer, ghost]}\n",
            "agents.wf.sub_agents.1", "'ghost' is not an agent of this file")
    refused(tmp_path, "  a: {kind: sequential, sub_agents: [writer, b]}\n"
                      "  b: {kind: parallel, sub_agents: [critic, a]}\n",
            "a cycle", "a -> b -> a")
    refused(tmp_path, "  wf: {kind: loop, max_iterations: 0, sub_agents: [writer]}\n",
            "agents.wf.max_iterations")
    refused(tmp_path, "  wf: {kind: sequential, sub_agents: [writer, "
                      "{agent: critic, output_key: writer}]}\n",
            "agents.wf.sub_agents.1", "output_key 'writer'")
    refused(tmp_path, "  wf: {kind: parallel, model: {kind: scripted}, sub_agents: [writer]}\n",
            "agents.wf", "no model:")
    refused(tmp_path, "  wf: {kind: sequential, tools: [], sub_agents: [writer]}\n",
            "agents.wf", "no tools:")
    refused(tmp_path, "  wf: {kind: sequential}\n", "agents.wf", "needs sub_agents")
    refused(tmp_path, "  wf: {kind: loop, stateless_checkpointing: false, sub_agents: "
                      "[writer]}\n", "agents.wf", "stateless_checkpointing must be true")
    refused(tmp_path, "  wf: {kind: sequential, max_iterations: 2, sub_agents: [writer]}\n",
            "agents.wf", "max_iterations is for loop agents")
    refused(tmp_path, "  wf: {sub_agents: [writer]}\n",
            "agents.wf", "sub_agents is for workflow agents")
    refused(tmp_path, "  wf: {kind: race, sub_agents: [writer]}\n", "agents.wf.kind")
    refused(tmp_path, "  wf: {kind: sequential, output_key: bad-key, sub_agents: [writer]}\n",
            "agents.wf.output_key")


def test_a_workflow_agent_can_be_copied_with_changes() -> None:
    """``dataclasses.replace`` (how an agent is copied with one change) gives the
    stages' peers back to the new agent: they are not peers of the user's."""
    loop = LoopAgent(name="refine", sub_agents=["writer", "critic"], max_iterations=2)
    logged = replace(loop, events=True, max_iterations=3)
    assert logged.events and workflow(logged).max_iterations == 3
    assert logged.peers == loop.peers and workflow(logged).stages == workflow(loop).stages
    other = replace(loop, sub_agents=["judge"])
    assert [p.agent for p in other.peers] == ["judge"]
    assert [s.agent for s in workflow(other).stages] == ["judge"]
    mistake("a workflow agent has no peers", lambda: replace(loop, peers=[Peer("b")]))
