"""An operator's handoff request (``meshpoint/handoff``, ``Client.handoff``) and a
task's iterations read back from its history (what ``tasks show`` and ``tasks cost``
print), on a SQLite file and on PostgreSQL. The command line itself is in
tests/acceptance/test_cli_tasks.py."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from decimal import Decimal
from typing import Any

import pytest

from meshpoint import a2a
from meshpoint.cli.handoffs import history_of, iterations
from meshpoint.history.costs import Prices
from meshpoint.llm import ScriptedModel
from meshpoint.runtime import Agent, AgentInstance, wire
from meshpoint.runtime.options import HandoffPolicy
from meshpoint.store import SqlStore
from tests.integration.mesh import Mesh, eventually
from tests.integration.test_handoff import tools
from tests.integration.test_runtime import no_rows_left

#: Prices per million tokens of the scripted model (named after its agent).
PRICES = Prices({"worker": {"prompt_tokens": Decimal("0.15"),
                            "completion_tokens": Decimal("0.6")}})


@pytest.fixture
async def priced(live_store: SqlStore) -> AsyncIterator[Mesh]:
    """A mesh on the test's store whose history prices the scripted model's tokens."""
    store = live_store.with_history(dataclasses.replace(live_store.history.options,
                                                         prices=PRICES))
    started = await Mesh(store).start()
    try:
        yield started
    finally:
        await started.close()


def worker(rounds: int = 4) -> Agent:
    """An agent whose tasks run ``rounds`` rounds of tool calls, a fifth of a second
    per model call, and never hand off by themselves."""
    return Agent("worker", ScriptedModel("worker", rounds=rounds, delay_s=0.2),
                 tools=tools(), handoff=HandoffPolicy(context_utilization=None,
                                                      explicit=False))


async def running(mesh: Mesh, text: str) -> tuple[str, str, AgentInstance]:
    """Submit ``text`` to the worker; its request id, task id and the instance running
    it, once one does."""
    request_id = await mesh.client.submit("worker", text)
    task_id = mesh.client.task_id("worker", request_id)
    await eventually(lambda: any(task_id in i.active for i in mesh.of("worker")),
                     what="the task running")
    holder = next(i for i in mesh.of("worker") if task_id in i.active)
    return request_id, task_id, holder


async def test_an_operator_hands_a_running_task_off_wherever_it_runs(
        priced: Mesh) -> None:
    """A ``meshpoint/handoff`` request reaches the instance running the task, whether
    it takes the request itself or another instance broadcasts it on the control
    subject: the task's iteration ends before its next model call (trigger
    ``operator``, the operator's reason in its record), the next starts in a fresh
    context, and the caller gets one answer with every round's results."""
    mesh = priced
    await mesh.run(worker(), 2)
    asked, task_id, _ = await running(mesh, "Survey: alpha")
    await mesh.client.handoff("worker", task_id, "the context drifted")
    # The other path on its own: the broadcast an instance sends when the task is not
    # in its memory, as the one running it receives it.
    broadcast, other_id, holder = await running(mesh, "Survey: beta")
    await mesh.broker.publish(holder.subjects.control("worker"),
                              wire.handoff_broadcast(other_id, "asked on the wire"))
    for request_id, tid, reason in ((asked, task_id, "the context drifted"),
                                    (broadcast, other_id, "asked on the wire")):
        answer = await mesh.client.wait(request_id, timeout_s=30)
        assert answer.status.state is a2a.TaskState.COMPLETED, answer
        text = answer.status.message.text  # type: ignore[union-attr]
        assert all(f"(round {n})" in text for n in range(1, 5)), text
        await no_rows_left(mesh.store)
        records = await history_of(mesh.store, tid)
        handoffs = [r for r in records if r.execution_state.phase == "handoff"]
        assert [(h.extensions["handoff"]["trigger"], h.extensions["handoff"]["reason"])
                for h in handoffs] == [("operator", reason)]
        assert records[-1].metadata.iteration == 2
        assert (await mesh.store.history.verify_task(tid)).ok
    assert sum(len(i.stats.tasks("handoff_requested")) for i in mesh.of("worker")) == 2


async def test_a_task_is_read_back_iteration_by_iteration_and_its_costs_add_up(
        priced: Mesh) -> None:
    """What ``tasks show`` and ``tasks cost`` print of a task that handed off: one row
    per iteration, how it started (the request, the handoff it received) and ended
    (its handoff's trigger and reason, then the task's end), its records, and its
    tokens and cost, which add up exactly to the task's total."""
    mesh = priced
    await mesh.run(worker(), 1)
    request_id, task_id, _ = await running(mesh, "Survey: alpha")
    await mesh.client.handoff("worker", task_id, "fresh eyes")
    assert (await mesh.client.wait(request_id, timeout_s=30)).status.state is \
        a2a.TaskState.COMPLETED
    await no_rows_left(mesh.store)
    records = await history_of(mesh.store, task_id)
    rows = iterations(records)
    assert [(r["iteration"], r["agent"], r["started_by"], r["ended_by"], r["reason"])
            for r in rows] == [(1, "worker", "request", "operator", "fresh eyes"),
                               (2, "worker", "operator", "completed", None)]
    assert [r["records"] for r in rows] == [
        sum(1 for rec in records if rec.metadata.iteration == n) for n in (1, 2)]
    assert rows[0]["first_seq"] == 1 and rows[1]["first_seq"] == rows[0]["last_seq"] + 1
    assert rows[1]["last_seq"] == records[-1].metadata.seq
    total = records[-1].metrics
    assert Decimal(total.cost["total"]) > 0
    assert sum(Decimal(r["cost"]) for r in rows) == Decimal(total.cost["total"])
    for kind in ("prompt_tokens", "completion_tokens"):
        assert sum(r["tokens"][kind] for r in rows) == total.tokens["total"]["totals"][kind]
    # Each iteration's figures are its own: both spent something.
    assert all(Decimal(r["cost"]) > 0 for r in rows)


async def test_an_agent_without_a_handoff_policy_dead_letters_the_request(
        mesh: Mesh) -> None:
    """The request is refused where it lands, saying why (nothing else happens: the
    task goes on as it was)."""
    await mesh.run(Agent("worker", ScriptedModel("worker", rounds=2, delay_s=0.2),
                         tools=tools()))
    request_id = await mesh.client.submit("worker", "Survey: alpha")
    task_id = mesh.client.task_id("worker", request_id)
    await mesh.client.handoff("worker", task_id, "please")
    await eventually(lambda: bool(mesh.dead_letters), what="the dead letter")
    (_, headers), = mesh.dead_letters
    assert any("has no handoff policy" in str(v) for v in headers.values()), headers
    answer = await mesh.client.wait(request_id, timeout_s=30)
    assert answer.status.state is a2a.TaskState.COMPLETED


def test_purged_records_are_one_row_of_their_own() -> None:
    """Records a purge removed (one row of ``tasks cost``) stay one row, apart from
    the iterations, so that the rows still add up."""
    purged: dict[str, Any] = {"seq": None, "purged_through": 3, "phase": "(purged)",
                              "tokens": {"prompt_tokens": 10, "completion_tokens": 2,
                                         "cached_tokens": 0}, "cost": "0.5"}
    rows = iterations([purged])
    assert [(r["iteration"], r["ended_by"], r["last_seq"], r["cost"]) for r in rows] == [
        (None, "(purged)", 3, "0.5")]
