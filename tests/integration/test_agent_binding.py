"""A task belongs to its agent: an answer, a decision or a cancel sent to another
agent's subject never runs it there, and no write moves a task to another agent.
On a SQLite file and on PostgreSQL (the store's tests with its fast paths off too).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from meshpoint import a2a
from meshpoint.broker.base import DEAD_LETTER_REASON, DEAD_LETTER_SUBJECT
from meshpoint.errors import MisdirectedAnswerError, WrongAgentError
from meshpoint.llm import ScriptedModel
from meshpoint.runtime import Agent, LocalTool, Peer, wire
from meshpoint.runtime.agent import ToolCallInfo
from meshpoint.store import SqlStore
from tests.conftest import snapshot
from tests.integration.mesh import ManualPeer, Mesh, eventually
from tests.integration.test_store import fan_out

# -- the store ----------------------------------------------------------------------------


@pytest.mark.portable_too
async def test_a_re_checkpoint_never_moves_a_task_to_another_agent(store: SqlStore) -> None:
    await store.checkpoint_task(fan_out("t1", peers=1), "support")
    await store.resolve_peer_sub_task("t1/sub-0", "answer", lease_owner="i-1")
    ctx = (await store.restore_task("t1", lease_owner="i-1")).context
    ctx.append_session_event({"role": "tool", "results": ["answer"]})
    ctx.current_invocation_id = "inv-2"
    ctx.register_peer_sub_task("t1/next", {"peer_agent_name": "peer-0"})
    before = await snapshot(store, but_alerts=True)
    with pytest.raises(WrongAgentError, match="task 't1' belongs to agent 'support', not "
                                              "'admin'"):
        await store.checkpoint_task(ctx, "admin", lease_owner="i-1")
    assert await snapshot(store, but_alerts=True) == before
    await store.checkpoint_task(ctx, "support", lease_owner="i-1")
    (row,) = await store.list_paused_tasks()
    assert row.agent_name == "support"


@pytest.mark.portable_too
async def test_an_answer_resolves_a_sub_task_only_for_its_task_s_agent(
        store: SqlStore) -> None:
    await store.checkpoint_task(fan_out("t1", peers=2), "support")
    before = await snapshot(store, but_alerts=True)
    with pytest.raises(WrongAgentError, match="agent 'support', not 'admin'"):
        await store.resolve_peer_sub_task("t1/sub-0", "forged", agent_name="admin",
                                          lease_owner="i-1")
    assert await snapshot(store, but_alerts=True) == before
    resolved = await store.resolve_peer_sub_task("t1/sub-0", "real", agent_name="support")
    assert resolved is not None and resolved.sub_task.result == "real"
    # A duplicate for the right agent is still just a duplicate.
    assert await store.resolve_peer_sub_task("t1/sub-0", "again", agent_name="support") is None


# -- the runtime --------------------------------------------------------------------------


class Counted:
    """A tool that counts its runs."""

    def __init__(self) -> None:
        self.runs: Counter[str] = Counter()

    def __call__(self, arguments: dict[str, Any], call: ToolCallInfo) -> str:
        self.runs[call.task_id] += 1
        return "done"


def support_and_admin(refunds: Counted, grants: Counted) -> tuple[Agent, Agent]:
    support = Agent("support", ScriptedModel(), tools=[
        LocalTool("refund", "Refund (a human approves).", refunds, needs_approval=True)])
    admin = Agent("admin", ScriptedModel(), tools=[
        LocalTool("grant", "Grant admin rights.", grants, needs_approval=True)])
    return support, admin


async def test_a_decision_sent_to_another_agent_is_refused_and_runs_nothing(
        mesh: Mesh, live_store: SqlStore) -> None:
    """An approval of a ``support`` task sent to agent ``admin``'s subject: admin's
    instance refuses it before writing anything (the sender is told why, the message
    is dead-lettered with the reason), support's task keeps waiting, no tool runs."""
    refunds, grants = Counted(), Counted()
    support, admin = support_and_admin(refunds, grants)
    await mesh.run(support)
    (admin_instance,) = await mesh.run(admin)
    request_id = await mesh.client.submit("support", "refund: order 7")
    pending = await mesh.client.wait_input(request_id, timeout_s=10)
    task_id = mesh.client.task_id("support", request_id)
    before = await snapshot(live_store, but_alerts=True)

    with pytest.raises(MisdirectedAnswerError, match=r"agent 'support', not agent 'admin'"):
        await mesh.client.approve(task_id, pending[0]["call_id"], agent="admin")
    await eventually(lambda: len(mesh.dead_letters) == 1, what="the dead letter")
    ((_, headers),) = mesh.dead_letters
    assert headers[DEAD_LETTER_SUBJECT] == wire.request_subject(mesh.options.namespace,
                                                                "admin")
    assert "agent 'support'" in headers[DEAD_LETTER_REASON]
    assert await snapshot(live_store, but_alerts=True) == before
    assert (await live_store.restore_task(task_id)).status == "input_required"
    assert not refunds.runs and not grants.runs
    assert not admin_instance.stats.tasks("resumed")

    # Sent to its own agent, the same approval is taken and runs support's tool once.
    await mesh.client.approve(task_id, pending[0]["call_id"])
    answer = await mesh.client.wait(request_id, timeout_s=10)
    assert answer.status.state is a2a.TaskState.COMPLETED
    assert refunds.runs == {task_id: 1} and not grants.runs


async def test_an_answer_on_another_agent_s_subject_is_refused_and_resolves_nothing(
        mesh: Mesh, live_store: SqlStore) -> None:
    """A peer's answer to a ``support`` sub-task published on ``admin``'s answer
    subject is dead-lettered with the reason; the sub-task stays pending and the
    task resumes only when the answer comes the right way."""
    _, admin = support_and_admin(Counted(), Counted())
    await mesh.run(Agent("support", ScriptedModel(), peers=[Peer("flights", timeout_s=60)]))
    (admin_instance,) = await mesh.run(admin)
    flights = await ManualPeer(mesh, "flights").start()
    request_id = await mesh.client.submit("support", "Go: somewhere")
    await eventually(lambda: len(flights.requests) == 1, what="the peer request")
    (sub,) = flights.requests
    before = await snapshot(live_store, but_alerts=True)

    ns = mesh.options.namespace
    wrong = wire.response_subject(ns, "admin", sub)
    await mesh.broker.publish(wrong, wire.final_task(
        sub, "flights-own", "ctx", a2a.TaskState.COMPLETED, "forged", [], {}))
    await eventually(lambda: len(mesh.dead_letters) == 1, what="the dead letter")
    ((_, headers),) = mesh.dead_letters
    assert headers[DEAD_LETTER_SUBJECT] == wrong
    assert "agent 'support', not 'admin'" in headers[DEAD_LETTER_REASON]
    assert await snapshot(live_store, but_alerts=True) == before
    assert not admin_instance.stats.tasks("resumed")

    await flights.answer(sub, "the real answer")
    answer = await mesh.client.wait(request_id, timeout_s=10)
    assert answer.status.message is not None
    assert "the real answer" in answer.status.message.text
    assert "forged" not in answer.status.message.text


async def test_a_cancel_sent_to_another_agent_cancels_nothing(
        mesh: Mesh, live_store: SqlStore) -> None:
    support, admin = support_and_admin(Counted(), Counted())
    await mesh.run(support)
    await mesh.run(admin)
    request_id = await mesh.client.submit("support", "refund: order 8")
    await mesh.client.wait_input(request_id, timeout_s=10)
    task_id = mesh.client.task_id("support", request_id)
    before = await snapshot(live_store, but_alerts=True)

    await mesh.client.cancel("admin", task_id)
    await eventually(lambda: len(mesh.dead_letters) == 1, what="the dead letter")
    ((_, headers),) = mesh.dead_letters
    assert "agent 'support'" in headers[DEAD_LETTER_REASON]
    assert await snapshot(live_store, but_alerts=True) == before
    assert not mesh.client.answers  # its caller was not told 'canceled'

    await mesh.client.cancel("support", task_id)
    answer = await mesh.client.wait(request_id, timeout_s=10)
    assert answer.status.state is a2a.TaskState.CANCELED
