"""``Scope``: what every part of one instance shares and none of them changes.

An :class:`~meshpoint.runtime.instance.AgentInstance` builds one scope and hands it
to each of its parts (the turn loop, the pause boundary, answers, cancels, endings,
the loops), instead of passing each of them the same ids, store, broker and options
one by one. It holds no part: a part reaches another only through what it is given
when it is built, and the instance builds them in an order in which each is given
only parts already built.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from meshpoint.broker.base import Broker
from meshpoint.ops.tracing import Tracing
from meshpoint.runtime.agent import RuntimeOptions
from meshpoint.store.base import Store


@dataclass(frozen=True, slots=True)
class Scope:
    """Who an instance is, where its state lives, how it talks, and its options."""

    #: The agent this instance serves: it takes answers, cancels and recoveries only
    #: for tasks of this agent.
    agent_name: str
    #: This instance's id (the owner of the leases it takes, its inbox).
    instance_id: str
    store: Store
    broker: Broker
    options: RuntimeOptions
    #: Wall-clock time in epoch seconds (when a task paused, how long it waited).
    clock: Callable[[], float] = field(default=time.time)
    #: The spans of this instance's tasks (OpenTelemetry's API: no-ops until the
    #: application configures an SDK).
    tracing: Tracing = field(default_factory=Tracing)

    @property
    def lease_ttl_s(self) -> float:
        """How long a lease this instance takes lasts before another may take over."""
        return self.options.lease_ttl_s
