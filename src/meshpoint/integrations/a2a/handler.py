"""The gateway's a2a-sdk request handler: one agent of the mesh as an A2A server.

``SendMessage`` (``message/send``) publishes a meshpoint request on the broker, as
:class:`~meshpoint.runtime.Client` does, and waits (unless the client asked to return
at once) until the task ends or waits for input; a message naming a task that waits
for input answers it (see :func:`answer_of`); one naming a task still working joins
its history. ``GetTask``, ``CancelTask``, ``SendStreamingMessage`` and
``SubscribeToTask`` read the task from the store
(:mod:`meshpoint.integrations.a2a.views`): the handler keeps no task in memory, so any gateway
process answers for any task, after any of them restarted. The only thing a gateway
holds is the inbox of the requests it sent: the answer it hears there is written to
the event log at once, for every other gateway to read.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from a2a.server.context import ServerCallContext
from a2a.server.request_handlers.request_handler import RequestHandler
from a2a.types.a2a_pb2 import (
    AgentCard,
    CancelTaskRequest,
    DeleteTaskPushNotificationConfigRequest,
    GetExtendedAgentCardRequest,
    GetTaskPushNotificationConfigRequest,
    GetTaskRequest,
    ListTaskPushNotificationConfigsRequest,
    ListTaskPushNotificationConfigsResponse,
    ListTasksRequest,
    ListTasksResponse,
    Message,
    Role,
    SendMessageRequest,
    SubscribeToTaskRequest,
    Task,
    TaskArtifactUpdateEvent,
    TaskPushNotificationConfig,
    TaskState,
    TaskStatus,
    TaskStatusUpdateEvent,
)
from a2a.utils.errors import (
    ExtendedAgentCardNotConfiguredError,
    InternalError,
    InvalidParamsError,
    PushNotificationNotSupportedError,
    TaskNotCancelableError,
    TaskNotFoundError,
    UnsupportedOperationError,
)
from google.protobuf.json_format import MessageToDict
from pydantic import ValidationError

from meshpoint import a2a
from meshpoint.errors import MeshpointError, UnknownTaskError
from meshpoint.integrations.a2a.views import (
    FINAL_STATES,
    GatewayLog,
    agent_message,
    message_json,
    read_task,
    state_of,
    status_json,
)
from meshpoint.runtime import Client
from meshpoint.runtime.decisions import Answer, Approve, Deny, Reply

logger = logging.getLogger("meshpoint.integrations.a2a")


@dataclass
class Mesh:
    """What every agent's handler shares: the store, the mesh's client (whose inbox
    hears the answers to the requests this gateway sent) and the event log."""

    store: Any
    client: Client
    log: GatewayLog
    #: How long ``SendMessage`` waits for the task to end or pause for input; after
    #: that it returns the task as it stands (the client polls ``GetTask``).
    wait_s: float = 60.0
    #: How often a wait or a stream reads the task again from the store.
    poll_s: float = 0.1
    #: How long a read that finds a task ended, by its history, before this gateway's
    #: watcher recorded the answer it heard (its artifacts), waits for that record.
    answer_grace_s: float = 5.0
    _watchers: set[asyncio.Task[None]] = field(default_factory=set)
    #: The tasks whose answer this gateway's inbox will hear (a watcher runs).
    _watching: set[str] = field(default_factory=set)
    _hearing: dict[str, set[asyncio.Event]] = field(default_factory=dict)

    @contextlib.contextmanager
    def hearing(self, task_id: str) -> Iterator[asyncio.Event]:
        """An event set each time this gateway records what it heard of ``task_id``
        (a pause for input, the answer): a wait on a task this gateway sent reads it
        again at once, not at its next poll."""
        event = asyncio.Event()
        self._hearing.setdefault(task_id, set()).add(event)
        try:
            yield event
        finally:
            waiting = self._hearing[task_id]
            waiting.discard(event)
            if not waiting:
                del self._hearing[task_id]

    def _heard(self, task_id: str) -> None:
        for event in self._hearing.get(task_id, ()):
            event.set()

    async def submit(self, agent: str, message: Message) -> str:
        """Send ``message`` to ``agent`` as a new task; returns the task's id once the
        request and the client's message are recorded."""
        text = "\n".join(p.text for p in message.parts if p.HasField("text"))
        if not text.strip():
            raise InvalidParamsError(message="the message has no text part: meshpoint "
                                             "agents take a request in words")
        request_id = await self.client.submit(agent, text)
        task_id = self.client.task_id(agent, request_id)
        sent = MessageToDict(message)
        sent.update(taskId=task_id, contextId=message.context_id or task_id)
        await self.log.note(agent, task_id, "message", sent, flush=False)
        await self.log.note(agent, task_id, "status",
                            status_json(TaskState.TASK_STATE_SUBMITTED))
        self._watching.add(task_id)
        watcher = asyncio.create_task(self._watch(agent, request_id, task_id))
        self._watchers.add(watcher)
        watcher.add_done_callback(self._watchers.discard)
        return task_id

    async def _watch(self, agent: str, request_id: str, task_id: str) -> None:
        """Write what this gateway's inbox hears of ``task_id`` to the event log: each
        pause for input, then the answer (with its artifacts)."""
        try:
            while True:
                step = await self.client.wait_next(request_id, timeout_s=86_400.0)
                if step.answer is None:
                    await self.log.note(agent, task_id, "status", status_json(
                        TaskState.TASK_STATE_INPUT_REQUIRED, agent_message(
                            task_id, task_id, "waits for a human to answer its pending "
                            "calls", {"pending_approvals": step.pending})))
                    self._heard(task_id)
                    continue
                answer = step.answer
                message = message_json(answer.status.message) if answer.status.message \
                    else None
                if message is not None:
                    message["contextId"] = task_id
                artifacts = [{"artifactId": a.artifact_id, "name": a.name or "",
                              "parts": message_json(a2a.Message(
                                  role="agent", parts=a.parts,
                                  message_id="x"))["parts"]} for a in answer.artifacts]
                await self.log.note(agent, task_id, "status", status_json(
                    state_of(answer.status.state), message, artifacts))
                self._heard(task_id)
                return
        except TimeoutError:
            return
        except MeshpointError as error:  # the store is away: GetTask reads the history
            logger.warning("could not record the answer of %s: %s", task_id, error)
        finally:
            self._watching.discard(task_id)
            self._heard(task_id)
            self.client.forget(request_id)

    async def close(self) -> None:
        for watcher in list(self._watchers):
            watcher.cancel()
        for watcher in list(self._watchers):
            with contextlib.suppress(BaseException):
                await watcher


def answer_of(message: Message, by: str) -> Answer:
    """The answer a message to a task waiting for input carries: a data part
    ``{"decision": "approve", "call_id": ..., "arguments": {...}}`` (or ``"deny"`` with
    a ``reason``, or ``"reply"`` with a ``text``), as ``meshpoint tasks approve``,
    ``deny`` and ``reply`` take it; else its text, a reply in words to every pending
    call. InvalidParamsError saying what is wrong."""
    for part in message.parts:
        if part.HasField("data"):
            data = MessageToDict(part)["data"]
            if not isinstance(data, dict) or "decision" not in data:
                continue
            kinds: dict[str, type[Approve] | type[Deny] | type[Reply]] = {
                "approve": Approve, "deny": Deny, "reply": Reply}
            kind = kinds.get(str(data["decision"]))
            if kind is None:
                raise InvalidParamsError(message=f"decision must be one of approve, deny, "
                                                 f"reply; got {data['decision']!r:.40}")
            try:
                return kind.model_validate({**data, "by": by})
            except ValidationError as error:
                raise InvalidParamsError(message=f"not a {data['decision']}: "
                                                 f"{error.errors()[0]['msg']}") from None
    text = "\n".join(p.text for p in message.parts if p.HasField("text"))
    if not text.strip():
        raise InvalidParamsError(message="an answer to a task waiting for input is a data "
                                         "part with a decision, or text (a reply)")
    return Reply(text=text, by=by)


class MeshRequestHandler(RequestHandler):
    """The handler of one agent's A2A endpoint (see the module docstring). ``meshes``:
    the mesh of each tenant the gateway serves; a call is served by its credential's
    tenant's (``context.state["auth"].tenant``), or by the only one, without
    credentials. One handler object serves one call (:meth:`for_call`)."""

    def __init__(self, agent: str, meshes: dict[str, Mesh], default: str) -> None:
        self.agent = agent
        self.meshes = meshes
        self.default = default
        self.mesh = meshes[default]

    def for_call(self, context: ServerCallContext) -> MeshRequestHandler:
        """This handler on the mesh of the call's tenant."""
        tenant = getattr(context.state.get("auth"), "tenant", None) or self.default
        mesh = self.meshes.get(tenant)
        if mesh is None:  # a credential of a tenant this gateway does not serve
            raise InternalError(message=f"tenant {tenant!r} is not served here")
        handler = MeshRequestHandler(self.agent, self.meshes, self.default)
        handler.mesh = mesh
        return handler

    async def _read(self, task_id: str, history_length: int | None = None, *,
                    wait_answer: bool = True) -> Task:
        if not task_id:
            raise InvalidParamsError(message="the task's id is missing (params.id)")
        try:
            task = await read_task(self.mesh.store, self.mesh.log, self.agent, task_id,
                                   history_length=history_length)
        except MeshpointError as error:
            raise InternalError(message=f"the store could not be read: {error}") from None
        if task is None:
            raise TaskNotFoundError(message=f"task {task_id!r:.300} is not a task of agent "
                                            f"{self.agent!r}")
        if wait_answer and task.status.state in FINAL_STATES and not task.artifacts and \
                task_id in self.mesh._watching:
            # Ended by its history, and this gateway's watcher is about to record the
            # answer it heard, with its artifacts: that record is the task's end.
            # Once: a task that ends without an answer (canceled) is read as it is then.
            with self.mesh.hearing(task_id) as heard:
                await _either(heard, self.mesh.answer_grace_s)
            return await self._read(task_id, history_length, wait_answer=False)
        return task

    async def _until(self, task_id: str, done: Callable[[Task], bool],
                     timeout_s: float, *, fresh: bool = False) -> Task:
        """The task once ``done`` says so of it, or as it stands after ``timeout_s``.
        ``fresh``: sent by this gateway just now (no await since), so that nothing
        is worth reading before its inbox hears of it, or the first poll."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        with self.mesh.hearing(task_id) as heard:
            if fresh:
                await _either(heard, min(self.mesh.poll_s, timeout_s))
            while True:
                heard.clear()
                task = await self._read(task_id)
                if done(task) or loop.time() >= deadline:
                    return task
                await _either(heard, min(self.mesh.poll_s, deadline - loop.time()))

    async def _start(self, params: SendMessageRequest, context: ServerCallContext
                     ) -> tuple[str, Callable[[Task], bool]]:
        """Send the message: a new task, the answer to one waiting for input, or a
        further message to one working (:meth:`_note`). Returns the task's id and what
        to wait for."""
        message = params.message
        # A2A requires both (protobuf reads a missing one as empty, the SDK lets it be).
        if not message.message_id:
            raise InvalidParamsError(message="the message has no messageId")
        if message.role == Role.ROLE_UNSPECIFIED:
            raise InvalidParamsError(message="the message has no role (ROLE_USER)")
        if not message.task_id:
            task_id = await self.mesh.submit(self.agent, message)
            return task_id, _settled
        task_id = message.task_id
        before = await self._read(task_id)
        if before.status.state in FINAL_STATES:
            raise UnsupportedOperationError(
                message=f"task {task_id} has ended ({TaskState.Name(before.status.state)}): "
                        "it takes no more messages; send a new one without a taskId")
        if message.context_id and message.context_id != before.context_id:
            raise InvalidParamsError(message=f"the message's contextId "
                                             f"{message.context_id!r:.80} is not task "
                                             f"{task_id}'s ({before.context_id})")
        if before.status.state != TaskState.TASK_STATE_INPUT_REQUIRED:
            return task_id, await self._note(task_id, message, before)
        by = context.user.user_name if context.user.is_authenticated else "a2a-gateway"
        answer = answer_of(message, by or "a2a-gateway")
        try:
            await self.mesh.client.answer(task_id, answer, agent=self.agent)
        except UnknownTaskError:
            raise TaskNotFoundError(message=f"task {task_id} is not waiting") from None
        except MeshpointError as error:  # refused: not pending, bad arguments, unsigned
            raise InvalidParamsError(message=str(error)) from None
        sent = MessageToDict(message)
        sent.setdefault("contextId", before.context_id)
        await self.mesh.log.note(self.agent, task_id, "message", sent)
        shown = MessageToDict(before.status)

        def moved_on(task: Task) -> bool:  # settled again, past the pause answered
            return _settled(task) and (
                task.status.state != TaskState.TASK_STATE_INPUT_REQUIRED or
                _pending(MessageToDict(task.status)) != _pending(shown))
        return task_id, moved_on

    async def _note(self, task_id: str, message: Message, before: Task
                    ) -> Callable[[Task], bool]:
        """A further message to a task that is working (it waits for no input): taken
        into the task's history, in order, and the call then waits as a first message
        does; the agent does not read it (see docs/a2a.md)."""
        if not any(p.HasField("text") or p.HasField("data") for p in message.parts):
            raise InvalidParamsError(message="the message has no text nor data part")
        sent = MessageToDict(message)
        sent.update(taskId=task_id, contextId=before.context_id)
        await self.mesh.log.note(self.agent, task_id, "message", sent)
        return _settled

    async def on_message_send(self, params: SendMessageRequest,
                              context: ServerCallContext) -> Task | Message:
        return await self.for_call(context)._send(params, context)

    async def _send(self, params: SendMessageRequest,
                    context: ServerCallContext) -> Task | Message:
        task_id, done = await self._start(params, context)
        config = params.configuration
        history = config.history_length if config.HasField("history_length") else None
        if not config.return_immediately:
            task = await self._until(task_id, done, self.mesh.wait_s,
                                     fresh=not params.message.task_id)
            if history is None:  # as read: no need to read it again
                return task
        return await self._read(task_id, history)

    async def on_message_send_stream(self, params: SendMessageRequest,
                                     context: ServerCallContext
                                     ) -> AsyncGenerator[Any]:
        handler = self.for_call(context)
        task_id, done = await handler._start(params, context)
        async for event in handler._follow(task_id, done):
            yield event

    async def on_subscribe_to_task(self, params: SubscribeToTaskRequest,
                                   context: ServerCallContext) -> AsyncGenerator[Any]:
        handler = self.for_call(context)
        task = await handler._read(params.id)
        if task.status.state in FINAL_STATES:
            raise UnsupportedOperationError(
                message=f"task {params.id} has ended ({TaskState.Name(task.status.state)}): "
                        "read it with GetTask")
        async for event in handler._follow(params.id, _settled):
            yield event

    async def _follow(self, task_id: str, done: Callable[[Task], bool]
                      ) -> AsyncGenerator[Any]:
        """The task as it stands, then each change of its status read from the store,
        until ``done`` says so (it ended: its artifacts, then its final status; or it
        waits for input, A2A's interrupted state, which ends a stream too)."""
        task = await self._read(task_id)
        yield task
        last = MessageToDict(task.status)
        last.pop("timestamp", None)
        while not done(task):
            await asyncio.sleep(self.mesh.poll_s)
            task = await self._read(task_id)
            now = MessageToDict(task.status)
            now.pop("timestamp", None)
            if now == last:
                continue
            last = now
            if task.status.state in FINAL_STATES:
                for artifact in task.artifacts:
                    yield TaskArtifactUpdateEvent(task_id=task_id, context_id=task.context_id,
                                                  artifact=artifact, last_chunk=True)
            status = TaskStatus()
            status.CopyFrom(task.status)
            yield TaskStatusUpdateEvent(task_id=task_id, context_id=task.context_id,
                                        status=status)

    async def on_get_task(self, params: GetTaskRequest,
                          context: ServerCallContext) -> Task | None:
        if params.HasField("history_length") and params.history_length < 0:
            raise InvalidParamsError(message="historyLength must be >= 0")
        return await self.for_call(context)._read(
            params.id, params.history_length if params.HasField("history_length") else None)

    async def on_cancel_task(self, params: CancelTaskRequest,
                             context: ServerCallContext) -> Task | None:
        return await self.for_call(context)._cancel(params)

    async def _cancel(self, params: CancelTaskRequest) -> Task:
        task = await self._read(params.id)
        if task.status.state in FINAL_STATES:
            raise TaskNotCancelableError(
                message=f"task {params.id} has ended ({TaskState.Name(task.status.state)})")
        await self.mesh.client.cancel(self.agent, params.id)
        return await self._until(params.id, lambda t: t.status.state in FINAL_STATES,
                                 min(self.mesh.wait_s, 30.0))

    async def on_list_tasks(self, params: ListTasksRequest,
                            context: ServerCallContext) -> ListTasksResponse:
        return await self.for_call(context)._list(params)

    async def _list(self, params: ListTasksRequest) -> ListTasksResponse:
        """The agent's tasks sent through a gateway (of this tenant), each read from the
        store, the latest updated first; ``pageToken`` is the offset of the page."""
        size = params.page_size if params.HasField("page_size") else 50
        if not 1 <= size <= 100:
            raise InvalidParamsError(message="pageSize must be from 1 to 100")
        if params.HasField("history_length") and params.history_length < 0:
            raise InvalidParamsError(message="historyLength must be >= 0")
        try:
            offset = int(params.page_token or "0")
        except ValueError:
            offset = -1
        if offset < 0:
            raise InvalidParamsError(message=f"pageToken {params.page_token!r:.80} is not "
                                             "one this server gave")
        history = params.history_length if params.HasField("history_length") else None
        tasks = []
        for task_id in await self.mesh.log.task_ids(self.agent):
            task = await self._read(task_id, history)
            if params.context_id and task.context_id != params.context_id:
                continue
            if params.status and task.status.state != params.status:
                continue
            if params.HasField("status_timestamp_after") and (
                    task.status.timestamp.ToNanoseconds() <
                    params.status_timestamp_after.ToNanoseconds()):
                continue
            if not params.include_artifacts:
                del task.artifacts[:]
            tasks.append(task)
        tasks.sort(key=lambda t: t.status.timestamp.ToNanoseconds(), reverse=True)
        page = tasks[offset:offset + size]
        more = offset + size < len(tasks)
        return ListTasksResponse(tasks=page, page_size=len(page), total_size=len(tasks),
                                 next_page_token=str(offset + size) if more else "")

    async def on_create_task_push_notification_config(
            self, params: TaskPushNotificationConfig,
            context: ServerCallContext) -> TaskPushNotificationConfig:
        raise PushNotificationNotSupportedError

    async def on_get_task_push_notification_config(
            self, params: GetTaskPushNotificationConfigRequest,
            context: ServerCallContext) -> TaskPushNotificationConfig:
        raise PushNotificationNotSupportedError

    async def on_list_task_push_notification_configs(
            self, params: ListTaskPushNotificationConfigsRequest,
            context: ServerCallContext) -> ListTaskPushNotificationConfigsResponse:
        raise PushNotificationNotSupportedError

    async def on_delete_task_push_notification_config(
            self, params: DeleteTaskPushNotificationConfigRequest,
            context: ServerCallContext) -> None:
        raise PushNotificationNotSupportedError

    async def on_get_extended_agent_card(self, params: GetExtendedAgentCardRequest,
                                         context: ServerCallContext) -> AgentCard:
        raise ExtendedAgentCardNotConfiguredError


async def _either(heard: asyncio.Event, seconds: float) -> None:
    """Until ``heard`` is set or after ``seconds``, whichever comes first."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(seconds):
            await heard.wait()


def _settled(task: Task) -> bool:
    """Whether a stream of ``task`` ends: it ended, or it waits for input."""
    return task.status.state in FINAL_STATES or \
        task.status.state == TaskState.TASK_STATE_INPUT_REQUIRED


def _pending(status: dict[str, Any]) -> list[str]:
    """The call ids a status's data part says are pending."""
    for part in (status.get("message") or {}).get("parts") or []:
        data = part.get("data")
        if isinstance(data, dict):
            return sorted(str(p.get("call_id")) for p in data.get("pending_approvals") or []
                          if isinstance(p, dict))
    return []


__all__ = ["Mesh", "MeshRequestHandler", "answer_of"]
