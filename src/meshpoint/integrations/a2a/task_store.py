""":class:`StoreTaskStore`: an a2a-sdk ``TaskStore`` on a meshpoint store, for those who
build their own A2A server with the SDK (its ``DefaultRequestHandler``) and want its
tasks kept where meshpoint keeps everything else: SQLite or PostgreSQL, the store's
tenant (row-level security on PostgreSQL), its sealing if configured.

Each ``save`` appends the task as it stands to the event log (event type
``a2a_task``, the task's id as the thread), flushed before ``save`` returns; ``get``
reads the latest; ``delete`` appends a tombstone. So a task's every saved state
stays readable in order (``meshpoint events --thread ID``), and any process on the
store reads what another saved.
"""

from __future__ import annotations

from typing import Any

from a2a.server.context import ServerCallContext
from a2a.server.tasks.task_store import TaskStore
from a2a.types.a2a_pb2 import ListTasksRequest, ListTasksResponse, Task
from google.protobuf.json_format import MessageToDict, ParseDict

from meshpoint.events import Event, EventStore

#: The event type of a saved task; ``agent_id`` is :data:`AGENT` unless given.
EVENT_TYPE = "a2a_task"
AGENT = "a2a-task-store"


class StoreTaskStore(TaskStore):
    """An a2a-sdk TaskStore writing to ``events`` (an :class:`EventStore` on the
    meshpoint store; see the module docstring). ``agent`` names the writer in the
    log."""

    def __init__(self, events: EventStore, *, agent: str = AGENT) -> None:
        self.events = events
        self.agent = agent

    async def save(self, task: Task, context: ServerCallContext) -> None:
        self.events.log_event(self.agent, task.id, EVENT_TYPE, step_name="save",
                              output_data=MessageToDict(task))
        await self.events.flush()

    async def get(self, task_id: str, context: ServerCallContext) -> Task | None:
        latest = await self.events.get_latest_event(thread_id=task_id, agent_id=self.agent,
                                                    event_type=EVENT_TYPE)
        return None if latest is None else _task(latest)

    async def delete(self, task_id: str, context: ServerCallContext) -> None:
        if await self.get(task_id, context) is not None:
            self.events.log_event(self.agent, task_id, EVENT_TYPE, step_name="delete")
            await self.events.flush()

    async def list(self, params: ListTasksRequest,
                   context: ServerCallContext) -> ListTasksResponse:
        """The saved tasks (each as last saved), the latest saved first, filtered by
        context and state; ``page_token`` is the id of the last task of the page
        before."""
        latest: dict[str, Event] = {}
        for event in await self.events.get_events(agent_id=self.agent,
                                                  event_type=EVENT_TYPE, newest_first=True):
            if event.thread_id is not None:
                latest.setdefault(event.thread_id, event)
        tasks = [task for task in (_task(e) for e in latest.values()) if task is not None
                 and (not params.context_id or task.context_id == params.context_id)
                 and (not params.status or task.status.state == params.status)]
        if params.page_token:
            ids = [t.id for t in tasks]
            tasks = tasks[ids.index(params.page_token) + 1:] if params.page_token in ids \
                else []
        size = params.page_size or 50
        page = tasks[:size]
        for task in page:
            if params.HasField("history_length"):
                keep = params.history_length
                del task.history[:max(0, len(task.history) - keep)]
            if not params.include_artifacts:
                del task.artifacts[:]
        return ListTasksResponse(tasks=page, page_size=size, total_size=len(tasks),
                                 next_page_token=page[-1].id if len(tasks) > size else "")


def _task(event: Event) -> Task | None:
    body: Any = event.output_data
    if event.step_name == "delete" or not isinstance(body, dict):
        return None
    task: Task = ParseDict(body, Task(), ignore_unknown_fields=True)
    return task
