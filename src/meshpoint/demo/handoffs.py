"""The demo's long tasks: a ``researcher`` whose tasks run as chains of fresh-context
iterations (docs/handoff.md), beside the coordinator's trips and killed as they are.

A long task asks for several rounds of research; each round calls two peers
(``flights``, ``hotels``: the task pauses for them) and reads a long page with a
local tool (``read``), so its conversation grows by a page a round. The researcher's
model (scripted, deterministic, a little slow, as a model is) has a small
``context_window``, and its :class:`~meshpoint.runtime.options.HandoffPolicy` hands
the task off before a model call whose prompt would fill more than 0.70 of it; the
model itself asks for a fresh context (the ``handoff`` tool, the ``explicit`` trigger)
after :data:`HANDOFF_AFTER` rounds in one. Either way: the iteration's final
checkpoint (status ``handoff``, the continuation prompt in its history record), then
the handoff message, which any researcher instance takes. With :data:`ROUNDS` rounds
every long task hands off three times (once asked for, twice for its context), and,
with three instances, mostly to another one. Its answer still lists every round's
results.

:func:`handoff_figures` reads what happened from the history records (never from
the instances' memory, which a kill loses): iterations, handoffs by trigger, the
largest context utilization at a handoff of the utilization trigger (the last model
call's prompt over the window, from ``extensions.handoff.detail.utilization``), and
how many handoffs another instance took (``extensions.handoff.by`` beside the next
iteration's ``extensions.handoff_received.by``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

from meshpoint.llm.scripted import ScriptedModel
from meshpoint.runtime import Agent, LocalTool, Peer
from meshpoint.runtime.options import HandoffPolicy, RecoveryPolicy
from meshpoint.store import SqlStore

RESEARCHER = "researcher"
#: The peers a long task calls each round (one per topic of its request).
TOPICS = ("flights", "hotels")
#: Rounds of research a long task asks for, and the researcher model's context window
#: (tokens, a token per 4 characters): it holds two or three rounds, so that a task
#: hands off at least twice, and the largest continuation prompt (what every round
#: accomplished) still leaves room for a round under the 0.70 threshold. The model
#: asks for a handoff itself after HANDOFF_AFTER rounds in one context.
ROUNDS = 6
CONTEXT_WINDOW = 1200
HANDOFF_AFTER = 3
#: The threshold of the context-utilization trigger (HandoffPolicy's default).
UTILIZATION = 0.70
#: A page of notes, as a source read in full would give (it fills the context).
_PAGE = ("Timetables, fares, connections, baggage rules and local notes for the leg, "
         "copied in full from the source. ") * 6


def read(arguments: dict[str, Any]) -> str:
    """Read a source in full (the long tool result that fills a context)."""
    return f"source on {arguments.get('query')}: {_PAGE}"


def researcher(*, peer_timeout_s: float, delay_s: float = 0.08,
               recovery: RecoveryPolicy | None = None) -> Agent:
    """The agent of the long tasks: peers, a long-reading tool, a handoff policy whose
    triggers that fire here are context utilization and the model's own request
    (errors and budgets are left at their defaults). ``delay_s``: each model call's
    thinking time; ``recovery``: its recovery policy (the default's if None)."""
    # The model is named as the coordinator's, so the demo's prices cover it.
    model = ScriptedModel(rounds=ROUNDS, context_window=CONTEXT_WINDOW, delay_s=delay_s,
                          handoff_after=HANDOFF_AFTER)
    return Agent(RESEARCHER, model, peers=[Peer(name, timeout_s=peer_timeout_s)
                                           for name in TOPICS],
                 tools=[LocalTool("read", "Read a source in full.", read)],
                 handoff=HandoffPolicy(context_utilization=UTILIZATION), events=True,
                 recovery=recovery or RecoveryPolicy())


def long_request(number: int) -> str:
    return f"Research trip {number} in depth: {', '.join(TOPICS)}"


def long_task_count(tasks: int, share: float) -> int:
    """How many of ``tasks`` are long ones: ``share`` of them, rounded down."""
    return min(tasks, int(tasks * share + 1e-9))


async def handoff_figures(store: SqlStore, task_ids: Iterable[str]) -> dict[str, Any]:
    """What the history records of the long tasks ``task_ids`` say of their handoffs
    (see the module docstring); the records are read once the tasks ended."""
    iterations = 0
    fewest: int | None = None
    triggers: Counter[str] = Counter()
    utilizations: list[float] = []
    elsewhere = 0
    for task_id in task_ids:
        records = list(reversed(await store.history.get_checkpoint_history(task_id)))
        handoffs = [r for r in records if r.execution_state.phase == "handoff"]
        iterations += max((r.metadata.iteration for r in records), default=0)
        fewest = len(handoffs) if fewest is None else min(fewest, len(handoffs))
        by: dict[str, Any] = {}
        for record in handoffs:
            detail = record.extensions.get("handoff") or {}
            triggers[str(detail.get("trigger"))] += 1
            use = (detail.get("detail") or {}).get("utilization")
            if detail.get("trigger") == "context_utilization" and use is not None:
                utilizations.append(float(use))
            by[record.metadata.checkpoint_id] = detail.get("by")
        elsewhere += _taken_elsewhere(records, by)
    return {"iterations": iterations, "handoffs": sum(triggers.values()),
            "handoffs_by_trigger": dict(sorted(triggers.items())),
            "fewest_handoffs_per_long_task": fewest,
            "handoffs_taken_elsewhere": elsewhere,
            "max_utilization_at_handoff": max(utilizations, default=None),
            "utilization_threshold": UTILIZATION}


def _taken_elsewhere(records: Sequence[Any], by: dict[str, Any]) -> int:
    """How many of a task's iterations began on an instance other than the one whose
    handoff record they read."""
    count = 0
    for record in records:
        received = record.extensions.get("handoff_received") if \
            record.execution_state.phase == "iteration" else None
        if isinstance(received, dict) and received.get("by") is not None and \
                by.get(str(received.get("record"))) not in (None, received["by"]):
            count += 1
    return count
