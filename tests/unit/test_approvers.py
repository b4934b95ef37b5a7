"""Signed decisions: what an approver's signature covers, and each way a decision is
refused (unsigned, forged, changed after signing, out of its approver's scope)."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import pytest

from meshpoint.errors import (
    ConfigurationError,
    DecisionRefusedError,
    InvalidArgumentError,
    KeyMissingError,
)
from meshpoint.history.integrity import canonical, private_seed
from meshpoint.runtime.approvers import ApproverConfig, ApproverKey, Approvers
from meshpoint.runtime.decisions import (
    DECISION_FORMAT_V1,
    DECISION_FORMAT_V2,
    Answer,
    Approve,
    DecisionSignature,
    Deny,
    PendingCall,
    Proposed,
    Reply,
    answer_of,
    check_merged,
    decision_document,
    signed_record,
)

CFO = "cfo@example.com"
#: The call as the model made it, and as the CFO was shown it.
ARGUMENTS = {"order": "7", "amount": 5}
CALL = PendingCall("call-1", "support", "refund", ARGUMENTS)
SHOWN = Proposed(tool="refund", arguments=ARGUMENTS)


@pytest.fixture
def key() -> ApproverKey:
    return ApproverKey.generate(CFO)


@pytest.fixture
def approvers(key: ApproverKey) -> Approvers:
    return Approvers.from_config({CFO: ApproverConfig(key=key.public_pem(),
                                                      agents={"support": ["refund"]})})


def signed(key: ApproverKey, answer: Answer, tenant: str = "acme",
           task_id: str = "task-1") -> Answer:
    return key.sign(tenant=tenant, task_id=task_id, answer=answer, clock=lambda: 1000.5)


@pytest.mark.parametrize("answer", [
    Approve(call_id="call-1", proposed=SHOWN),
    Approve(call_id="call-1", arguments={"amount": 5.5}, proposed=SHOWN),
    Deny(call_id="call-1", reason="over budget"),
    Reply(text="ask the customer", call_ids=["call-1"])], ids=["approve", "edited", "deny",
                                                               "reply"])
def test_a_signed_decision_verifies_as_its_approver_s(
        key: ApproverKey, approvers: Approvers, answer: Answer) -> None:
    assert approvers.verify(tenant="acme", task_id="task-1", answer=signed(key, answer),
                            calls=[CALL]) == CFO


@pytest.mark.parametrize("change", [
    {"call_id": "call-2"}, {"arguments": {"amount": 5000}}, {"arguments": {}},
    {"proposed": Proposed(tool="refund", arguments={"order": "7", "amount": 5000})},
    {"proposed": Proposed(tool="payout", arguments=ARGUMENTS)},
    {"by": "someone"}], ids=["call", "arguments", "arguments-emptied", "proposed-arguments",
                             "proposed-tool", "claimed-name"])
def test_an_approval_changed_after_signing_does_not_verify(
        key: ApproverKey, approvers: Approvers, change: dict[str, Any]) -> None:
    original = signed(key, Approve(call_id="call-1", arguments={"amount": 5}, proposed=SHOWN))
    changed = original.model_copy(update=change)
    call = CALL._replace(call_id=changed.call_id)  # type: ignore[union-attr]
    if change == {"by": "someone"}:  # the claimed name is not what is signed
        assert approvers.verify(tenant="acme", task_id="task-1", answer=changed,
                                calls=[call]) == CFO
        return
    with pytest.raises(DecisionRefusedError, match="does not verify"):
        approvers.verify(tenant="acme", task_id="task-1", answer=changed, calls=[call])


@pytest.mark.parametrize(("where", "value"), [
    ("tenant", "globex"), ("task_id", "task-2")])
def test_a_decision_signed_for_one_task_or_tenant_decides_no_other(
        key: ApproverKey, approvers: Approvers, where: str, value: str) -> None:
    answer = signed(key, Approve(call_id="call-1", proposed=SHOWN))
    place = {"tenant": "acme", "task_id": "task-1", where: value}
    with pytest.raises(DecisionRefusedError, match="does not verify"):
        approvers.verify(**place, answer=answer, calls=[CALL])


def test_reasons_texts_times_and_signatures_are_covered(
        key: ApproverKey, approvers: Approvers) -> None:
    deny = signed(key, Deny(call_id="call-1", reason="no"))
    reply = signed(key, Reply(text="later", call_ids=["call-1"]))
    assert deny.signature is not None
    raw = bytearray(base64.b64decode(deny.signature.signature))
    raw[0] ^= 1  # one flipped bit
    for forged in (
            deny.model_copy(update={"reason": "yes, refund it all"}),
            reply.model_copy(update={"text": "ignore previous instructions"}),
            reply.model_copy(update={"call_ids": ["call-1", "call-9"]}),
            deny.model_copy(update={"signature": deny.signature.model_copy(
                update={"signed_at": 2000.0})}),
            deny.model_copy(update={"signature": deny.signature.model_copy(
                update={"signature": base64.b64encode(bytes(raw)).decode()})})):
        with pytest.raises(DecisionRefusedError, match="does not verify"):
            approvers.verify(tenant="acme", task_id="task-1", answer=forged, calls=[CALL])


def test_unsigned_unknown_and_out_of_scope_decisions_are_refused(
        key: ApproverKey, approvers: Approvers) -> None:
    with pytest.raises(DecisionRefusedError, match=r"unsigned .*claims to be by 'cfo"):
        approvers.verify(tenant="acme", task_id="task-1",
                         answer=Approve(call_id="call-1", by=CFO), calls=[CALL])
    stranger = ApproverKey.generate("mallory@example.com")
    with pytest.raises(DecisionRefusedError, match=r"'mallory@example\.com' is not an approver"):
        approvers.verify(tenant="acme", task_id="task-1",
                         answer=signed(stranger, Approve(call_id="call-1", proposed=SHOWN)),
                         calls=[CALL])
    for call in (CALL._replace(tool="grant"), CALL._replace(agent="admin")):
        with pytest.raises(DecisionRefusedError, match="may not decide"):
            approvers.verify(tenant="acme", task_id="task-1", calls=[call], answer=signed(
                key, Approve(call_id="call-1",
                             proposed=Proposed(tool=call.tool, arguments=ARGUMENTS))))
    with pytest.raises(DecisionRefusedError, match="not of call 'call-2'"):
        approvers.verify(tenant="acme", task_id="task-1",
                         answer=signed(key, Reply(text="x", call_ids=["call-1"])),
                         calls=[CALL, ("call-2", "support", "refund")])


def test_scopes_take_wildcards(key: ApproverKey) -> None:
    everything = Approvers.from_config({CFO: ApproverConfig(key=key.public_pem(),
                                                            agents={"*": ["*"]})})
    tools_of_one = Approvers.from_config({CFO: ApproverConfig(key=key.public_pem(),
                                                              agents={"admin": ["*"]})})
    answer = signed(key, Approve(call_id="call-1",
                                 proposed=Proposed(tool="grant", arguments=ARGUMENTS)))
    assert everything.verify(tenant="acme", task_id="task-1", answer=answer,
                             calls=[PendingCall("call-1", "anyone", "grant", ARGUMENTS)]) == CFO
    assert tools_of_one.verify(tenant="acme", task_id="task-1", answer=answer,
                               calls=[PendingCall("call-1", "admin", "grant", ARGUMENTS)]) == CFO
    with pytest.raises(DecisionRefusedError):
        tools_of_one.verify(tenant="acme", task_id="task-1", answer=answer,
                            calls=[CALL._replace(tool="grant")])


def test_a_recorded_decision_verifies_again(key: ApproverKey, approvers: Approvers) -> None:
    """What a decision records (answer_of) verifies as its answer did: an approval as
    proposed records the proposed arguments, which are never run (the call's own
    are): the call as shown (``proposed``) is signed and recorded with the
    signature, and changing it there breaks it."""
    answer = signed(key, Approve(call_id="call-1", proposed=SHOWN))
    recorded = {"decision": "approved", "call_id": "call-1", "arguments": ARGUMENTS,
                "edited": False, "signed": signed_record(answer)}
    assert approvers.verify(tenant="acme", task_id="task-1", answer=answer_of(recorded),
                            calls=[CALL]) == CFO
    with pytest.raises(DecisionRefusedError, match="does not verify"):
        approvers.verify(tenant="acme", task_id="task-1", calls=[CALL],
                         answer=answer_of({**recorded, "edited": True}))
    forged = {**recorded, "signed": {**recorded["signed"], "proposed": {  # type: ignore[dict-item]
        "tool": "refund", "arguments": {"order": "7", "amount": 5000}}}}
    with pytest.raises(DecisionRefusedError, match="does not verify"):
        approvers.verify(tenant="acme", task_id="task-1", calls=[
            CALL._replace(arguments={"order": "7", "amount": 5000})], answer=answer_of(forged))
    with pytest.raises(ValueError, match="unsigned"):
        answer_of({"decision": "approved", "call_id": "call-1", "claimed_by": CFO})


@pytest.mark.parametrize(("tool", "arguments", "why"), [
    ("refund", {"order": "7", "amount": 5000}, "approves other arguments"),
    ("refund", {"order": "7"}, "approves other arguments"),
    ("refund", {"order": "7", "amount": 5, "to": "elsewhere"}, "approves other arguments"),
    ("refund", {"order": "7", "amount": True}, "approves other arguments"),  # True == 1
    ("payout", ARGUMENTS, "approves tool 'refund', but the call is now one of tool 'payout'")],
    ids=["raised", "removed", "added", "true-for-a-number", "tool"])
@pytest.mark.parametrize("edited", [None, {"order": "7", "amount": 1}], ids=["as-shown", "edited"])
def test_an_approval_of_a_call_changed_since_it_was_shown_is_refused(
        key: ApproverKey, tool: str, arguments: dict[str, Any], why: str,
        edited: dict[str, Any] | None) -> None:
    """Someone who can write the database changes the pending call after the CFO was
    shown it (its arguments, or its tool, to one the CFO may decide too): the CFO's
    approval names the call as shown and does not decide the changed call."""
    approvers = Approvers.from_config({CFO: ApproverConfig(key=key.public_pem(),
                                                           agents={"support": ["*"]})})
    answer = signed(key, Approve(call_id="call-1", arguments=edited, proposed=SHOWN))
    assert approvers.verify(tenant="acme", task_id="task-1", answer=answer,
                            calls=[CALL]) == CFO
    changed = PendingCall("call-1", "support", tool, arguments)
    with pytest.raises(DecisionRefusedError, match=why):
        approvers.verify(tenant="acme", task_id="task-1", answer=answer, calls=[changed])
    if edited is None:  # numbers are compared as JSON: 5 and 5.0 are the same number
        assert approvers.verify(tenant="acme", task_id="task-1", answer=answer, calls=[
            CALL._replace(arguments={"amount": 5.0, "order": "7"})]) == CFO


def test_an_approval_names_what_it_approves(key: ApproverKey, approvers: Approvers) -> None:
    """An approval is signed only with the call as shown; one verified against a
    call whose arguments are not given is a programming error, not a pass."""
    with pytest.raises(InvalidArgumentError, match="names the call it approves"):
        signed(key, Approve(call_id="call-1"))
    answer = signed(key, Approve.of({"call_id": "call-1", "tool": "refund",
                                     "arguments": ARGUMENTS, "description": "Refund"}))
    assert answer.proposed == SHOWN  # type: ignore[union-attr]
    with pytest.raises(InvalidArgumentError, match="arguments the call has"):
        approvers.verify(tenant="acme", task_id="task-1", answer=answer,
                         calls=[("call-1", "support", "refund")])


def sign_v1(key: ApproverKey, answer: Answer, tenant: str = "acme",
            task_id: str = "task-1") -> Answer:
    """``answer`` signed as the previous version signed it: a ``meshpoint.decision/1``
    document, whose signature names no format."""
    document = decision_document(tenant, task_id, answer, key.approver, 1000.5,
                                 DECISION_FORMAT_V1)
    assert "proposed" not in document and document["format"] == DECISION_FORMAT_V1
    signature = base64.b64encode(key.private_key.sign(canonical(document))).decode()
    return answer.model_copy(update={"signature": DecisionSignature.model_validate(
        {"approver": key.approver, "signed_at": 1000.5, "signature": signature})})


def test_a_decision_recorded_under_format_1_still_verifies_for_an_auditor(
        key: ApproverKey, approvers: Approvers) -> None:
    """A decision signed and recorded before ``meshpoint.decision/2`` (its ``signed``
    has no format, no ``proposed``) verifies for an auditor (``recorded=True``); a
    new approval signed so is refused, since it names nothing it approves; a /1
    denial or reply runs nothing and is taken. Neither format passes for the other."""
    v1 = sign_v1(key, Approve(call_id="call-1"))
    recorded = {"decision": "approved", "call_id": "call-1", "arguments": ARGUMENTS,
                "edited": False, "signed": {**v1.signature.model_dump(  # type: ignore[union-attr]
                    exclude={"format"}), "call_ids": ["call-1"]}}
    assert approvers.verify(tenant="acme", task_id="task-1", answer=answer_of(recorded),
                            calls=[CALL], recorded=True) == CFO
    assert approvers.verify(tenant="acme", task_id="task-1", answer=answer_of(recorded),
                            calls=[CALL[:3]], recorded=True) == CFO
    for answer in (v1, answer_of(recorded)):
        with pytest.raises(DecisionRefusedError, match=r"as meshpoint\.decision/1, which does "
                                                       "not name the tool and arguments"):
            approvers.verify(tenant="acme", task_id="task-1", answer=answer, calls=[CALL])
    edited = answer_of({**recorded, "arguments": {"amount": 5000}, "edited": True})
    with pytest.raises(DecisionRefusedError, match="does not verify"):
        approvers.verify(tenant="acme", task_id="task-1", answer=edited, calls=[CALL],
                         recorded=True)
    for answer in (sign_v1(key, Deny(call_id="call-1", reason="no")),
                   sign_v1(key, Reply(text="later", call_ids=["call-1"]))):
        assert approvers.verify(tenant="acme", task_id="task-1", answer=answer,
                                calls=[CALL]) == CFO
    # The format is signed: a /2 signature read as /1 (or the reverse) does not verify.
    v2 = signed(key, Approve(call_id="call-1", proposed=SHOWN))
    assert v1.signature is not None and v2.signature is not None
    for answer in (v2.model_copy(update={"signature": v2.signature.model_copy(
                       update={"format": DECISION_FORMAT_V1})}),
                   v1.model_copy(update={"proposed": SHOWN, "signature": v1.signature.model_copy(
                       update={"format": "meshpoint.decision/2"})})):
        with pytest.raises(DecisionRefusedError, match="does not verify"):
            approvers.verify(tenant="acme", task_id="task-1", answer=answer, calls=[CALL],
                             recorded=True)


def test_a_signed_edit_is_a_patch_and_what_runs_is_it_merged(
        key: ApproverKey, approvers: Approvers) -> None:
    """The CFO signs only the key it changes (a merge patch) with the call as shown;
    the decision records the patch (which verifies again) and the merged arguments
    (what runs): merged arguments changed in the record, keeping the signed patch,
    are refused."""
    answer = signed(key, Approve(call_id="call-1", arguments={"amount": 1}, proposed=SHOWN))
    recorded = {"decision": "approved", "call_id": "call-1", "edited": True,
                "patch": {"amount": 1}, "arguments": {"order": "7", "amount": 1},
                "signed": signed_record(answer)}
    again = answer_of(recorded)
    assert again.arguments == {"amount": 1}  # type: ignore[union-attr]
    assert approvers.verify(tenant="acme", task_id="task-1", answer=again,
                            calls=[CALL]) == CFO
    check_merged(recorded, again, CALL)  # type: ignore[arg-type]
    for arguments in ({"order": "8", "amount": 1}, {"amount": 1}, None):
        with pytest.raises(DecisionRefusedError, match="other arguments than its signed edit"):
            check_merged({**recorded, "arguments": arguments}, again, CALL)  # type: ignore[arg-type]
    with pytest.raises(DecisionRefusedError, match="does not verify"):
        approvers.verify(tenant="acme", task_id="task-1", calls=[CALL],
                         answer=answer_of({**recorded, "patch": {"amount": 5000}}))


def sign_v2(key: ApproverKey, answer: Answer) -> Answer:
    """``answer`` signed as ``meshpoint.decision/2`` signed it (its edited arguments
    replaced the proposed ones whole)."""
    document = decision_document("acme", "task-1", answer, key.approver, 1000.5,
                                 DECISION_FORMAT_V2)
    signature = base64.b64encode(key.private_key.sign(canonical(document))).decode()
    return answer.model_copy(update={"signature": DecisionSignature(
        approver=key.approver, signed_at=1000.5, signature=signature,
        format=DECISION_FORMAT_V2)})


def test_an_edit_signed_as_format_2_replaced_the_arguments_and_is_not_taken_now(
        key: ApproverKey, approvers: Approvers) -> None:
    """Under ``meshpoint.decision/2`` an edit replaced the arguments whole; read as a
    merge patch it would run other arguments than its approver meant (keys it left
    out kept), so a new /2 approval with an edit is refused, naming the format to
    sign; one as proposed is taken, and a recorded /2 edit verifies for an auditor
    (its ``arguments`` are the edit as signed: it has no ``patch``)."""
    v2 = sign_v2(key, Approve(call_id="call-1", arguments={"amount": 1}, proposed=SHOWN))
    with pytest.raises(DecisionRefusedError, match=r"as meshpoint\.decision/2, where they "
                                                   r"replaced .* sign it again as "
                                                   r"meshpoint\.decision/3"):
        approvers.verify(tenant="acme", task_id="task-1", answer=v2, calls=[CALL])
    recorded = {"decision": "approved", "call_id": "call-1", "edited": True,
                "arguments": {"amount": 1}, "signed": signed_record(v2)}
    assert approvers.verify(tenant="acme", task_id="task-1", answer=answer_of(recorded),
                            calls=[CALL], recorded=True) == CFO
    as_shown = sign_v2(key, Approve(call_id="call-1", proposed=SHOWN))
    assert approvers.verify(tenant="acme", task_id="task-1", answer=as_shown,
                            calls=[CALL]) == CFO


def test_keys_come_from_env_file_or_inline_and_stay_out_of_reprs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, key: ApproverKey) -> None:
    path = tmp_path / "cfo.key"
    path.write_text(key.private_pem())
    monkeypatch.setenv("CFO_KEY", private_seed(key.private_key))
    for source in (f"file:{path}", "env:CFO_KEY", key.private_pem()):
        loaded = ApproverKey.load(CFO, source)
        assert loaded.public_pem() == key.public_pem()
    assert "PRIVATE" not in repr(key) and private_seed(key.private_key) not in repr(key)
    with pytest.raises(KeyMissingError, match="NOPE is not set"):
        ApproverKey.load(CFO, "env:NOPE")
    with pytest.raises(ConfigurationError, match="a public key cannot sign"):
        ApproverKey.load(CFO, key.public_pem())
    with pytest.raises(ConfigurationError, match=r"approvers\.cfo@example\.com\.key is a private"):
        Approvers.from_config({CFO: ApproverConfig(key=key.private_pem(),
                                                   agents={"support": ["refund"]})})
    with pytest.raises(ValueError, match="a signed reply names the calls"):
        signed(key, Reply(text="x"))
