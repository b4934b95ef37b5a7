"""Workflow agents end to end (docs/workflows.md): sequential, parallel and loop agents
whose stages are peer calls to real agents (or to peers the test plays by hand), on
a SQLite file and on PostgreSQL: what each stage is asked, the answer, the progress
in the history and the live checkpoint, failures, cancels, approvals inside a stage,
the event log, and a workflow built from a config file."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from meshpoint import a2a
from meshpoint.config import load_config
from meshpoint.events.log import EventStore
from meshpoint.llm.base import ModelResponse, ToolSpec
from meshpoint.runtime import (
    Agent,
    LoopAgent,
    ParallelAgent,
    SequentialAgent,
    SubAgent,
    wire,
)
from meshpoint.runtime.approvals import APPROVAL
from meshpoint.store import SqlStore
from tests.integration.mesh import ManualPeer, Mesh, eventually
from tests.integration.test_approvals import SideEffects, approving
from tests.integration.test_handoff import history
from tests.integration.test_runtime import no_rows_left, text

REQUEST = "Write about tides"


class Said:
    """A model whose n-th answer (from 1) is ``answers[n - 1]`` (the last one once
    they run out; ``"<name> <n>"`` without answers), keeping every conversation it
    was shown."""

    def __init__(self, name: str, *answers: str) -> None:
        self.name = name
        self.answers = answers
        self.shown: list[list[dict[str, Any]]] = []

    async def complete(self, messages: list[dict[str, Any]],
                       tools: list[ToolSpec]) -> ModelResponse:
        self.shown.append(messages)
        n = len(self.shown)
        if not self.answers:
            return ModelResponse(text=f"{self.name} {n}")
        return ModelResponse(text=self.answers[min(n, len(self.answers)) - 1])


def said(name: str, answers: list[str] | None = None) -> Said:
    """A :class:`Said` model, as a config file's ``model: {kind: python}`` builds it."""
    return Said(name, *(answers or []))


class Broken:
    """A model that fails every call."""

    name = "broken"

    async def complete(self, messages: list[dict[str, Any]],
                       tools: list[ToolSpec]) -> ModelResponse:
        raise RuntimeError("the model is down")


def asked(model: Said, call: int = 0) -> str:
    """What the ``call``-th conversation shown to ``model`` asked (its last message)."""
    return str(model.shown[call][-1]["content"])


def system(model: Said, call: int = 0) -> str | None:
    first = model.shown[call][0]
    return str(first["content"]) if first["role"] == "system" else None


async def records(store: SqlStore, task_id: str) -> list[dict[str, Any]]:
    """The execution state of each of the task's history records, oldest first, once
    the task ended."""
    return [r.execution_state.model_dump() for r in await history(store, task_id)]


async def live_state(store: SqlStore, task_id: str) -> dict[str, Any]:
    """The execution state the paused task's live checkpoint carries."""
    restored = await store.restore_task(task_id)
    return dict(restored.context.history["record"]["execution_state"])


def states(execution_state: dict[str, Any]) -> dict[str, str]:
    return {s["output_key"]: s["state"] for s in execution_state["stages"]}


# -- sequential -----------------------------------------------------------------------------

async def test_sequential_stages_see_the_request_and_earlier_answers(
        mesh: Mesh, live_store: SqlStore) -> None:
    """Each stage is asked the request plus a section per earlier answer; a stage's
    system prompt has its ``{key}`` placeholders filled from those answers (a
    ``{key?}`` the state lacks emptied, a brace that names no answer kept); the
    workflow answers with the last stage's answer; its records say where it stood."""
    outliner = Said("outliner", "1. moon 2. sun")
    writer = Said("writer", "Tides follow the moon.")
    editor = Said("editor", "Tides follow the moon (edited).")
    await mesh.run(Agent("outliner", outliner))
    await mesh.run(Agent("writer", writer, output_key="draft", system_prompt=(
        "Expand the outline: {outline}. Notes: {notes?}. Keep {braces} as they are.")))
    await mesh.run(Agent("editor", editor, system_prompt="Edit {draft} of {outline}."))
    await mesh.run(SequentialAgent(name="pipeline", sub_agents=[
        SubAgent(agent="outliner", output_key="outline"),
        Agent("writer", writer, output_key="draft"), "editor"]))
    request_id = await mesh.client.submit("pipeline", REQUEST)
    answer = await mesh.client.wait(request_id, timeout_s=20)
    assert answer.status.state is a2a.TaskState.COMPLETED, answer
    assert text(answer) == "Tides follow the moon (edited)."

    assert asked(outliner) == REQUEST and system(outliner) is None
    assert asked(writer) == f"{REQUEST}\n\n## outline\n\n1. moon 2. sun"
    assert system(writer) == ("Expand the outline: 1. moon 2. sun. Notes: . "
                              "Keep {braces} as they are.")
    assert asked(editor) == (f"{REQUEST}\n\n## outline\n\n1. moon 2. sun"
                             "\n\n## draft\n\nTides follow the moon.")
    assert system(editor) == "Edit Tides follow the moon. of 1. moon 2. sun."
    assert [len(m.shown) for m in (outliner, writer, editor)] == [1, 1, 1]

    task_id = mesh.client.task_id("pipeline", request_id)
    written = await records(live_store, task_id)
    assert [r["phase"] for r in written] == ["waiting_peers"] * 3 + ["completed"]
    assert {r["workflow_type"] for r in written} == {"sequential"}
    assert [r["workflow_stage"] for r in written] == [0, 1, 2, 2]
    assert [states(r) for r in written] == [
        {"outline": "running", "draft": "waiting", "editor": "waiting"},
        {"outline": "done", "draft": "running", "editor": "waiting"},
        {"outline": "done", "draft": "done", "editor": "running"},
        {"outline": "done", "draft": "done", "editor": "done"}]
    assert [s["agent"] for s in written[0]["stages"]] == ["outliner", "writer", "editor"]
    await no_rows_left(live_store)


# -- parallel -------------------------------------------------------------------------------

async def test_parallel_branches_start_in_one_pause_and_answer_in_branch_order(
        mesh: Mesh, live_store: SqlStore) -> None:
    """All branches are asked at once, in one checkpoint holding every sub-task; the
    answers, given in reverse order, are merged in branch order."""
    await mesh.run(ParallelAgent(name="fan", sub_agents=["north", "east", "south"]))
    peers = {name: await ManualPeer(mesh, name).start() for name in ("north", "east", "south")}
    request_id = await mesh.client.submit("fan", REQUEST)
    await eventually(lambda: all(len(p.requests) == 1 for p in peers.values()),
                     what="a request to each branch")
    task_id = mesh.client.task_id("fan", request_id)
    paused = await live_store.restore_task(task_id)
    subs = {name: next(iter(p.requests)) for name, p in peers.items()}
    assert set(paused.context.active_peer_sub_tasks) == set(subs.values())
    assert states(paused.context.history["record"]["execution_state"]) == {
        "north": "running", "east": "running", "south": "running"}
    assert all(p.requests[subs[n]][0] == REQUEST for n, p in peers.items())

    for name in ("south", "east", "north"):
        await peers[name].answer(subs[name], f"{name} answer")

        async def resolved(sub: str = subs[name]) -> bool:
            return (await live_store.get_peer_sub_task(sub)).status == "resolved"

        if name != "north":  # the last answer ends the task and its rows
            await eventually(resolved, what=f"the {name} answer recorded")
    answer = await mesh.client.wait(request_id, timeout_s=20)
    assert answer.status.state is a2a.TaskState.COMPLETED, answer
    assert text(answer) == ("## north\n\nnorth answer\n\n## east\n\neast answer"
                            "\n\n## south\n\nsouth answer")
    written = await records(live_store, task_id)
    assert [r["phase"] for r in written] == ["waiting_peers", "completed"]
    assert "workflow_stage" not in written[0] and written[0]["workflow_type"] == "parallel"
    assert len(mesh.events("paused", "fan")) == 1
    assert all(p.cancels == [] for p in peers.values())


# -- loop -----------------------------------------------------------------------------------

async def test_a_loop_stops_when_a_stage_escalates(mesh: Mesh, live_store: SqlStore) -> None:
    """The loop runs its stages round after round, each round numbered in its
    records and its live checkpoint, until an answer escalates; it answers with the
    last answer that did not."""
    writer = Said("writer")
    await mesh.run(Agent("writer", writer))
    await mesh.run(LoopAgent(name="refine", sub_agents=["writer", "critic"], max_iterations=5))
    critic = await ManualPeer(mesh, "critic").start()
    request_id = await mesh.client.submit("refine", REQUEST)
    task_id = mesh.client.task_id("refine", request_id)

    await eventually(lambda: len(critic.requests) == 1, what="the first critique")
    first = next(iter(critic.requests))
    assert critic.requests[first][0] == f"{REQUEST}\n\n## writer\n\nwriter 1"
    live = await live_state(live_store, task_id)
    assert (live["loop_iteration"], live["loop_max_iterations"]) == (1, 5)
    await critic.answer(first, "more about the sun")

    await eventually(lambda: len(critic.requests) == 2, what="the second critique")
    second = list(critic.requests)[1]
    assert asked(writer, 1) == (f"{REQUEST}\n\n## writer\n\nwriter 1"
                                "\n\n## critic\n\nmore about the sun")
    live = await live_state(live_store, task_id)
    assert live["loop_iteration"] == 2 and live["workflow_stage"] == 1
    assert states(live) == {"writer": "done", "critic": "running"}
    await critic.answer(second, json.dumps({"escalate": True, "why": "good enough"}))

    answer = await mesh.client.wait(request_id, timeout_s=20)
    assert answer.status.state is a2a.TaskState.COMPLETED, answer
    assert text(answer) == "writer 2"
    assert len(writer.shown) == 2
    written = await records(live_store, task_id)
    assert [(r["phase"], r["loop_iteration"]) for r in written] == [
        ("waiting_peers", 1), ("waiting_peers", 1), ("waiting_peers", 2),
        ("waiting_peers", 2), ("completed", 2)]
    assert {r["loop_max_iterations"] for r in written} == {5}


async def test_a_loop_stops_after_max_iterations(mesh: Mesh, live_store: SqlStore) -> None:
    writer, critic = Said("writer"), Said("critic")
    await mesh.run(Agent("writer", writer))
    await mesh.run(Agent("critic", critic))
    await mesh.run(LoopAgent(name="refine", sub_agents=["writer", "critic"], max_iterations=2))
    request_id = await mesh.client.submit("refine", REQUEST)
    answer = await mesh.client.wait(request_id, timeout_s=20)
    assert answer.status.state is a2a.TaskState.COMPLETED, answer
    assert text(answer) == "critic 2"
    assert (len(writer.shown), len(critic.shown)) == (2, 2)
    assert asked(writer, 1) == f"{REQUEST}\n\n## writer\n\nwriter 1\n\n## critic\n\ncritic 1"
    written = await records(live_store, mesh.client.task_id("refine", request_id))
    assert [r["loop_iteration"] for r in written] == [1, 1, 2, 2, 2]
    assert written[-1]["phase"] == "completed"
    assert states(written[-1]) == {"writer": "done", "critic": "done"}


# -- nesting --------------------------------------------------------------------------------

async def test_a_sequential_of_a_parallel_of_a_loop(mesh: Mesh, live_store: SqlStore) -> None:
    writer = Said("writer")
    critic = Said("critic", "shorter", json.dumps({"escalate": True}))
    facts, summarizer = Said("facts", "the moon pulls"), Said("summarizer", "Tides: done.")
    for name, model in (("writer", writer), ("critic", critic), ("facts", facts),
                        ("summarizer", summarizer)):
        await mesh.run(Agent(name, model))
    await mesh.run(LoopAgent(name="refine", sub_agents=["writer", "critic"], max_iterations=4))
    await mesh.run(ParallelAgent(name="research", sub_agents=["refine", "facts"]))
    await mesh.run(SequentialAgent(name="pipeline", sub_agents=["research", "summarizer"]))
    answer = await mesh.client.ask("pipeline", REQUEST, timeout_s=30)
    assert answer.status.state is a2a.TaskState.COMPLETED, answer
    assert text(answer) == "Tides: done."
    assert asked(summarizer) == (f"{REQUEST}\n\n## research\n\n## refine\n\nwriter 2"
                                 "\n\n## facts\n\nthe moon pulls")
    assert asked(facts) == REQUEST
    assert (len(writer.shown), len(critic.shown)) == (2, 2)
    await no_rows_left(live_store)


async def test_placeholders_reach_the_stages_of_a_nested_workflow(mesh: Mesh) -> None:
    """As in ADK, where a workflow's state is its whole session's: a stage of a
    parallel (or any) workflow that is itself a stage fills ``{key}`` from the answers
    of the outer workflow's earlier stages too."""
    outliner, writer, critic = Said("outliner", "1. moon"), Said("writer"), Said("critic")
    await mesh.run(Agent("outliner", outliner, output_key="outline"))
    await mesh.run(Agent("writer", writer, system_prompt="Expand {outline}."))
    await mesh.run(Agent("critic", critic, system_prompt="Judge {writer?} of {outline}."))
    await mesh.run(ParallelAgent(name="fan", sub_agents=["writer"]))
    await mesh.run(LoopAgent(name="refine", sub_agents=["fan", "critic"], max_iterations=1))
    await mesh.run(SequentialAgent(name="pipeline", sub_agents=[
        Agent("outliner", outliner, output_key="outline"), "refine"]))
    answer = await mesh.client.ask("pipeline", REQUEST, timeout_s=20)
    assert answer.status.state is a2a.TaskState.COMPLETED, answer
    assert system(writer) == "Expand 1. moon."
    # The writer answered inside the parallel: its answer came out with the parallel's.
    assert system(critic) == "Judge writer 1 of 1. moon."


async def test_a_nested_workflows_stage_answers_reach_the_outer_stages_after_it(
        mesh: Mesh) -> None:
    """ADK's pattern of parallel gatherers, each under its own output key, then a
    merger that names them: a nested workflow answers its caller with its stages'
    answers too, so ``{web}`` and ``{papers}`` are filled beside ``{gather}``."""
    web, papers, merger = Said("web", "W"), Said("papers", "P"), Said("merger")
    await mesh.run(Agent("web", web))
    await mesh.run(Agent("papers", papers, output_key="papers_found"))
    await mesh.run(Agent("merger", merger, system_prompt="{web} + {papers_found} / {gather?}"))
    await mesh.run(ParallelAgent(name="gather", sub_agents=[
        "web", SubAgent(agent="papers", output_key="papers_found")]))
    await mesh.run(SequentialAgent(name="pipeline", sub_agents=["gather", "merger"]))
    answer = await mesh.client.ask("pipeline", REQUEST, timeout_s=20)
    assert answer.status.state is a2a.TaskState.COMPLETED, answer
    assert system(merger) == "W + P / ## web\n\nW\n\n## papers_found\n\nP"


# -- failures -------------------------------------------------------------------------------

async def test_a_failed_stage_fails_the_workflow_naming_it(mesh: Mesh,
                                                           live_store: SqlStore) -> None:
    first, last = Said("first"), Said("last")
    await mesh.run(Agent("first", first))
    await mesh.run(Agent("broken", Broken()))
    await mesh.run(Agent("last", last))
    await mesh.run(SequentialAgent(name="pipeline", sub_agents=[
        "first", SubAgent(agent="broken", output_key="check"), "last"]))
    request_id = await mesh.client.submit("pipeline", REQUEST)
    answer = await mesh.client.wait(request_id, timeout_s=20)
    assert answer.status.state is a2a.TaskState.FAILED, answer
    assert text(answer) == "stage check (agent broken) failed: RuntimeError: the model is down"
    assert len(first.shown) == 1 and last.shown == []
    written = await records(live_store, mesh.client.task_id("pipeline", request_id))
    assert (written[-1]["phase"], written[-1]["workflow_stage"]) == ("failed", 1)
    assert states(written[-1]) == {"first": "done", "check": "failed", "last": "waiting"}


async def test_a_stage_that_times_out_fails_the_workflow_naming_it(
        mesh: Mesh, live_store: SqlStore) -> None:
    await mesh.run(ParallelAgent(name="fan", sub_agents=[
        "quick", SubAgent(agent="silent", timeout_s=0.3)]))
    await mesh.run(Agent("quick", Said("quick")))
    silent = await ManualPeer(mesh, "silent").start()
    answer = await mesh.client.ask("fan", REQUEST, timeout_s=20)
    assert answer.status.state is a2a.TaskState.FAILED, answer
    assert "stage silent (agent silent) timeout" in text(answer), text(answer)
    assert "quick" not in text(answer)
    (sub,) = silent.requests
    await eventually(lambda: silent.cancels == [
        wire.derive_task_id("silent", silent.requests[sub][1], sub)], what="the cancel")
    await no_rows_left(live_store)


# -- cancel ---------------------------------------------------------------------------------

async def test_cancel_reaches_every_running_branch_and_nested_stage(
        mesh: Mesh, live_store: SqlStore) -> None:
    """Canceling a parallel workflow cancels each branch still running, a nested
    sequential one too, which cancels its own running stage; an answered branch and a
    stage never started are left alone."""
    await mesh.run(ParallelAgent(name="fan", sub_agents=["done", "busy", "inner"]))
    await mesh.run(SequentialAgent(name="inner", sub_agents=["deep", "later"]))
    peers = {name: await ManualPeer(mesh, name).start()
             for name in ("done", "busy", "deep", "later")}
    request_id = await mesh.client.submit("fan", REQUEST)
    await eventually(lambda: all(len(peers[n].requests) == 1 for n in ("done", "busy", "deep")),
                     what="the requests of the branches and the nested stage")
    done_sub = next(iter(peers["done"].requests))
    await peers["done"].answer(done_sub, "finished early")

    async def resolved() -> bool:
        return (await live_store.get_peer_sub_task(done_sub)).status == "resolved"

    await eventually(resolved, what="the answered branch recorded")
    await mesh.client.cancel("fan", mesh.client.task_id("fan", request_id))
    answer = await mesh.client.wait(request_id, timeout_s=20)
    assert answer.status.state is a2a.TaskState.CANCELED, answer

    def canceled(name: str) -> bool:
        peer = peers[name]
        (sub,) = peer.requests
        return peer.cancels == [wire.derive_task_id(name, peer.requests[sub][1], sub)]

    await eventually(lambda: canceled("busy") and canceled("deep"),
                     what="the cancels of the running branch and the nested stage")
    assert peers["done"].cancels == [] and peers["later"].requests == {}
    await eventually(lambda: len(mesh.events("canceled", "inner")) == 1,
                     what="the nested workflow canceled")
    await no_rows_left(live_store)


# -- approvals ------------------------------------------------------------------------------

async def test_an_approval_inside_a_stage(mesh: Mesh, live_store: SqlStore) -> None:
    """A stage whose tool waits for a human pauses its own task; once approved the
    tool runs once and the workflow goes on to its next stage."""
    effects = SideEffects()
    reviewer = Said("reviewer", "Reviewed.")
    await mesh.run(replace(approving(effects), name="clerk"))
    await mesh.run(Agent("reviewer", reviewer))
    await mesh.run(SequentialAgent(name="office", sub_agents=["clerk", "reviewer"]))
    request_id = await mesh.client.submit("office", "Send the report")
    waiting: list[str] = []

    async def clerk_waits() -> bool:
        waiting[:] = [t.task_id for t in await live_store.list_paused_tasks(agent_name="clerk")
                      if t.status == "input_required"]
        return bool(waiting)

    await eventually(clerk_waits, what="the clerk's task waiting for approval")
    (clerk_task,) = waiting
    (call,) = [s for s in await live_store.get_peer_sub_tasks_for_task(clerk_task)
               if s.status == "pending" and APPROVAL in s.correlation_data]
    assert not effects.runs
    live = await live_state(live_store, mesh.client.task_id("office", request_id))
    assert states(live) == {"clerk": "running", "reviewer": "waiting"}
    decision = await mesh.client.approve(clerk_task, call.sub_task_id, by="alice")
    assert decision["decision"] == "approved"
    answer = await mesh.client.wait(request_id, timeout_s=20)
    assert answer.status.state is a2a.TaskState.COMPLETED, answer
    assert text(answer) == "Reviewed."
    assert list(effects.runs.values()) == [1]
    assert "sent 'Send the report'" in asked(reviewer)
    await no_rows_left(live_store)


# -- events ---------------------------------------------------------------------------------

async def test_each_stage_is_a_step_of_the_event_log(mesh: Mesh, live_store: SqlStore) -> None:
    await mesh.run(Agent("outliner", Said("outliner")))
    await mesh.run(Agent("writer", Said("writer"), output_key="draft"))
    await mesh.run(SequentialAgent(name="pipeline", events=True, sub_agents=[
        "outliner", Agent("writer", Said("writer"), output_key="draft")]))
    request_id = await mesh.client.submit("pipeline", REQUEST)
    answer = await mesh.client.wait(request_id, timeout_s=20)
    assert answer.status.state is a2a.TaskState.COMPLETED, answer
    task_id = mesh.client.task_id("pipeline", request_id)
    log = EventStore(live_store)
    steps: list[tuple[str, str | None]] = []

    async def logged() -> bool:
        steps[:] = [(e.event_type, e.step_name) for e in await log.get_events(thread_id=task_id)
                    if (e.step_name or "").startswith("stage:")]
        return len(steps) == 4

    await eventually(logged, what="the stages' events")
    assert steps == [("step_start", "stage:outliner"), ("step_complete", "stage:outliner"),
                     ("step_start", "stage:draft"), ("step_complete", "stage:draft")]
    done = await log.get_events(thread_id=task_id, event_type="step_complete")
    assert [e.output_data for e in done if e.step_name == "stage:draft"] == [
        {"state": "completed", "text": "writer 1"}]


# -- config ---------------------------------------------------------------------------------

CONFIG = """
namespace: ignored
store: sqlite:///unused.db
broker: memory://
agents:
  pipeline:
    kind: sequential
    sub_agents: [outliner, {agent: writer, output_key: draft, timeout_s: 30}, polish]
  polish:
    kind: loop
    max_iterations: 2
    sub_agents: [critic]
  outliner:
    output_key: outline
    model: {kind: python, factory: "tests.integration.test_workflows:said",
            options: {name: outliner, answers: ["1. moon"]}}
  writer:
    system_prompt: "Expand {outline}"
    model: {kind: python, factory: "tests.integration.test_workflows:said",
            options: {name: writer}}
  critic:
    model: {kind: python, factory: "tests.integration.test_workflows:said",
            options: {name: critic}}
"""


async def test_a_workflow_built_from_a_config_file(mesh: Mesh, tmp_path: Path) -> None:
    path = tmp_path / "mesh.yaml"
    path.write_text(CONFIG)
    config = load_config(path)
    agents = {name: config.build_agent(name)
              for name in ("pipeline", "polish", "outliner", "writer", "critic")}
    assert isinstance(agents["pipeline"], SequentialAgent)
    assert isinstance(agents["polish"], LoopAgent) and agents["polish"].max_iterations == 2
    for agent in agents.values():
        await mesh.run(agent)
    answer = await mesh.client.ask("pipeline", REQUEST, timeout_s=20)
    assert answer.status.state is a2a.TaskState.COMPLETED, answer
    assert text(answer) == "critic 2"
    writer = agents["writer"].model
    assert isinstance(writer, Said)
    assert system(writer) == "Expand 1. moon"
    assert asked(writer) == f"{REQUEST}\n\n## outline\n\n1. moon"
    critic = agents["critic"].model
    assert isinstance(critic, Said)
    assert asked(critic) == (f"{REQUEST}\n\n## outline\n\n1. moon\n\n## draft\n\nwriter 1")
