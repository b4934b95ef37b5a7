"""Approval pauses (docs/runtime.md, "Approvals"): a tool call that waits for a human's decision.

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
anything is written (the call is pending and an approval; edited arguments, a JSON
merge patch of the proposed ones, satisfy the tool's JSON schema once merged, which
the item carries; an approval that names the call as
it was shown, ``proposed``, names it as it is now) and then resolves the item in the
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
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import best_match

from meshpoint import a2a
from meshpoint.broker.base import Broker, Delivery
from meshpoint.context import TaskExecutionContext
from meshpoint.errors import (
    AlreadyAnsweredError,
    AnswerRefusedError,
    ArgumentsRejectedError,
    BadMessageError,
    DecisionRefusedError,
    MisdirectedAnswerError,
    NotPendingError,
    StoreError,
    SubTaskMovingError,
    UnknownSubTaskError,
    UnknownTaskError,
    UnreadableValueError,
)
from meshpoint.llm.base import ToolCall
from meshpoint.runtime import wire
from meshpoint.runtime.agent import Agent
from meshpoint.runtime.approvers import Approvers
from meshpoint.runtime.calls import Item, Opened, run_tool
from meshpoint.runtime.decisions import (
    ANSWER_KEY,
    RECORDED,
    Answer,
    Approve,
    Deny,
    PendingCall,
    Proposed,
    Reply,
    answer_of,
    check_merged,
    check_proposed,
    merge_patch,
    parse_answer,
    signed_record,
)
from meshpoint.runtime.outages import Outages
from meshpoint.runtime.scope import Scope
from meshpoint.runtime.stats import InstanceStats
from meshpoint.runtime.tasks import DeadLetters, LeaseOwners
from meshpoint.store.base import Store
from meshpoint.store.results import Resolution, SubTask
from meshpoint.store.sealing import UNREADABLE

__all__ = ["ANSWER_KEY", "APPROVAL", "Answer", "ApprovalCalls", "Approve", "Decided", "Deny",
           "Inputs", "Reply", "as_shown", "decide", "parse_answer"]

logger = logging.getLogger("meshpoint.runtime")

#: The correlation key that makes an item an approval: what the human decides on.
APPROVAL = "approval"
#: ``resolved_by`` of an item a human answered.
RESOLVED_BY_HUMAN = "human"
#: ``ctx.flags`` key: the model's call id -> the id of the approval item it waits on.
APPROVAL_CALLS = "approval_calls"


# -- the pause ------------------------------------------------------------------------


@dataclass(frozen=True)
class ApprovalCalls:
    """The :class:`~meshpoint.runtime.calls.CallKind` of local tool calls that need a
    human's approval (see the module docstring)."""

    pause_status = "input_required"
    immediate = False
    runs_tools = True  # an approved call's tool runs when it is settled
    announce_check_s = None  # its announcement (a status update) is not kept to be asked again

    agent: Agent
    broker: Broker
    #: The instance's: where each decision and an approved tool's run are logged.
    stats: InstanceStats
    #: Who may decide (None or empty: anyone, each decision's name only claimed).
    approvers: Approvers | None = None
    #: The store's tenant, which a signed decision names.
    tenant: str = "default"

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
        # Which item this call waits on, kept with the task: a decision recorded for
        # another item (copied into this one's row) is refused when it settles.
        ctx.flags.setdefault(APPROVAL_CALLS, {})[call.id] = call_id
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

    async def announce_again(self, sub: SubTask) -> bool:
        return False  # never checked (announce_check_s is None)

    async def withdraw(self, sub_task_id: str, correlation: dict[str, Any]) -> None:
        """Nobody is to be told: a late answer is refused as not pending."""

    def refused(self, ctx: TaskExecutionContext, call: ToolCall, result: Any) -> str | None:
        """With approvers configured, why a decision cannot be settled: it must be one
        of theirs for this very call, signed over what it records, and an approval
        must name the tool and arguments that would run now, as its approver was
        shown them, and record as its arguments its signed edit merged into them (a
        decision can reach the store without an instance's check:
        ``meshpoint tasks approve``, or anyone who can write the database; and so
        can a change to the call after the check). None to settle it; the call is
        made again otherwise (a new item, shown as it now is: the task keeps
        waiting). A deadline's denial needs no approver."""
        if not self.approvers or not isinstance(result, dict) or \
                result.get("decision") not in RECORDED.values():
            return None
        expected = (ctx.flags.get(APPROVAL_CALLS) or {}).get(call.id)
        try:
            if expected is not None and result.get("call_id") != expected:
                raise DecisionRefusedError(
                    f"it decides call {result.get('call_id')!r}, not {expected!r}, the one "
                    f"{call.name!r} waits on")
            answer = answer_of(result)
            pending = PendingCall(result["call_id"], self.agent.name, call.name,
                                  call.arguments)
            approver = self.approvers.verify(
                tenant=self.tenant, task_id=ctx.task_id, answer=answer, calls=[pending])
            if isinstance(answer, Approve):
                check_merged(result, answer, pending)
        except ValueError as error:
            claimed = result.get("claimed_by") or result.get("by")
            return f"{error} (claimed by {claimed!r})"
        except DecisionRefusedError as error:
            return str(error)
        # What is recorded of it from now on names its verified approver.
        result.update(by=approver, verified=True)
        result.pop("claimed_by", None)
        return None

    async def settle(self, ctx: TaskExecutionContext, call: ToolCall, result: Any) -> Any:
        """Run an approved call's tool now, with the arguments as the human left them
        (edited, or else the model's own: never arguments a decision records without
        saying it edited them); a call not approved gets a result saying why. Each
        decision is kept in the task's ``flags["approvals"]`` (who answered, when,
        what)."""
        (ctx.flags.get(APPROVAL_CALLS) or {}).pop(call.id, None)
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
            arguments = decision["arguments"] if decision.get("edited") else call.arguments
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


@dataclass(frozen=True, slots=True)
class Decided:
    """What an accepted answer did: each item's decision, and the resolution that
    completed the task's join, if this answer completed it."""

    decisions: list[dict[str, Any]]
    completing: Resolution | None


async def decide(store: Store, task_id: str, answer: Answer, *, by: str,
                 agent: str | None = None, approvers: Approvers | None = None,
                 lease_owner: str | None = None, lease_ttl_s: float = 30.0,
                 clock: Callable[[], float] = time.time) -> Decided:
    """Check ``answer`` to ``task_id`` and record it (see the module docstring).

    Raises before writing anything: UnknownTaskError for a task the tenant does not
    have paused; MisdirectedAnswerError for a task of another agent than ``agent``
    (the one whose subject the answer came on, if given); NotPendingError for a
    call that is not one of its pending approvals (or a reply to a task waiting for
    none); ArgumentsRejectedError for edited arguments (a JSON merge patch of the
    call's) that, merged, fail the tool's schema;
    DecisionRefusedError, with ``approvers``, for an answer not signed by one of
    them who may decide each call's tool, and for an approval whose ``proposed``
    (signed, or given unsigned) is not the call's tool and arguments as stored
    now; AlreadyAnsweredError (with the standing
    decision) for a call answered first. With ``lease_owner``, the answer that
    completes the join takes the resume lease in the same transaction.

    The decision records its verified approver as ``by`` (``verified: true``);
    without ``approvers``, the name the answer gives (else ``by``) is recorded only
    as ``claimed_by`` (``verified: false``). A signature is kept (``signed``).
    """
    if isinstance(answer, Reply):
        waiting = await _pending_for_reply(store, task_id, answer)
        _check_agent(waiting[0], agent)
    else:
        waiting = [await _pending_approval(store, task_id, answer.call_id, agent)]
    who = _who(store, task_id, answer, waiting, approvers, claimed=answer.by or by)
    if isinstance(answer, Reply):
        decided, completing = [], None
        for sub in waiting:
            decision = {"decision": "replied", "call_id": sub.sub_task_id, "text": answer.text,
                        **who, "at": clock()}
            resolution = await _resolve(store, sub, decision, lease_owner, lease_ttl_s)
            if resolution is not None:  # an approve that raced this reply won that call
                decided.append(decision)
                completing = resolution if resolution.join_complete else completing
        if not decided:
            raise AlreadyAnsweredError(f"every pending call of task {task_id!r} was "
                                       "answered first")
        return Decided(decided, completing)
    (sub,) = waiting
    if isinstance(answer, Approve):
        given = sub.correlation_data[APPROVAL]
        if answer.proposed is not None:  # unsigned, or checked already by _who
            check_proposed(answer, _pending_call(sub))
        # An edit is a merge patch of the arguments the call has (which an approval
        # that names them, ``proposed``, was checked to match): the merged ones are
        # checked, recorded and run; the patch is kept as it was given (and signed).
        edit = {} if answer.arguments is None else {"patch": answer.arguments}
        arguments = given["arguments"]
        if edit:
            arguments = merge_patch(arguments, answer.arguments)
            check_arguments(given["tool"], given.get("parameters") or {}, arguments)
        decision = {"decision": "approved", "call_id": sub.sub_task_id, "arguments": arguments,
                    "edited": bool(edit), **edit, **who, "at": clock()}
    else:
        decision = {"decision": "denied", "call_id": sub.sub_task_id,
                    "reason": answer.reason, **who, "at": clock()}
    resolution = await _resolve(store, sub, decision, lease_owner, lease_ttl_s)
    if resolution is None:
        raise _already_answered(await store.get_peer_sub_task(sub.sub_task_id))
    return Decided([decision], resolution if resolution.join_complete else None)


async def _pending_for_reply(store: Store, task_id: str, answer: Reply) -> list[SubTask]:
    """The pending approvals a reply answers: those it names, else every one."""
    subs = await store.get_peer_sub_tasks_for_task(task_id)
    for sub in subs:
        _check_readable(sub)
    approvals = {s.sub_task_id: s for s in subs if _is_approval(s)}
    if answer.call_ids is not None:
        unknown = [c for c in answer.call_ids if c not in approvals]
        if unknown:
            raise NotPendingError(f"task {task_id!r} has no call {unknown[0]!r} waiting "
                                  "for approval: the id is wrong, or the task has moved on")
        named = [approvals[c] for c in dict.fromkeys(answer.call_ids)]
        waiting = [s for s in named if s.status == "pending"]
        if not waiting:
            raise _already_answered(named[0])
        return waiting
    waiting = [s for s in approvals.values() if s.status == "pending"]
    if not waiting:
        raise NotPendingError(f"task {task_id!r} is not waiting for a human's input")
    return waiting


def _who(store: Store, task_id: str, answer: Answer, calls: Sequence[SubTask],
         approvers: Approvers | None, *, claimed: str) -> dict[str, Any]:
    """What a decision records of who made it: its verified approver, or (without
    approvers) only the name it claims; DecisionRefusedError if approvers are
    configured and it is not one of theirs for each of ``calls``."""
    signed = signed_record(answer)
    if not approvers:
        return {"claimed_by": claimed, "verified": False,
                **({"signed": signed} if signed else {})}
    approver = approvers.verify(tenant=store.tenant_id, task_id=task_id, answer=answer,
                                calls=[_pending_call(s) for s in calls])
    return {"by": approver, "verified": True, "signed": signed}


def _pending_call(sub: SubTask) -> PendingCall:
    approval = sub.correlation_data[APPROVAL]
    return PendingCall(sub.sub_task_id, sub.agent_name, approval["tool"],
                       approval["arguments"])


async def as_shown(store: Store, task_id: str, answer: Approve) -> Approve:
    """``answer`` naming the call it approves as ``store`` holds it now (its tool and
    arguments, which an approver's signature then covers: what ``meshpoint tasks
    approve`` shows and signs); unchanged if ``task_id`` has no such call readable
    (:func:`decide` then says why)."""
    for sub in await store.get_peer_sub_tasks_for_task(task_id):
        approval = sub.correlation_data.get(APPROVAL)
        if sub.sub_task_id == answer.call_id and isinstance(approval, dict):
            return answer.model_copy(update={"proposed": Proposed(
                tool=approval["tool"], arguments=approval["arguments"])})
    return answer


def check_arguments(tool: str, schema: dict[str, Any], arguments: Any) -> None:
    """ArgumentsRejectedError naming the first place ``arguments`` break ``schema``."""
    error = best_match(Draft202012Validator(schema).iter_errors(arguments))
    if error is not None:
        where = "/".join(str(p) for p in error.absolute_path) or "the arguments"
        raise ArgumentsRejectedError(
            f"the edited arguments of {tool!r} do not satisfy its schema: {where}: "
            f"{error.message}")


async def _pending_approval(store: Store, task_id: str, call_id: str,
                            agent: str | None) -> SubTask:
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
    _check_readable(sub)
    _check_agent(sub, agent)
    if not _is_approval(sub):
        raise NotPendingError(
            f"call {call_id!r} of task {task_id!r} is a call to a peer, not one waiting "
            "for approval")
    if sub.status == "moving":  # its task leaves for the cloud: decide it there
        raise SubTaskMovingError(call_id)
    if sub.status != "pending":
        raise _already_answered(sub)
    return sub


def _check_readable(sub: SubTask) -> None:
    """UnreadableValueError for a call whose correlation data the store could not
    open (its key is not held: a process without the key ring, or a shredded tenant):
    nothing is decided, and nothing written in clear beside sealed rows."""
    reason = sub.correlation_data.get(UNREADABLE)
    if reason is not None:
        raise UnreadableValueError(f"call {sub.sub_task_id!r} of task {sub.task_id!r} "
                                   f"cannot be answered: {reason}", task_id=sub.task_id)


def _check_agent(sub: SubTask, agent: str | None) -> None:
    """MisdirectedAnswerError if ``sub``'s task is not ``agent``'s (when given)."""
    if agent is not None and sub.agent_name != agent:
        raise MisdirectedAnswerError(
            f"task {sub.task_id!r} is a task of agent {sub.agent_name!r}, not agent "
            f"{agent!r}, whose subject this answer came on: nothing was written; send it "
            f"to {sub.agent_name!r}")


def _is_approval(sub: SubTask) -> bool:
    return isinstance(sub.correlation_data.get(APPROVAL), dict)


def _already_answered(sub: SubTask) -> AlreadyAnsweredError:
    decision = as_decision(sub.result)
    how = decision["decision"]
    if decision.get("reason") == "timed out":
        how = "denied: timed out"
    return AlreadyAnsweredError(
        f"call {sub.sub_task_id!r} of task {sub.task_id!r} was already answered "
        f"({how}, {decided_by(decision)})", decision=decision)


def decided_by(decision: dict[str, Any]) -> str:
    """Who a recorded decision says made it, as a human reads it: ``by X`` for a
    verified approver (or the deadline), ``claimed by X, unverified`` otherwise."""
    if decision.get("by") is not None:
        return f"by {decision['by']}"
    return f"claimed by {decision.get('claimed_by')}, unverified"


async def _resolve(store: Store, sub: SubTask, decision: dict[str, Any],
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

    scope: Scope
    outages: Outages
    owners: LeaseOwners
    dead_letters: DeadLetters
    stats: InstanceStats
    resume: Callable[[str, str], Awaitable[None]]
    #: Who may decide (None or empty: anyone, each decision's name only claimed).
    approvers: Approvers | None = None

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
                self.scope.store, task_id, answer, by=reply_to or "anonymous",
                agent=self.scope.agent_name, approvers=self.approvers, lease_owner=owner,
                lease_ttl_s=self.scope.lease_ttl_s))
        except MisdirectedAnswerError as error:
            # Not acknowledged and dropped: no instance of the task's own agent will
            # see it on this subject. The sender is told, and it is dead-lettered.
            self.stats.note("answer_refused", task_id)
            await self._reply(reply_to, wire.error_response(request.id, error.code, str(error)))
            await self.dead_letters.reject(delivery, BadMessageError(str(error)))
            return
        except (AnswerRefusedError, UnknownTaskError) as error:
            self.stats.note("answer_refused", task_id)
            if isinstance(error, DecisionRefusedError):
                # Someone tried to decide without an approver's signature: worth a
                # line in the log beside the refusal its sender is told.
                logger.warning("%s: refused a decision for task %s from %s: %s",
                               self.scope.instance_id, task_id, reply_to or "an unnamed sender",
                               error)
            code = error.code if isinstance(error, AnswerRefusedError) else wire.TASK_NOT_FOUND
            data = {"decision": error.decision} if isinstance(
                error, AnswerRefusedError) and error.decision else None
            await self._reply(reply_to, wire.error_response(request.id, code, str(error), data))
            await delivery.ack()
            return
        except StoreError as error:
            logger.warning("%s: could not record an answer to %s (%s); retrying later",
                           self.scope.instance_id, task_id, error)
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
                await self.scope.broker.publish(reply_to, document)
            except Exception as error:  # the answer stands; the sender times out
                logger.warning("%s: could not tell %s: %s", self.scope.instance_id, reply_to,
                               error)
