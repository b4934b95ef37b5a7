"""Subjects, headers and the A2A documents agents exchange.

Subjects follow the topic layout of docs/runtime.md ("Subjects") under a root per tenant
(:mod:`meshpoint.runtime.subjects`). Answers are addressed to the calling *agent*,
so any of its instances can take them; only a task on the in-memory path
(checkpointing off, or a failed checkpoint) has its peers answer to the *instance*
that holds it (``...instance.<agent>.<id>...``), since no other could.

The reply subjects travel as headers (``Meshpoint-Reply-To`` and
``Meshpoint-Status-To``), like reply topics in the user properties of the source
design, and are validated before use like everything else from the wire: only a
subject of the right kind under the tenant's own root is used
(:meth:`~meshpoint.runtime.subjects.Subjects.reply_subject`).
"""

from __future__ import annotations

import hashlib
import uuid
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, TypeAdapter

from meshpoint import a2a
from meshpoint.errors import InvalidArgumentError
from meshpoint.runtime.subjects import Subjects

REPLY_TO = "Meshpoint-Reply-To"
#: A2A's JSON-RPC error code for a task the agent does not have.
TASK_NOT_FOUND = -32001
STATUS_TO = "Meshpoint-Status-To"


def request_subject(ns: str, agent: str) -> str:
    """The default tenant's request subject of ``agent`` (:class:`Subjects` has every
    subject of any tenant)."""
    return Subjects(ns).request(agent)


def response_subject(ns: str, agent: str, sub_task_id: str) -> str:
    return Subjects(ns).response(agent, sub_task_id)


def status_subject(ns: str, agent: str, sub_task_id: str) -> str:
    return Subjects(ns).status(agent, sub_task_id)


def control_subject(ns: str, agent: str) -> str:
    """Broadcast to every live instance of an agent (cancel of a running task)."""
    return Subjects(ns).control(agent)


def answer_msg_id(task_id: str) -> str:
    """The dedupe id of a task's final answer: the same for every run of the task."""
    return f"answer.{task_id}"


def request_msg_id(sub_task_id: str) -> str:
    """The dedupe id of a peer's request: the same each time its item is announced
    (a redelivered request's run announces the stored items again, and the broker
    drops the copy of one announced before)."""
    return f"request.{sub_task_id}"


def new_id() -> str:
    """A fresh id that is also a valid subject token."""
    return uuid.uuid4().hex


def derive_task_id(agent: str, reply_to: str | None, request_id: str | int) -> str:
    """The id an agent gives the task a request starts.

    Derived from the request, so a redelivered request names the same task (its
    second first-checkpoint collides instead of forking the task), and a caller
    that never heard from the peer can still name the peer's task in a cancel.
    """
    digest = hashlib.sha256(f"{reply_to or ''}|{request_id!r}".encode()).hexdigest()[:32]
    return f"{agent}-{digest}"


def reply_headers(reply_to: str, status_to: str) -> dict[str, str]:
    return {REPLY_TO: reply_to, STATUS_TO: status_to}


def send_request(request_id: str, text: str, *, metadata: dict[str, Any] | None = None,
                 context_id: str | None = None) -> bytes:
    """A new task's request. A peer call names its task as the ``context_id``, which
    the peer's answer carries back (A2A's grouping of related tasks): an answer whose
    sub-task is gone can then be told a late one (its task ended, or moved on) from
    one no task of the tenant ever waited for."""
    return a2a.encode(a2a.SendMessageRequest(id=request_id, params=a2a.MessageSendParams(
        message=a2a.Message(role="user", parts=[a2a.TextPart(text=text)],
                            message_id=request_id, metadata=metadata,
                            context_id=context_id))))


class CancelBroadcast(BaseModel):
    """A control message: cancel ``cancel``, a task of the agent, wherever it runs."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    cancel: str = Field(min_length=1, max_length=255)


_CONTROL: TypeAdapter[CancelBroadcast] = TypeAdapter(CancelBroadcast)


def cancel_broadcast(task_id: str) -> bytes:
    return CancelBroadcast(cancel=task_id).model_dump_json().encode()


class HandoffBroadcast(BaseModel):
    """A control message: the instance running ``task_id`` (a task of the agent) ends
    its iteration before its next model call, and a fresh-context one carries it on
    (``meshpoint tasks handoff``; :mod:`meshpoint.runtime.handoff`). Every other
    instance ignores it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    method: Literal["meshpoint/handoff"] = "meshpoint/handoff"
    task_id: str = Field(min_length=1, max_length=255)
    #: Why, in the operator's words: the handoff record and the continuation prompt
    #: carry it.
    reason: str = Field(default="", max_length=1000)


ControlMessage = CancelBroadcast | HandoffBroadcast


def _control_kind(value: Any) -> str:
    """A control message that names a ``method`` claims to be a handoff request: its
    errors are that shape's; any other, a cancel's."""
    return "handoff" if isinstance(value, dict) and "method" in value else "cancel"


_CONTROL_MESSAGE: TypeAdapter[ControlMessage] = TypeAdapter(Annotated[
    Annotated[CancelBroadcast, Tag("cancel")] | Annotated[HandoffBroadcast, Tag("handoff")],
    Discriminator(_control_kind)])


def parse_control(data: bytes, *, max_bytes: int = a2a.MAX_MESSAGE_BYTES) -> str:
    """The task id a cancel broadcast names; BadMessageError (naming what is wrong)
    for anything else, however it is malformed."""
    return a2a.parse_json(_CONTROL, "control message", data, max_bytes).cancel


def handoff_broadcast(task_id: str, reason: str = "") -> bytes:
    return HandoffBroadcast(task_id=task_id, reason=reason).model_dump_json().encode()


def parse_control_message(data: bytes, *,
                          max_bytes: int = a2a.MAX_MESSAGE_BYTES) -> ControlMessage:
    """A control message: a cancel (:class:`CancelBroadcast`), or, when it names a
    ``method``, an operator's handoff request (:class:`HandoffBroadcast`);
    BadMessageError (naming what is wrong) for anything else."""
    return a2a.parse_json(_CONTROL_MESSAGE, "control message", data, max_bytes)


def cancel_request(task_id: str) -> bytes:
    return a2a.encode(a2a.CancelTaskRequest(id=new_id(), params=a2a.TaskIdParams(id=task_id)))


def handoff_request(task_id: str, reason: str = "") -> bytes:
    """An operator's request that ``task_id`` hand off (``meshpoint/handoff``)."""
    return a2a.encode(a2a.HandoffTaskRequest(id=new_id(), params=a2a.HandoffParams(
        id=task_id, reason=reason)))


def status_update(request_id: str | int, task_id: str, context_id: str,
                  state: a2a.TaskState, text: str | None = None,
                  metadata: dict[str, Any] | None = None) -> bytes:
    message = None if text is None else a2a.Message(
        role="agent", parts=[a2a.TextPart(text=text)], message_id=new_id(), task_id=task_id)
    return a2a.encode(a2a.SuccessResponse(id=request_id, result=a2a.TaskStatusUpdateEvent(
        task_id=task_id, context_id=context_id,
        status=a2a.TaskStatus(state=state, message=message), final=False,
        metadata=metadata)))


def final_task(request_id: str | int, task_id: str, context_id: str, state: a2a.TaskState,
               text: str, artifacts: list[dict[str, Any]],
               metadata: dict[str, Any]) -> bytes:
    """A task's answer: its final state, text, and every artifact it collected."""
    message = a2a.Message(role="agent", parts=[a2a.TextPart(text=text or state.value)],
                          message_id=new_id(), task_id=task_id)
    return a2a.encode(a2a.SuccessResponse(id=request_id, result=a2a.Task(
        id=task_id, context_id=context_id, status=a2a.TaskStatus(state=state, message=message),
        artifacts=[a2a.Artifact.model_validate(a) for a in artifacts], metadata=metadata)))


def answer_artifact(task_id: str, agent: str, text: str) -> dict[str, Any]:
    """The artifact every answer carries: the answer text, named by its agent."""
    return {"artifactId": f"{task_id}-answer", "name": f"{agent} answer",
            "parts": [{"kind": "text", "text": text}], "metadata": {"agent": agent}}


def as_result(response: a2a.SuccessResponse | a2a.ErrorResponse) -> dict[str, Any] | None:
    """The result a peer's response resolves its sub-task with, or None if the
    response is only progress (a non-final status or an artifact update)."""
    if isinstance(response, a2a.ErrorResponse):
        return {"status": "failed", "error": response.error.message, "artifacts": []}
    result = response.result
    if isinstance(result, a2a.Message):
        return {"status": "completed", "text": result.text, "artifacts": []}
    if isinstance(result, a2a.Task):
        if not result.status.state.is_final:
            return None
        text = result.status.message.text if result.status.message else ""
        nested = (result.metadata or {}).get("meshpoint_workflow_state")
        return {"status": result.status.state.value, "text": text,
                # A workflow's answer carries its stages' answers (runtime/stages.py).
                **({"workflow_state": nested} if isinstance(nested, dict) else {}),
                "peer_task_id": result.id,
                "artifacts": [a.model_dump(by_alias=True, exclude_none=True)
                              for a in result.artifacts],
                "token_usage": (result.metadata or {}).get("token_usage"),
                "peer_agent": (result.metadata or {}).get("agent")}
    if isinstance(result, a2a.TaskStatusUpdateEvent) and result.final:
        text = result.status.message.text if result.status.message else ""
        return {"status": result.status.state.value, "text": text,
                "peer_task_id": result.task_id, "artifacts": []}
    return None


def progress_task_id(response: a2a.SuccessResponse | a2a.ErrorResponse) -> str | None:
    """The peer's own task id, as a progress message names it."""
    if isinstance(response, a2a.SuccessResponse):
        result = response.result
        if isinstance(result, a2a.TaskStatusUpdateEvent | a2a.TaskArtifactUpdateEvent):
            return result.task_id
        if isinstance(result, a2a.Task):
            return result.id
    return None


def input_required(request_id: str | int, task_id: str, context_id: str, text: str,
                   data: dict[str, Any]) -> bytes:
    """The status update that tells a caller its task waits for a human: ``text`` says
    so in words, the data part says what to answer (``pending_approvals``)."""
    message = a2a.Message(role="agent", parts=[a2a.TextPart(text=text), a2a.DataPart(data=data)],
                          message_id=new_id(), task_id=task_id)
    return a2a.encode(a2a.SuccessResponse(id=request_id, result=a2a.TaskStatusUpdateEvent(
        task_id=task_id, context_id=context_id,
        status=a2a.TaskStatus(state=a2a.TaskState.INPUT_REQUIRED, message=message),
        final=False)))


def answer_request(request_id: str, task_id: str,
                   answer: BaseModel | dict[str, Any]) -> bytes:
    """A human's answer to a waiting task: a ``message/send`` naming the task, the
    answer (:mod:`meshpoint.runtime.decisions`: approve, deny or reply, perhaps
    signed; or its JSON form) as a data part, and its claimed author in the metadata
    too."""
    document = answer if isinstance(answer, dict) else answer.model_dump(
        mode="json", exclude_none=True)
    by = document.get("by")
    return a2a.encode(a2a.SendMessageRequest(id=request_id, params=a2a.MessageSendParams(
        message=a2a.Message(role="user", parts=[a2a.DataPart(data={"meshpoint_answer": document})],
                            message_id=request_id, task_id=task_id,
                            metadata={"meshpoint_by": by} if by else None))))


def answer_accepted(request_id: str | int, task_id: str,
                    decisions: list[dict[str, Any]]) -> bytes:
    """The reply to an accepted answer: the decisions it recorded."""
    return a2a.encode(a2a.SuccessResponse(id=request_id, result=a2a.Message(
        role="agent", parts=[a2a.DataPart(data={"decisions": decisions})],
        message_id=new_id(), task_id=task_id)))


def error_response(request_id: str | int | None, code: int, message: str,
                   data: Any = None) -> bytes:
    """A JSON-RPC error reply (a refused answer, a malformed message)."""
    return a2a.encode(a2a.ErrorResponse(id=request_id, error=a2a.JSONRPCError(
        code=code, message=message, data=data)))


def agent_of_task(task_id: str) -> str:
    """The agent a task id derived by :func:`derive_task_id` belongs to."""
    agent, sep, digest = task_id.rpartition("-")
    if not sep or not agent or len(digest) != 32:
        raise InvalidArgumentError(
            f"cannot tell the agent of task {task_id!r} (not an id meshpoint gave a "
            "task): name the agent")
    return agent
