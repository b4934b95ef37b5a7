"""Approvals from authenticated approvers: a decision is signed with the approver's
Ed25519 key, and the runtime verifies it (who signed, over what, and whether that
approver may decide that agent's tool) before anything is written, and again when
the task settles a decision someone wrote straight into the store. An approval
names the call as its approver was shown it: a call changed in the database
afterwards is not run on its strength.

On a SQLite file and on PostgreSQL; the attack also runs over NATS.
"""

from __future__ import annotations

import base64
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import pytest
from sqlalchemy import Connection, select, update
from sqlalchemy.engine import make_url

from meshpoint import a2a
from meshpoint.errors import (
    AlreadyAnsweredError,
    DecisionRefusedError,
    InvalidArgumentError,
    UnknownTaskError,
)
from meshpoint.history.integrity import canonical
from meshpoint.llm import ScriptedModel
from meshpoint.llm.base import ModelResponse, ToolCall, ToolSpec
from meshpoint.runtime import Agent, Client, LocalTool
from meshpoint.runtime.agent import ToolCallInfo
from meshpoint.runtime.approvals import Approve, decide
from meshpoint.runtime.approvers import ApproverConfig, ApproverKey, Approvers
from meshpoint.runtime.decisions import DECISION_FORMAT_V1, DecisionSignature, decision_document
from meshpoint.store import SqlStore, open_store
from meshpoint.store.postgres_tenancy import grant_runtime_role
from meshpoint.store.schema import peer_sub_tasks, session_events
from tests.conftest import pg_drop_roles, snapshot
from tests.integration.mesh import Mesh, eventually

#: Some of its tests create and drop roles (catalog rows every role shares): on the
#: worker of a parallel run that runs all such tests, one after another.
pytestmark = pytest.mark.xdist_group("pg_roles")

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


def shown(client: Client, call_id: str) -> dict[str, Any]:
    """The pending call ``call_id`` as ``client``'s input-required updates showed it."""
    return next(call for pending in client.input_required.values() for call in pending
                if call["call_id"] == call_id)


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
    # The CFO's edit is a merge patch of the proposed arguments ({"order": "refund",
    # "amount": 7.0}, read from the request): it drops the amount and gives the order.
    assert shown(requester, call_id)["arguments"] == {"order": "refund", "amount": 7.0}
    patch = {"amount": None, "order": "7"}
    signed = cfo_key.sign(tenant=mesh.store.tenant_id, task_id=task_id,
                          answer=Approve.of(shown(requester, call_id), patch))
    tampered = signed.model_copy(update={"arguments": {**patch, "amount": 10_000}})
    with pytest.raises(DecisionRefusedError, match="does not verify"):
        await requester.answer(task_id, tampered)
    assert await snapshot(mesh.store) == before, "a refused decision wrote"
    assert not refunds.runs
    assert (await mesh.store.restore_task(task_id)).status == "input_required"

    decision = await requester.answer(task_id, signed)
    assert (decision[0]["by"], decision[0]["verified"]) == (CFO, True)
    assert "claimed_by" not in decision[0]
    # Recorded: the patch as signed, and the merged arguments that run.
    assert (decision[0]["patch"], decision[0]["arguments"]) == (patch, {"order": "7"})
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
            (cfo_key.sign(tenant=tenant, task_id=first,
                          answer=Approve.of(shown(mesh.client, first_call))),
             second, second_call),
            (cfo_key.sign(tenant="globex", task_id=second,
                          answer=Approve.of(shown(mesh.client, second_call))),
             second, second_call)):
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


#: An edit of the scripted model's ``{"query": ...}`` into a refund of order 5.
PATCH_5 = {"query": None, "order": "5", "amount": 5}


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
                          answer=Approve.of(again[0], PATCH_5))
    decided = await decide(live_store, task_id, signed, by="operator", lease_owner="x",
                           lease_ttl_s=60)
    # What runs is changed, the signed patch kept (which still verifies): refused,
    # since it is not the patch merged into the call's arguments.
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
                          answer=Approve.of(third[0], PATCH_5))
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


class Proposer:
    """A model that asks for one refund of 5 on order 7, then answers with what its
    tools said."""

    name = "proposer"

    async def complete(self, messages: list[dict[str, Any]],
                       tools: list[ToolSpec]) -> ModelResponse:
        if not any(m.get("role") == "assistant" for m in messages):
            return ModelResponse(text=None, tool_calls=(
                ToolCall("refund_1", "refund", {"order": "7", "amount": 5}),))
        said = [str(m.get("content")) for m in messages if m.get("role") == "tool"]
        return ModelResponse(text="; ".join(said))


def proposing(refunds: Refunds, payouts: Refunds) -> Agent:
    """support with two tools a human approves: the model calls refund only."""
    return Agent("support", Proposer(), tools=[
        LocalTool("refund", "Refund an order (a human approves).", refunds,
                  parameters=REFUND, needs_approval=True),
        LocalTool("payout", "Pay an amount out (a human approves).", payouts,
                  parameters=REFUND, needs_approval=True)])


@pytest.fixture
async def writer(backend: str, live_store: SqlStore, store_url: str,
                 store_options: dict[str, Any]) -> AsyncIterator[SqlStore]:
    """Someone who can write the database and holds no key, as the application's
    role: on PostgreSQL a runtime role (it owns nothing, has no BYPASSRLS, and row
    security is forced), in the mesh's tenant; on SQLite, whoever can write the
    file."""
    if backend == "sqlite":
        yield live_store
        return
    role = f"mp_writer_{uuid.uuid4().hex[:10]}"
    await grant_runtime_role(live_store, role)
    url = make_url(store_url).set(username=role).render_as_string(hide_password=False)
    try:
        async with await open_store(url, tenant_id=live_store.tenant_id, migrate=False,
                                    pool_size=1, **store_options) as store:
            yield store
    finally:
        await pg_drop_roles(role)


async def change_the_call(writer: SqlStore, task_id: str, call_id: str, *, where: str,
                          **change: Any) -> None:
    """What the writer does after the approver saw the call ``call_id`` of ``task_id``:
    set its ``tool`` or ``arguments`` (``change``) in the conversation, whose model
    turn says what runs, and (``where == "row"``) in its sub-task row too, which
    ``tasks show`` and an instance's check when the approval arrives read."""
    def body(conn: Connection) -> None:
        row = conn.execute(select(peer_sub_tasks.c.correlation_data).where(
            peer_sub_tasks.c.sub_task_id == call_id)).one()
        correlation = row.correlation_data
        function_call_id = correlation["function_call_id"]
        if where == "row":
            correlation["approval"].update(change)
            conn.execute(update(peer_sub_tasks).where(
                peer_sub_tasks.c.sub_task_id == call_id).values(correlation_data=correlation))
        changed = 0
        for seq, events in conn.execute(select(session_events.c.seq, session_events.c.data)
                                        .where(session_events.c.logical_task_id == task_id)):
            assert isinstance(events, list), "the conversation is stored as JSON"
            for event in events:
                for call in event.get("tool_calls") or ():
                    if call["id"] == function_call_id:
                        call.update({"name" if k == "tool" else k: v for k, v in change.items()})
                        changed += 1
            conn.execute(update(session_events).where(
                session_events.c.logical_task_id == task_id, session_events.c.seq == seq)
                .values(data=events))
        assert changed == 1, "the model's call is in the conversation once"

    await writer.transaction(body, write=True)


CHANGES = {"arguments": {"arguments": {"order": "7", "amount": 50_000}},
           "tool": {"tool": "payout"}}


@pytest.mark.parametrize("where", ["row", "conversation"])
@pytest.mark.parametrize("what", sorted(CHANGES))
async def test_an_approval_does_not_run_a_call_changed_after_it_was_shown(
        mesh: Mesh, writer: SqlStore, cfo_key: ApproverKey, what: str, where: str,
        caplog: pytest.LogCaptureFixture) -> None:
    """The attack: the CFO is shown refund(order 7, 5) and signs its approval as
    proposed; before it is delivered, someone who can write the database (the
    application's role, no key) raises the amount to 50 000, or makes the call one
    of payout (which the CFO may decide too). Changed in the sub-task row as well,
    the approval is refused when it arrives (nothing written, logged, the call still
    pending); changed in the conversation only (what runs), it is refused when the
    task settles, and the call waits for approval again, shown as it now is. The
    tool never runs. It ran with the writer's arguments, as the CFO's, before."""
    refunds, payouts = Refunds(), Refunds()
    approvers = Approvers.from_config({CFO: ApproverConfig(
        key=cfo_key.public_pem(), agents={"support": ["refund", "payout"]})})
    await mesh.run(proposing(refunds, payouts), approvers=approvers)
    request_id, task_id, call_id = await waiting(mesh, mesh.client, "refund order 7")
    seen = shown(mesh.client, call_id)
    assert (seen["tool"], seen["arguments"]) == ("refund", {"order": "7", "amount": 5})
    signed = cfo_key.sign(tenant=mesh.store.tenant_id, task_id=task_id,
                          answer=Approve.of(seen))

    await change_the_call(writer, task_id, call_id, where=where, **CHANGES[what])
    caplog.set_level("WARNING", logger="meshpoint.runtime")
    if where == "row":
        before = await snapshot(mesh.store)
        with pytest.raises(DecisionRefusedError, match="changed after it was shown"):
            await mesh.client.answer(task_id, signed)
        assert await snapshot(mesh.store) == before, "a refused approval wrote"
        assert (await mesh.store.get_peer_sub_task(call_id)).status == "pending"
        assert (await mesh.store.restore_task(task_id)).status == "input_required"
        assert mesh.events("answer_refused") == [(mesh.instances[0].instance_id, task_id)]
        logged = "refused a decision for task"
    else:
        decided = await mesh.client.answer(task_id, signed)
        assert (decided[0]["by"], decided[0]["verified"]) == (CFO, True)
        again = await mesh.client.wait_input(request_id, timeout_s=10)
        changed = {"tool": "refund", "arguments": seen["arguments"], **CHANGES[what]}
        assert again[0]["call_id"] != call_id
        assert (again[0]["tool"], again[0]["arguments"]) == (changed["tool"],
                                                            changed["arguments"])
        logged = f"the result of call refund_1 ({changed['tool']}) is refused"
    assert any(logged in r.getMessage() and "changed after it was shown" in r.getMessage()
               for r in caplog.records), "the refusal is logged with its reason"
    assert not refunds.runs and not payouts.runs


async def test_an_approval_as_shown_runs_the_call_once(
        mesh: Mesh, cfo_key: ApproverKey, approvers: Approvers) -> None:
    """The path the attack leaves alone: the call unchanged, the CFO's approval as
    proposed runs it once, with the model's arguments."""
    refunds, payouts = Refunds(), Refunds()
    await mesh.run(proposing(refunds, payouts), approvers=approvers)
    request_id, task_id, call_id = await waiting(mesh, mesh.client, "refund order 7")
    decided = await mesh.client.approve(task_id, call_id, key=cfo_key)
    assert decided["signed"]["proposed"] == {"tool": "refund",
                                             "arguments": {"order": "7", "amount": 5}}
    answer = await mesh.client.wait(request_id, timeout_s=20)
    assert answer.status.state is a2a.TaskState.COMPLETED
    assert refunds.runs == {task_id: 1} and refunds.arguments == [{"order": "7", "amount": 5}]
    assert not payouts.runs


async def test_an_approval_signed_as_format_1_is_refused_and_its_call_waits(
        mesh: Mesh, live_store: SqlStore, cfo_key: ApproverKey,
        approvers: Approvers) -> None:
    """``meshpoint.decision/1`` did not name what an approval approves: a new approval
    signed so (an old client) is refused when it arrives, and when it reaches the
    store unchecked it is refused as the task settles it (the call waits again)."""
    refunds, payouts = Refunds(), Refunds()
    await mesh.run(proposing(refunds, payouts), approvers=approvers)
    request_id, task_id, call_id = await waiting(mesh, mesh.client, "refund order 7")

    def v1(call: str) -> Approve:
        answer = Approve(call_id=call)
        document = decision_document(live_store.tenant_id, task_id, answer, CFO, 1000.5,
                                     DECISION_FORMAT_V1)
        signature = base64.b64encode(cfo_key.private_key.sign(canonical(document))).decode()
        return answer.model_copy(update={"by": CFO, "signature": DecisionSignature(
            approver=CFO, signed_at=1000.5, signature=signature)})

    with pytest.raises(DecisionRefusedError, match=r"meshpoint\.decision/1"):
        await mesh.client.answer(task_id, v1(call_id))
    await decide(live_store, task_id, v1(call_id), by=CFO)  # no approvers known here
    again = await mesh.client.wait_input(request_id, timeout_s=10)
    assert again[0]["call_id"] != call_id
    assert not refunds.runs


@pytest.fixture(autouse=True)
def _quiet(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("ERROR", logger="meshpoint")

