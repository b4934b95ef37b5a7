"""What a checkpoint writes: planned before any I/O, and the steps of its portable body.

:func:`plan_checkpoint` checks a checkpoint's arguments and builds, once, the
parameters every path of :meth:`SqlStore.checkpoint_task` runs with: the task row
(its context compressed and sealed as configured), its join's sub-tasks and
invocations, the conversation events new since the last checkpoint, and the history
record (:mod:`meshpoint.history.planning`), hashed and signed.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, NoReturn

from sqlalchemy import Connection

from meshpoint.context import CheckpointDict, TaskExecutionContext
from meshpoint.errors import (
    CheckpointConflictError,
    InvalidArgumentError,
    LeaseNotHeldError,
    UnknownTaskError,
)
from meshpoint.history.planning import (
    HistoryHead,
    HistoryOptions,
    PlannedRecord,
    plan_record,
    seal_context,
)
from meshpoint.store import queries as q
from meshpoint.store.checks import check_agent, check_id, check_timeout, check_ttl
from meshpoint.store.history_chain import record_params
from meshpoint.store.results import CheckpointReceipt
from meshpoint.store.rows import encode_context, plan_join
from meshpoint.store.schema import CHECKPOINT_STATUSES
from meshpoint.store.sealing import CONVERSATION, CORRELATION, RESULTS, Sealer

#: Keys of the checkpoint dict that are stored in tables of their own.
SPLIT_KEYS = ("active_peer_sub_tasks", "parallel_tool_calls", "session_events",
              "session_events_persisted")


def check_checkpoint_args(status: str, default_timeout_s: float, lease_owner: str | None,
                          holder: str | None, hold_lease_s: float) -> None:
    """InvalidArgumentError for a checkpoint's arguments that cannot go together."""
    if status not in CHECKPOINT_STATUSES:
        raise InvalidArgumentError(
            f"status must be one of {CHECKPOINT_STATUSES}, got {status!r} (resuming is "
            "set by the store when a join completes)")
    check_timeout("default_timeout_s", default_timeout_s)
    if lease_owner is not None:
        check_id("lease_owner", lease_owner)
    if holder is not None:
        check_id("holder", holder)
        check_ttl(hold_lease_s)
        if status != "working" or lease_owner not in (None, holder):
            raise InvalidArgumentError(
                "holder= keeps the lease through a mid-turn checkpoint: the status must "
                f"be 'working' (got {status!r}) and a resumed task's holder its "
                f"lease_owner (got {holder!r} and {lease_owner!r})")
    elif status == "working":
        raise InvalidArgumentError(
            "a task checkpointed as working is still running: name its lease holder "
            "(holder=)")


@dataclass(frozen=True)
class CheckpointPlan:
    """One checkpoint's parameters (``params``, for every statement of every path)
    and what the context and the receipt learn once it committed."""

    tenant_id: str
    task_id: str
    agent_name: str
    status: str
    doc: CheckpointDict
    context: dict[str, Any]
    params: dict[str, Any]
    event_count: int
    context_bytes: int
    compressed: bool
    planned: PlannedRecord | None
    history: HistoryOptions
    compress_threshold: int
    max_inflate: int

    def with_head(self, head: HistoryHead) -> CheckpointPlan:
        """The same checkpoint, its record chained to ``head`` instead (the id of an
        ended task whose end was forgotten, started again: its history goes on)."""
        planned = self._record(head)
        return replace(self, planned=planned,
                       params={**self.params, **record_params(planned)})

    def _record(self, head: HistoryHead | None) -> PlannedRecord:
        return plan_record(
            tenant_id=self.tenant_id, task_id=self.task_id, agent_name=self.agent_name,
            status=self.status, phase=None, doc=self.doc,
            context_sha256=self.params["p_sha256"], session_event_count=self.event_count,
            head=head, now=self.params["p_now"], options=self.history,
            compress_threshold=self.compress_threshold, max_inflate=self.max_inflate,
            snapshot_context=self.context)

    def committed(self, ctx: TaskExecutionContext, version: int) -> CheckpointReceipt:
        """Tell ``ctx`` what is stored now, and the receipt."""
        ctx.session_events_persisted = self.event_count
        if self.planned is not None:
            ctx.history_head = self.planned.head(
                self.planned.document["metrics"]["tokens"]["total"])
        return CheckpointReceipt(
            task_id=ctx.task_id, version=version,
            sub_task_deadlines={sub["sub_task_id"]: sub["timeout_deadline"]
                                for sub in self.params["p_subs"]},
            events_appended=len(self.params["p_events"]), context_bytes=self.context_bytes,
            compressed=self.compressed)


def plan_checkpoint(ctx: TaskExecutionContext, agent_name: str, *, keys: dict[str, Any],
                    status: str, default_timeout_s: float, expires_at: float | None,
                    lease_owner: str | None, holder: str | None, hold_lease_s: float,
                    now: float, history: HistoryOptions, sealer: Sealer,
                    compress_threshold: int, max_inflate: int) -> CheckpointPlan:
    """Plan a checkpoint of ``ctx`` (see the module docstring); ``keys`` are the
    store's (its tenant), ``sealer`` its encryption of columns."""
    check_id("agent_name", agent_name)
    check_checkpoint_args(status, default_timeout_s, lease_owner, holder, hold_lease_s)
    doc = ctx.checkpoint_delta()  # validates and copies before any I/O
    subs, invocations = plan_join(doc, status, default_timeout_s)
    new_events = doc["session_events"]
    first_new = doc["session_events_persisted"]
    event_count = first_new + len(new_events)
    if lease_owner is None and first_new != 0:
        raise InvalidArgumentError(
            f"task {ctx.task_id!r} is checkpointed for the first time but its context "
            f"says {first_new} events are already stored: a resumed task is checkpointed "
            "again with lease_owner=, by the holder of its resume lease")
    context = {k: v for k, v in doc.items() if k not in SPLIT_KEYS}
    task_id = ctx.task_id
    if history.encryption is not None:
        seal_context(history.encryption, context, keys["p_tenant"], task_id)
    # Encoded once, sealed where the store encrypts (store/sealing.py): every path
    # writes these values as they are.
    encoded = encode_context(context, sealer, task_id, compress_threshold, max_inflate)
    # One set of parameters for every statement of either path; the sub-tasks,
    # invocations and new events also travel as JSON arrays (for fast paths).
    params = {
        **keys, "p_task": task_id, "p_agent": agent_name, "p_status": status,
        "p_owner": lease_owner, "p_invocation": doc["current_invocation_id"],
        "p_context": encoded.blob, "p_encoding": encoded.encoding,
        "p_sha256": encoded.sha256, "p_event_count": event_count,
        "p_now": now, "p_expires_at": expires_at,
        "p_events": sealer.seal("conversation", new_events, CONVERSATION, task=task_id,
                                seq=str(first_new)) if new_events else new_events,
        "p_first": first_new, "p_holder": holder,
        "p_hold_until": None if holder is None else now + hold_lease_s,
        "p_has_events": bool(new_events),
        "p_subs": [{"sub_task_id": sub_task_id, "invocation_id": corr["invocation_id"],
                    "function_call_id": corr["function_call_id"],
                    "peer_agent_name": corr.get("peer_agent_name"),
                    "peer_task_id": corr.get("peer_task_id"),
                    "correlation_data": sealer.seal("calls", corr, CORRELATION,
                                                    task=task_id, sub_task=sub_task_id),
                    "timeout_s": timeout_s,
                    "timeout_deadline": now + min(timeout_s, _announce_check(corr, timeout_s))}
                   for sub_task_id, corr, timeout_s in subs],
        "p_invs": [{"invocation_id": inv, "total_expected": calls.total,
                    "completed_count": calls.completed, "call_order": calls.call_order,
                    "results": sealer.seal("calls", calls.results, RESULTS, task=task_id,
                                           invocation=inv)}
                   for inv, calls in invocations.items()]}
    plan = CheckpointPlan(
        tenant_id=keys["p_tenant"], task_id=task_id, agent_name=agent_name,
        status=status, doc=doc, context=context, params=params, event_count=event_count,
        context_bytes=len(encoded.blob), compressed=encoded.compressed, planned=None,
        history=history, compress_threshold=compress_threshold, max_inflate=max_inflate)
    if not history.enabled:
        return replace(plan, params={**params, **record_params(None)})
    # A first checkpoint starts a chain; a resumed task's goes on from its head.
    planned = plan._record(None if lease_owner is None else ctx.history_head)
    return replace(plan, planned=planned, params={**params, **record_params(planned)})


# -- the portable body's steps -------------------------------------------------------------

def rewrite_task(conn: Connection, params: dict[str, Any]) -> int:
    """A re-checkpoint's task row, and the removal of its finished join."""
    row = q.RECHECKPOINT_TASK.first(conn, params)
    if row is None:
        _explain_refused_recheckpoint(conn, params)
    # Only a task whose join completed is rewritten: an answer arriving while the
    # lease is held would otherwise be erased by the rewrite.
    if q.COUNT_OPEN_SUB_TASKS.scalar(conn, params):
        raise CheckpointConflictError(
            f"task {params['p_task']!r} still waits on peer sub-tasks; it can be "
            "checkpointed again only after its join completed")
    q.DELETE_TASK_SUB_TASKS.rows(conn, params)
    q.DELETE_TASK_INVOCATIONS.rows(conn, params)
    return int(row.version)


def insert_children(conn: Connection, params: dict[str, Any]) -> None:
    """Insert a checkpoint's sub-tasks, invocations and new events (portable body)."""
    if params["p_subs"]:
        q.INSERT_SUB_TASK.execute_many(conn, [{**params, **sub} for sub in params["p_subs"]])
    if params["p_invs"]:
        q.INSERT_INVOCATION.execute_many(conn, [{**params, **inv} for inv in params["p_invs"]])
    if params["p_has_events"]:
        q.APPEND_EVENTS.rows(conn, params)


def _explain_refused_recheckpoint(conn: Connection, params: dict[str, Any]) -> NoReturn:
    task_id, owner = params["p_task"], params["p_owner"]
    state = q.TASK_STATE.first(conn, params)
    if state is None:
        raise UnknownTaskError(task_id)
    check_agent(f"task {task_id!r}", state.agent_name, params["p_agent"])
    if state.owner != owner:
        raise LeaseNotHeldError(task_id, owner)
    raise CheckpointConflictError(
        f"task {task_id!r} has {state.session_event_count} stored conversation events "
        f"but the context says {params['p_first']}: checkpoint the context restored "
        "from the store, whose conversation only grows")


def _announce_check(correlation: dict[str, Any], timeout_s: float) -> float:
    """When the sub-task's announcement is checked (``announce_check_s`` in its
    correlation data: the request is published again then if the peer has said
    nothing, see ``Store.check_announcements``); its timeout if never."""
    check = correlation.get("announce_check_s")
    if isinstance(check, int | float) and not isinstance(check, bool) \
            and 0 < check < timeout_s - 0.001:  # queries.ANNOUNCE_CHECK's margin
        return float(check)
    return timeout_s
