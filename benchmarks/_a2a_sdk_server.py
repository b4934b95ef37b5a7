"""The SDK's side of ``bench_gateway.py``: one agent served as a2a-sdk's helloworld
sample serves its own, in a process of its own that imports nothing of meshpoint.

    python benchmarks/_a2a_sdk_server.py PORT

Prints :data:`READY` (flushed) once it takes requests; stops on SIGTERM.
"""

from __future__ import annotations

import asyncio
import sys

import uvicorn
from a2a.helpers import (
    get_message_text,
    new_task_from_user_message,
    new_text_message,
    new_text_part,
)
from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.events import EventQueue
from a2a.server.request_handlers import DefaultRequestHandler
from a2a.server.routes import create_agent_card_routes, create_jsonrpc_routes
from a2a.server.tasks import InMemoryTaskStore, TaskUpdater
from a2a.types import AgentCapabilities, AgentCard, AgentInterface, AgentSkill
from a2a.types.a2a_pb2 import TaskState
from starlette.applications import Starlette

READY = "a2a-sdk: ready"


class Echo(AgentExecutor):
    """Answers at once: the task working, the answer as an artifact, completed."""

    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        assert context.message is not None
        task = context.current_task
        if task is None:
            task = new_task_from_user_message(context.message)
            await event_queue.enqueue_event(task)
        updater = TaskUpdater(event_queue=event_queue, task_id=task.id,
                              context_id=task.context_id)
        await updater.update_status(state=TaskState.TASK_STATE_WORKING)
        answer = f"[echo] {get_message_text(context.message)}"
        await updater.add_artifact(parts=[new_text_part(text=answer)], name="echo answer")
        await updater.update_status(state=TaskState.TASK_STATE_COMPLETED,
                                    message=new_text_message(answer))

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        raise NotImplementedError("an echo ends at once")


def main(port: int) -> None:
    card = AgentCard(
        name="echo", description="Answers at once.", version="0.0.1",
        default_input_modes=["text/plain"], default_output_modes=["text/plain"],
        capabilities=AgentCapabilities(streaming=True),
        supported_interfaces=[AgentInterface(protocol_binding="JSONRPC",
                                             url=f"http://127.0.0.1:{port}/")],
        skills=[AgentSkill(id="echo", name="echo", description="Answers at once.",
                           tags=["echo"])])
    handler = DefaultRequestHandler(agent_executor=Echo(), task_store=InMemoryTaskStore(),
                                    agent_card=card)
    app = Starlette(routes=[*create_agent_card_routes(card),
                            *create_jsonrpc_routes(handler, "/")])

    async def serve() -> None:  # as `meshpoint gateway` runs uvicorn: the same loop
        server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port,
                                               log_level="warning", lifespan="off"))
        serving = asyncio.create_task(server.serve())
        while not server.started and not serving.done():
            await asyncio.sleep(0.05)
        print(READY, flush=True)
        await serving

    asyncio.run(serve())


if __name__ == "__main__":
    main(int(sys.argv[1]))
