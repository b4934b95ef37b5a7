"""A human's answer to a call waiting for approval, and the document its approver signs.

An answer is one of :class:`Approve`, :class:`Deny` or :class:`Reply`; it travels
in a ``message/send`` naming the task (a DataPart ``{"meshpoint_answer": {...}}``,
or a plain-text reply) and :func:`parse_answer` reads it from there.

A broker does not say who published a message, so an answer's ``by`` is only a
claim. An approver proves who it is by signing the answer
(:class:`~meshpoint.runtime.approvers.ApproverKey`): Ed25519 over the RFC 8785
canonical JSON (:func:`meshpoint.history.integrity.canonical`) of :func:`decision_document`,
which holds everything the decision does and where it applies::

    {"format": "meshpoint.decision/3", "tenant": ..., "task_id": ...,
     "call_ids": [...],          # the call decided (a reply: every call it answers)
     "decision": "approve" | "deny" | "reply",
     "arguments": {...} | null,  # approve: the edit, a JSON merge patch of the
                                 # proposed arguments (null: as proposed)
     "proposed": {"tool": ..., "arguments": {...}} | null,
                                 # approve: the call as its approver was shown it
     "reason": str | null,       # deny: what the model is told
     "text": str | null,         # reply: what the model is told
     "approver": "cfo@example.com", "signed_at": 1767225600.25}

The call id binds a decision to one call of one task of one tenant: it cannot be
moved to another, and replaying it finds the call answered (the first answer wins).
``proposed`` binds an approval to what was approved: the call's tool and its
arguments are read from the database, and someone who can write it could change
them after the approver saw them; an approval whose ``proposed`` is not the call
as stored (:func:`check_proposed`) is refused. An edit is a JSON merge patch
(RFC 7396, :func:`merge_patch`) of the proposed arguments, so ``proposed`` and
``arguments`` together name exactly what runs; the recorded decision keeps both the
patch as signed (``patch``) and the merged arguments that ran (``arguments``).

Older formats still verify for an auditor of what was recorded, but an instance
takes no new decision they cannot say plainly
(:meth:`~meshpoint.runtime.approvers.Approvers.verify`): ``meshpoint.decision/1``
(before ``proposed``) is the document without that key, and no approval signed under
it is taken; ``meshpoint.decision/2`` is the same document as ``/3`` but its
``arguments`` replaced the proposed ones whole, so an approval with edited arguments
signed under it is refused (one as proposed is taken).
The signature travels with the answer (:class:`DecisionSignature`) and is kept in
the recorded decision (``signed``), so the decision can be verified again when its
task settles it, and by an auditor later (:func:`answer_of`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Literal, NamedTuple

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from meshpoint import a2a
from meshpoint.errors import BadMessageError, DecisionRefusedError, MeshpointError
from meshpoint.history.integrity import canonical

#: The key of the DataPart an answer travels in (A2A ``message/send`` naming the task).
ANSWER_KEY = "meshpoint_answer"
#: The formats of the document an approver signs, oldest first.
DecisionFormat = Literal["meshpoint.decision/1", "meshpoint.decision/2",
                         "meshpoint.decision/3"]
#: The ``format`` of the document an approver signs.
DECISION_FORMAT: DecisionFormat = "meshpoint.decision/3"
#: The format before it, which does not name what an approval approves: verified
#: for an auditor of recorded decisions, refused for a new approval.
DECISION_FORMAT_V1: DecisionFormat = "meshpoint.decision/1"
#: The format whose edited arguments replaced the proposed ones whole: verified for
#: an auditor, refused for a new approval with edited arguments.
DECISION_FORMAT_V2: DecisionFormat = "meshpoint.decision/2"
#: What a recorded decision says it was, by the kind of answer.
RECORDED = {"approve": "approved", "deny": "denied", "reply": "replied"}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class DecisionSignature(_Strict):
    """An approver's signature of an answer (see the module docstring)."""

    #: The approver's id, as configured (e.g. ``cfo@example.com``).
    approver: str = Field(min_length=1, max_length=200)
    #: When it was signed (seconds since the epoch).
    signed_at: float
    #: The base64 of the Ed25519 signature of the decision document.
    signature: str = Field(min_length=1, max_length=200)
    #: The format of the document signed (absent: a signature made before
    #: ``meshpoint.decision/2``). Signed too: changing it breaks the signature.
    format: DecisionFormat = DECISION_FORMAT_V1

    @field_validator("signed_at")
    @classmethod
    def _finite(cls, value: float) -> float:
        if not math.isfinite(value):
            raise ValueError("must be a finite number")
        return value


class Proposed(_Strict):
    """A call waiting for approval as its approver was shown it: its tool and the
    arguments the model gave."""

    tool: str = Field(min_length=1, max_length=255)
    arguments: dict[str, Any]


class Approve(_Strict):
    """Approve a pending call, with its arguments edited or as the model gave them."""

    decision: Literal["approve"] = "approve"
    call_id: str = Field(min_length=1, max_length=255)
    #: The edit: a JSON merge patch (RFC 7396) of the proposed arguments, so only
    #: the keys to change are given (``None`` as a value removes the key; objects
    #: merge key by key; anything else replaces). None: run them as proposed.
    arguments: dict[str, Any] | None = None
    #: The call approved, as its approver was shown it (a signed approval needs it).
    proposed: Proposed | None = None
    #: Who says they answer: a claim, unless ``signature`` proves it.
    by: str | None = Field(default=None, max_length=200)
    signature: DecisionSignature | None = None

    @classmethod
    def of(cls, pending: Mapping[str, Any], arguments: dict[str, Any] | None = None,
           *, by: str | None = None) -> Approve:
        """The approval of ``pending``, a call waiting for approval as it was shown
        (a dict of :meth:`~meshpoint.runtime.client.Client.wait_input`, or of
        ``meshpoint tasks show --json``: its ``call_id``, ``tool`` and
        ``arguments``), with ``arguments`` (a JSON merge patch) merged into the
        model's if given."""
        return cls(call_id=pending["call_id"], arguments=arguments, by=by,
                   proposed=Proposed(tool=pending["tool"], arguments=pending["arguments"]))


class Deny(_Strict):
    """Deny a pending call; ``reason`` is shown to the model."""

    decision: Literal["deny"] = "deny"
    call_id: str = Field(min_length=1, max_length=255)
    reason: str = Field(default="denied", max_length=10_000)
    by: str | None = Field(default=None, max_length=200)
    signature: DecisionSignature | None = None


class Reply(_Strict):
    """Answer in words instead: the pending calls of the task (``call_ids``, or every
    one when that is None; a signed reply names them) are left unrun and the model
    is shown the text."""

    decision: Literal["reply"] = "reply"
    text: str = Field(min_length=1, max_length=100_000)
    call_ids: list[str] | None = Field(default=None, min_length=1, max_length=100)
    by: str | None = Field(default=None, max_length=200)
    signature: DecisionSignature | None = None


Answer = Approve | Deny | Reply
_ANSWERS: dict[str, type[Approve | Deny | Reply]] = {
    "approve": Approve, "deny": Deny, "reply": Reply}


def parse_answer(message: a2a.Message) -> Answer:
    """The answer a ``message/send`` naming a task carries: a DataPart
    ``{"meshpoint_answer": {...}}`` (approve, deny, or a signed reply), or else its
    text (a reply). BadMessageError if it carries neither or a malformed one."""
    by = (message.metadata or {}).get("meshpoint_by")
    for part in message.parts:
        if isinstance(part, a2a.DataPart) and ANSWER_KEY in part.data:
            raw = part.data[ANSWER_KEY]
            kind = raw.get("decision") if isinstance(raw, dict) else None
            model = _ANSWERS.get(kind) if isinstance(kind, str) else None
            if model is None:
                raise BadMessageError(
                    f"{ANSWER_KEY}.decision must be one of {sorted(_ANSWERS)}, got {kind!r}")
            try:
                return model.model_validate(
                    {**raw, "by": raw.get("by", by if isinstance(by, str) else None)})
            except ValidationError as error:
                first = error.errors(include_url=False)[0]
                where = ".".join(str(p) for p in first["loc"]) or ANSWER_KEY
                raise BadMessageError(f"bad answer: {where}: {first['msg']}") from None
    if not message.text:
        raise BadMessageError(
            f"a message naming a task must carry an answer: a data part "
            f"{{{ANSWER_KEY!r}: ...}} or text (a reply)")
    return Reply(text=message.text, by=by if isinstance(by, str) else None)


def call_ids_of(answer: Answer) -> list[str]:
    """The calls an answer decides, as its signature names them (a reply that names
    none answers every pending call, and cannot be signed)."""
    if isinstance(answer, Reply):
        return list(answer.call_ids or ())
    return [answer.call_id]


def decision_document(tenant: str, task_id: str, answer: Answer, approver: str,
                      signed_at: float, form: DecisionFormat = DECISION_FORMAT
                      ) -> dict[str, Any]:
    """What ``approver`` signs to make ``answer`` (to ``task_id`` of ``tenant``) its
    own, in format ``form`` (see the module docstring)."""
    document = {
        "format": form, "tenant": tenant, "task_id": task_id,
        "call_ids": call_ids_of(answer), "decision": answer.decision,
        "arguments": answer.arguments if isinstance(answer, Approve) else None,
        "reason": answer.reason if isinstance(answer, Deny) else None,
        "text": answer.text if isinstance(answer, Reply) else None,
        "approver": approver, "signed_at": signed_at}
    if form != DECISION_FORMAT_V1:
        proposed = answer.proposed if isinstance(answer, Approve) else None
        document["proposed"] = proposed.model_dump() if proposed is not None else None
    return document


class PendingCall(NamedTuple):
    """A call a decision decides, as the deciding process holds it."""

    call_id: str
    agent: str
    tool: str
    #: The arguments the model gave (what an approval as proposed runs); None only
    #: where they are not known: an auditor's check of a recorded decision.
    arguments: dict[str, Any] | None = None


def check_proposed(answer: Approve, call: PendingCall) -> None:
    """DecisionRefusedError unless ``answer`` names ``call`` as it is now: the same
    tool, and (when known) the same arguments, compared as canonical JSON (exactly:
    ``1`` is not ``true``)."""
    proposed = answer.proposed
    if proposed is None:
        raise DecisionRefusedError(
            f"the approval of call {call.call_id!r} does not name the tool and arguments "
            "it approves (proposed): approve the call as it was shown (Approve.of, "
            "Client.approve, meshpoint tasks approve)")
    if proposed.tool != call.tool:
        raise DecisionRefusedError(
            f"the approval of call {call.call_id!r} approves tool {proposed.tool!r}, but "
            f"the call is now one of tool {call.tool!r}: it was changed after it was "
            "shown; nothing was run")
    if call.arguments is not None and _canonical(proposed.arguments) != _canonical(
            call.arguments):
        raise DecisionRefusedError(
            f"the approval of call {call.call_id!r} approves other arguments of "
            f"{call.tool!r} than the call now has: it was changed after it was shown; "
            "nothing was run")


def merge_patch(target: Any, patch: Any) -> Any:
    """``target`` with the JSON merge patch ``patch`` applied (RFC 7396), as a new
    value (neither argument is changed): an object patch merges key by key, a
    ``None`` (JSON null) value removing the key and an object value merging into the
    target's (an empty object if it has none there); any other patch replaces the
    target whole. A merge patch cannot set a value to null, nor edit a list in part:
    give the whole list."""
    if not isinstance(patch, dict):
        return patch
    merged = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            merged.pop(key, None)
        else:
            merged[key] = merge_patch(merged.get(key), value)
    return merged


def check_merged(decision: Mapping[str, Any], answer: Approve,
                 call: PendingCall) -> None:
    """DecisionRefusedError unless the arguments ``decision`` records (what would run)
    are the signed edit of ``answer`` merged into ``call``'s arguments: a signature
    covers the patch, and this binds what runs to it."""
    if answer.arguments is None or call.arguments is None:
        return
    if _canonical(merge_patch(call.arguments, answer.arguments)) != _canonical(
            decision.get("arguments")):
        raise DecisionRefusedError(
            f"the approval of call {call.call_id!r} records other arguments than its "
            "signed edit merged into the call's: it was changed after it was signed; "
            "nothing was run")


def _canonical(value: Any) -> bytes | None:
    try:
        return canonical(value)
    except (MeshpointError, ValueError, TypeError):
        return None  # never equal to what a real call holds


def signed_record(answer: Answer) -> dict[str, Any] | None:
    """What a recorded decision keeps of the answer's signature, to verify it again
    (:func:`answer_of`); None for an unsigned answer."""
    if answer.signature is None:
        return None
    record = {**answer.signature.model_dump(), "call_ids": call_ids_of(answer)}
    if isinstance(answer, Approve) and answer.proposed is not None:
        record["proposed"] = answer.proposed.model_dump()
    return record


def answer_of(decision: dict[str, Any]) -> Answer:
    """The signed answer a recorded decision was made from, rebuilt from what it
    records (the edit only if there was one, as signed: its ``patch``, or the
    ``arguments`` of a decision recorded before edits were merge patches; an
    approval as proposed runs the call's own arguments, which its ``proposed``
    names). ValueError if the
    decision is unsigned or malformed. Verifying it again proves that nothing the
    decision does was changed since its approver signed it (a decision recorded
    under ``meshpoint.decision/1`` included)."""
    signed = decision.get("signed")
    if not isinstance(signed, dict):
        raise ValueError("the decision is unsigned")
    kind = decision.get("decision")
    try:
        signature = DecisionSignature.model_validate(
            {k: v for k, v in signed.items() if k not in ("call_ids", "proposed")})
        if kind == "approved":
            edit = decision.get("patch", decision.get("arguments"))
            return Approve(call_id=decision["call_id"], signature=signature,
                           arguments=edit if decision.get("edited") else None,
                           proposed=signed.get("proposed"))
        if kind == "denied":
            return Deny(call_id=decision["call_id"], reason=decision["reason"],
                        signature=signature)
        if kind == "replied":
            return Reply(text=decision["text"], call_ids=signed.get("call_ids"),
                         signature=signature)
    except (KeyError, TypeError, ValidationError) as error:
        raise ValueError(f"the decision is malformed: {error}") from None
    raise ValueError(f"{kind!r} is not a decision")
