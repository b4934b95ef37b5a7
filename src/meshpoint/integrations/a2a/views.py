"""A task as an A2A client sees it, read from the store alone (never from a gateway's
memory), so every gateway process answers ``GetTask`` alike, before and after any of
them restarts.

Three sources, the first that knows the task's state wins:

1. the gateway's own entries in the event log (:class:`GatewayLog`): the request as the
   client sent it, each message that answered it, and the answer (state, text,
   artifacts) once the gateway that submitted it heard it;
2. the checkpoint history: a task that paused and ended has its end (and answer) in
   its last record, whoever submitted it;
3. the live rows: a paused task is ``input-required`` (with its pending calls in a
   data part) or ``working``.

A task none of them knows is unknown (``TaskNotFoundError`` to the client).
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

from a2a.types.a2a_pb2 import Task, TaskState
from google.protobuf.json_format import ParseDict

from meshpoint import a2a
from meshpoint.errors import MeshpointError, UnknownTaskError
from meshpoint.events import EventStore
from meshpoint.runtime import wire

#: The event type of a gateway's entry in the event log (agent: the task's agent).
EVENT_TYPE = "a2a_gateway"

_STATES = {a2a.TaskState.SUBMITTED: TaskState.TASK_STATE_SUBMITTED,
           a2a.TaskState.WORKING: TaskState.TASK_STATE_WORKING,
           a2a.TaskState.INPUT_REQUIRED: TaskState.TASK_STATE_INPUT_REQUIRED,
           a2a.TaskState.COMPLETED: TaskState.TASK_STATE_COMPLETED,
           a2a.TaskState.CANCELED: TaskState.TASK_STATE_CANCELED,
           a2a.TaskState.FAILED: TaskState.TASK_STATE_FAILED,
           a2a.TaskState.REJECTED: TaskState.TASK_STATE_REJECTED,
           a2a.TaskState.AUTH_REQUIRED: TaskState.TASK_STATE_AUTH_REQUIRED,
           a2a.TaskState.UNKNOWN: TaskState.TASK_STATE_UNSPECIFIED}
#: How a task's history says it ended, as an A2A state (an expired task failed).
_ENDINGS = {"completed": TaskState.TASK_STATE_COMPLETED,
            "failed": TaskState.TASK_STATE_FAILED,
            "canceled": TaskState.TASK_STATE_CANCELED,
            "expired": TaskState.TASK_STATE_FAILED}
FINAL_STATES = frozenset({TaskState.TASK_STATE_COMPLETED, TaskState.TASK_STATE_FAILED,
                          TaskState.TASK_STATE_CANCELED, TaskState.TASK_STATE_REJECTED})


def state_of(state: a2a.TaskState) -> int:
    """meshpoint's wire state as the SDK's enum."""
    return _STATES[state]


def message_json(message: a2a.Message) -> dict[str, Any]:
    """A meshpoint (A2A 0.3) message in the A2A 1.0 JSON form the SDK parses."""
    parts: list[dict[str, Any]] = []
    for part in message.parts:
        if isinstance(part, a2a.TextPart):
            parts.append({"text": part.text})
        elif isinstance(part, a2a.DataPart):
            parts.append({"data": part.data})
    out: dict[str, Any] = {"messageId": message.message_id, "parts": parts,
                           "role": "ROLE_AGENT" if message.role == "agent" else "ROLE_USER"}
    if message.task_id:
        out["taskId"] = message.task_id
    return out


def agent_message(task_id: str, context_id: str, text: str,
                  data: dict[str, Any] | None = None, *,
                  message_id: str | None = None) -> dict[str, Any]:
    """An agent's message of ``task_id`` in the 1.0 JSON form; ``message_id`` (default:
    a new one) is given for a message rebuilt from the store at every read, so that
    every read gives it the same id."""
    parts: list[dict[str, Any]] = [{"text": text}]
    if data is not None:
        parts.append({"data": data})
    return {"messageId": message_id or wire.new_id(), "taskId": task_id,
            "contextId": context_id, "role": "ROLE_AGENT", "parts": parts}


def _stable_id(*names: str) -> str:
    """The id of a message rebuilt from the store: the same at every read of it."""
    return uuid.uuid5(uuid.NAMESPACE_URL, "meshpoint-a2a:" + "/".join(names)).hex


class GatewayLog:
    """The gateway's entries in the event log, one per thing a client or the mesh said
    about a task: ``kind`` ``message`` (a client's message, kept as the task's history),
    or ``status`` (the task's status as the gateway heard it: submitted, input
    required, or its answer with its artifacts). Each write is flushed before it
    returns, so another gateway reads it at once."""

    def __init__(self, events: EventStore) -> None:
        self.events = events

    async def note(self, agent: str, task_id: str, kind: str, body: dict[str, Any], *,
                   flush: bool = True) -> None:
        """Log an entry; ``flush=False`` leaves it to the next note's flush (both
        written in one transaction)."""
        self.events.log_event(agent, task_id, EVENT_TYPE, step_name=kind, output_data=body)
        if flush:
            await self.events.flush()

    async def task_ids(self, agent: str) -> list[str]:
        """The tasks of ``agent`` sent through a gateway, the latest sent first."""
        found = await self.events.get_events(agent_id=agent, event_type=EVENT_TYPE,
                                             newest_first=True)
        return list(dict.fromkeys(e.thread_id for e in found if e.thread_id))

    async def entries(self, agent: str, task_id: str) -> list[tuple[str, dict[str, Any]]]:
        found = await self.events.get_events(thread_id=task_id, agent_id=agent,
                                             event_type=EVENT_TYPE)
        return [(e.step_name or "", e.output_data) for e in found
                if isinstance(e.output_data, dict)]


async def read_task(store: Any, log: GatewayLog, agent: str, task_id: str, *,
                    history_length: int | None = None) -> Task | None:
    """``task_id`` of ``agent`` as an A2A Task, or None if neither the log, the history
    nor the live rows know it (an id of another agent is unknown here too)."""
    try:
        if wire.agent_of_task(task_id) != agent:
            return None
    except MeshpointError:
        return None
    entries = await log.entries(agent, task_id)
    messages = [body for kind, body in entries if kind == "message"]
    statuses = [body for kind, body in entries if kind == "status"]
    context_id = str(next((m["contextId"] for m in messages if m.get("contextId")), task_id))
    task: dict[str, Any] = {"id": task_id, "contextId": context_id}
    status: dict[str, Any] | None = None
    artifacts: list[Any] = []
    if statuses and statuses[-1].get("state") in _FINAL_NAMES:
        status, artifacts = statuses[-1], statuses[-1].get("artifacts") or []
    if status is None:
        status = await _ended(store, task_id, context_id)
    if status is None:
        status = await _live(store, task_id, context_id)
    if status is None and statuses:
        status = statuses[-1]
    if status is None:
        return None
    task["status"] = {k: v for k, v in status.items() if k != "artifacts"}
    if artifacts:
        task["artifacts"] = artifacts
    history = [*messages]
    if status.get("message"):
        history.append(status["message"])
    if history_length is not None:
        history = history[len(history) - history_length:] if history_length > 0 else []
    if history:
        task["history"] = history
    parsed: Task = ParseDict(task, Task(), ignore_unknown_fields=True)
    return parsed


_FINAL_NAMES = frozenset(TaskState.Name(s) for s in FINAL_STATES)


def status_json(state: int, message: dict[str, Any] | None = None,
                artifacts: list[dict[str, Any]] | None = None, *,
                at: float | None = None) -> dict[str, Any]:
    """A status entry: the state's name, the message, the time (ISO 8601, UTC): ``at``
    (seconds since the epoch), else now."""
    when = datetime.now(UTC) if at is None else datetime.fromtimestamp(at, UTC)
    now = when.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    out: dict[str, Any] = {"state": TaskState.Name(state), "timestamp": now}
    if message is not None:
        out["message"] = message
    if artifacts:
        out["artifacts"] = artifacts
    return out


async def _ended(store: Any, task_id: str, context_id: str) -> dict[str, Any] | None:
    """How the task's history says it ended, or None (no history, or not ended)."""
    try:
        record = await store.history.get_latest_checkpoint(task_id)
    except MeshpointError:
        return None
    if record is None:
        return None
    execution = record.execution_state
    phase = str(execution.get("phase") if isinstance(execution, dict) else execution.phase)
    state = _ENDINGS.get(phase)
    if state is None:
        return None
    # The runtime writes the answer (or the failure's reason) into the last record.
    said = record.extensions.get("ending") if isinstance(record.extensions, dict) else None
    said = said if isinstance(said, dict) else {}
    text = said.get("answer") if said.get("answer") is not None else (
        said.get("reason") or phase)
    status = status_json(state, agent_message(task_id, context_id, str(text),
                                              message_id=_stable_id(task_id, phase)))
    ended_at = getattr(record.metadata, "timestamp", None)  # ISO 8601: when it ended
    if isinstance(ended_at, str) and ended_at:
        status["timestamp"] = ended_at if ended_at.endswith("Z") or "+" in ended_at \
            else f"{ended_at}Z"
    return status


async def _live(store: Any, task_id: str, context_id: str) -> dict[str, Any] | None:
    """A paused task's status from its live rows, or None if it has none."""
    from meshpoint.runtime.approvals import APPROVAL, describe

    try:
        subs = await store.get_peer_sub_tasks_for_task(task_id)
        restored = await store.restore_task(task_id, verify=False)
    except UnknownTaskError:
        return None
    pending = [describe(s.sub_task_id, s.correlation_data) for s in subs
               if s.status == "pending" and isinstance(s.correlation_data.get(APPROVAL), dict)]
    # Its time: when it paused last (every read of it gives the same status).
    at = restored.checkpointed_at
    if restored.status != "input_required" or not pending:
        # Answered, it may still wait on its peers: working, to its caller.
        return status_json(TaskState.TASK_STATE_WORKING, at=at)
    calls = sorted(str(p.get("call_id")) for p in pending)
    return status_json(TaskState.TASK_STATE_INPUT_REQUIRED, agent_message(
        task_id, context_id, "waits for a human to answer its pending calls",
        {"pending_approvals": pending}, message_id=_stable_id(task_id, *calls)), at=at)


