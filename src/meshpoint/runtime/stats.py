"""What an instance did, counted, for tests, the demo and operators."""

from __future__ import annotations

import statistics
import time
from collections import Counter, deque
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from meshpoint.ops.tracing import Tracing

#: Recent events and latency samples kept per instance: a long-running instance
#: must not grow with the number of tasks it has seen.
KEEP = 10_000


R = TypeVar("R")


def ms_since(started: float) -> float:
    """Milliseconds since ``started`` (a ``time.perf_counter()``), to the microsecond."""
    return round((time.perf_counter() - started) * 1000, 3)


class Journal(Protocol):
    """Where an instance logs its steps (:class:`meshpoint.events.log.EventJournal`)."""

    def __call__(self, event_type: str, task_id: str | None, *, step: str | None = None,
                 input: Any = None, output: Any = None, state: Any = None,
                 message: Any = None) -> None: ...


#: The event type (meshpoint.events.log) each counted happening is logged as.
_EVENT_OF = {"started": "step_start", "paused": "pause", "paused_in_memory": "pause",
             "resumed": "resume", "recovered": "recovery", "expired": "recovery",
             "reminded": "recovery", "timeout": "timeout", "approved": "approval",
             "denied": "approval", "replied": "approval", "answer_refused": "approval",
             "completed": "answer", "failed": "answer", "canceled": "cancel",
             "rejected": "answer", "blocked": "error", "reconstructed": "recovery",
             "dead_lettered": "error", "key_missing": "error", "restart_refused": "error",
             "dropped": "recovery", "approval_resumed": "resume",
             "ignored_answer": "protocol_receive",
             "handoff_requested": "protocol_receive"}


@dataclass
class InstanceStats:
    """Counters and latency samples of one :class:`AgentInstance`.

    ``events`` lists ``(what, task_id)`` in order, so a test can check which
    instance did what: ``started``, ``paused``, ``paused_in_memory``, ``resumed``,
    ``recovered`` (a task whose holder died, or whose lease was given up, taken up
    again), ``approval_resumed`` (a task a human's answer straight into the store,
    ``meshpoint tasks approve``, made resumable), ``completed``, ``failed``,
    ``canceled``, ``timeout``,
    ``ignored_answer``, ``dropped`` (another instance owns the task), ``key_missing``
    (a stored task left to an instance holding the key its history needs),
    ``blocked``, ``reconstructed`` and ``restart_refused`` (a blocked task not
    restarted: its request is not the one its history names), ``answer_claimed`` (an
    answer resolved its call in the store), ``redelivered`` (a request delivered
    again; noted with its subject, as ``dead_lettered`` is). Only the
    latest ``KEEP`` events and samples are kept; ``counts`` are totals, and also
    count ``checkpoints`` (writes that committed, even if the instance was killed
    while waiting for the commit).
    """

    instance_id: str
    counts: Counter[str] = field(default_factory=Counter)
    events: deque[tuple[str, str]] = field(default_factory=lambda: deque(maxlen=KEEP))
    #: Wall time of each checkpoint write, in milliseconds (the latest KEEP).
    checkpoint_ms: deque[float] = field(default_factory=lambda: deque(maxlen=KEEP))
    #: From the end of the turn that paused to the start of the resumed turn, in ms.
    pause_resume_ms: deque[float] = field(default_factory=lambda: deque(maxlen=KEEP))
    #: Tasks resumed here that another instance had paused.
    resumed_elsewhere: int = 0

    #: Where the instance's steps go when its agent keeps an event log
    #: (``Agent(events=True)``: a :class:`meshpoint.events.log.EventJournal`); None keeps
    #: nothing beyond these counts.
    journal: Journal | None = None
    #: Called with ``(what, task_id, detail)`` for each counted happening (the alerts
    #: and the breaker watch them: :mod:`meshpoint.runtime.alerts`). A watcher must
    #: not block: it schedules what it does.
    watchers: list[Callable[[str, str, dict[str, Any]], None]] = field(default_factory=list)
    #: The instance's spans (a local tool's run is one).
    tracing: Tracing = field(default_factory=Tracing)

    def note(self, what: str, task_id: str, *, journal: bool = True, **detail: Any) -> None:
        """Count ``what`` happened to ``task_id`` (and log it, with ``detail``, unless
        ``journal`` is off: the step is logged where it takes effect)."""
        self.counts[what] += 1
        self.events.append((what, task_id))
        if journal and self.journal is not None:
            self.journal(_EVENT_OF.get(what, what), task_id, step=what,
                         output=detail or None)
        for watcher in self.watchers:
            watcher(what, task_id, detail)

    def log(self, event_type: str, task_id: str | None, **fields: Any) -> None:
        """Log a step that is not counted (a model call, a tool, a protocol message)
        if the agent keeps an event log: ``step``, ``input``, ``output``, ``state``,
        ``message`` as :meth:`meshpoint.events.log.EventJournal.__call__` takes them."""
        if self.journal is not None:
            self.journal(event_type, task_id, **fields)

    async def tool_step(self, task_id: str, call_id: str, tool: str,
                        arguments: Any, run: Callable[[], Awaitable[R]],
                        output: Callable[[R], Any] = lambda result: result) -> R:
        """``await run()``, a local tool's run, logged as the step ``tool:<name>``
        (its start with the arguments it runs with, its end with ``output(result)``
        and how long it took): whether it ran at once or once a human approved it,
        the event log, and a reconstruction from it, know it ran."""
        step = f"tool:{tool}"
        self.log("step_start", task_id, step=step,
                 input={"call_id": call_id, "arguments": arguments})
        started = time.perf_counter()
        with self.tracing.tool_call(task_id, tool, call_id):
            result = await run()
        self.log("step_complete", task_id, step=step, output=output(result),
                 state={"duration_ms": ms_since(started)})
        return result

    def summary(self, *, samples: bool = False) -> dict[str, object]:
        """Counts and p50/p99 latencies as JSON-ready data (with the raw samples, to
        pool them across instances, if ``samples``)."""
        out: dict[str, object] = {"instance_id": self.instance_id, "counts": dict(self.counts),
                                  "resumed_elsewhere": self.resumed_elsewhere}
        for name in ("checkpoint_ms", "pause_resume_ms"):
            values = list(getattr(self, name))
            out[name] = {"p50": percentile(values, 50), "p99": percentile(values, 99),
                         "n": len(values), **({"samples": values} if samples else {})}
        return out

    def tasks(self, what: str) -> list[str]:
        return [task for event, task in self.events if event == what]


def percentile(samples: Iterable[float], p: int) -> float | None:
    """The ``p``-th percentile (1-99) of ``samples``; the sample itself if there is one,
    None if there are none.

    The one definition the runtime's stats, the demo and every benchmark use: the
    standard library's ``statistics.quantiles(..., method="inclusive")``, which
    interpolates between the two nearest ranks (numpy's default, ``linear``)."""
    ordered = sorted(samples)
    if not 1 <= p <= 99:
        raise ValueError(f"p must be a percentile from 1 to 99, got {p!r}")
    if len(ordered) < 2:
        return ordered[0] if ordered else None
    return statistics.quantiles(ordered, n=100, method="inclusive")[p - 1]
