"""``StoreTaskStore``: the a2a-sdk ``TaskStore`` on a meshpoint store, on SQLite and
PostgreSQL: what one store object saved another reads, every state stays in the
event log, a delete hides the task, ``list`` filters and pages; and the SDK's own
``DefaultRequestHandler`` runs on it."""

from __future__ import annotations

from typing import Any

from a2a.server.context import ServerCallContext
from a2a.types.a2a_pb2 import ListTasksRequest, Task, TaskState, TaskStatus
from google.protobuf.json_format import ParseDict

from meshpoint.events import EventStore
from meshpoint.integrations.a2a.task_store import EVENT_TYPE, StoreTaskStore
from meshpoint.store import SqlStore, open_store

CALL = ServerCallContext()


def task(task_id: str, state: Any, context_id: str = "ctx-1",
         history: int = 2) -> Task:
    return ParseDict({"id": task_id, "contextId": context_id,
                      "status": {"state": TaskState.Name(state)},
                      "artifacts": [{"artifactId": "a1", "parts": [{"text": "out"}]}],
                      "history": [{"messageId": f"m{i}", "role": "ROLE_USER",
                                   "parts": [{"text": f"turn {i}"}]}
                                  for i in range(history)]}, Task())


async def test_saved_tasks_are_read_back_by_another_store_object(
        store: SqlStore, store_url: str, store_options: dict[str, object]) -> None:
    async with EventStore(store) as events:
        tasks = StoreTaskStore(events)
        assert await tasks.get("t-1", CALL) is None
        await tasks.save(task("t-1", TaskState.TASK_STATE_WORKING), CALL)
        await tasks.save(task("t-1", TaskState.TASK_STATE_COMPLETED), CALL)
        await tasks.save(task("t-2", TaskState.TASK_STATE_WORKING, "ctx-2"), CALL)
        other = await open_store(store_url, **store_options)  # type: ignore[arg-type]
        try:
            async with EventStore(other) as elsewhere:
                read = await StoreTaskStore(elsewhere).get("t-1", CALL)
                assert read == task("t-1", TaskState.TASK_STATE_COMPLETED)
                # Every state saved stays, in order, in the event log.
                saved = await elsewhere.get_events(thread_id="t-1", event_type=EVENT_TYPE)
                assert [e.output_data["status"]["state"] for e in saved] == [
                    "TASK_STATE_WORKING", "TASK_STATE_COMPLETED"]
        finally:
            await other.close()
        await tasks.delete("t-1", CALL)
        assert await tasks.get("t-1", CALL) is None
        await tasks.delete("t-1", CALL)  # deleting an unknown task does nothing
        assert await tasks.get("t-2", CALL) is not None


async def test_list_filters_pages_and_trims(store: SqlStore) -> None:
    async with EventStore(store) as events:
        tasks = StoreTaskStore(events)
        for n in range(5):
            await tasks.save(task(f"t-{n}", TaskState.TASK_STATE_WORKING
                                  if n % 2 else TaskState.TASK_STATE_COMPLETED,
                                  f"ctx-{n % 2}", history=3), CALL)
        every = await tasks.list(ListTasksRequest(), CALL)
        assert [t.id for t in every.tasks] == ["t-4", "t-3", "t-2", "t-1", "t-0"]
        assert every.total_size == 5 and not every.tasks[0].artifacts
        working = await tasks.list(ListTasksRequest(
            status=TaskState.TASK_STATE_WORKING), CALL)
        assert [t.id for t in working.tasks] == ["t-3", "t-1"]
        ctx = await tasks.list(ListTasksRequest(context_id="ctx-0", page_size=2,
                                                history_length=1,
                                                include_artifacts=True), CALL)
        assert [t.id for t in ctx.tasks] == ["t-4", "t-2"] and ctx.next_page_token == "t-2"
        assert [len(t.history) for t in ctx.tasks] == [1, 1] and ctx.tasks[0].artifacts
        rest = await tasks.list(ListTasksRequest(context_id="ctx-0", page_size=2,
                                                 page_token=ctx.next_page_token), CALL)
        assert [t.id for t in rest.tasks] == ["t-0"] and rest.next_page_token == ""


async def test_the_sdks_own_request_handler_runs_on_it(store: SqlStore) -> None:
    from a2a.server.agent_execution import AgentExecutor, RequestContext
    from a2a.server.events import EventQueue
    from a2a.server.request_handlers import DefaultRequestHandler
    from a2a.server.tasks import TaskUpdater
    from a2a.types.a2a_pb2 import AgentCard, GetTaskRequest, Message, Part, Role, SendMessageRequest

    class Echo(AgentExecutor):
        async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
            updater = TaskUpdater(event_queue, context.task_id or "",
                                  context.context_id or "")
            await event_queue.enqueue_event(Task(
                id=context.task_id, context_id=context.context_id,
                status=TaskStatus(state=TaskState.TASK_STATE_SUBMITTED)))
            await updater.complete(updater.new_agent_message([Part(text="echo")]))

        async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
            raise NotImplementedError

    async with EventStore(store) as events:
        card = AgentCard(name="echo", description="echo", version="1")
        handler = DefaultRequestHandler(agent_executor=Echo(),
                                        task_store=StoreTaskStore(events), agent_card=card)
        result = await handler.on_message_send(SendMessageRequest(message=Message(
            role=Role.ROLE_USER, message_id="m", parts=[Part(text="hi")])), CALL)
        assert isinstance(result, Task)
        got = await handler.on_get_task(GetTaskRequest(id=result.id), CALL)
        assert got is not None and got.status.state == TaskState.TASK_STATE_COMPLETED
        stored = await StoreTaskStore(events).get(result.id, CALL)
        assert stored is not None and stored.status == got.status
        assert isinstance(stored.status, TaskStatus)
