"""Approval pauses (seed 004): a tool call that waits for a human's decision.

A local tool declared with ``needs_approval`` (or a predicate on the call's
arguments that says yes) is not run when the model calls it. The call becomes one
more outstanding item of the turn's join, resolved by a human instead of a peer,
so the same machinery applies: the task is checkpointed as ``input_required`` in
one transaction with its pending calls, then its caller is sent an A2A
``input-required`` status update describing them (:meth:`ApprovalCalls.announce`),
then its request is acknowledged and the task leaves memory. The item's deadline
is the tool's ``approval_timeout_s``: the sweeper then resolves it, and the call
is denied, "timed out".

A human answers from anywhere (:meth:`meshpoint.runtime.client.Client.approve`,
``deny``, ``reply``, or ``meshpoint tasks approve`` on the store directly), and any
instance takes the answer (:class:`Inputs`). :func:`decide` checks it before
anything is written (the call is pending and an approval; edited arguments satisfy
the tool's JSON schema, which the item carries) and then resolves the item in the
store, claim and result in one transaction: the first answer wins, a second is
told who won and how. When the join completes, the task is resumed as after a
peer's answer, and :meth:`ApprovalCalls.settle` runs an approved tool with the
arguments as the human left them; a denied call's result tells the model why.
Nothing that ran before the pause runs again.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from jsonschema import Draft202012Validator
from jsonschema.exceptions import best_match
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from meshpoint import a2a
from meshpoint.broker.base import Broker, Delivery
from meshpoint.context import TaskExecutionContext
from meshpoint.errors import (
    AlreadyAnsweredError,
    AnswerRefusedError,
    ArgumentsRejectedError,
    BadMessageError,
    MisdirectedAnswerError,
    NotPendingError,
    StoreError,
    UnknownSubTaskError,
    UnknownTaskError,
)
from meshpoint.llm.base import ToolCall
from meshpoint.runtime import wire
from meshpoint.runtime.agent import Agent
from meshpoint.runtime.calls import Item, Opened, run_tool
from meshpoint.runtime.outages import Outages
from meshpoint.runtime.stats import InstanceStats
from meshpoint.runtime.tasks import DeadLetters, LeaseOwners
from meshpoint.store.base import Store
from meshpoint.store.records import PeerSubTask, Resolution

logger = logging.getLogger("meshpoint.runtime")

#: The correlation key that makes an item an approval: what the human decides on.
APPROVAL = "approval"
#: ``resolved_by`` of an item a human answered.
RESOLVED_BY_HUMAN = "human"
#: The key of the DataPart an answer travels in (A2A ``message/send`` naming the task).
ANSWER_KEY = "meshpoint_answer"


# -- the pause ------------------------------------------------------------------------


@dataclass(frozen=True)
class ApprovalCalls:
    """The :class:`~meshpoint.runtime.calls.CallKind` of local tool calls that need a
    human's approval (see the module docstring)."""

    pause_status = "input_required"
    immediate = False

    agent: Agent
    broker: Broker
    #: The instance's: where each decision and an approved tool's run are logged.
    stats: InstanceStats

    def handles(self, call: ToolCall) -> bool:
        tool = self.agent.local_tool(call.name)
        return tool is not None and tool.requires_approval(call.arguments)

    def owns(self, correlation: dict[str, Any]) -> bool:
        return isinstance(correlation.get(APPROVAL), dict)

    async def open(self, ctx: TaskExecutionContext, invocation_id: str,
                   call: ToolCall) -> Opened:
        tool = self.agent.local_tool(call.name)
        assert tool is not None, "handles() said this call is a local tool's"
        call_id = wire.new_id()
        ctx.register_peer_sub_task(call_id, {
            "invocation_id": invocation_id, "function_call_id": call.id,
            "timeout_s": tool.approval_timeout_s,
            APPROVAL: {"tool": call.name, "description": tool.description,
                       "arguments": call.arguments, "parameters": tool.parameters}})
        return Opened(sub_task_id=call_id)

    async def announce(self, ctx: TaskExecutionContext, items: Sequence[Item], *,
                       inbox: str | None) -> None:
        """Tell the task's caller, in an ``input-required`` status update, what waits
        for approval: each call's id (the one to answer), tool, arguments and
        description."""
        status_to = ctx.a2a_context.get("status_to")
        if not status_to:
            return
        pending = [describe(call_id, corr) for call_id, corr in items]
        names = ", ".join(f"{p['tool']} ({p['call_id']})" for p in pending)
        await self.broker.publish(status_to, wire.input_required(
            ctx.a2a_context.get("request_id") or ctx.task_id, ctx.task_id,
            ctx.a2a_context.get("context_id") or ctx.task_id,
            f"waiting for approval of {names}", {"pending_approvals": pending}))

    async def withdraw(self, sub_task_id: str, correlation: dict[str, Any]) -> None:
        """Nobody is to be told: a late answer is refused as not pending."""

    async def settle(self, ctx: TaskExecutionContext, call: ToolCall, result: Any) -> Any:
        """Run an approved call's tool now, with the arguments as the human left them;
        a call not approved gets a result saying why. Each decision is kept in the
        task's ``flags["approvals"]`` (who answered, when, what)."""
        decision = as_decision(result)
        ctx.flags.setdefault("approvals", []).append(
            {"function_call_id": call.id, "tool": call.name, **decision})
        # Every decision is logged here, however it was given (a client, `meshpoint
        # tasks approve` straight to the store, the deadline).
        self.stats.log("approval", ctx.task_id, step=decision["decision"],
                       input={"function_call_id": call.id, "tool": call.name},
                       output=decision)
        if decision["decision"] == "approved":
            tool = self.agent.local_tool(call.name)
            if tool is None:
                return {"error": f"unknown tool {call.name!r}"}
            arguments = decision["arguments"]
            return await self.stats.tool_step(
                ctx.task_id, call.id, call.name, arguments,
                lambda: run_tool(tool, ctx, call, arguments))
        if decision["decision"] == "replied":
            return {"error": "not run: the human answered instead of approving",
                    "human_reply": decision["text"]}
        return {"error": f"not approved: {decision.get('reason') or 'denied'}"}


def describe(call_id: str, correlation: dict[str, Any]) -> dict[str, Any]:
    """A pending approval as a human is shown it."""
    approval = correlation[APPROVAL]
    return {"call_id": call_id, "tool": approval["tool"],
            "arguments": approval["arguments"], "description": approval["description"],
            "function_call_id": correlation.get("function_call_id"),
            "timeout_s": correlation.get("timeout_s")}


def as_decision(result: Any) -> dict[str, Any]:
    """The decision an approval item was resolved with; a deadline that passed (the
    sweeper's timeout result) is a denial, "timed out"."""
    if isinstance(result, dict) and result.get("decision") in ("approved", "denied",
                                                               "replied"):
        return result
    return {"decision": "denied", "reason": "timed out", "by": "meshpoint",
            "at": time.time()}


# -- answers ----------------------------------------------------------------------------


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Approve(_Strict):
    """Approve a pending call, with its arguments edited or as the model gave them."""

    decision: Literal["approve"] = "approve"
    call_id: str = Field(min_length=1, max_length=255)
    arguments: dict[str, Any] | None = None
    by: str | None = Field(default=None, max_length=200)


class Deny(_Strict):
    """Deny a pending call; ``reason`` is shown to the model."""

    decision: Literal["deny"] = "deny"
    call_id: str = Field(min_length=1, max_length=255)
    reason: str = Field(default="denied", max_length=10_000)
    by: str | None = Field(default=None, max_length=200)


class Reply(_Strict):
    """Answer in words instead: every pending call of the task is left unrun and the
    model is shown the text."""

    decision: Literal["reply"] = "reply"
    text: str = Field(min_length=1, max_length=100_000)
    by: str | None = Field(default=None, max_length=200)


Answer = Approve | Deny | Reply
_ANSWERS: dict[str, type[Approve | Deny | Reply]] = {
    "approve": Approve, "deny": Deny, "reply": Reply}


def parse_answer(message: a2a.Message) -> Answer:
    """The answer a ``message/send`` naming a task carries: a DataPart
    ``{"meshpoint_answer": {...}}`` (approve or deny), or else its text (a reply).
    BadMessageError if it carries neither or a malformed one."""
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


@dataclass(frozen=True, slots=True)
class Decided:
    """What an accepted answer did: each item's decision, and the resolution that
    completed the task's join, if this answer completed it."""

    decisions: list[dict[str, Any]]
    completing: Resolution | None


async def decide(store: Store, task_id: str, answer: Answer, *, by: str,
                 agent: str | None = None, lease_owner: str | None = None,
                 lease_ttl_s: float = 30.0,
                 clock: Callable[[], float] = time.time) -> Decided:
    """Check ``answer`` to ``task_id`` and record it (see the module docstring).

    Raises before writing anything: UnknownTaskError for a task the tenant does not
    have paused; MisdirectedAnswerError for a task of another agent than ``agent``
    (the one whose subject the answer came on, if given); NotPendingError for a
    call that is not one of its pending approvals (or a reply to a task waiting for
    none); ArgumentsRejectedError for edited arguments that fail the tool's schema;
    AlreadyAnsweredError (with the standing decision) for a call answered first.
    With ``lease_owner``, the answer that completes the join takes the resume lease
    in the same transaction.
    """
    who = answer.by or by
    if isinstance(answer, Reply):
        subs = await store.get_peer_sub_tasks_for_task(task_id)
        waiting = [s for s in subs if s.status == "pending" and _is_approval(s)]
        if not waiting:
            raise NotPendingError(f"task {task_id!r} is not waiting for a human's input")
        _check_agent(waiting[0], agent)
        decided, completing = [], None
        for sub in waiting:
            decision = {"decision": "replied", "call_id": sub.sub_task_id, "text": answer.text,
                        "by": who, "at": clock()}
            resolution = await _resolve(store, sub, decision, lease_owner, lease_ttl_s)
            if resolution is not None:  # an approve that raced this reply won that call
                decided.append(decision)
                completing = resolution if resolution.join_complete else completing
        if not decided:
            raise AlreadyAnsweredError(f"every pending call of task {task_id!r} was "
                                       "answered first")
        return Decided(decided, completing)
    sub = await _pending_approval(store, task_id, answer.call_id, agent)
    if isinstance(answer, Approve):
        given = sub.correlation_data[APPROVAL]
        arguments = given["arguments"] if answer.arguments is None else answer.arguments
        if answer.arguments is not None:
            check_arguments(given["tool"], given.get("parameters") or {}, arguments)
        decision = {"decision": "approved", "call_id": sub.sub_task_id, "arguments": arguments,
                    "edited": answer.arguments is not None, "by": who, "at": clock()}
    else:
        decision = {"decision": "denied", "call_id": sub.sub_task_id,
                    "reason": answer.reason, "by": who, "at": clock()}
    resolution = await _resolve(store, sub, decision, lease_owner, lease_ttl_s)
    if resolution is None:
        raise _already_answered(await store.get_peer_sub_task(sub.sub_task_id))
    return Decided([decision], resolution if resolution.join_complete else None)


def check_arguments(tool: str, schema: dict[str, Any], arguments: Any) -> None:
    """ArgumentsRejectedError naming the first place ``arguments`` break ``schema``."""
    error = best_match(Draft202012Validator(schema).iter_errors(arguments))
    if error is not None:
        where = "/".join(str(p) for p in error.absolute_path) or "the arguments"
        raise ArgumentsRejectedError(
            f"the edited arguments of {tool!r} do not satisfy its schema: {where}: "
            f"{error.message}")


async def _pending_approval(store: Store, task_id: str, call_id: str,
                            agent: str | None) -> PeerSubTask:
    try:
        sub = await store.get_peer_sub_task(call_id)
    except UnknownSubTaskError:
        await store.get_peer_sub_tasks_for_task(task_id)  # UnknownTaskError first
        raise NotPendingError(
            f"task {task_id!r} has no pending call {call_id!r}: the id is wrong, or the "
            "task has moved on since") from None
    if sub.task_id != task_id:
        await store.get_peer_sub_tasks_for_task(task_id)  # UnknownTaskError first
        raise NotPendingError(f"call {call_id!r} is not a call of task {task_id!r}")
    _check_agent(sub, agent)
    if not _is_approval(sub):
        raise NotPendingError(
            f"call {call_id!r} of task {task_id!r} is a call to a peer, not one waiting "
            "for approval")
    if sub.status != "pending":
        raise _already_answered(sub)
    return sub


def _check_agent(sub: PeerSubTask, agent: str | None) -> None:
    """MisdirectedAnswerError if ``sub``'s task is not ``agent``'s (when given)."""
    if agent is not None and sub.agent_name != agent:
        raise MisdirectedAnswerError(
            f"task {sub.task_id!r} is a task of agent {sub.agent_name!r}, not agent "
            f"{agent!r}, whose subject this answer came on: nothing was written; send it "
            f"to {sub.agent_name!r}")


def _is_approval(sub: PeerSubTask) -> bool:
    return isinstance(sub.correlation_data.get(APPROVAL), dict)


def _already_answered(sub: PeerSubTask) -> AlreadyAnsweredError:
    decision = as_decision(sub.result)
    how = decision["decision"]
    if decision.get("reason") == "timed out":
        how = "denied: timed out"
    return AlreadyAnsweredError(
        f"call {sub.sub_task_id!r} of task {sub.task_id!r} was already answered "
        f"({how}, by {decision.get('by')})", decision=decision)


async def _resolve(store: Store, sub: PeerSubTask, decision: dict[str, Any],
                   lease_owner: str | None, lease_ttl_s: float) -> Resolution | None:
    return await store.resolve_peer_sub_task(
        sub.sub_task_id, decision, resolved_by=RESOLVED_BY_HUMAN, lease_owner=lease_owner,
        lease_ttl_s=lease_ttl_s, agent_name=sub.agent_name)


@dataclass(frozen=True)
class Inputs:
    """Takes a human's answers (``message/send`` naming a task of this agent) on any
    instance: checks and records each with :func:`decide`, answers the sender,
    acknowledges, and resumes the task if the answer completed its join.
    ``resume(task_id, owner)`` continues a task under ``owner``'s lease."""

    instance_id: str
    #: The instance's agent: an answer is taken only for a task of this agent.
    agent_name: str
    store: Store
    broker: Broker
    outages: Outages
    owners: LeaseOwners
    dead_letters: DeadLetters
    stats: InstanceStats
    lease_ttl_s: float
    resume: Callable[[str, str], Awaitable[None]]

    async def on_answer(self, request: a2a.SendMessageRequest, reply_to: str | None,
                        delivery: Delivery) -> None:
        task_id = request.params.message.task_id
        assert task_id is not None, "the instance routes only messages naming a task"
        try:
            answer = parse_answer(request.params.message)
        except BadMessageError as error:
            await self._reply(reply_to, wire.error_response(request.id, -32602, str(error)))
            await self.dead_letters.reject(delivery, error)
            return
        owner = self.owners.next()
        try:
            decided = await self.outages.outlast(delivery, lambda: decide(
                self.store, task_id, answer, by=reply_to or "anonymous",
                agent=self.agent_name, lease_owner=owner, lease_ttl_s=self.lease_ttl_s))
        except MisdirectedAnswerError as error:
            # Not acknowledged and dropped: no instance of the task's own agent will
            # see it on this subject. The sender is told, and it is dead-lettered.
            self.stats.note("answer_refused", task_id)
            await self._reply(reply_to, wire.error_response(request.id, error.code, str(error)))
            await self.dead_letters.reject(delivery, BadMessageError(str(error)))
            return
        except (AnswerRefusedError, UnknownTaskError) as error:
            self.stats.note("answer_refused", task_id)
            code = error.code if isinstance(error, AnswerRefusedError) else wire.TASK_NOT_FOUND
            data = {"decision": error.decision} if isinstance(
                error, AnswerRefusedError) and error.decision else None
            await self._reply(reply_to, wire.error_response(request.id, code, str(error), data))
            await delivery.ack()
            return
        except StoreError as error:
            logger.warning("%s: could not record an answer to %s (%s); retrying later",
                           self.instance_id, task_id, error)
            await delivery.nak(1.0)
            return
        for decision in decided.decisions:
            # Counted here; logged when the task settles it (ApprovalCalls.settle),
            # where every decision arrives, whichever way it was given.
            self.stats.note(decision["decision"], task_id, journal=False)
        await self._reply(reply_to, wire.answer_accepted(request.id, task_id,
                                                         decided.decisions))
        await delivery.ack()
        completing = decided.completing
        if completing is not None and completing.lease_owner == owner:
            await self.resume(task_id, owner)

    async def _reply(self, reply_to: str | None, document: bytes) -> None:
        if reply_to:
            try:
                await self.broker.publish(reply_to, document)
            except Exception as error:  # the answer stands; the sender times out
                logger.warning("%s: could not tell %s: %s", self.instance_id, reply_to,
                               error)
