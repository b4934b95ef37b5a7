"""Approvals from authenticated approvers: a decision is signed with the approver's
Ed25519 key, and the runtime verifies it (who signed, over what, and whether that
approver may decide that agent's tool) before anything is written, and again when
the task settles a decision someone wrote straight into the store.

On a SQLite file and on PostgreSQL; the attack also runs over NATS.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from sqlalchemy import update

from meshpoint import a2a
from meshpoint.errors import (
    AlreadyAnsweredError,
    DecisionRefusedError,
    InvalidArgumentError,
    UnknownTaskError,
)
from meshpoint.llm import ScriptedModel
from meshpoint.runtime import Agent, Client, LocalTool
from meshpoint.runtime.agent import ToolCallInfo
from meshpoint.runtime.approvals import Approve, decide
from meshpoint.runtime.approvers import ApproverConfig, ApproverKey, Approvers
from meshpoint.store import SqlStore
from meshpoint.store.schema import peer_sub_tasks
from tests.conftest import snapshot
from tests.integration.mesh import Mesh, eventually

CFO = "cfo@example.com"
REFUND = {"type": "object", "properties": {"order": {"type": "string"},
                                           "amount": {"type": "number"}},
          "required": ["order"], "additionalProperties": False}


class Refunds:
    """The tool a human must approve: counts its runs and keeps their arguments."""

    def __init__(self) -> None:
        self.runs: Counter[str] = Counter()
        self.arguments: list[dict[str, Any]] = []

    def __call__(self, arguments: dict[str, Any], call: ToolCallInfo) -> str:
        self.runs[call.task_id] += 1
        self.arguments.append(arguments)
        return f"refunded {arguments.get('amount', 'in full')}"


def support(refunds: Refunds) -> Agent:
    return Agent("support", ScriptedModel(), tools=[
        LocalTool("refund", "Refund an order (a human approves).", refunds,
                  parameters=REFUND, needs_approval=True)])


@pytest.fixture
def cfo_key() -> ApproverKey:
    return ApproverKey.generate(CFO)


@pytest.fixture
def ops_key() -> ApproverKey:
    return ApproverKey.generate("ops@example.com")


@pytest.fixture
def approvers(cfo_key: ApproverKey, ops_key: ApproverKey) -> Approvers:
    """The CFO may decide support's refunds; the ops lead may decide anything of
    the admin agent (and nothing of support's)."""
    ops = ops_key
    return Approvers.from_config({
        CFO: ApproverConfig(key=cfo_key.public_pem(), agents={"support": ["refund"]}),
        "ops@example.com": ApproverConfig(key=ops.public_pem(), agents={"admin": ["*"]})})


async def waiting(mesh: Mesh, client: Client, text: str) -> tuple[str, str, str]:
    """Submit ``text`` to support and wait until its refund waits for approval:
    (request id, task id, the call id the requester was told)."""
    request_id = await client.submit("support", text)
    pending = await client.wait_input(request_id, timeout_s=10)
    return request_id, client.task_id("support", request_id), pending[0]["call_id"]


async def test_a_requester_cannot_approve_its_own_call_nor_name_the_approver(
        broker_mesh: Mesh, cfo_key: ApproverKey, ops_key: ApproverKey,
        approvers: Approvers) -> None:
    """The attack: the requester learns the call id from its input-required update
    and approves its own refund with edited arguments, as ``by: cfo@example.com``.
    Unsigned, signed by a key that is not the CFO's, signed by an approver who may
    not decide this tool, or signed by the CFO over other arguments than those sent:
    each is refused with the reason, nothing is written, the tool does not run, and
    the task keeps waiting. The CFO's own signed decision is recorded as the CFO's
    (verified) and the tool runs once; replaying it changes nothing."""
    mesh = broker_mesh
    refunds = Refunds()
    await mesh.run(support(refunds), 2, approvers=approvers)
    requester = mesh.client
    request_id, task_id, call_id = await waiting(mesh, requester, "refund: order 7")
    before = await snapshot(mesh.store)
    edited = {"order": "7", "amount": 10_000}

    with pytest.raises(DecisionRefusedError, match="unsigned"):
        await requester.approve(task_id, call_id, edited, by=CFO)
    forger = ApproverKey.generate(CFO)  # claims to be the CFO, with its own key
    with pytest.raises(DecisionRefusedError, match="does not verify"):
        await requester.approve(task_id, call_id, edited, key=forger)
    with pytest.raises(DecisionRefusedError, match="not an approver"):
        await requester.approve(task_id, call_id, edited,
                                key=ApproverKey.generate("mallory@example.com"))
    with pytest.raises(DecisionRefusedError, match="may not decide tool 'refund' of agent"):
        await requester.approve(task_id, call_id, edited, key=ops_key)
    signed = cfo_key.sign(tenant=mesh.store.tenant_id, task_id=task_id,
                          answer=Approve(call_id=call_id, arguments={"order": "7"}))
    tampered = signed.model_copy(update={"arguments": edited})
    with pytest.raises(DecisionRefusedError, match="does not verify"):
        await requester.answer(task_id, tampered)
    assert await snapshot(mesh.store) == before, "a refused decision wrote"
    assert not refunds.runs
    assert (await mesh.store.restore_task(task_id)).status == "input_required"

    decision = await requester.answer(task_id, signed)
    assert (decision[0]["by"], decision[0]["verified"]) == (CFO, True)
    assert "claimed_by" not in decision[0]
    answer = await requester.wait(request_id, timeout_s=20)
    assert answer.status.state is a2a.TaskState.COMPLETED
    assert refunds.runs == {task_id: 1} and refunds.arguments == [{"order": "7"}]
    with pytest.raises((AlreadyAnsweredError, UnknownTaskError)):
        await requester.answer(task_id, signed)  # a replay: the first answer won
    assert refunds.runs == {task_id: 1}


async def test_a_signed_decision_is_bound_to_its_tenant_task_and_call(
        mesh: Mesh, cfo_key: ApproverKey, approvers: Approvers) -> None:
    """A decision the CFO signed for one call does not decide another: not another
    call of the same task's kind, not the same call id under another task or tenant."""
    refunds = Refunds()
    await mesh.run(support(refunds), approvers=approvers)
    _, first, first_call = await waiting(mesh, mesh.client, "refund: order 1")
    _, second, second_call = await waiting(mesh, mesh.client, "refund: order 2")
    tenant = mesh.store.tenant_id
    for signed, task_id, call_id in (
            (cfo_key.sign(tenant=tenant, task_id=first, answer=Approve(call_id=first_call)),
             second, second_call),
            (cfo_key.sign(tenant="globex", task_id=second,
                          answer=Approve(call_id=second_call)), second, second_call)):
        moved = signed.model_copy(update={"call_id": call_id})
        with pytest.raises(DecisionRefusedError, match="does not verify"):
            await mesh.client.answer(task_id, moved)
    assert not refunds.runs


async def test_denials_and_replies_are_signed_too(
        mesh: Mesh, cfo_key: ApproverKey, approvers: Approvers) -> None:
    refunds = Refunds()
    await mesh.run(support(refunds), approvers=approvers)
    request_id, task_id, call_id = await waiting(mesh, mesh.client, "refund: order 3")
    with pytest.raises(DecisionRefusedError, match="unsigned"):
        await mesh.client.deny(task_id, call_id, "no", by=CFO)
    with pytest.raises(DecisionRefusedError, match="unsigned"):
        await mesh.client.reply(task_id, "call the customer first")
    with pytest.raises(InvalidArgumentError, match="call_ids"):
        await mesh.client.reply(task_id, "call the customer first", key=cfo_key)
    decided = await mesh.client.reply(task_id, "call the customer first", key=cfo_key,
                                      call_ids=[call_id])
    assert [(d["decision"], d["by"]) for d in decided] == [("replied", CFO)]
    answer = await mesh.client.wait(request_id, timeout_s=20)
    assert "call the customer first" in answer.status.message.text  # type: ignore[union-attr]
    assert not refunds.runs

    request_id, task_id, call_id = await waiting(mesh, mesh.client, "refund: order 4")
    decided = await mesh.client.deny(task_id, call_id, "over budget", key=cfo_key)
    assert (decided["decision"], decided["by"], decided["verified"]) == ("denied", CFO, True)
    answer = await mesh.client.wait(request_id, timeout_s=20)
    assert "not approved: over budget" in answer.status.message.text  # type: ignore[union-attr]


async def test_decisions_written_into_the_store_are_verified_when_the_task_settles(
        mesh: Mesh, live_store: SqlStore, cfo_key: ApproverKey,
        approvers: Approvers) -> None:
    """``meshpoint tasks approve`` writes a decision straight into the store, where an
    instance's verification cannot see it, and so can anyone who can write the
    database. The instance that settles the task verifies it: an unsigned approval,
    or a signed one whose arguments were changed in the row, is not run; the call
    waits for approval again (a new call id, its caller told), and a decision the
    CFO signed settles it."""
    refunds = Refunds()
    await mesh.run(support(refunds), approvers=approvers)
    request_id, task_id, call_id = await waiting(mesh, mesh.client, "refund: order 5")

    # Unsigned, straight into the store (no approvers known to the writer).
    await decide(live_store, task_id, Approve(call_id=call_id), by=CFO)
    again = await mesh.client.wait_input(request_id, timeout_s=10)
    assert again[0]["call_id"] != call_id and again[0]["tool"] == "refund"
    assert not refunds.runs

    # Signed by the CFO, then its arguments changed in the row by a database writer.
    signed = cfo_key.sign(tenant=live_store.tenant_id, task_id=task_id,
                          answer=Approve(call_id=again[0]["call_id"],
                                         arguments={"order": "5", "amount": 5}))
    decided = await decide(live_store, task_id, signed, by="operator", lease_owner="x",
                           lease_ttl_s=60)
    forged = {**decided.decisions[0], "arguments": {"order": "5", "amount": 50_000}}
    await live_store.run(lambda conn: conn.execute(
        update(peer_sub_tasks).where(peer_sub_tasks.c.sub_task_id == again[0]["call_id"])
        .values(result=forged)), write=True)
    await live_store.release_resume_lease(task_id, "x")
    third = await mesh.client.wait_input(request_id, timeout_s=10)
    assert third[0]["call_id"] not in (call_id, again[0]["call_id"])
    assert not refunds.runs

    # The CFO's decision, through the store, settles it.
    signed = cfo_key.sign(tenant=live_store.tenant_id, task_id=task_id,
                          answer=Approve(call_id=third[0]["call_id"],
                                         arguments={"order": "5", "amount": 5}))
    await decide(live_store, task_id, signed, by="operator")
    answer = await mesh.client.wait(request_id, timeout_s=20)
    assert answer.status.state is a2a.TaskState.COMPLETED
    assert refunds.arguments == [{"order": "5", "amount": 5}]
    await eventually(lambda: refunds.runs == {task_id: 1}, what="one run")


async def test_without_approvers_a_decision_names_only_a_claimed_approver(
        mesh: Mesh) -> None:
    """The embedded default (no approvers configured, one trusted user): decisions
    are taken, but the name they give is recorded as claimed, never as who
    decided."""
    refunds = Refunds()
    await mesh.run(support(refunds))
    request_id, task_id, call_id = await waiting(mesh, mesh.client, "refund: order 6")
    decision = await mesh.client.approve(task_id, call_id, by=CFO)
    assert decision["claimed_by"] == CFO and decision["verified"] is False
    assert "by" not in decision
    answer = await mesh.client.wait(request_id, timeout_s=20)
    assert answer.status.state is a2a.TaskState.COMPLETED


@pytest.fixture(autouse=True)
def _quiet(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("ERROR", logger="meshpoint")

