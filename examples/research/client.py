"""Ask the research pipeline for a brief, and print it.

    python client.py "Heat pumps in cold climates"

With mesh.yaml's defaults (a SQLite file, the in-process broker) every agent runs in
this process (``meshpoint.embedded``). With MESHPOINT_BROKER_URL=nats://... (and a
PostgreSQL store) it is a client of the ``meshpoint serve`` processes instead
(``meshpoint.config.open_client``): the same code, the same file.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from meshpoint.config import load_config, open_client
from meshpoint.embedded import embedded


async def main(text: str) -> int:
    config = load_config(Path(__file__).with_name("mesh.yaml"))
    in_process = config.broker.url == "memory://"
    async with (embedded(config) if in_process else open_client(config)) as client:
        request = await client.submit("research", text)
        print(f"task {client.task_id('research', request)}", flush=True)
        task = await client.wait(request, timeout_s=600)
        message = task.status.message
        print(f"{task.status.state.value}:\n{message.text if message else ''}")
        return 0 if task.status.state.value == "completed" else 1


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(f"usage: python {sys.argv[0]} 'the topic to research'")
    sys.exit(asyncio.run(main(sys.argv[1])))
