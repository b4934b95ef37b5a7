"""A workflow agent's task in ``meshpoint tasks show``: its kind, each stage (output
key, agent, state) and a loop's round, as the runtime writes them into the task's
history records (``execution_state``, :meth:`meshpoint.runtime.stages.Workflow.
describe`): read from the live checkpoint's context while the task runs, and from
its last history record once it ended."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rich.console import Console
from rich.table import Table

from meshpoint.cli.common import shown
from meshpoint.runtime.stages import METADATA_KEY

#: How a stage's state is drawn.
_STYLE = {"done": "green", "running": "yellow", "waiting": "dim", "failed": "red"}


def workflow_of(execution_state: Any) -> dict[str, Any] | None:
    """The workflow's progress in a record's ``execution_state`` (a mapping or the
    record's section), or None when the task is not a workflow's: ``type``,
    ``stage`` (the index of the current stage; none for a parallel workflow),
    ``loop_iteration`` and ``loop_max_iterations`` (a loop's; the latter None without
    a bound) and ``stages``, each ``{output_key, agent, state}``."""
    if execution_state is None:
        return None
    state = (execution_state if isinstance(execution_state, Mapping)
             else execution_state.model_dump())
    kind = state.get("workflow_type")
    stages = state.get("stages")
    if not isinstance(kind, str) or not isinstance(stages, list):
        return None
    return {"type": kind, "stage": state.get("workflow_stage"),
            "loop_iteration": state.get("loop_iteration"),
            "loop_max_iterations": state.get("loop_max_iterations"),
            "stages": [{"output_key": s.get("output_key"), "agent": s.get("agent"),
                        "state": s.get("state")} for s in stages if isinstance(s, Mapping)]}


def live_workflow(context: Any, subs: Sequence[Any] = ()) -> dict[str, Any] | None:
    """The progress of a live task's workflow, from its checkpoint's context (what
    the turn loop wrote into ``history.record.execution_state`` when it paused), with
    each running stage whose call was answered since (its sub-task in ``subs`` is no
    longer pending: a parallel workflow's branch, while the others run) shown done,
    or failed."""
    record = context.history.get("record") if isinstance(context.history, dict) else None
    workflow = workflow_of(record.get("execution_state")) if isinstance(record, dict) else None
    if workflow is None:
        return None
    answered = {}
    for sub in subs:
        said = ((sub.correlation_data or {}).get("metadata") or {}).get(METADATA_KEY)
        if isinstance(said, Mapping) and sub.status == "resolved":  # answered, or timed out
            result = sub.result if isinstance(sub.result, Mapping) else {}
            answered[(said.get("stage"), said.get("iteration"))] = \
                "done" if result.get("status", "completed") == "completed" else "failed"
    for stage in workflow["stages"]:
        state = answered.get((stage["output_key"], workflow["loop_iteration"] or 1))
        if stage["state"] == "running" and state is not None:
            stage["state"] = state
    return workflow


def print_workflow(console: Console, workflow: dict[str, Any], *, ended: bool) -> None:
    """The workflow as a table: a row per stage. A stage of an ended loop that its
    last round did not reach shows as ``not run``."""
    title = f"{workflow['type']} workflow"
    if workflow["type"] == "loop":
        bound = workflow["loop_max_iterations"]
        title += (f", iteration {workflow['loop_iteration']}"
                  + (f" of {bound}" if bound is not None else " (no bound)"))
    table = Table(title=title)
    for column in ("#", "output_key", "agent", "state"):
        table.add_column(column)
    for number, stage in enumerate(workflow["stages"], 1):
        state = str(stage["state"])
        said = "not run" if ended and state == "waiting" else state
        table.add_row(str(number), shown(stage["output_key"]), shown(stage["agent"]),
                      f"[{_STYLE.get(state, 'default')}]{shown(said)}[/]")
    console.print(table)
