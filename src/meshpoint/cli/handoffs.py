"""``meshpoint tasks handoff``, and a task's iterations as ``tasks show`` and ``tasks
cost`` list them (docs/runtime.md, "Handoff").

A task of an agent with a ``handoff:`` policy runs as a chain of fresh-context
iterations. Its history tells them apart: each record carries its ``iteration``; the
record that ends one has phase ``handoff`` and ``extensions.handoff`` (why: the
trigger, its detail, the context utilization measured); the record that starts the
next has phase ``iteration`` and ``extensions.handoff_received`` (the handoff record
it read). :func:`iterations` reads them back, one row per iteration, whose costs add
up exactly to the task's total.

``meshpoint tasks handoff ID`` is an operator's explicit request (the ``operator``
trigger): a ``meshpoint/handoff`` request to the agent (any client the agent takes
requests from may send it), which the instance that takes it broadcasts to every
instance of the agent, and the one running the task hands it off before its next
model call. Only a running task can be handed
off: a task waiting for peers or a human has calls outstanding, and its stored state
may be rewritten only once they are answered (the store's lease rules), so the
request is refused, saying so, instead of being dropped or kept where no instance
looks.
"""

from __future__ import annotations

import json
import time
from decimal import Decimal
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from meshpoint.cli.common import AsJson, console, run_sync, shown
from meshpoint.errors import InvalidArgumentError, NotFoundError

#: Why an iteration ended, when no handoff record says (its last record's phase).
RUNNING = "-"


async def history_of(store: Any, task_id: str) -> list[Any]:
    """The task's verified history, oldest first; fields encrypted under a key this
    process does not hold stay sealed (``keep_unreadable``)."""
    return list(reversed(await store.history.get_checkpoint_history(
        task_id, limit=100_000, keep_unreadable=True)))


def iterations(records: list[Any]) -> list[dict[str, Any]]:
    """The iterations of a task from its history ``records`` (oldest first; rows of
    ``tasks cost``'s shape may stand in for purged ones: ``seq`` None, no record):
    for each, its number, agent, records (count and first/last seq), how it started
    (``started_by``: the trigger of the handoff it received, ``request`` for the
    first), how it ended (``ended_by``: its handoff's trigger, else its last phase),
    the handoff's reason and context ``utilization`` (the last model call's prompt
    over the window, when the trigger measured it), tokens and cost. The costs are
    the sums of the records' own (``metrics.cost.iteration``), so the rows add up to
    the task's total exactly, as ``tasks cost``'s rows do."""
    rows: list[dict[str, Any]] = []
    for record in records:
        number = record.metadata.iteration if hasattr(record, "metadata") else None
        if not rows or rows[-1]["iteration"] != number:
            rows.append({"iteration": number, "agent": None, "records": 0, "first_seq": None,
                         "last_seq": None, "started_by": "request" if number == 1 else None,
                         "ended_by": RUNNING, "reason": None, "utilization": None,
                         "tokens": {"prompt_tokens": 0, "completion_tokens": 0,
                                    "cached_tokens": 0}, "cost": Decimal(0)})
        row = rows[-1]
        if hasattr(record, "metadata"):
            _add_record(row, record)
        else:  # the records a purge removed, one row of ``tasks cost``
            row.update(iteration=None, ended_by="(purged)",
                       last_seq=record.get("purged_through"))
            _add_figures(row, record["tokens"], record["cost"])
    return [{**row, "cost": str(row["cost"])} for row in rows]


def _add_record(row: dict[str, Any], record: Any) -> None:
    meta, phase = record.metadata, record.execution_state.phase
    row["agent"] = row["agent"] or meta.agent_id
    row["records"] += 1
    row["first_seq"] = row["first_seq"] if row["first_seq"] is not None else meta.seq
    row["last_seq"] = meta.seq
    extensions = record.extensions if isinstance(record.extensions, dict) else {}
    received = extensions.get("handoff_received")
    if phase == "iteration" and isinstance(received, dict):
        row["started_by"] = received.get("trigger")
    handoff = extensions.get("handoff")
    if phase == "handoff" and isinstance(handoff, dict):
        detail = handoff.get("detail")
        row.update(ended_by=handoff.get("trigger"), reason=handoff.get("reason"),
                   utilization=detail.get("utilization") if isinstance(detail, dict)
                   else None)
    elif row["ended_by"] in (RUNNING, *_PAUSES) or phase in _ENDS:
        row["ended_by"] = phase if phase in _ENDS else RUNNING
    _add_figures(row, record.metrics.tokens["iteration"]["totals"],
                 record.metrics.cost.get("iteration", "0"))


#: Phases that end a task, and those of a pause (the iteration goes on after them).
_ENDS = ("completed", "failed", "canceled", "expired", "blocked")
_PAUSES = ("waiting_peers", "input_required", "working")


def _add_figures(row: dict[str, Any], tokens: dict[str, Any], cost: Any) -> None:
    for kind in row["tokens"]:
        row["tokens"][kind] += int(tokens.get(kind, 0))
    row["cost"] += Decimal(str(cost))


def print_iterations(rows: list[dict[str, Any]], *, title: str, currency: str = "",
                     costs: bool = False) -> None:
    """The iterations as a table: with ``costs``, tokens and cost (``tasks cost``),
    else how each started and ended (``tasks show``)."""
    table = Table(title=title)
    # Short headers: the reason gets the room a terminal has left.
    columns = (("iteration", "agent", "records", "prompt", "completion", "cached",
                f"cost ({currency})") if costs else
               ("#", "agent", "records", "started by", "ended by", "context", "reason"))
    for column in columns:
        # The figures whole (they must be seen to add up) and the short words too;
        # an agent's name and the reason fold on a narrow terminal.
        table.add_column(column, overflow="fold",
                         no_wrap=column not in ("agent", "reason"))
    for row in rows:
        number = "(purged)" if row["iteration"] is None else str(row["iteration"])
        seqs = f"{row['records']} (#{row['first_seq']}-{row['last_seq']})" \
            if row["first_seq"] is not None else "-"
        if costs:
            t = row["tokens"]
            table.add_row(number, shown(row["agent"] or "-"), seqs, str(t["prompt_tokens"]),
                          str(t["completion_tokens"]), str(t["cached_tokens"]),
                          str(row["cost"]))
        else:
            use = row["utilization"]
            table.add_row(number, shown(row["agent"] or "-"), seqs,
                          shown(row["started_by"] or "-"), shown(row["ended_by"]),
                          "-" if not isinstance(use, int | float) else f"{use:.2f}",
                          shown(row["reason"] or "-"))
    console.print(table)


def handoff(task_id: Annotated[str, typer.Argument(help="The task.")],
            config: Annotated[Path, typer.Option(
                "--config", "-c", envvar="MESHPOINT_CONFIG",
                help="The mesh config: its broker reaches the agent's instances, and it "
                     "says whether the agent hands off.")],
            reason: Annotated[str, typer.Option(
                "--reason", help="Why: the handoff record and the next iteration's "
                "prompt carry it.")] = "",
            agent: Annotated[str | None, typer.Option(
                "--agent", help="The task's agent (default: read from the task id).")] = None,
            force: Annotated[bool, typer.Option(
                "--force", help="Send the request even if the store knows no such task "
                "(it may be running in memory on an instance, before its first "
                "checkpoint).")] = False,
            as_json: AsJson = False) -> None:
    """Hand a running task to a fresh-context iteration (the ``operator`` trigger): the
    instance running it ends its iteration before its next model call, and the next
    one starts, on any instance, from the continuation prompt. Needs the mesh's
    broker (NATS) and an agent with a ``handoff:`` section. Refused (exit 1), nothing
    sent: a task that waits for peers or a human (it is not running: ask again once it
    runs), is handing off already, is blocked, or has ended; one the store does not
    know, unless ``--force``."""
    from meshpoint.config import load_config
    from meshpoint.runtime import wire

    if len(reason) > 1000:
        raise typer.BadParameter(f"at most 1000 characters, got {len(reason)}",
                                 param_hint="--reason")

    async def run() -> dict[str, Any]:
        mesh = load_config(config)
        name = agent or wire.agent_of_task(task_id)
        if mesh.agent_config(name).handoff is None:
            raise InvalidArgumentError(
                f"agent {name!r} has no handoff policy, so its tasks never hand off: add a "
                f"handoff: section to agents.{name} in {config} (handoff: {{}} for the "
                "defaults) and restart its instances")
        if mesh.broker.url.startswith("memory://"):
            raise InvalidArgumentError(
                "the config's broker is memory://, which reaches only its own process: "
                "ask that process's instance (AgentInstance) instead")
        state = await _running_state(mesh, task_id)
        if state == "unknown" and not force:
            raise NotFoundError(
                f"the store knows no task {task_id!r} in tenant {mesh.store.tenant!r}: no "
                "live rows and no history (a typo, another tenant's task, or one still "
                "running in memory on an instance, before its first checkpoint: --force "
                "sends the request anyway)")
        async with mesh.open_client() as client:  # never creates the namespace's stream
            await client.handoff(name, task_id,
                                 reason or "an operator asked for a fresh context")
        return {"task_id": task_id, "agent": name, "handoff": "sent", "state": state}

    sent = run_sync(run, as_json)
    if as_json:
        print(json.dumps(sent))
    else:
        console.print(f"handoff of task {shown(task_id)} sent to agent {shown(sent['agent'])}: "
                      "the instance running it hands it off before its next model call")


async def _running_state(mesh: Any, task_id: str) -> str:
    """``running`` (stored, its lease held), ``unknown`` (no live rows, no history),
    or a refusal naming the state the task is in."""
    from meshpoint.errors import HistoryIntegrityError, UnknownTaskError
    from meshpoint.history.planning import END_PHASES

    store = await mesh.open_store()
    try:
        try:
            try:
                task = await store.restore_task(task_id)
            except HistoryIntegrityError:
                task = await store.restore_task(task_id, verify=False)
        except UnknownTaskError:
            record = await store.history.get_latest_checkpoint(task_id)
            if record is None:
                return "unknown"
            phase = str(record.execution_state.phase)
            raise InvalidArgumentError(
                f"task {task_id!r} has ended ({phase})" if phase in END_PHASES else
                f"task {task_id!r} has no live rows (its history's last record: {phase}); "
                "there is nothing to hand off") from None
    finally:
        await store.close()
    leased = task.owner is not None and (task.lease_expires_at or 0) > time.time()
    if task.status in ("resuming", "working") and leased:
        return "running"
    raise InvalidArgumentError(_refusal(task_id, task.status, leased))


def _refusal(task_id: str, status: str, leased: bool) -> str:
    if status in ("waiting_peers", "input_required"):
        waits = "peers" if status == "waiting_peers" else "a human's answer"
        return (f"task {task_id!r} is not running: it waits for {waits} ({status}), and "
                "its stored state is rewritten only once they answer. A handoff is taken "
                "before a model call, by the instance running the task: ask again once it "
                "runs (meshpoint tasks show)")
    if status == "handoff":
        return (f"task {task_id!r} is handing off already: its next iteration starts on "
                "any instance of its agent")
    if status == "blocked":
        return (f"task {task_id!r} is blocked, waiting for an operator; a handoff cannot "
                "unblock it")
    return (f"task {task_id!r} is {status} but no instance holds its lease (its instance "
            "died: recovery resumes it): ask again once it runs")


def handoff_commands(tasks_app: typer.Typer) -> None:
    """Register this module's commands on ``meshpoint tasks``."""
    tasks_app.command()(handoff)
