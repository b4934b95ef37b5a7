"""Restores verified against the checkpoint history (docs/history.md, "Restores never
continue from unverified state"): a task is never resumed from state that fails
verification.

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
raises :class:`~meshpoint.errors.HistoryIntegrityError` naming the bad record.

A holder of the lease that cannot sign (no active signing key) meeting a signed
chain, or any chain where its store requires signatures, raises
:class:`~meshpoint.errors.KeyMissingError` before it judges or writes anything: every
one of its outcomes (the task's next checkpoint, a rewind's record) would be an
unsigned record that every verifier rejects, and a task it blocked would be a healthy
task taken from the instances that can sign. The task is left for one of them.
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
from meshpoint.compression import DEFAULT_MAX_DECOMPRESSED_BYTES
from meshpoint.errors import (
    CorruptCheckpointError,
    HistoryIntegrityError,
    KeyMissingError,
    LeaseNotHeldError,
    TaskBlockedError,
    UnknownTaskError,
    UnreadableValueError,
)
from meshpoint.history.encryption import is_envelope
from meshpoint.history.planning import (
    HistoryHead,
    HistoryOptions,
    PlannedRecord,
    encryption_keys,
    plan_record,
    seal_context,
    sound_annotations,
)
from meshpoint.history.verification import (
    StoredRecord,
    checked_snapshot,
    verify_chain,
    verify_head,
    verify_record,
)
from meshpoint.store import event_queries as eq
from meshpoint.store import history_queries as hq
from meshpoint.store import queries as q
from meshpoint.store.checkpoints import SPLIT_KEYS
from meshpoint.store.history_chain import (
    head_of,
    read_chain,
    record_params,
    stored_head,
    stored_head_of,
    stored_record,
    write_record,
)
from meshpoint.store.results import RestoredTask
from meshpoint.store.rows import (
    HeadRow,
    RecordRow,
    RestoreRows,
    TaskRow,
    encode_context,
    join_events,
    restored,
)
from meshpoint.store.sealing import CONVERSATION, RESULTS, Sealer, seal_event_row

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
    #: The store's encryption of its columns: rows are opened and written with it.
    sealer: Sealer
    clock: Callable[[], float] = time.time
    compress_threshold: int = 16_384
    #: The store's max_decompressed_bytes: no context or snapshot inflates past it.
    max_inflate: int = DEFAULT_MAX_DECOMPRESSED_BYTES

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
            # checkpointed without a history
            return restored(task_id, rows, lease_owner, self.sealer,
                            max_inflate=self.max_inflate)
        if lease_owner is not None:
            self._check_can_sign(task_id, rows)
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
                    result = restored(task_id, rows, lease_owner, self.sealer,
                                      max_inflate=self.max_inflate)
                except UnreadableValueError as error:
                    if self.sealer.keys is None:
                        # This process was given no key ring: a configuration error,
                        # nothing changed, the task left for an instance that has one.
                        raise
                    live_problem = str(error)
                except CorruptCheckpointError as error:
                    live_problem = str(error)
                else:
                    result.context.history_head = head_of(latest, rows.head)
                    return result
            try:
                return await self._repair(task_id, rows, latest, live_problem, lease_owner)
            except HistoryIntegrityError as error:  # its snapshot failed too: walk the chain
                return await self._fall_back(
                    task_id, rows, f"{live_problem}; and its last record: {error.reason}",
                    lease_owner, intact_is_news=False)
        return await self._fall_back(task_id, rows, why, lease_owner)

    def _check_can_sign(self, task_id: str, rows: RestoreRows) -> None:
        why = missing_signing_key(self.options, task_id, rows.head, rows.latest)
        if why is not None:
            raise why

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
            result = restored(task_id, rows._replace(task=fixed), lease_owner, self.sealer,
                              max_inflate=self.max_inflate)
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
            raw, why = checked_snapshot(read, max_inflate=self.max_inflate)
            if raw is None:
                raise ValueError(why or "the record has no snapshot")
            snapshot = orjson.loads(raw)
            if is_envelope(snapshot):  # encrypted whole (store/sealing.py, "snapshots")
                snapshot = encryption_keys(self.options).decrypt(
                    snapshot, tenant=self.tenant_id,
                    aad={"task": record.task_id, "record": record.checkpoint_id,
                         "field": "snapshot"})
            if not isinstance(snapshot, dict) or not isinstance(snapshot.get("context"), dict):
                raise ValueError("the snapshot is not a task's state")
        except (ValueError, KeyMissingError) as error:
            # KeyMissingError: its key was shredded; the snapshot is as good as lost.
            raise HistoryIntegrityError(
                f"its snapshot: {error}", task_id=record.task_id,
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
        # Columns outside the hash decide nothing here: a walk for a restore skips them.
        report = verify_chain(task_id, stored, None if head is None else stored_head(head),
                              self.options, snapshots=True, columns=False,
                              max_inflate=self.max_inflate)
        if report.ok and intact_is_news:  # the last record changed meanwhile: retry
            raise HistoryIntegrityError(f"{why} (but the chain now verifies: restore again)",
                                        task_id=task_id)
        if report.ok:
            return await self._block(task_id, rows, why, lease_owner)
        if lease_owner is None:
            raise HistoryIntegrityError(report.reason or why, task_id=task_id,
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
        events = join_events(task_id, rows.events, self.sealer)[:count]
        doc = {**context, "active_peer_sub_tasks": {}, "parallel_tool_calls": invocations,
               "session_events": events, "session_events_persisted": count}
        encoded = encode_context(context, self.sealer, task_id, self.compress_threshold,
                                 self.max_inflate)
        sha = encoded.sha256
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
            compress_threshold=self.compress_threshold, snapshot_context=context,
            max_inflate=self.max_inflate)
        params = self._keys(
            p_task=task_id, p_agent=task.agent_name, p_owner=lease_owner, p_now=now,
            p_context=encoded.blob, p_encoding=encoded.encoding, p_sha256=sha,
            p_event_count=count, p_invocation=context.get("current_invocation_id"),
            p_first=count, **record_params(planned))

        def body(conn: Connection) -> None:
            if not q.REWIND_TASK.rowcount(conn, params):
                raise LeaseNotHeldError(task_id, lease_owner)
            for statement in (q.DELETE_TASK_SUB_TASKS, q.DELETE_TASK_INVOCATIONS,
                              q.DELETE_EVENTS_FROM):
                statement.rows(conn, params)
            q.INSERT_INVOCATION.execute_many(conn, [
                {**params, "invocation_id": inv, "total_expected": len(c["call_order"]),
                 "completed_count": len(c["results"]), "call_order": c["call_order"],
                 "results": self.sealer.seal("calls", c["results"], RESULTS, task=task_id,
                                             invocation=inv)}
                for inv, c in invocations.items()])
            write_record(conn, params)
            eq.INSERT_EVENT.rows(conn, self._event(params, task_id, task.agent_name,
                                              "integrity_rewound", {
                                                  "problem": problem, "failed": bad_id,
                                                  "rewound_to": good.checkpoint_id}, now))

        await self.write(f"rewinding task {task_id!r}", body)
        rewound = await self.read(f"restoring task {task_id!r}", lambda conn: RestoreRows(
            q.GET_TASK.first(conn, params), q.GET_EVENTS.rows(conn, params),
            q.GET_INVOCATIONS.rows(conn, params), q.GET_TASK_SUB_TASKS.rows(conn, params)))
        result = restored(task_id, rewound, lease_owner, self.sealer,
                          max_inflate=self.max_inflate)
        result.context.history_head = planned.head(planned.document["metrics"]["tokens"]["total"])
        return result

    async def restart(self, ctx: Any, agent_name: str, lease_owner: str,
                      reason: str) -> None:
        """Make ``ctx`` (a fresh context: a reconstruction's prompt, say) the live state
        of its task, for the holder of its lease: the conversation, joins and items
        replaced, the task ``resuming`` under that lease, and a record (``restarted``,
        chained to the stored head, the bad records kept as evidence) and an
        ``integrity_restarted`` event that say why."""
        await self.fresh(ctx, agent_name, lease_owner, phase="restarted",
                         extensions={"restarted": reason}, event_type="integrity_restarted",
                         event_data={"reason": reason})

    async def fresh(self, ctx: Any, agent_name: str, lease_owner: str, *, phase: str,
                    extensions: dict[str, Any], event_type: str,
                    event_data: dict[str, Any]) -> None:
        """Make ``ctx``, a fresh context, the live state of its task for the holder of
        its lease (see :meth:`restart`; a handoff's next iteration starts so too): a
        record in ``phase`` with ``extensions``, and an event ``event_type`` with
        ``event_data``, in the same transaction. LeaseNotHeldError unless
        ``lease_owner`` holds the lease."""
        task_id = ctx.task_id
        doc = ctx.to_checkpoint_dict()
        context = {k: v for k, v in doc.items() if k not in SPLIT_KEYS}
        if self.options.encryption is not None:
            seal_context(self.options.encryption, context, self.tenant_id, task_id)
        encoded = encode_context(context, self.sealer, task_id, self.compress_threshold,
                                 self.max_inflate)
        sha = encoded.sha256
        events = doc["session_events"]
        now = self.clock()
        keys = self._keys(p_task=task_id)

        def body(conn: Connection) -> PlannedRecord | None:
            head = stored_head_of(conn, keys)
            row = hq.GET_HEAD.first(conn, keys)
            if head is None and row is not None:  # the head's record is gone
                head = HistoryHead(str(row.head_id), row.head_hash, row.records, {},
                                   row.pruned_through, row.pruned_hash,
                                   signed=row.signature is not None)
            planned = plan_record(
                tenant_id=self.tenant_id, task_id=task_id, agent_name=agent_name,
                status="resuming", phase=phase, doc={
                    **doc, "history": {**(doc.get("history") or {}), "record": {
                        **((doc.get("history") or {}).get("record") or {}),
                        "extensions": extensions}}},
                context_sha256=sha, session_event_count=len(events), head=head, now=now,
                options=self.options, compress_threshold=self.compress_threshold,
                snapshot_context=context, max_inflate=self.max_inflate,
            ) if self.options.enabled else None
            params = self._keys(
                p_task=task_id, p_agent=agent_name, p_owner=lease_owner, p_now=now,
                p_context=encoded.blob, p_encoding=encoded.encoding, p_sha256=sha,
                p_event_count=len(events), p_invocation=None, p_first=0,
                p_events=self.sealer.seal("conversation", events, CONVERSATION,
                                          task=task_id, seq="0"),
                p_has_events=bool(events), **record_params(planned))
            if not q.REWIND_TASK.rowcount(conn, params):
                raise LeaseNotHeldError(task_id, lease_owner)
            for statement in (q.DELETE_TASK_SUB_TASKS, q.DELETE_TASK_INVOCATIONS,
                              q.DELETE_EVENTS_FROM):
                statement.rows(conn, params)
            q.APPEND_EVENTS.rows(conn, params)
            write_record(conn, params)
            eq.INSERT_EVENT.rows(conn, self._event(params, task_id, agent_name,
                                                   event_type, event_data, now))
            return planned

        planned = await self.write(f"starting task {task_id!r} afresh ({phase})", body)
        ctx.session_events_persisted = len(events)
        if planned is not None:
            ctx.history_head = planned.head(planned.document["metrics"]["tokens"]["total"])

    async def _block(self, task_id: str, rows: RestoreRows, problem: str,
                     lease_owner: str | None) -> RestoredTask:
        task = rows.task
        assert task is not None
        if lease_owner is None:
            raise HistoryIntegrityError(problem, task_id=task_id)
        now = self.clock()
        params = self._keys(p_task=task_id, p_owner=lease_owner, p_now=now)

        def body(conn: Connection) -> None:
            if not q.BLOCK_TASK.rowcount(conn, params):
                raise LeaseNotHeldError(task_id, lease_owner)
            eq.INSERT_EVENT.rows(conn, self._event(params, task_id, task.agent_name,
                                                   "integrity_blocked", {"problem": problem},
                                                   now))

        await self.write(f"blocking task {task_id!r}", body)
        raise TaskBlockedError(task_id, problem,
                               a2a_context=a2a_context(task, self.sealer, self.max_inflate))

    async def _log(self, task_id: str, agent: str, kind: str, detail: dict[str, Any]) -> None:
        now = self.clock()
        params = self._keys(p_task=task_id)
        await self.write(f"logging {kind} of task {task_id!r}", lambda conn: (
            eq.INSERT_EVENT.rows(conn, self._event(params, task_id, agent, kind, detail,
                                                   now))))

    def _event(self, params: dict[str, Any], task_id: str, agent: str, kind: str,
               detail: dict[str, Any], now: float) -> dict[str, Any]:
        """The parameters of an event-log row saying what happened to the task, its
        payload sealed as the event log seals it; in clear if the tenant has no key
        left to seal with (its keys shredded: the task is blocked all the same, and
        the payload is the store's own account, ids and reasons, not content)."""
        from meshpoint.history.planning import new_checkpoint_id

        row = {**params, "p_event_id": new_checkpoint_id(), "p_agent": agent,
               "p_task": task_id, "p_event_type": kind, "p_step": None, "p_input": None,
               "p_output": detail, "p_state": None,
               "p_at_us": round(now * 1_000_000)}  # the store's clock
        try:
            return seal_event_row(self.sealer, row)
        except KeyMissingError:
            return row


def missing_signing_key(options: HistoryOptions, task_id: str, head: HeadRow | None,
                        latest: RecordRow | None) -> KeyMissingError | None:
    """The KeyMissingError of a lease holder that must sign what it writes next and
    cannot (see the module docstring), or None. Read from the head's and the last
    record's signature columns: one a forger set to NULL makes the chain fail
    verification wherever the key is held."""
    if not options.enabled or options.signing.signs or (head is None and latest is None):
        return None
    signed = any(row is not None and row.signature is not None for row in (head, latest))
    if not (signed or options.signatures_required):
        return None
    return KeyMissingError(
        f"task {task_id!r}: its history is " + ("signed" if signed else "required to be "
                                                "signed")
        + ", and this store has no active signing key (history.signing.active) to sign "
        "what resuming or ending it writes: nothing was written, and the task is left "
        "for an instance configured with the signing key")


def _parent_head(head: Any, good: StoredRecord) -> Any:
    """The head a rewind's record chains to: the stored head (the chain goes on from
    where it ends, bad records and all, as evidence), with the tokens and cost of
    ``good``."""
    from meshpoint.history.planning import HistoryHead

    spent = head_of(good)
    return HistoryHead(str(head.head_id), head.head_hash, head.records, spent.tokens,
                       head.pruned_through, head.pruned_hash,
                       signed=head.signature is not None or good.signature is not None,
                       cost=spent.cost)


def a2a_context(task: TaskRow, sealer: Sealer, max_inflate: int) -> dict[str, Any]:
    """The task's addressing from its live row, if that still decodes (to tell its
    caller it is blocked); empty otherwise."""
    from meshpoint.store.rows import decode_context

    try:
        value = decode_context(task, sealer, max_inflate=max_inflate).get("a2a_context")
    except CorruptCheckpointError:
        return {}
    return value if isinstance(value, dict) else {}
