"""Approvers: who may decide the calls that wait for a human, proven by a signature.

Anyone who can publish to an agent's request subject can send an answer, and a
broker does not say who published it. So with approvers configured, an answer is
taken only if it is signed by one of them (:mod:`meshpoint.runtime.decisions` says
what is signed) and that approver may decide the call's tool: its identity comes
from the key it signs with, never from the message. Each approver is configured
with its Ed25519 *public* key and its scope, in the mesh config or in code::

    approvers = Approvers.from_config({
        "cfo@example.com": ApproverConfig(key="file:/etc/meshpoint/cfo.pub.pem",
                                          agents={"support": ["refund"]})})
    AgentInstance(agent, store, broker, approvers=approvers)

and signs with its private key, which stays with it (:class:`ApproverKey`:
``Client.approve(..., key=...)``, ``meshpoint tasks approve --key``).
``meshpoint keys approver new`` makes a key pair.

Without approvers (the embedded default: one trusted user) answers are taken as
before, but the name an answer gives is recorded as ``claimed_by`` with
``verified: false``, never as who decided.
"""

from __future__ import annotations

import base64
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)
from pydantic import BaseModel, ConfigDict, Field

from meshpoint.errors import (
    ConfigurationError,
    DecisionRefusedError,
    InvalidArgumentError,
    MeshpointError,
)
from meshpoint.history.integrity import canonical, load_key
from meshpoint.runtime.decisions import (
    DECISION_FORMAT,
    DECISION_FORMAT_V1,
    DECISION_FORMAT_V2,
    Answer,
    Approve,
    DecisionSignature,
    PendingCall,
    Reply,
    call_ids_of,
    check_proposed,
    decision_document,
)

#: In an approver's scope: every agent, or every tool of an agent.
ANY = "*"


class ApproverConfig(BaseModel):
    """One approver of the mesh config's ``approvers:`` (keyed by the approver's id,
    e.g. ``cfo@example.com``), and of :meth:`Approvers.from_config`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    #: Its Ed25519 public key: ``env:VAR``, ``file:PATH``, or the PEM itself (the
    #: history's signing keys are read the same way). Never its private key.
    key: str = Field(min_length=1)
    #: The calls it may decide: agent (or ``"*"``) -> that agent's tools (``["*"]``:
    #: all of them).
    agents: dict[str, list[str]] = Field(min_length=1)


@dataclass(frozen=True)
class Approver:
    """A configured approver: its public key and the tools it may decide."""

    id: str
    public_key: Ed25519PublicKey = field(repr=False)
    #: agent (or ANY) -> tools (ANY among them: all).
    scope: Mapping[str, frozenset[str]]

    def may_decide(self, agent: str, tool: str) -> bool:
        tools = self.scope.get(agent, frozenset()) | self.scope.get(ANY, frozenset())
        return tool in tools or ANY in tools


class Approvers:
    """The approvers of a deployment; :meth:`verify` checks a signed answer."""

    def __init__(self, approvers: Iterable[Approver] = ()) -> None:
        self._by_id = {approver.id: approver for approver in approvers}

    @classmethod
    def from_config(cls, config: Mapping[str, ApproverConfig]) -> Approvers:
        """The approvers of ``config`` (id -> :class:`ApproverConfig`), their keys read
        now: ConfigurationError (or KeyMissingError) naming the approver otherwise."""
        loaded = []
        for approver_id, spec in config.items():
            if not approver_id or len(approver_id) > 200:
                raise ConfigurationError(
                    f"approver id {approver_id!r} must be 1 to 200 characters")
            key = load_key(f"approvers.{approver_id}", spec.key)
            if isinstance(key, Ed25519PrivateKey):
                raise ConfigurationError(
                    f"approvers.{approver_id}.key is a private key: give the approver's "
                    "public key (its private key stays with the approver, who signs)")
            loaded.append(Approver(approver_id, key, {
                agent: frozenset(tools) for agent, tools in spec.agents.items()}))
        return cls(loaded)

    def __bool__(self) -> bool:
        return bool(self._by_id)

    def __len__(self) -> int:
        return len(self._by_id)

    def __repr__(self) -> str:
        return f"Approvers({sorted(self._by_id)})"

    def verify(self, *, tenant: str, task_id: str, answer: Answer,
               calls: Sequence[PendingCall | tuple[str, str, str]],
               recorded: bool = False) -> str:
        """The id of the approver who signed ``answer`` (to ``task_id`` of ``tenant``),
        which decides ``calls`` (each a :class:`PendingCall`: call id, agent, tool and
        the arguments the model gave); DecisionRefusedError saying why it cannot be
        taken: unsigned, an unknown approver, a signature that does not verify
        (forged, or of other content), other calls than it names, a call its approver
        may not decide, or an approval of another tool or other arguments than the
        call has now (:func:`~meshpoint.runtime.decisions.check_proposed`).

        An approval signed under ``meshpoint.decision/1`` does not name what it
        approves: it is refused, unless ``recorded`` (an auditor verifying a decision
        recorded before ``/2``, :func:`~meshpoint.runtime.decisions.answer_of`); so is
        an approval with edited arguments signed under ``meshpoint.decision/2``, whose
        edit replaced the arguments whole where ``/3``'s is a merge patch. A denial
        or a reply runs nothing, and verifies under any format."""
        signature = answer.signature
        if signature is None:
            claimed = f" (it claims to be by {answer.by!r})" if answer.by else ""
            raise DecisionRefusedError(
                f"the decision is unsigned{claimed}: decisions must be signed by a "
                f"configured approver ({', '.join(sorted(self._by_id))})")
        approver = self._by_id.get(signature.approver)
        if approver is None:
            raise DecisionRefusedError(
                f"{signature.approver!r} is not an approver of this mesh (approvers: "
                f"{', '.join(sorted(self._by_id))})")
        document = decision_document(tenant, task_id, answer, signature.approver,
                                     signature.signed_at, signature.format)
        try:
            approver.public_key.verify(base64.b64decode(signature.signature, validate=True),
                                       canonical(document))
        except (InvalidSignature, ValueError, MeshpointError):
            raise DecisionRefusedError(
                f"the signature of {signature.approver!r}'s decision does not verify with "
                "its key: it was made with another key, or the decision was changed "
                "(its task, calls, arguments, reason or text) after it was signed"
            ) from None
        if isinstance(answer, Approve) and signature.format == DECISION_FORMAT_V1 \
                and not recorded:
            raise DecisionRefusedError(
                f"{signature.approver!r} signed this approval as {DECISION_FORMAT_V1}, "
                "which does not name the tool and arguments it approves: sign it again "
                f"as {DECISION_FORMAT} (a current Client or meshpoint tasks approve)")
        if isinstance(answer, Approve) and answer.arguments is not None \
                and signature.format == DECISION_FORMAT_V2 and not recorded:
            raise DecisionRefusedError(
                f"{signature.approver!r} signed these edited arguments as "
                f"{DECISION_FORMAT_V2}, where they replaced the proposed ones whole; "
                f"they are now a JSON merge patch of them: sign it again as "
                f"{DECISION_FORMAT} (a current Client or meshpoint tasks approve)")
        named = call_ids_of(answer)
        for call in map(_pending, calls):
            if call.call_id not in named:
                raise DecisionRefusedError(
                    f"{signature.approver!r} signed a decision of calls {named}, not of "
                    f"call {call.call_id!r}")
            if not approver.may_decide(call.agent, call.tool):
                raise DecisionRefusedError(
                    f"{signature.approver!r} may not decide tool {call.tool!r} of agent "
                    f"{call.agent!r} (call {call.call_id!r})")
            if isinstance(answer, Approve) and signature.format != DECISION_FORMAT_V1:
                if call.arguments is None and not recorded:
                    raise InvalidArgumentError(
                        f"an approval of call {call.call_id!r} is verified against the "
                        "arguments the call has (PendingCall.arguments)")
                check_proposed(answer, call)
        return signature.approver


def _pending(call: PendingCall | tuple[str, str, str]) -> PendingCall:
    return call if isinstance(call, PendingCall) else PendingCall(*call)


@dataclass(frozen=True)
class ApproverKey:
    """An approver's private key, which signs its decisions (keep it with the
    approver: the runtime holds only the public half)."""

    approver: str
    private_key: Ed25519PrivateKey = field(repr=False)

    def __post_init__(self) -> None:
        if type(self.approver) is not str or not 0 < len(self.approver) <= 200:
            raise InvalidArgumentError(
                f"an approver id is a str of 1 to 200 characters, got {self.approver!r}")

    @classmethod
    def generate(cls, approver: str) -> ApproverKey:
        """A new key pair for ``approver``."""
        return cls(approver, Ed25519PrivateKey.generate())

    @classmethod
    def load(cls, approver: str, source: str) -> ApproverKey:
        """``approver``'s private key from ``source``: ``env:VAR``, ``file:PATH`` or
        the key itself (PEM, or the base64 of a 32-byte seed)."""
        key = load_key(f"approver {approver}", source)
        if not isinstance(key, Ed25519PrivateKey):
            raise ConfigurationError(
                f"approver {approver!r}: a public key cannot sign; give its private key")
        return cls(approver, key)

    def public_pem(self) -> str:
        """The public half, PEM-encoded: what the mesh config's ``approvers:`` holds."""
        return self.private_key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        ).decode()

    def private_pem(self) -> str:
        """The private key, PEM-encoded (PKCS #8, unencrypted): keep it secret."""
        return self.private_key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption()).decode()

    def sign(self, *, tenant: str, task_id: str, answer: Answer,
             clock: Callable[[], float] = time.time) -> Answer:
        """``answer`` signed by this approver, for ``task_id`` of ``tenant``, as
        ``meshpoint.decision/2``. A reply must name the calls it answers
        (``call_ids``), an approval the call it approves as it was shown
        (``proposed``: :meth:`Approve.of`)."""
        if isinstance(answer, Reply) and not answer.call_ids:
            raise InvalidArgumentError(
                "a signed reply names the calls it answers: give call_ids (the pending "
                "calls, from Client.wait_input or meshpoint tasks show)")
        if isinstance(answer, Approve) and answer.proposed is None:
            raise InvalidArgumentError(
                "a signed approval names the call it approves as it was shown: give "
                "proposed (its tool and arguments: Approve.of(pending), with a pending "
                "call from Client.wait_input or meshpoint tasks show)")
        if answer.by is not None and answer.by != self.approver:
            raise InvalidArgumentError(
                f"the answer says it is by {answer.by!r}, the key is {self.approver!r}'s")
        signed_at = clock()
        document = decision_document(tenant, task_id, answer, self.approver, signed_at)
        signature = base64.b64encode(self.private_key.sign(canonical(document))).decode()
        return answer.model_copy(update={"by": self.approver, "signature": DecisionSignature(
            approver=self.approver, signed_at=signed_at, signature=signature,
            format=DECISION_FORMAT)})
