"""``meshpoint tasks show`` of a workflow agent's task, run as a subprocess against
the store of a running mesh: the workflow's kind, each stage (output key, agent,
done/running/waiting/failed) and a loop's round of its bound, from the live
checkpoint while the task runs and from its last history record once it ended; the
same in ``--json``. The stages are agents the test plays by hand, so it says when
each answers."""

from __future__ import annotations

import json
from typing import Any

from meshpoint.llm import ScriptedModel
from meshpoint.runtime import Agent, LoopAgent, ParallelAgent, SequentialAgent
from meshpoint.store import SqlStore
from tests.acceptance.test_cli_tasks import ok_json, tasks, where  # noqa: F401 (fixture)
from tests.integration.mesh import ManualPeer, Mesh, eventually


def states(shown: dict[str, Any]) -> list[tuple[str, str, str]]:
    return [(s["output_key"], s["agent"], s["state"]) for s in shown["workflow"]["stages"]]


async def asked(peer: ManualPeer, count: int) -> str:
    """The sub-task id of the ``count``-th request ``peer`` got, once it came."""
    await eventually(lambda: len(peer.requests) >= count, what=f"{peer.agent} asked")
    return list(peer.requests)[count - 1]


async def shown_when(where: list[str], task_id: str,  # noqa: F811
                     stages: list[tuple[str, str, str]]
                     ) -> dict[str, Any]:
    """``tasks show --json`` once the task's workflow shows ``stages``."""
    last: dict[str, Any] = {}

    async def there() -> bool:
        nonlocal last
        last = await ok_json(where, "show", task_id)
        return last.get("workflow") is not None and states(last) == stages

    await eventually(there, timeout_s=30, what=f"{stages} shown")
    return last


async def test_a_loop_shows_its_round_and_each_stage_live_and_ended(
        mesh: Mesh, live_store: SqlStore, where: list[str]) -> None:  # noqa: F811
    critic = await ManualPeer(mesh, "critic").start()
    await mesh.run(Agent("reviser", ScriptedModel(persona="reviser")))
    await mesh.run(LoopAgent(name="polish", sub_agents=["critic", "reviser"],
                             max_iterations=3))
    request_id = await mesh.client.submit("polish", "Draft: heat pumps work in the cold")
    task_id = mesh.client.task_id("polish", request_id)

    first = await asked(critic, 1)
    shown = await shown_when(where, task_id, [("critic", "critic", "running"),
                                              ("reviser", "reviser", "waiting")])
    assert shown["live"] is True and shown["status"] == "waiting_peers"
    # The stage's timeout (600 s), not its announcement check (30 s), stored first.
    assert [round(w["deadline"] - shown["checkpointed_at"]) for w in shown["waiting_on"]] \
        == [600]
    assert shown["workflow"] | {"stages": None} == {
        "type": "loop", "stage": 0, "loop_iteration": 1, "loop_max_iterations": 3,
        "stages": None}
    code, out, err = await tasks(where, "show", task_id)
    assert code == 0, err
    assert "loop workflow, iteration 1 of 3" in out
    assert [line.split()[1:4] for line in out.splitlines()
            if line.startswith("│") and line.split()[1] in ("1", "2")][-2:] == [
        ["1", "│", "critic"], ["2", "│", "reviser"]]
    assert "running" in out and "waiting" in out

    # The critic asks for a change: the reviser runs, and the critic is asked again,
    # in round 2.
    await critic.answer(first, "Cite a source.")
    second = await asked(critic, 2)
    shown = await shown_when(where, task_id, [("critic", "critic", "running"),
                                              ("reviser", "reviser", "waiting")])
    assert shown["workflow"]["loop_iteration"] == 2
    # Satisfied, it escalates: the loop ends with the reviser's answer, and its last
    # record still says where it stood.
    await critic.answer(second, json.dumps({"escalate": True}))
    ended = await shown_when(where, task_id, [("critic", "critic", "done"),
                                              ("reviser", "reviser", "waiting")])
    assert ended["live"] is False and ended["status"] == "completed"
    assert ended["answer"].startswith("[reviser] ")
    assert ended["workflow"]["loop_iteration"] == 2
    code, out, err = await tasks(where, "show", task_id)
    assert code == 0, err
    assert "loop workflow, iteration 2 of 3" in out and "not run" in out  # the reviser


async def test_a_sequential_and_a_parallel_stage_show_what_ran_and_what_waits(
        mesh: Mesh, live_store: SqlStore, where: list[str]) -> None:  # noqa: F811
    web = await ManualPeer(mesh, "web").start()
    papers = await ManualPeer(mesh, "papers").start()
    await mesh.run(Agent("writer", ScriptedModel(persona="writer")))
    await mesh.run(ParallelAgent(name="gather", sub_agents=["web", "papers"]))
    await mesh.run(SequentialAgent(name="research", sub_agents=["gather", "writer"]))
    request_id = await mesh.client.submit("research", "Heat pumps")
    task_id = mesh.client.task_id("research", request_id)

    on_web, on_papers = await asked(web, 1), await asked(papers, 1)
    shown = await shown_when(where, task_id, [("gather", "gather", "running"),
                                              ("writer", "writer", "waiting")])
    assert shown["workflow"] == {"type": "sequential", "stage": 0, "loop_iteration": None,
                                 "loop_max_iterations": None, "stages": shown["workflow"][
                                     "stages"]}
    gather_id = next(t["task_id"] for t in (await ok_json(where, "list"))["tasks"]
                     if t["agent"] == "gather")
    await shown_when(where, gather_id, [("web", "web", "running"),
                                        ("papers", "papers", "running")])
    # One branch answered: it shows done while the other runs (the task is not
    # checkpointed again until both have; its answered call says so).
    await web.answer(on_web, "web: notes")
    shown = await shown_when(where, gather_id, [("web", "web", "done"),
                                                ("papers", "papers", "running")])
    assert shown["workflow"]["type"] == "parallel" and shown["workflow"]["stage"] is None
    code, out, err = await tasks(where, "show", gather_id)
    assert code == 0 and "parallel workflow" in out, err
    await papers.answer(on_papers, "papers: notes")
    ended = await shown_when(where, task_id, [("gather", "gather", "done"),
                                              ("writer", "writer", "done")])
    assert ended["live"] is False and ended["answer"].startswith("[writer] ")
    code, out, err = await tasks(where, "show", task_id)
    assert code == 0 and "sequential workflow" in out, err
