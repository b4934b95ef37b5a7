"""What an instance did, counted, for tests, the demo and operators."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field


@dataclass
class InstanceStats:
    """Counters and latency samples of one :class:`AgentInstance`.

    ``events`` lists ``(what, task_id)`` in order, so a test can check which
    instance did what: ``started``, ``paused``, ``paused_in_memory``, ``resumed``,
    ``recovered``, ``completed``, ``failed``, ``canceled``, ``timeout``,
    ``ignored_answer``, ``dropped`` (another instance owns the task).
    """

    instance_id: str
    counts: Counter[str] = field(default_factory=Counter)
    events: list[tuple[str, str]] = field(default_factory=list)
    #: Wall time of each checkpoint write, in milliseconds.
    checkpoint_ms: list[float] = field(default_factory=list)
    #: From the checkpoint of a pause to the start of the resumed turn, in ms.
    pause_resume_ms: list[float] = field(default_factory=list)
    #: Tasks resumed here that another instance had paused.
    resumed_elsewhere: int = 0

    def note(self, what: str, task_id: str) -> None:
        self.counts[what] += 1
        self.events.append((what, task_id))

    def tasks(self, what: str) -> list[str]:
        return [task for event, task in self.events if event == what]


def percentile(samples: list[float], p: float) -> float | None:
    """Nearest-rank percentile; None without samples."""
    if not samples:
        return None
    ordered = sorted(samples)
    rank = max(0, min(len(ordered) - 1, round(p / 100 * len(ordered) + 0.5) - 1))
    return ordered[rank]
