"""``meshpoint tasks cost``: what a task spent, from its verified history (docs/history.md,
"Cost attribution"): checkpoint by checkpoint, iteration by iteration (a task that
hands off runs as several, :mod:`meshpoint.cli.handoffs`), by model and by source;
every table's rows add up exactly to the total."""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Annotated, Any

import typer
from rich.table import Table

from meshpoint.cli.common import (
    AsJson,
    Config,
    Schema,
    Tenant,
    Url,
    console,
    fail,
    run_on_store,
    shown,
)
from meshpoint.errors import KeyMissingError, MeshpointError, UnknownHistoryError
from meshpoint.history.costs import amount
from meshpoint.history.verification import holds_envelope


def _figures_sealed(record: Any) -> bool:
    """Whether what ``tasks cost`` prints of a record (read with ``keep_unreadable``)
    is still encrypted under a key this process does not hold. A section sealed whole
    stays its envelope, a dict; one sealed in part, a model with an envelope inside."""
    state, metrics = record.execution_state, record.metrics
    if isinstance(state, dict) or isinstance(metrics, dict):
        return True
    return any(holds_envelope(value) for value in (state.phase, metrics.tokens,
                                                     metrics.cost))


def cost(task_id: Annotated[str, typer.Argument(help="The task.")],
         url: Url = None, config: Config = None, schema: Schema = None,
         tenant: Tenant = None, as_json: AsJson = False) -> None:
    """A task's tokens and cost, checkpoint by checkpoint, iteration by iteration (a
    task that hands off runs as several) and in total, by model and by source (the
    agent itself, each peer), from its verified history (prices: the config's
    ``history.prices``, applied when each record was written). The rows of either
    table add up to the total exactly."""
    from meshpoint.cli.handoffs import history_of, iterations, print_iterations

    # Fields encrypted under a key no longer held (crypto-shredded) stay sealed: the
    # cost is still there unless it was encrypted itself.
    records = run_on_store(url, config, schema, tenant, as_json,
                           lambda store: history_of(store, task_id))
    if not records:
        _never_paused(task_id, url, config, schema, tenant, as_json)
        return
    sealed = next((r.metadata.seq for r in records if _figures_sealed(r)), None)
    if sealed is not None:
        fail(KeyMissingError(f"task {task_id!r}: record {sealed}'s metrics or phase are "
                             "encrypted with a key this process does not hold (give the "
                             "key ring with --config)"), as_json)
    last = records[-1].metrics
    rows = [{"seq": r.metadata.seq, "checkpoint_id": r.metadata.checkpoint_id,
             "phase": r.execution_state.phase, "timestamp": r.metadata.timestamp,
             "tokens": r.metrics.tokens["iteration"]["totals"],
             "cost": r.metrics.cost.get("iteration", "0")} for r in records]
    try:
        if records[0].metadata.seq > 1:
            # A purge removed the records before: what they cost is the first one's
            # total less its own iteration, one row, so that the rows still add up.
            rows.insert(0, _purged_row(records[0]))
        # The total printed is the exact sum of the rows printed (each record's total
        # is its parent's plus its own, so this is the last record's total too).
        spent = sum((Decimal(str(row["cost"])) for row in rows), Decimal(0))
    except ArithmeticError:
        fail(MeshpointError(f"task {task_id!r}: a record's cost is not a decimal "
                            "amount"), as_json)
    total = {"tokens": last.tokens["total"], "cost": {**last.cost, "total": amount(spent)}}
    # Each checkpoint's row in exactly one iteration's (the purged ones in their own).
    by_iteration = iterations([*rows[:1 if records[0].metadata.seq > 1 else 0], *records])
    if as_json:
        print(json.dumps({"task_id": task_id, "currency": last.cost.get("currency"),
                          "checkpoints": rows, "iterations": [
                              {k: row[k] for k in ("iteration", "agent", "records",
                                                   "first_seq", "last_seq", "tokens",
                                                   "cost")} for row in by_iteration],
                          "total": total}))
        return
    currency = shown(last.cost.get("currency", ""))  # in headers too
    table = Table(title=f"cost of task {shown(task_id)}, checkpoint by checkpoint")
    widest = max(len(str(row["cost"])) for row in rows)
    for column in ("#", "phase", "written", "prompt", "completion", "cached",
                   f"cost ({currency})"):
        # The figures are never cut short (a narrow terminal folds the phase and the
        # time instead): the rows must be seen to add up to the total.
        cost_column = column.startswith("cost")
        table.add_column(column, justify="right" if column != "phase" else "left",
                         overflow="fold", no_wrap=cost_column,
                         min_width=widest if cost_column else None)
    for row in rows:
        t = row["tokens"]
        seq = row["seq"] if row["seq"] is not None else f"1-{row['purged_through']}"
        table.add_row(str(seq), shown(row["phase"]), shown((row["timestamp"] or "-")[:19]),
                      str(t.get("prompt_tokens", 0)), str(t.get("completion_tokens", 0)),
                      str(t.get("cached_tokens", 0)), str(row["cost"]))
    console.print(table)
    if len(by_iteration) > 1:
        print_iterations(by_iteration, title="iteration by iteration", currency=currency,
                         costs=True)
    for title, key in (("by model", "by_model"), ("by source", "by_source")):
        breakdown = Table(title=f"in total, {title}")
        for column in (title.split()[-1], "prompt", "completion", "cached",
                       f"cost ({currency})"):
            breakdown.add_column(column, overflow="fold")
        for name, counts in sorted(total["tokens"].get(key, {}).items()):
            # A record written before costs were kept by source has none: "-".
            price = (total["cost"].get(key) or {}).get(name, {}).get("total")
            breakdown.add_row(shown(name), *(shown(counts.get(kind, 0)) for kind in (
                "prompt_tokens", "completion_tokens", "cached_tokens")),
                              "-" if price is None else shown(price))
        if key == "by_source" and total["cost"].get("unattributed"):
            # An iteration with several sources and several models: its cost is the
            # task's, but not any one source's (docs/history.md, "Cost attribution").
            breakdown.add_row("(not attributable)", "", "", "",
                              shown(total["cost"]["unattributed"]))
        console.print(breakdown)
    unpriced = total["cost"].get("unpriced") or []
    console.print(f"total: {shown(total['cost'].get('total', '0'))} {currency}"
                  + (f" (no price for {shown(', '.join(unpriced))})" if unpriced else ""))


def _never_paused(task_id: str, url: str | None, config: Any, schema: str | None,
                  tenant: str | None, as_json: bool) -> None:
    """``tasks cost`` of a task without a history: one that ran to its end without
    pausing wrote no checkpoint, so no cost record (the design's zero writes). If the
    event log knows it (its agent keeps one), say so, with the tokens its model calls
    logged; else exit 1 saying what the store does not know."""
    from meshpoint.cli.ended import ran_unpaused

    events = run_on_store(url, config, schema, tenant, as_json,
                          lambda store: ran_unpaused(store, task_id))
    if not events:
        unknown = UnknownHistoryError(task_id)
        unknown.args = (f"task {task_id!r} has no checkpoint history and no event in this "
                        "tenant: a task that runs to its end without pausing writes no "
                        "checkpoint and so no cost record (with its agent's `events: true` "
                        "the event log keeps its model calls' tokens); else its history was "
                        "purged, or it belongs to another tenant",)
        fail(unknown, as_json)
    tokens: dict[str, int] = dict.fromkeys(("prompt_tokens", "completion_tokens"), 0)
    for event in events:
        usage = (event.state_snapshot or {}).get("usage") if \
            event.event_type == "step_complete" and event.step_name == "model" else None
        for kind in tokens:
            if isinstance(usage, dict) and isinstance(usage.get(kind), int):
                tokens[kind] += usage[kind]
    note = (f"task {task_id!r} never paused: a task that runs to its end without pausing "
            "writes no checkpoint, so it has no history and no cost record; its agent's "
            f"event log has {len(events)} event(s) of it, whose model calls used the "
            "tokens shown (priced only in a history)")
    if as_json:
        print(json.dumps({"task_id": task_id, "history": False, "note": note,
                          "events": len(events), "tokens": tokens}))
        return
    console.print(f"{shown(note)}: prompt {tokens['prompt_tokens']}, completion "
                  f"{tokens['completion_tokens']}", highlight=False)


def _purged_row(first: Any) -> dict[str, Any]:
    """The records a purge removed before ``first``, as one row of ``tasks cost``
    (``seq`` None, ``purged_through`` the last one's seq)."""
    tokens = first.metrics.tokens
    before = {kind: int(tokens["total"]["totals"].get(kind, 0))
              - int(tokens["iteration"]["totals"].get(kind, 0))
              for kind in ("prompt_tokens", "completion_tokens", "cached_tokens")}
    cost = Decimal(str(first.metrics.cost.get("total", "0"))) - Decimal(
        str(first.metrics.cost.get("iteration", "0")))
    return {"seq": None, "purged_through": first.metadata.seq - 1, "checkpoint_id": None,
            "phase": "(purged)", "timestamp": None, "tokens": before, "cost": amount(cost)}


def cost_commands(tasks_app: typer.Typer) -> None:
    """Register this module's commands on ``meshpoint tasks``."""
    tasks_app.command()(cost)
