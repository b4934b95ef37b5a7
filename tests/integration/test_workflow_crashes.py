"""A workflow's instance killed at every stage boundary and inside each stage: no
completed stage (or parallel branch, or loop iteration) runs again, and the caller
gets one answer, the one an uninterrupted run gives.

Each sub-agent's model answers from its request alone and counts the requests it
answers, by request text (every stage of every loop iteration is asked a text of its
own): that count is the side effect that must happen exactly once (the sub-agents and
workflows are in :mod:`tests.integration.workflow_stages`). The instances are killed
in-process, as a crash kills them (nothing acknowledged, no lease released), and a
fresh instance of the same agent replaces each one killed."""

from __future__ import annotations

import asyncio
import json
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest

from meshpoint import a2a
from meshpoint.errors import UnknownTaskError
from meshpoint.runtime import Agent, AgentInstance, SequentialAgent, SubAgent
from meshpoint.runtime.workflows import METADATA_KEY
from meshpoint.store import SqlStore
from tests.integration.mesh import FAST, Mesh, eventually
from tests.integration.test_runtime import no_rows_left, text
from tests.integration.workflow_stages import (
    NO_LIMITS,
    REQUEST,
    SUB_AGENTS,
    Counting,
    workflows,
)

#: Shorter than FAST: a kill costs a lease (or an ack wait), and a run has many kills.
QUICK = replace(FAST, lease_ttl_s=0.5, request_ack_wait_s=0.8, recovery_interval_s=0.05)
#: Where a workflow's instance is killed, every time the point comes (once per point
#: and boundary): as it checkpoints a stage boundary (before the write commits), after
#: the first write committed and before the stage's calls are published, after a stage's
#: call is published and before the task leaves its memory, inside a stage (the
#: instance that paused the task dies while a sub-agent works), and after the
#: workflow's answer is published and before its rows are deleted.
POINTS = ("before_checkpoint", "after_checkpoint", "after_publish", "in_stage",
          "after_answer")


class Kills:
    """Kills a workflow agent's instance at ``point`` (see POINTS), once per boundary,
    and starts a fresh instance of its agent in its place. ``None``: no kills (the
    uninterrupted run), only the boundaries counted."""

    def __init__(self, mesh: Mesh, agents: dict[str, Agent]) -> None:
        self.mesh = mesh
        self.agents = agents
        self.point: str | None = None
        #: The boundaries at each point the run came to (killed there, or not); a set,
        #: so that a turn a slow instance ran twice (its lease taken over) counts once.
        self.seen: dict[str, set[Any]] = defaultdict(set)
        self.killed: set[Any] = set()
        #: The instance that wrote the latest checkpoint of a workflow's task.
        self.last_pauser: AgentInstance | None = None

    def holding(self, task_id: str, lease_owner: str | None = None) -> AgentInstance:
        """The instance running ``task_id``: the lease's owner, else the one holding it
        in memory, else the one whose run of a redelivered copy of its request was
        refused and now announces the stored calls again."""
        if lease_owner is not None:
            instance_id = lease_owner.rpartition("#")[0]
            return next(i for i in self.mesh.instances if i.instance_id == instance_id)
        running = [i for i in self.mesh.instances if i.running]
        holders = [i for i in running if task_id in i.active]
        return holders[0] if holders else next(
            i for i in reversed(running) if task_id in i.stats.tasks("dropped"))

    async def replace(self, victim: AgentInstance) -> None:
        if not victim.running:
            return  # killed already (it paused the task, then died at another point)
        await victim.kill()
        await self.mesh.run(self.agents[victim.agent.name])

    async def at(self, point: str, boundary: Any, victim: Callable[[], AgentInstance],
                 *, die_here: bool = True) -> None:
        """The run came to ``point`` at ``boundary``: kill the ``victim`` if this is
        the point killed at and the boundary was not killed before. ``die_here``: the
        caller runs in the victim's task, which the kill cancels."""
        if boundary in self.killed:
            return
        self.seen[point].add(boundary)
        if point != self.point:
            return
        self.killed.add(boundary)
        dying = victim()
        if not die_here:
            await self.replace(dying)
            return
        # Cancelled by the kill, unless the caller is shielded (a checkpoint's write):
        # then the victim's run is cancelled where it awaits it, and this ends too.
        await asyncio.shield(asyncio.get_running_loop().create_task(self.replace(dying)))
        raise asyncio.CancelledError

    def install(self, store: SqlStore, models: list[Counting]) -> None:
        checkpoint = store.checkpoint_task

        async def checkpointing(ctx: Any, agent_name: str, **kw: Any) -> Any:
            if agent_name not in self.agents:
                return await checkpoint(ctx, agent_name, **kw)
            boundary = (ctx.task_id, len(ctx.session_events))
            owner = kw.get("lease_owner")
            await self.at("before_checkpoint", ("before", boundary),
                          lambda: self.holding(ctx.task_id, owner))
            receipt = await checkpoint(ctx, agent_name, **kw)
            self.last_pauser = self.holding(ctx.task_id, owner)
            # A first checkpoint's run is redelivered; a resumed run's is not (see
            # test_a_stage_call_is_published_after_a_resumed_runs_checkpoint).
            await self.at("after_checkpoint" if owner is None else "after_recheckpoint",
                          ("after", boundary), lambda: self.holding(ctx.task_id, owner))
            return receipt

        store.checkpoint_task = checkpointing  # type: ignore[method-assign]
        broker, publish = self.mesh.broker, self.mesh.broker.publish

        async def publishing(subject: str, data: bytes, *args: Any, **kw: Any) -> None:
            await publish(subject, data, *args, **kw)
            msg_id = kw.get("msg_id") or ""
            if msg_id.startswith("answer.") and msg_id.partition(".")[2].split("-")[0] \
                    in self.agents:
                task_id = msg_id.partition(".")[2]
                await self.at("after_answer", msg_id, lambda: self.holding(task_id))
                return
            try:
                request = json.loads(data)
                metadata = request["params"]["message"]["metadata"]
            except (ValueError, KeyError, TypeError):
                return
            if METADATA_KEY in (metadata or {}):
                task_id = metadata["meshpoint_caller"]["task_id"]
                await self.at("after_publish", ("publish", request["id"]),
                              lambda: self.holding(task_id))

        broker.publish = publishing  # type: ignore[method-assign]

        async def in_stage(agent: str, request: str) -> None:
            assert self.last_pauser is not None
            pauser = self.last_pauser
            await self.at("in_stage", ("stage", agent, request), lambda: pauser,
                          die_here=False)

        for model in models:
            model.hook = in_stage


async def start(mesh: Mesh, shape: str
                ) -> tuple[str, Kills, Counter[tuple[str, str]]]:
    """Two instances of each workflow agent of ``shape``, one of each sub-agent, the
    kills installed (killing nothing yet)."""
    counts: Counter[tuple[str, str]] = Counter()
    models = [Counting(name, counts) for name in SUB_AGENTS]
    for model in models:
        await mesh.run(Agent(model.agent, model))
    asked, agents = workflows(shape)
    kills = Kills(mesh, {a.name: a for a in agents})
    kills.install(mesh.store, models)
    for agent in agents:
        await mesh.run(agent, 2)
    return asked, kills, counts


async def settled(mesh: Mesh, agents: set[str]) -> None:
    """Nothing of the run is left to happen: every request to a workflow agent was
    acknowledged (a killed instance's copy redelivered and dropped) and no live row
    is left, so no late copy or recovery can answer again."""
    def all_acked() -> bool:
        sent = {data for kind, subject, data in mesh.broker.log  # type: ignore[attr-defined]
                if kind == "publish" and subject.rpartition(".")[2] in agents
                and ".request." in subject}
        acked = {data for kind, _, data in mesh.broker.log  # type: ignore[attr-defined]
                 if kind == "ack"}
        return sent <= acked

    await eventually(all_acked, timeout_s=15, what="every workflow request acknowledged")
    await no_rows_left(mesh.store)


async def reference(mesh: Mesh, asked: str, kills: Kills,
                    counts: Counter[tuple[str, str]]) -> tuple[str, dict[str, int]]:
    """The uninterrupted run: its answer and the boundaries it came to at each point;
    the sub-agents' counts are then cleared."""
    task = await mesh.client.ask(asked, REQUEST, timeout_s=30)
    assert task.status.state is a2a.TaskState.COMPLETED, task
    await settled(mesh, set(kills.agents))
    assert set(counts.values()) == {1}, counts
    seen = {point: len(boundaries) for point, boundaries in kills.seen.items()}
    kills.seen.clear()
    return text(task), seen


async def crashed_run(mesh: Mesh, shape: str, point: str) -> None:
    asked, kills, counts = await start(mesh, shape)
    expected, boundaries = await reference(mesh, asked, kills, counts)
    once = Counter(dict.fromkeys(counts, 1))
    counts.clear()

    kills.point = point
    rid = await mesh.client.submit(asked, REQUEST)
    task = await mesh.client.wait(rid, 20)
    assert task.status.state is a2a.TaskState.COMPLETED, task
    await settled(mesh, set(kills.agents))
    # Killed at every boundary of the point the uninterrupted run came to.
    assert len(kills.killed) == boundaries.get(point, 0) > 0, (kills.killed, boundaries)
    assert counts == once, "a stage ran again (or never): " + repr(counts - once or once - counts)
    assert text(task) == expected
    assert len(mesh.client.answers[rid]) == 1


#: The nested workflow has the most boundaries (slow): once per point, on one backend.
CASES = [pytest.param(backend, shape, point, id=f"{shape}-{point}-{backend}",
                      marks=() if backend == "sqlite" else pytest.mark.postgres)
         for shape in ("sequential", "parallel", "loop") for point in POINTS
         for backend in ("sqlite", "postgres")] + [
    pytest.param(backend, "nested", point, id=f"nested-{point}-{backend}",
                 marks=() if backend == "sqlite" else pytest.mark.postgres)
    for point, backend in zip(POINTS, ("postgres", "sqlite", "postgres", "sqlite",
                                       "postgres"), strict=True)]


@pytest.mark.parametrize(("backend", "shape", "point"), CASES, indirect=["backend"])
async def test_a_workflow_killed_at_every_boundary_runs_no_stage_twice(
        live_store: SqlStore, shape: str, point: str) -> None:
    """A workflow's instance is killed at every boundary of ``point`` (each once);
    every sub-agent's side effect happens once per stage and loop iteration, and the
    caller gets one answer, the uninterrupted run's."""
    mesh = await Mesh(live_store, QUICK).start()
    try:
        await crashed_run(mesh, shape, point)
    finally:
        await mesh.close()


async def test_a_parallel_workflow_killed_after_some_branches_answered_waits_for_the_rest(
        live_store: SqlStore) -> None:
    """Two of three branches have answered when every instance of the parallel
    workflow dies; fresh instances take the last answer: the answered branches are not
    asked again, the last one is asked once, and the answer is the uninterrupted one."""
    mesh = await Mesh(live_store, QUICK).start()
    try:
        asked, kills, counts = await start(mesh, "parallel")
        expected, _ = await reference(mesh, asked, kills, counts)
        once = Counter(dict.fromkeys(counts, 1))
        counts.clear()
        gate = asyncio.Event()

        async def held(agent: str, request: str) -> None:
            if agent == "edit":
                await gate.wait()

        for instance in mesh.of("edit"):
            instance.agent.model.hook = held  # type: ignore[attr-defined]
        rid = await mesh.client.submit(asked, REQUEST)
        task_id = mesh.client.task_id(asked, rid)

        async def two_answered() -> bool:
            try:
                subs = await live_store.get_peer_sub_tasks_for_task(task_id)
            except UnknownTaskError:
                return False  # not checkpointed yet
            return sorted(s.peer_agent_name or "" for s in subs if s.status != "pending") \
                == ["outline", "research"]

        await eventually(two_answered, what="two branches answered")
        for instance in mesh.of("par"):
            await instance.kill()
        await mesh.run(kills.agents["par"], 2)
        gate.set()
        task = await mesh.client.wait(rid, 20)
        assert task.status.state is a2a.TaskState.COMPLETED, task
        await settled(mesh, {"par"})
        assert text(task) == expected
        assert counts == once
        requests = Counter(subject.rpartition(".")[2] for subject, _ in mesh.broker.published(
            f"{QUICK.namespace}.") if ".request." in subject)  # type: ignore[attr-defined]
        # Each branch asked once per run (the reference run's and this one's).
        assert requests == {"par": 2, "research": 2, "outline": 2, "edit": 2}, requests
        assert len(mesh.client.answers[rid]) == 1
    finally:
        await mesh.close()


@pytest.mark.portable_too
async def test_a_stage_call_is_published_after_a_resumed_runs_checkpoint(
        live_store: SqlStore) -> None:
    """The instance that resumed a sequential workflow dies after checkpointing its
    second stage's call and before publishing it: the call must still be made, once.
    The resumed run's checkpoint released the task, and no message is left to
    redeliver: the sweeper's announcement check publishes the call again once the
    sub-agent has said nothing for ``announce_check_s`` (the broker would drop the
    copy had the first been published)."""
    mesh = await Mesh(live_store, replace(QUICK, announce_check_s=0.3)).start()
    try:
        counts: Counter[tuple[str, str]] = Counter()
        models = [Counting(name, counts) for name in SUB_AGENTS]
        for model in models:
            await mesh.run(Agent(model.agent, model))
        seq = SequentialAgent(name="seq", recovery=NO_LIMITS, sub_agents=[
            "research", SubAgent(agent="outline", timeout_s=60)])
        kills = Kills(mesh, {"seq": seq})
        kills.install(mesh.store, models)
        await mesh.run(seq, 2)
        kills.point = "after_recheckpoint"
        task = await mesh.client.ask("seq", REQUEST, timeout_s=20)
        assert kills.killed
        assert task.status.state is a2a.TaskState.COMPLETED, text(task)
        assert set(counts.values()) == {1}
        assert mesh.events("announced_again", "seq")
    finally:
        await mesh.close()
