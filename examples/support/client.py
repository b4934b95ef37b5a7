"""Ask the support agent something, and approve (or deny) its refunds here.

    python client.py "Refund order A-1002: 8900 cents, it arrived damaged"

With mesh.yaml's defaults (a SQLite file, the in-process broker) every agent runs in
this process (``meshpoint.embedded``). With MESHPOINT_BROKER_URL=nats://... (and a
PostgreSQL store) it is a client of the ``meshpoint serve`` processes instead
(``meshpoint.config.open_client``): the same code, the same file.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

from meshpoint.config import load_config, open_client
from meshpoint.embedded import embedded


async def main(text: str) -> int:
    config = load_config(Path(__file__).with_name("mesh.yaml"))
    in_process = config.broker.url == "memory://"
    async with (embedded(config) if in_process else open_client(config)) as client:
        request = await client.submit("support", text)
        print(f"task {client.task_id('support', request)}", flush=True)
        step = await client.wait_next(request, timeout_s=600)
        while not step.ended:  # the task waits for a human: you
            for call in step.pending:
                print(f"{call['tool']} {json.dumps(call['arguments'])} waits for approval")
                said = await asyncio.to_thread(input, "approve? [y/N] ")
                if said.strip().lower() in ("y", "yes"):
                    await client.approve(step.task_id, call["call_id"])
                else:
                    await client.deny(step.task_id, call["call_id"], "the approver said no")
            step = await client.wait_next(request, timeout_s=600)
        task = step.answer
        message = task.status.message
        print(f"{task.status.state.value}: {message.text if message else ''}")
        return 0 if task.status.state.value == "completed" else 1


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(f"usage: python {sys.argv[0]} 'what you ask the support agent'")
    sys.exit(asyncio.run(main(sys.argv[1])))
