"""One of the two processes of test_recovery_limits.py's breaker test: each opens its
own store on the shared database and asks the agent's breaker, in step with the other
(a barrier), then writes what it saw to a JSON file for the parent."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from meshpoint.store import open_store

AGENT = "coordinator"
LIMITS = {"failures": 2, "window_s": 60.0, "cooldown_s": 1.5}


async def _main(name: str, url: str, options: dict[str, Any], barrier: Any,
                out_path: str) -> None:
    seen: dict[str, Any] = {}
    store = await open_store(url, **options)
    try:
        barrier.wait()
        # 1. One failed resume each: the second of the two opens the breaker.
        before, after = await store.breakers.note(AGENT, "failure", owner=f"{name}#1", **LIMITS)
        seen["opened"] = before.state == "closed" and after.state == "open"
        barrier.wait()
        # 2. Open: neither may resume.
        seen["held"] = not (await store.breakers.admit(AGENT, f"{name}#2", trial_ttl_s=5))[0]
        barrier.wait()
        # 3. After the cool-down both ask at once: exactly one gets the trial.
        state = await store.breakers.state(AGENT)
        await asyncio.sleep(max(0.0, (state.opened_until or 0) - time.time()) + 0.05)
        barrier.wait()
        allowed, state = await store.breakers.admit(AGENT, f"{name}#3", trial_ttl_s=5)
        seen["trial"] = allowed
        barrier.wait()
        # 4. The trial succeeds: the breaker closes, for both.
        if allowed:
            before, after = await store.breakers.note(AGENT, "success", owner=f"{name}#3",
                                                     **LIMITS)
            seen["closed"] = (before.state, after.state) == ("half_open", "closed")
        barrier.wait()
        seen["after"] = (await store.breakers.admit(AGENT, f"{name}#4", trial_ttl_s=5))[0]
    finally:
        await store.close()
    with open(out_path, "w") as out:
        json.dump(seen, out)


def run(name: str, url: str, options: dict[str, Any], barrier: Any, out_path: str) -> None:
    asyncio.run(_main(name, url, options, barrier, out_path))
