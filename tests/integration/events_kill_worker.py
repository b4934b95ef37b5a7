"""The process test_events.py kills with SIGKILL: it logs numbered events as fast as
it can and prints, after each write of the log, how many events are written, so the
parent knows what must survive the kill."""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

from meshpoint.events.log import EventStore
from meshpoint.store import open_store


async def main(url: str, options: dict[str, Any], flush_interval_s: float) -> None:
    async with open_store(url, migrate=False, pool_size=2, **options) as store:
        log = EventStore(store, flush_interval_s=flush_interval_s)
        number = reported = 0
        while True:  # until killed
            log.log_event("writer", "killed", "step_complete", output_data={"n": number})
            number += 1
            if log.written != reported:
                reported = log.written
                print(f"written {reported}", flush=True)
            await asyncio.sleep(0.0005)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], json.loads(sys.argv[2]), float(sys.argv[3])))
