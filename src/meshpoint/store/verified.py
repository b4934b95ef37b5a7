"""Restores verified against the checkpoint history (DESIGN.md invariant 9): a task is
never resumed from state that fails verification.

A restore reads the task's live rows with its history head and last record. The
record must verify (content hash, signature, the signed head naming it), and the
live row must be the state that record describes (its context's hash and event
count). Then:

* all holds: the task is restored, and its context learns its head;
* the record holds but the live row does not (its context was damaged or replaced):
  the task is restored from the snapshot stored with that record, the live
  children (answers recorded since) as they are; an ``integrity_repaired`` event
  says so;
* the record does not hold: the whole chain is walked. If it is intact up to a
  record that verifies (the chain is *corrupt* after it, not *broken*), the holder
  of the task's lease rewinds the task to that record: its snapshot becomes the live
  state, the calls it was waiting on are resolved as lost (their answers went with
  the records that failed), and a new record, linked to the stored head, says so
  (``integrity_rewound``). The task resumes from there at once;
* otherwise (a record missing, out of order or another tenant's, the tail cut off,
  or no record verifies) the holder marks the task ``blocked`` for an operator, logs
  ``integrity_blocked`` and raises :class:`~meshpoint.errors.TaskBlockedError`.

Without a lease (a read: ``meshpoint tasks show``) nothing is changed: a failure
raises :class:`~meshpoint.errors.IntegrityError` naming the bad record.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Any

import orjson
from sqlalchemy import Connection

from meshpoint import _json
from meshpoint.errors import (
    CorruptCheckpointError,
    IntegrityError,
    LeaseNotHeldError,
    TaskBlockedError,
    UnknownTaskError,
)
from meshpoint.history import (
    HistoryHead,
    HistoryOptions,
    PlannedRecord,
    plan_record,
    seal_context,
    sound_annotations,
)
from meshpoint.store import event_queries as eq
from meshpoint.store import history_queries as hq
from meshpoint.store import queries as q
from meshpoint.store.checkpoints import SPLIT_KEYS
from meshpoint.store.history import (
    head_of,
    read_chain,
    record_params,
    stored_head,
    stored_head_of,
    stored_record,
    write_record,
)
from meshpoint.store.records import RestoredTask
from meshpoint.store.rows import RestoreRows, TaskRow, join_events, restored
from meshpoint.verification import (
    StoredRecord,
    checked_snapshot,
    verify_chain,
    verify_head,
    verify_record,
)

#: The result a call gets when the answer it had was lost with a record that failed
#: verification (a rewind): the model sees the call failed and may make it again.
LOST_RESULT = {"status": "lost", "error": "the result of this call was lost: a later "
               "checkpoint of the task failed verification and the task was rewound to "
               "the checkpoint before it; make the call again if it is still needed"}


@dataclass(frozen=True)
class VerifiedRestore:
    """Restores checked against the history (see the module docstring)."""

    tenant_id: str
    options: HistoryOptions
    read: Callable[[str, Callable[[Connection], Any]], Awaitable[Any]]
    write: Callable[[str, Callable[[Connection], Any]], Awaitable[Any]]
    clock: Callable[[], float] = time.time
    compress_threshold: int = 16_384

    def _keys(self, **extra: Any) -> dict[str, Any]:
        return {"p_tenant": self.tenant_id, **extra}

    async def restore(self, task_id: str, rows: RestoreRows,
                      lease_owner: str | None) -> RestoredTask:
        task = rows.task
        if task is None:
            raise UnknownTaskError(task_id)
        if lease_owner is not None and task.owner != lease_owner:
            raise LeaseNotHeldError(task_id, lease_owner, task.status)
        if rows.head is None and rows.latest is None:
            return restored(task_id, rows, lease_owner)  # checkpointed without a history
        why = self._latest_problem(rows)
        if why is None:
            latest = stored_record(rows.latest)  # type: ignore[arg-type]
            recovery = latest.document.get("recovery") or {}
            live_problem: str | None = None
            if (task.context_sha256 != recovery.get("context_sha256")
                    or task.session_event_count != recovery.get("session_event_count")):
                live_problem = "the live row is not the state its last record describes"
            else:
                try:
                    result = restored(task_id, rows, lease_owner)
                except CorruptCheckpointError as error:
                    live_problem = str(error)
                else:
                    result.context.history_head = head_of(latest, rows.head)
                    return result
            try:
                return await self._repair(task_id, rows, latest, live_problem, lease_owner)
            except IntegrityError as error:  # its snapshot failed too: walk the chain
                return await self._fall_back(
                    task_id, rows, f"{live_problem}; and its last record: {error.reason}",
                    lease_owner, intact_is_news=False)
        return await self._fall_back(task_id, rows, why, lease_owner)

    # -- the last record ----------------------------------------------------------------

    def _latest_problem(self, rows: RestoreRows) -> str | None:
        """Why the task's last record cannot be trusted, or None."""
        if rows.head is None:
            return "it has records but no head"
        head = stored_head(rows.head)
        why = verify_head(head, self.options)
        if why is not None:
            return f"its head: {why}"
        if rows.latest is None:
            return f"its head names record {head.records}, which is not stored"
        latest = stored_record(rows.latest)
        if latest.seq != head.records or latest.hash != head.head_hash:
            return (f"its head names record {head.records}, the last stored does not "
                    "match it")
        return verify_record(latest, self.options)

    # -- repair: the record holds, the live row does not -----------------------------

    async def _repair(self, task_id: str, rows: RestoreRows, latest: StoredRecord,
                      problem: str, lease_owner: str | None) -> RestoredTask:
        snapshot = await self._snapshot(latest)
        context_raw = _json.dump_bytes(snapshot["context"])
        task = rows.task
        assert task is not None
        fixed = task._replace(context=context_raw, context_encoding="json",
                              context_sha256=hashlib.sha256(context_raw).hexdigest(),
                              session_event_count=snapshot["session_event_count"])
        try:
            result = restored(task_id, rows._replace(task=fixed), lease_owner)
        except CorruptCheckpointError as error:
            return await self._block(task_id, rows, f"{problem}; and {error}", lease_owner)
        result.context.history_head = head_of(latest, rows.head)
        if lease_owner is not None:
            await self._log(task_id, task.agent_name, "integrity_repaired", {
                "problem": problem, "restored_from": latest.checkpoint_id})
        return result

    async def _snapshot(self, record: StoredRecord) -> dict[str, Any]:
        """The verified snapshot stored with ``record``."""
        row = await self.read(f"reading the snapshot of {record.checkpoint_id}", lambda conn: (
            hq.GET_SNAPSHOT.first(conn, self._keys(p_rec_id=record.checkpoint_id))))
        read = replace(record, snapshot=None if row is None or row.snapshot is None
                       else bytes(row.snapshot),
                       snapshot_encoding=None if row is None else row.snapshot_encoding)
        try:
            raw, why = checked_snapshot(read)
            if raw is None:
                raise ValueError(why or "the record has no snapshot")
            snapshot = orjson.loads(raw)
            if "context" not in snapshot and "snapshot" in self.options.encrypt_fields:
                from meshpoint.history import encryption_keys

                snapshot = encryption_keys(self.options).decrypt(
                    snapshot, tenant=self.tenant_id,
                    aad={"task": record.task_id, "record": record.checkpoint_id,
                         "field": "snapshot"})
            if not isinstance(snapshot, dict) or not isinstance(snapshot.get("context"), dict):
                raise ValueError("the snapshot is not a task's state")
        except ValueError as error:
            raise IntegrityError(f"its snapshot: {error}", task_id=record.task_id,
                                 checkpoint_id=record.checkpoint_id, seq=record.seq) from None
        return dict(snapshot)

    # -- the last record fails: rewind or block ---------------------------------------

    async def _fall_back(self, task_id: str, rows: RestoreRows, why: str,
                         lease_owner: str | None, *, intact_is_news: bool = True
                         ) -> RestoredTask:
        """Walk the chain to rewind or block the task. ``intact_is_news``: the chain
        failed where the restore looked, so a walk that finds it intact means another
        writer changed it meanwhile (restore again); else (the live row and its last
        record's snapshot both failed) an intact chain has nothing to restore from."""
        keys = self._keys(p_task=task_id)

        stored, head = await self.read(f"verifying the history of task {task_id!r}",
                                       lambda conn: read_chain(conn, keys))
        report = verify_chain(task_id, stored, None if head is None else stored_head(head),
                              self.options, snapshots=True)
        if report.ok and intact_is_news:  # the last record changed meanwhile: retry
            raise IntegrityError(f"{why} (but the chain now verifies: restore again)",
                                 task_id=task_id)
        if report.ok:
            return await self._block(task_id, rows, why, lease_owner)
        if lease_owner is None:
            raise IntegrityError(report.reason or why, task_id=task_id,
                                 checkpoint_id=report.first_bad_id, seq=report.first_bad_seq)
        if report.kind == "corrupt" and report.last_good_seq >= 1:
            good = next(r for r in stored if r.seq == report.last_good_seq)
            return await self._rewind(task_id, rows, good, report.reason or why,
                                      report.first_bad_id, lease_owner)
        return await self._block(task_id, rows, report.reason or why, lease_owner)

    async def _rewind(self, task_id: str, rows: RestoreRows, good: StoredRecord, problem: str,
                      bad_id: str | None, lease_owner: str) -> RestoredTask:
        """Make ``good``'s snapshot the task's live state, its open calls lost, and
        record that in a new record linked to the stored head."""
        snapshot = await self._snapshot(good)
        task = rows.task
        assert task is not None and rows.head is not None
        context = dict(snapshot["context"])
        invocations: dict[str, dict[str, Any]] = {
            inv: {"call_order": list(calls.get("call_order") or []),
                  "results": dict(calls.get("results") or {})}
            for inv, calls in (snapshot.get("parallel_tool_calls") or {}).items()}
        for corr in (snapshot.get("active_peer_sub_tasks") or {}).values():
            calls = invocations.get(corr.get("invocation_id"))
            if calls is not None:
                calls["results"].setdefault(corr.get("function_call_id"), LOST_RESULT)
        count = int(snapshot["session_event_count"])
        events = join_events(task_id, rows.events)[:count]
        doc = {**context, "active_peer_sub_tasks": {}, "parallel_tool_calls": invocations,
               "session_events": events, "session_events_persisted": count}
        raw = _json.dump_bytes(context)
        sha = hashlib.sha256(raw).hexdigest()
        parent = stored_head(rows.head)
        now = self.clock()
        annotations = sound_annotations(context.get("history") or {},
                                        f"the rewind of task {task_id!r}")
        planned = plan_record(
            tenant_id=self.tenant_id, task_id=task_id, agent_name=task.agent_name,
            status="resuming", phase="rewound", doc={
                **doc, "history": {**annotations, "record": {
                    **(annotations.get("record") or {}),
                    "extensions": {"rewound_to": good.checkpoint_id, "failed": bad_id,
                                   "problem": problem}}}},
            context_sha256=sha, session_event_count=count,
            head=_parent_head(parent, good), now=now, options=self.options,
            compress_threshold=self.compress_threshold, snapshot_context=context)
        params = self._keys(
            p_task=task_id, p_agent=task.agent_name, p_owner=lease_owner, p_now=now,
            p_context=raw, p_encoding="json", p_sha256=sha, p_event_count=count,
            p_invocation=context.get("current_invocation_id"), p_first=count,
            **record_params(planned))

        def body(conn: Connection) -> None:
            if not q.REWIND_TASK.rowcount(conn, params):
                raise LeaseNotHeldError(task_id, lease_owner)
            for statement in (q.DELETE_TASK_SUB_TASKS, q.DELETE_TASK_INVOCATIONS,
                              q.DELETE_EVENTS_FROM):
                statement.rows(conn, params)
            q.INSERT_INVOCATION.execute_many(conn, [
                {**params, "invocation_id": inv, "total_expected": len(c["call_order"]),
                 "completed_count": len(c["results"]), "call_order": c["call_order"],
                 "results": c["results"]} for inv, c in invocations.items()])
            write_record(conn, params)
            eq.INSERT_EVENT.rows(conn, _event(params, task_id, task.agent_name,
                                              "integrity_rewound", {
                                                  "problem": problem, "failed": bad_id,
                                                  "rewound_to": good.checkpoint_id}, now))

        await self.write(f"rewinding task {task_id!r}", body)
        rewound = await self.read(f"restoring task {task_id!r}", lambda conn: RestoreRows(
            q.GET_TASK.first(conn, params), q.GET_EVENTS.rows(conn, params),
            q.GET_INVOCATIONS.rows(conn, params), q.GET_TASK_SUB_TASKS.rows(conn, params)))
        result = restored(task_id, rewound, lease_owner)
        result.context.history_head = planned.head(planned.document["metrics"]["tokens"]["total"])
        return result

    async def restart(self, ctx: Any, agent_name: str, lease_owner: str,
                      reason: str) -> None:
        """Make ``ctx`` (a fresh context: a reconstruction's prompt, say) the live state
        of its task, for the holder of its lease: the conversation, joins and items
        replaced, the task ``resuming`` under that lease, and a record (``restarted``,
        chained to the stored head, the bad records kept as evidence) and an
        ``integrity_restarted`` event that say why."""
        task_id = ctx.task_id
        doc = ctx.to_checkpoint_dict()
        context = {k: v for k, v in doc.items() if k not in SPLIT_KEYS}
        if self.options.encryption is not None:
            seal_context(self.options.encryption, context, self.tenant_id, task_id)
        raw = _json.dump_bytes(context)
        sha = hashlib.sha256(raw).hexdigest()
        events = doc["session_events"]
        now = self.clock()
        keys = self._keys(p_task=task_id)

        def body(conn: Connection) -> PlannedRecord | None:
            head = stored_head_of(conn, keys)
            row = hq.GET_HEAD.first(conn, keys)
            if head is None and row is not None:  # the head's record is gone
                head = HistoryHead(str(row.head_id), row.head_hash, row.records, {},
                                   row.pruned_through, row.pruned_hash)
            planned = plan_record(
                tenant_id=self.tenant_id, task_id=task_id, agent_name=agent_name,
                status="resuming", phase="restarted", doc={
                    **doc, "history": {**(doc.get("history") or {}), "record": {
                        "extensions": {"restarted": reason}}}},
                context_sha256=sha, session_event_count=len(events), head=head, now=now,
                options=self.options, compress_threshold=self.compress_threshold,
                snapshot_context=context) if self.options.enabled else None
            params = self._keys(
                p_task=task_id, p_agent=agent_name, p_owner=lease_owner, p_now=now,
                p_context=raw, p_encoding="json", p_sha256=sha, p_event_count=len(events),
                p_invocation=None, p_first=0, p_events=events, p_has_events=bool(events),
                **record_params(planned))
            if not q.REWIND_TASK.rowcount(conn, params):
                raise LeaseNotHeldError(task_id, lease_owner)
            for statement in (q.DELETE_TASK_SUB_TASKS, q.DELETE_TASK_INVOCATIONS,
                              q.DELETE_EVENTS_FROM):
                statement.rows(conn, params)
            q.APPEND_EVENTS.rows(conn, params)
            write_record(conn, params)
            eq.INSERT_EVENT.rows(conn, _event(params, task_id, agent_name,
                                              "integrity_restarted", {"reason": reason},
                                              now))
            return planned

        planned = await self.write(f"restarting task {task_id!r}", body)
        ctx.session_events_persisted = len(events)
        if planned is not None:
            ctx.history_head = planned.head(planned.document["metrics"]["tokens"]["total"])

    async def _block(self, task_id: str, rows: RestoreRows, problem: str,
                     lease_owner: str | None) -> RestoredTask:
        task = rows.task
        assert task is not None
        if lease_owner is None:
            raise IntegrityError(problem, task_id=task_id)
        now = self.clock()
        params = self._keys(p_task=task_id, p_owner=lease_owner, p_now=now)

        def body(conn: Connection) -> None:
            if not q.BLOCK_TASK.rowcount(conn, params):
                raise LeaseNotHeldError(task_id, lease_owner)
            eq.INSERT_EVENT.rows(conn, _event(params, task_id, task.agent_name,
                                              "integrity_blocked", {"problem": problem}, now))

        await self.write(f"blocking task {task_id!r}", body)
        raise TaskBlockedError(task_id, problem, a2a_context=_a2a_context(task))

    async def _log(self, task_id: str, agent: str, kind: str, detail: dict[str, Any]) -> None:
        now = self.clock()
        params = self._keys(p_task=task_id)
        await self.write(f"logging {kind} of task {task_id!r}", lambda conn: (
            eq.INSERT_EVENT.rows(conn, _event(params, task_id, agent, kind, detail, now))))


def _parent_head(head: Any, good: StoredRecord) -> Any:
    """The head a rewind's record chains to: the stored head (the chain goes on from
    where it ends, bad records and all, as evidence), with the tokens and cost of
    ``good``."""
    from meshpoint.history import HistoryHead

    spent = head_of(good)
    return HistoryHead(str(head.head_id), head.head_hash, head.records, spent.tokens,
                       head.pruned_through, head.pruned_hash, spent.cost)


def _event(params: dict[str, Any], task_id: str, agent: str, kind: str,
           detail: dict[str, Any], now: float) -> dict[str, Any]:
    from meshpoint.history import new_checkpoint_id

    return {**params, "p_event_id": new_checkpoint_id(), "p_agent": agent, "p_task": task_id,
            "p_event_type": kind, "p_step": None, "p_input": None, "p_output": detail,
            "p_state": None, "p_at_us": round(now * 1_000_000)}  # the store's clock


def _a2a_context(task: TaskRow) -> dict[str, Any]:
    """The task's addressing from its live row, if that still decodes (to tell its
    caller it is blocked); empty otherwise."""
    from meshpoint.store.rows import decode_context

    try:
        value = decode_context(task).get("a2a_context")
    except CorruptCheckpointError:
        return {}
    return value if isinstance(value, dict) else {}
