"""``Client``: submit tasks to agents and collect their answers.

A client is a caller that is not an agent (a CLI, a web backend, a test). Its
answers come to its own inbox; it counts every final answer it receives, so a
duplicate answer (at-least-once delivery of the final response) is visible.

It is also how a human answers a task that waits for approval, from any process:
:meth:`Client.approve`, :meth:`Client.deny` and :meth:`Client.reply` send the answer
to the task's agent, whose instance that takes it checks and records it and
replies; a refused answer raises
:class:`~meshpoint.errors.AnswerRefusedError` (or UnknownTaskError) saying why.
The tasks this client submitted tell it when they wait for input
(:meth:`Client.wait_input`); :meth:`Client.wait_next` waits for whichever comes
first, the answer or the next such pause (a :class:`NextStep`). A wait that runs out
raises :class:`~meshpoint.errors.WaitTimeoutError` (a TimeoutError) naming the task,
its agent and namespace, and what was waited for.

A client of a deployment opens the config's broker with
:func:`meshpoint.config.open_client`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from pydantic import ValidationError

from meshpoint import a2a
from meshpoint._validation import check_name, check_text, describe
from meshpoint.broker.base import Broker, ConsumerOptions, Delivery, Subscription
from meshpoint.errors import (
    AlreadyAnsweredError,
    AnswerRefusedError,
    ArgumentsRejectedError,
    BadMessageError,
    BrokerError,
    DecisionRefusedError,
    InvalidArgumentError,
    MeshpointError,
    MisdirectedAnswerError,
    NotPendingError,
    UnknownTaskError,
    WaitTimeoutError,
)
from meshpoint.ops.tracing import with_traceparent
from meshpoint.runtime import wire
from meshpoint.runtime.approvers import ApproverKey
from meshpoint.runtime.decisions import Answer, Approve, Deny, Proposed, Reply
from meshpoint.runtime.subjects import DEFAULT_TENANT, Subjects
from meshpoint.runtime.wire import TASK_NOT_FOUND

logger = logging.getLogger("meshpoint.client")
_Part = TypeVar("_Part", Approve, Deny, Reply, Proposed)


@dataclass(frozen=True)
class NextStep:
    """What :meth:`Client.wait_next` saw first: the task's final ``answer`` (it
    ended), or ``pending``, the calls its task now waits to have answered by a human
    (each as :meth:`Client.wait_input` gives them)."""

    request_id: str
    #: The task's id, as ``meshpoint tasks approve/deny/reply`` take it.
    task_id: str
    #: The final answer (completed, failed, canceled...), if the task ended.
    answer: a2a.Task | None = None
    #: The pending calls of an input-required pause (empty once the task ended).
    pending: list[dict[str, Any]] = field(default_factory=list)

    @property
    def ended(self) -> bool:
        """The task ended: ``answer`` is its final state."""
        return self.answer is not None


class Client:
    """Submits tasks to agents over ``broker``; use as ``async with Client(...)``."""

    def __init__(self, broker: Broker, *, namespace: str = "meshpoint",
                 tenant: str = DEFAULT_TENANT, client_id: str | None = None,
                 key: ApproverKey | None = None) -> None:
        self.broker = broker
        #: The approver key this client signs its answers with, unless a call gives one.
        self.key = key
        self.namespace = check_name("namespace", namespace)
        #: The tenant whose agents this client calls: its subjects are the tenant's.
        self.subjects = Subjects(namespace, tenant)
        self.client_id = check_name("client_id", client_id or f"client-{wire.new_id()[:12]}")
        #: This object's own subjects under the client's: two processes (or objects)
        #: with one client id never share an inbox.
        self.session = wire.new_id()[:16]
        self._prefix = self.subjects.client(self.client_id, self.session)
        #: request id -> every final answer received for it (normally one).
        self.answers: dict[str, list[a2a.Task]] = {}
        self._waiters: dict[str, asyncio.Future[a2a.Task]] = {}
        #: request id -> the agent it was sent to (named when a wait runs out).
        self._agents: dict[str, str] = {}
        #: request id -> the calls its task last said it waits to have approved.
        self.input_required: dict[str, list[dict[str, Any]]] = {}
        #: Request id -> the other status updates of its task, in arrival order (a task
        #: its agent had to block, say: state ``unknown``, the reason in its text).
        self.updates: dict[str, list[a2a.TaskStatusUpdateEvent]] = {}
        self._inputs: dict[str, asyncio.Future[list[dict[str, Any]]]] = {}
        self._replies: dict[str, asyncio.Future[a2a.SuccessResponse | a2a.ErrorResponse]] = {}
        self._subscription: Subscription | None = None

    async def start(self) -> Client:
        self._subscription = await self.broker.subscribe(
            f"{self._prefix}.>", self.subjects.queue(f"client-{self.client_id}-{self.session}"),
            self._on_message, ConsumerOptions(ephemeral=True))
        return self

    async def close(self) -> None:
        if self._subscription is not None:
            await self._subscription.stop()
            self._subscription = None

    async def __aenter__(self) -> Client:
        return await self.start()

    async def __aexit__(self, *_exc: object) -> None:
        await self.close()

    async def submit(self, agent: str, text: str, *, request_id: str | None = None) -> str:
        """Send ``text`` to ``agent`` as a new task; returns the request id."""
        self._check_started()
        check_name("agent", agent)
        request_id = check_name("request_id", request_id or wire.new_id())
        self._waiters.setdefault(request_id, asyncio.get_running_loop().create_future())
        self._agents[request_id] = agent
        await self.broker.publish(
            self.subjects.request(agent), wire.send_request(
                request_id, text, metadata=with_traceparent({}) or None),
            wire.reply_headers(f"{self._prefix}.response.{request_id}",
                               f"{self._prefix}.status.{request_id}"))
        return request_id

    def forget(self, request_id: str) -> None:
        """Drop what this client keeps of ``request_id`` (its answers, updates and
        waits): a long-lived client (the A2A gateway) calls it once it has recorded
        the answer elsewhere, so that its memory does not grow with every request."""
        for kept in (self.answers, self._waiters, self._agents, self.input_required,
                     self.updates, self._inputs):
            kept.pop(request_id, None)

    def task_id(self, agent: str, request_id: str) -> str:
        """The id ``agent`` gives the task of ``request_id`` (see derive_task_id)."""
        return wire.derive_task_id(agent, f"{self._prefix}.response.{request_id}", request_id)

    async def wait(self, request_id: str, timeout_s: float | None = None) -> a2a.Task:
        """The first final answer to ``request_id``; WaitTimeoutError (a TimeoutError)
        naming the task if none came within ``timeout_s``."""
        answer = self._submitted(request_id)
        await self._first(request_id, [answer], timeout_s, "answer")
        return answer.result()

    async def ask(self, agent: str, text: str, timeout_s: float | None = 60.0) -> a2a.Task:
        """Submit and wait for the answer."""
        return await self.wait(await self.submit(agent, text), timeout_s)

    async def cancel(self, agent: str, task_id: str) -> None:
        """Ask ``agent`` to cancel ``task_id``; its caller is answered ``canceled``."""
        await self.broker.publish(self.subjects.request(agent), wire.cancel_request(task_id))

    async def handoff(self, agent: str, task_id: str, reason: str = "") -> None:
        """Ask ``agent`` to hand ``task_id`` off to a fresh-context iteration (an
        operator's request; the agent needs a ``handoff`` policy): the instance
        running it does, before its next model call. A task that is not running (it
        waits for peers or a human, or in the store) is left as it is."""
        await self.broker.publish(self.subjects.request(agent),
                                  wire.handoff_request(task_id, reason))

    async def wait_input(self, request_id: str, timeout_s: float | None = None
                         ) -> list[dict[str, Any]]:
        """The pending approvals of ``request_id``'s task, once it waits for input:
        each a dict of ``call_id`` (what to answer), ``tool``, ``arguments``,
        ``description``, ``function_call_id`` and ``timeout_s``. Returns at once if
        an update not yet waited for arrived already. Returns ``[]`` once the task
        has ended (without needing input, or after it): its answer is then in
        :attr:`answers`, and :meth:`wait` returns it at once. WaitTimeoutError if
        neither came within ``timeout_s``."""
        return (await self._next(request_id, timeout_s, "input")).pending

    async def wait_next(self, request_id: str, timeout_s: float | None = None) -> NextStep:
        """Whichever comes first of ``request_id``'s task: its final answer
        (``NextStep.answer``; ``ended`` is true) or its next pause for a human
        (``NextStep.pending``, the calls to approve, deny or reply to). A pause
        already told and not yet waited for (here or by :meth:`wait_input`) returns
        at once; once the task ended, every call returns its answer. So a caller
        loops until ``ended``, answering each pause. WaitTimeoutError if neither
        came within ``timeout_s``."""
        return await self._next(request_id, timeout_s, "answer or input")

    async def _next(self, request_id: str, timeout_s: float | None, what: str) -> NextStep:
        answer = self._submitted(request_id)
        task_id = self.task_id(self._agents[request_id], request_id)
        pause = self._inputs.setdefault(request_id,
                                        asyncio.get_running_loop().create_future())
        await self._first(request_id, [answer, pause], timeout_s, what)
        if answer.done():  # the task ended: a pause told before is past
            if pause.done():
                self._inputs.pop(request_id, None)
            return NextStep(request_id, task_id, answer=answer.result())
        self._inputs.pop(request_id, None)
        return NextStep(request_id, task_id, pending=pause.result())

    async def _first(self, request_id: str, futures: list[asyncio.Future[Any]],
                     timeout_s: float | None, what: str) -> None:
        """Wait until one of ``futures`` is done (never cancelling them: a later
        wait goes on with them); WaitTimeoutError naming the task after
        ``timeout_s``."""
        if not any(f.done() for f in futures):
            await asyncio.wait(futures, timeout=timeout_s,
                               return_when=asyncio.FIRST_COMPLETED)
        if not any(f.done() for f in futures):
            agent = self._agents[request_id]
            raise WaitTimeoutError(
                task_id=self.task_id(agent, request_id), request_id=request_id, agent=agent,
                namespace=self.namespace, waited_for=what, timeout_s=timeout_s or 0.0)

    async def approve(self, task_id: str, call_id: str,
                      arguments: dict[str, Any] | None = None, *, agent: str | None = None,
                      by: str | None = None, key: ApproverKey | None = None,
                      proposed: Mapping[str, Any] | None = None,
                      timeout_s: float = 30.0) -> dict[str, Any]:
        """Approve the pending call ``call_id`` of ``task_id``, with ``arguments``
        merged into the model's if given (a JSON merge patch, RFC 7396: only the keys
        to change; ``None`` removes one), checked against the tool's JSON schema
        before anything is written. With ``key`` (or the client's), the approval is signed
        as that approver's, over the call as the approver was shown it: ``proposed``,
        a pending call's ``tool`` and ``arguments`` (a dict of :meth:`wait_input`,
        or of ``meshpoint tasks show --json``), by default what this client's own
        :meth:`wait_input` was told of ``call_id``. The approval is refused if the
        call is not that any more. Returns the recorded decision."""
        if arguments is not None and type(arguments) is not dict:
            raise InvalidArgumentError(f"arguments must be a dict, got {arguments!r:.80}")
        shown = None
        if proposed is not None:
            if not isinstance(proposed, Mapping):
                raise InvalidArgumentError(
                    f"proposed must be a pending call (a dict with its tool and arguments), "
                    f"got {proposed!r:.80}")
            shown = _answer(Proposed, tool=proposed.get("tool"),
                            arguments=proposed.get("arguments"))
        answer = _answer(Approve, call_id=call_id, arguments=arguments, by=by,
                         proposed=shown)
        return (await self.answer(task_id, answer, agent=agent, key=key,
                                  timeout_s=timeout_s))[0]

    async def deny(self, task_id: str, call_id: str, reason: str = "denied", *,
                   agent: str | None = None, by: str | None = None,
                   key: ApproverKey | None = None, timeout_s: float = 30.0) -> dict[str, Any]:
        """Deny the pending call ``call_id`` of ``task_id``; the model is shown
        ``reason``. With ``key`` (or the client's), signed. Returns the recorded
        decision."""
        answer = _answer(Deny, call_id=call_id, reason=reason, by=by)
        return (await self.answer(task_id, answer, agent=agent, key=key,
                                  timeout_s=timeout_s))[0]

    async def reply(self, task_id: str, text: str, *, agent: str | None = None,
                    by: str | None = None, call_ids: list[str] | None = None,
                    key: ApproverKey | None = None,
                    timeout_s: float = 30.0) -> list[dict[str, Any]]:
        """Answer a waiting task in words: its pending calls (``call_ids``, or every
        one) are not run and the model is shown ``text``. A signed reply (``key``, or
        the client's) names its calls. Returns the decisions recorded, one per call."""
        check_text("text", text)
        answer = _answer(Reply, text=text, call_ids=call_ids, by=by)
        return await self.answer(task_id, answer, agent=agent, key=key, timeout_s=timeout_s)

    async def answer(self, task_id: str, answer: Answer, *, agent: str | None = None,
                     key: ApproverKey | None = None,
                     timeout_s: float = 30.0) -> list[dict[str, Any]]:
        """Send ``answer`` (an :class:`~meshpoint.runtime.decisions.Approve`, ``Deny``
        or ``Reply``, perhaps signed elsewhere) to the waiting task ``task_id``; with
        ``key`` (or the client's), it is signed here. Returns the decisions recorded;
        raises AnswerRefusedError (or UnknownTaskError) saying why it was refused."""
        self._check_started()
        check_text("task_id", task_id)
        key = key or self.key
        if key is not None:
            if isinstance(answer, Approve) and answer.proposed is None:
                answer = self._as_shown(answer)
            answer = key.sign(tenant=self.subjects.tenant, task_id=task_id, answer=answer)
        elif answer.by is None:
            answer = answer.model_copy(update={"by": self.client_id})
        agent = check_name("agent", agent or wire.agent_of_task(task_id))
        request_id = wire.new_id()
        future = self._replies[request_id] = asyncio.get_running_loop().create_future()
        try:
            await self.broker.publish(
                self.subjects.request(agent), wire.answer_request(request_id, task_id, answer),
                wire.reply_headers(f"{self._prefix}.response.{request_id}",
                                   f"{self._prefix}.status.{request_id}"))
            try:
                response = await asyncio.wait_for(future, timeout_s)
            except TimeoutError:
                raise BrokerError(
                    f"no instance of agent {agent!r} (namespace {self.namespace!r}) "
                    f"answered within {timeout_s} s; the "
                    "answer may still be taken (answering again is safe: the first "
                    "answer wins)") from None
        finally:
            self._replies.pop(request_id, None)
        if isinstance(response, a2a.ErrorResponse):
            raise refusal(task_id, response.error)
        result = response.result
        data = next((p.data for p in result.parts if isinstance(p, a2a.DataPart)), {}) \
            if isinstance(result, a2a.Message) else {}
        return list(data.get("decisions") or [])

    def _as_shown(self, answer: Approve) -> Approve:
        """``answer`` naming its call as this client's :meth:`wait_input` showed it;
        unchanged if it showed no such call (signing then asks for ``proposed``)."""
        for pending in self.input_required.values():
            for call in pending:
                if call.get("call_id") == answer.call_id:
                    return answer.model_copy(update={"proposed": _answer(
                        Proposed, tool=call.get("tool"), arguments=call.get("arguments"))})
        return answer

    def _check_started(self) -> None:
        if self._subscription is None:
            raise InvalidArgumentError("start the client (async with Client(...)) first")

    def _submitted(self, request_id: str) -> asyncio.Future[a2a.Task]:
        """The answer to come of ``request_id``, which this client must have sent."""
        future = self._waiters.get(request_id)
        if future is None:
            raise InvalidArgumentError(f"no task was submitted with request id {request_id!r}")
        return future

    async def _on_message(self, delivery: Delivery) -> None:
        kind, _, request_id = delivery.message.subject[len(self._prefix) + 1:].partition(".")
        try:
            response = a2a.parse_response(delivery.message.data)
        except BadMessageError as error:
            await delivery.term(str(error))
            return
        await delivery.ack()
        reply = self._replies.get(request_id)
        if reply is not None:  # the reply to an answer of ours
            if not reply.done():
                reply.set_result(response)
            return
        if isinstance(response, a2a.ErrorResponse):
            logger.warning("request %s failed: %s", request_id, response.error.message)
            return
        result = response.result
        if kind == "status" and isinstance(result, a2a.TaskStatusUpdateEvent):
            if result.status.state is a2a.TaskState.INPUT_REQUIRED:
                self._note_input_required(request_id, result)
            else:
                self.updates.setdefault(request_id, []).append(result)
            return
        if kind == "response" and isinstance(result, a2a.Task) and result.status.state.is_final:
            self.answers.setdefault(request_id, []).append(result)
            future = self._waiters.get(request_id)
            if future is not None and not future.done():
                future.set_result(result)

    def _note_input_required(self, request_id: str, event: a2a.TaskStatusUpdateEvent) -> None:
        message = event.status.message
        data = next((p.data for p in message.parts if isinstance(p, a2a.DataPart)), {}) \
            if message else {}
        pending = [p for p in data.get("pending_approvals") or [] if isinstance(p, dict)]
        self.input_required[request_id] = pending
        future = self._inputs.get(request_id)
        if future is None or future.done():
            future = self._inputs[request_id] = asyncio.get_running_loop().create_future()
        future.set_result(pending)


def refusal(task_id: str, error: a2a.JSONRPCError) -> MeshpointError:
    """The error an agent's refusal of an answer to ``task_id`` stands for."""
    if error.code == TASK_NOT_FOUND:
        return UnknownTaskError(task_id)
    decision = error.data.get("decision") if isinstance(error.data, dict) else None
    for kind in (AlreadyAnsweredError, NotPendingError, ArgumentsRejectedError,
                 MisdirectedAnswerError, DecisionRefusedError):
        if error.code == kind.code:
            return kind(error.message, decision=decision)
    return AnswerRefusedError(error.message, decision=decision)


def _answer(kind: type[_Part], **fields: Any) -> _Part:
    """An answer (or part) of ``kind``; InvalidArgumentError naming the field that is
    wrong."""
    try:
        return kind(**{k: v for k, v in fields.items() if v is not None})
    except ValidationError as error:
        raise InvalidArgumentError(describe(error, kind)) from None
