"""A human's answer to a call waiting for approval, and the document its approver signs.

An answer is one of :class:`Approve`, :class:`Deny` or :class:`Reply`; it travels
in a ``message/send`` naming the task (a DataPart ``{"meshpoint_answer": {...}}``,
or a plain-text reply) and :func:`parse_answer` reads it from there.

A broker does not say who published a message, so an answer's ``by`` is only a
claim. An approver proves who it is by signing the answer
(:class:`~meshpoint.runtime.approvers.ApproverKey`): Ed25519 over the RFC 8785
canonical JSON (:func:`meshpoint.integrity.canonical`) of :func:`decision_document`,
which holds everything the decision does and where it applies::

    {"format": "meshpoint.decision/1", "tenant": ..., "task_id": ...,
     "call_ids": [...],          # the call decided (a reply: every call it answers)
     "decision": "approve" | "deny" | "reply",
     "arguments": {...} | null,  # approve: the edited arguments (null: as proposed)
     "reason": str | null,       # deny: what the model is told
     "text": str | null,         # reply: what the model is told
     "approver": "cfo@example.com", "signed_at": 1767225600.25}

The call id binds a decision to one call of one task of one tenant: it cannot be
moved to another, and replaying it finds the call answered (the first answer wins).
The signature travels with the answer (:class:`DecisionSignature`) and is kept in
the recorded decision (``signed``), so the decision can be verified again when its
task settles it, and by an auditor later (:func:`answer_of`).
"""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from meshpoint import a2a
from meshpoint.errors import BadMessageError

#: The key of the DataPart an answer travels in (A2A ``message/send`` naming the task).
ANSWER_KEY = "meshpoint_answer"
#: The ``format`` of the document an approver signs.
DECISION_FORMAT = "meshpoint.decision/1"
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

    @field_validator("signed_at")
    @classmethod
    def _finite(cls, value: float) -> float:
        if not math.isfinite(value):
            raise ValueError("must be a finite number")
        return value


class Approve(_Strict):
    """Approve a pending call, with its arguments edited or as the model gave them."""

    decision: Literal["approve"] = "approve"
    call_id: str = Field(min_length=1, max_length=255)
    arguments: dict[str, Any] | None = None
    #: Who says they answer: a claim, unless ``signature`` proves it.
    by: str | None = Field(default=None, max_length=200)
    signature: DecisionSignature | None = None


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
                      signed_at: float) -> dict[str, Any]:
    """What ``approver`` signs to make ``answer`` (to ``task_id`` of ``tenant``) its
    own (see the module docstring)."""
    return {
        "format": DECISION_FORMAT, "tenant": tenant, "task_id": task_id,
        "call_ids": call_ids_of(answer), "decision": answer.decision,
        "arguments": answer.arguments if isinstance(answer, Approve) else None,
        "reason": answer.reason if isinstance(answer, Deny) else None,
        "text": answer.text if isinstance(answer, Reply) else None,
        "approver": approver, "signed_at": signed_at}


def signed_record(answer: Answer) -> dict[str, Any] | None:
    """What a recorded decision keeps of the answer's signature, to verify it again
    (:func:`answer_of`); None for an unsigned answer."""
    if answer.signature is None:
        return None
    return {**answer.signature.model_dump(), "call_ids": call_ids_of(answer)}


def answer_of(decision: dict[str, Any]) -> Answer:
    """The signed answer a recorded decision was made from, rebuilt from what it
    records (the arguments only if they were edited: an approval as proposed runs
    the call's own arguments). ValueError if the decision is unsigned or malformed.
    Verifying it again proves that nothing the decision does was changed since its
    approver signed it."""
    signed = decision.get("signed")
    if not isinstance(signed, dict):
        raise ValueError("the decision is unsigned")
    kind = decision.get("decision")
    try:
        signature = DecisionSignature.model_validate(
            {k: v for k, v in signed.items() if k != "call_ids"})
        if kind == "approved":
            return Approve(call_id=decision["call_id"], signature=signature,
                           arguments=decision.get("arguments") if decision.get("edited")
                           else None)
        if kind == "denied":
            return Deny(call_id=decision["call_id"], reason=decision["reason"],
                        signature=signature)
        if kind == "replied":
            return Reply(text=decision["text"], call_ids=signed.get("call_ids"),
                         signature=signature)
    except (KeyError, TypeError, ValidationError) as error:
        raise ValueError(f"the decision is malformed: {error}") from None
    raise ValueError(f"{kind!r} is not a decision")
