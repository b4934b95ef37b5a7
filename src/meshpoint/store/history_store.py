"""The checkpoint history in the store: its operations
(:class:`HistoryStore`, reached as ``store.history``). Writing a record inside a
checkpoint's transaction, and reading a chain, is :mod:`meshpoint.store.history_chain`.

Records are immutable. Its write operations therefore append: an update is a
new record that amends an earlier one, a finalize a last record with the task's
outcome, a link a record naming another chain's record (and its hash). Every read
verifies what it returns before decoding it
(:func:`meshpoint.history.verification.verify_record`, and the links between the
records it returns), and raises :class:`~meshpoint.errors.HistoryIntegrityError` naming the
first bad record rather than return it.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import replace
from typing import Any, TypeVar

from sqlalchemy import Connection, exc

from meshpoint.compression import DEFAULT_MAX_DECOMPRESSED_BYTES
from meshpoint.errors import (
    CheckpointConflictError,
    HistoryIntegrityError,
    InvalidArgumentError,
    UnknownCheckpointError,
    UnknownHistoryError,
)
from meshpoint.history.integrity import head_message
from meshpoint.history.planning import (
    AGENT_SECTIONS,
    END_PHASES,
    MESHPOINT_FIELDS,
    HistoryOptions,
    plan_record,
)
from meshpoint.history.record import CheckpointRecord
from meshpoint.history.retention import Purge, candidate, plan_purge
from meshpoint.history.verification import (
    ChainReport,
    StoredRecord,
    record_model,
    said_outcome,
    verify_chain,
    verify_head,
    verify_record,
)
from meshpoint.store import history_queries as hq
from meshpoint.store import queries as q
from meshpoint.store.checks import check_id, check_limit, check_time_range
from meshpoint.store.engine import is_unique_violation
from meshpoint.store.history_chain import (
    HeadMovedError,
    head_of,
    read_chain,
    record_params,
    stored_head,
    stored_last,
    stored_record,
    write_record,
)
from meshpoint.store.rows import HeadRow, RecordRow

R = TypeVar("R")
#: Heads read per query by a purge.
_PAGE = 500
#: Tries of an append whose chain another writer moved meanwhile.
_APPEND_ATTEMPTS = 8


class HistoryStore:
    """The operations on one tenant's checkpoint history (see the module
    docstring). Built by :class:`~meshpoint.store.sqlstore.SqlStore`, which hands it the
    way to run a transaction; use it as ``store.history``."""

    def __init__(self, *, tenant_id: str, options: HistoryOptions,
                 read: Callable[[str, Callable[[Connection], Any]], Awaitable[Any]],
                 write: Callable[[str, Callable[[Connection], Any]], Awaitable[Any]],
                 clock: Callable[[], float] = time.time,
                 compress_threshold: int = 16_384,
                 max_inflate: int = DEFAULT_MAX_DECOMPRESSED_BYTES) -> None:
        self.tenant_id = tenant_id
        self.options = options
        self._read = read
        self._write = write
        self._clock = clock
        self._compress_threshold = compress_threshold
        self._max_inflate = max_inflate

    def _keys(self, **extra: Any) -> dict[str, Any]:
        return {"p_tenant": self.tenant_id, **extra}

    # -- reads ------------------------------------------------------------------------

    async def get_checkpoint(self, checkpoint_id: str) -> CheckpointRecord:
        """One record, verified (its content, signature and link to its parent)."""
        check_id("checkpoint_id", checkpoint_id, max_len=36)

        def body(conn: Connection) -> tuple[RecordRow | None, RecordRow | None, Any]:
            row = hq.GET_RECORD.first(conn, self._keys(p_rec_id=checkpoint_id))
            if row is None:
                return None, None, None
            keys = self._keys(p_task=row.logical_task_id)
            parent = hq.GET_RECORD_AT.first(conn, {**keys, "p_rec_seq": row.seq - 1}) \
                if row.seq > 1 else None
            return row, parent, hq.GET_HEAD.first(conn, keys)

        row, parent, head = await self._read(f"reading checkpoint {checkpoint_id!r}", body)
        if row is None:
            raise UnknownCheckpointError(checkpoint_id)
        record = stored_record(row)
        self._check(record, self._parent_hash(record, parent, head))
        return record_model(record, self.options)

    async def get_latest_checkpoint(self, task_id: str) -> CheckpointRecord | None:
        """The task's last record, verified against its signed head; None if the task
        has no history."""
        records = await self.get_checkpoint_history(task_id, limit=1)
        return records[0] if records else None

    async def get_checkpoint_history(self, task_id: str, limit: int = 100, *,
                                     keep_unreadable: bool = False
                                     ) -> list[CheckpointRecord]:
        """The task's newest ``limit`` records, newest first, each verified, linked to
        the next, and the newest matching the task's signed head. A field encrypted
        with a key this store does not hold raises KeyMissingError, or with
        ``keep_unreadable`` stays its envelope (see
        :func:`~meshpoint.history.verification.record_model`)."""
        check_id("task_id", task_id)
        check_limit(limit)
        keys = self._keys(p_task=task_id, p_limit=limit)

        def body(conn: Connection) -> tuple[list[RecordRow], HeadRow | None,
                                              RecordRow | None]:
            rows = hq.GET_HISTORY.rows(conn, keys)
            oldest = rows[-1] if rows else None
            parent = hq.GET_RECORD_AT.first(conn, {**keys, "p_rec_seq": oldest.seq - 1}) \
                if oldest is not None and oldest.seq > 1 else None
            return rows, hq.GET_HEAD.first(conn, keys), parent

        rows, head, parent = await self._read(f"reading the history of task {task_id!r}",
                                              body)
        if not rows and head is None:
            return []
        records = [stored_record(row) for row in reversed(rows)]  # oldest first
        if head is None:
            raise HistoryIntegrityError("it has records but no head", task_id=task_id)
        stored = stored_head(head)
        why = verify_head(stored, self.options)
        if why is not None:
            raise HistoryIntegrityError(f"its head: {why}", task_id=task_id)
        if records and records[-1].seq == head.records \
                and records[-1].hash != head.head_hash:
            self._check(records[-1], None)  # names what is wrong with it, if anything
            raise HistoryIntegrityError(f"record {head.records} is not the one its head names: it "
                                        "was replaced", task_id=task_id, seq=head.records)
        if not records or records[-1].seq != head.records:
            raise HistoryIntegrityError(
                f"its head says {head.records} records, the newest stored is record "
                f"{records[-1].seq if records else 0}: its tail was cut off or replaced",
                task_id=task_id)
        expected = self._parent_hash(records[0], parent, head)
        for record in records:
            self._check(record, expected)
            expected = record.hash
        return [record_model(r, self.options, keep_unreadable=keep_unreadable)
                for r in reversed(records)]

    async def get_checkpoints_by_agent(self, agent_id: str, *, since: float = 0.0,
                                       until: float | None = None,
                                       limit: int = 1000) -> list[CheckpointRecord]:
        """An agent's records written in ``[since, until)`` (epoch seconds), oldest
        first, each verified (content and signature)."""
        check_id("agent_id", agent_id)
        check_limit(limit)
        start, end = check_time_range(since, until)
        keys = self._keys(p_agent=agent_id, p_since=start, p_until=end, p_limit=limit)
        rows = await self._read(f"reading the history of agent {agent_id!r}",
                                lambda conn: hq.GET_BY_AGENT.rows(conn, keys))
        out = []
        for row in rows:
            record = stored_record(row)
            self._check(record, None)
            said = record.document["metadata"].get("agent_id")
            if said != agent_id:  # the column the query found it by was changed
                raise HistoryIntegrityError(
                    f"the record is stored under agent {agent_id!r} but says it is agent "
                    f"{said!r}'s", task_id=record.task_id,
                    checkpoint_id=record.checkpoint_id, seq=record.seq)
            out.append(record_model(record, self.options))
        return out

    async def verify_task(self, task_id: str) -> ChainReport:
        """Walk the task's whole chain against its head (see ChainReport)."""
        return (await self._walk(task_id))[1]

    async def last_verified(self, task_id: str) -> tuple[ChainReport, CheckpointRecord | None]:
        """The walk of the task's chain, and its newest record that verified with every
        record before it (None if none did): what a task can be rebuilt from."""
        records, report = await self._walk(task_id)
        good = next((r for r in records if r.seq == report.last_good_seq), None)
        return report, None if good is None else record_model(good, self.options)

    async def _walk(self, task_id: str) -> tuple[list[StoredRecord], ChainReport]:
        """The task's records (with their snapshots) and the walk of its chain;
        UnknownHistoryError if it has none."""
        check_id("task_id", task_id)
        keys = self._keys(p_task=task_id)
        records, head = await self._read(f"verifying the history of task {task_id!r}",
                                         lambda conn: read_chain(conn, keys))
        if not records and head is None:
            raise UnknownHistoryError(task_id)
        return records, verify_chain(task_id, records,
                                     None if head is None else stored_head(head),
                                     self.options, snapshots=True,
                                     max_inflate=self._max_inflate)

    async def task_ids(self, *, after: str = "", limit: int = 1000) -> list[str]:
        """The tenant's tasks that have a history, by id, after ``after`` (paging)."""
        check_limit(limit)
        return [row.logical_task_id for row in await self._heads(after, limit)]

    async def ended_tasks(self, *, agent_name: str | None = None,
                          limit: int = 100) -> list[HeadRow]:
        """The heads of the tenant's ended tasks (``outcome`` set), of ``agent_name``
        if given, the latest ended first: a task's end is in its history once its live
        rows are gone (``meshpoint tasks list --all``)."""
        check_limit(limit)
        if agent_name is not None:
            check_id("agent_name", agent_name)
        keys = self._keys(p_agent=agent_name or "", p_any_agent=agent_name is None,
                          p_limit=limit)
        return list(await self._read("listing the ended tasks", lambda conn: (
            hq.LIST_ENDED.rows(conn, keys))))

    async def headless_task_ids(self, *, after: str = "", limit: int = 1000) -> list[str]:
        """The tenant's tasks that have records but no head, by id, after ``after``
        (paging): chains :meth:`task_ids` does not list, whose head was deleted.
        :meth:`verify_task` reports each as broken."""
        check_limit(limit)
        keys = self._keys(p_after=after, p_limit=limit)
        rows = await self._read("listing the chains without a head", lambda conn: (
            hq.LIST_HEADLESS.rows(conn, keys)))
        return [row[0] for row in rows]

    async def _heads(self, after: str, limit: int) -> list[HeadRow]:
        keys = self._keys(p_after=after, p_limit=limit)
        return list(await self._read("listing the history heads", lambda conn: (
            hq.LIST_HEADS.rows(conn, keys))))

    # -- retention ------------------------------------------------------------------------

    async def purge(self, *, dry_run: bool = False,
                    progress: Callable[[int], None] | None = None) -> list[Purge]:
        """Remove what retention lets go, from the chains of tasks that ended (a live
        task's chain is never cut: its restore may need it). Per chain, its policy
        (:meth:`HistoryOptions.retention_of`): ``hold`` keeps everything,
        ``last:N`` the newest N records, ``days:N`` the records of the last N days.
        All of it is decided from what the records say, never from a column, and a
        chain is cut only if it verifies whole, by a process that can sign where it
        then starts (:mod:`meshpoint.history.retention`). The oldest records go; the
        head then says where the chain starts (re-signed), so the rest still
        verifies; a chain left empty goes with its head. With ``dry_run`` nothing is
        removed. Returns what was (or would be) purged, and each chain left alone
        with why (``skipped``); ``progress(n)`` is called after each chain."""
        now = self._clock()
        out: list[Purge] = []
        after = ""
        while True:
            heads = await self._heads(after, _PAGE)
            for head in heads:
                planned = await self._purge_plan(head, now)
                if planned is not None:
                    plan, read = planned
                    if not dry_run and plan.skipped is None:
                        plan = await self._purge(read, plan)
                    out.append(plan)
                if progress is not None:
                    progress(1)
            if len(heads) < _PAGE:
                return out
            after = heads[-1].logical_task_id

    async def _purge_plan(self, head: HeadRow, now: float) -> tuple[Purge, HeadRow] | None:
        """The purge of one chain, and its head as read with it; None if it keeps all.
        Its last record alone says whether it may lose any (most chains: live, kept,
        held); only then is it read whole, and verified."""
        keys = self._keys(p_task=head.logical_task_id)
        last = await self._read("reading a chain's last record", lambda conn: (
            hq.GET_RECORD_AT.first(conn, {**keys, "p_rec_seq": head.records})))
        if last is None or candidate(last.data, self.options) is None:
            return None  # (a head whose record is gone: `verify` reports it)
        records, row = await self._read(f"reading the chain of {head.logical_task_id!r}",
                                        lambda conn: read_chain(conn, keys))
        if row is None:
            return None  # purged meanwhile
        plan = plan_purge(head.logical_task_id, records, stored_head(row), self.options, now)
        return None if plan is None else (plan, row)

    async def _purge(self, head: HeadRow, plan: Purge) -> Purge:
        signature = key_id = None
        if not plan.whole and self.options.signing.signs:
            key_id, signature = self.options.signing.sign(head_message(
                self.tenant_id, head.logical_task_id, head.records, head.head_hash,
                plan.through, plan.through_hash))
        params = self._keys(p_task=head.logical_task_id, p_through=plan.through,
                            p_records=head.records, p_old_through=head.pruned_through,
                            p_pruned_hash=plan.through_hash, p_head_signature=signature,
                            p_head_key_id=key_id, p_now=self._clock())

        def body(conn: Connection) -> bool:
            moved = (hq.DELETE_HEAD if plan.whole else hq.PRUNE_HEAD).rowcount(conn, params)
            if moved:
                hq.DELETE_RECORDS_THROUGH.rowcount(conn, params)
            return bool(moved)

        done = await self._write(f"purging the history of {head.logical_task_id!r}", body)
        return plan if done else replace(plan, skipped="its chain changed meanwhile")

    # -- writes: appends ----------------------------------------------------------------

    async def create_checkpoint(self, task_id: str, agent_id: str,
                                state: Mapping[str, Any], *, phase: str | None = None
                                ) -> str:
        """Append a record of ``state`` (sections of the record: ``execution_state``,
        ``context_summary``, ``metrics``, ``recovery``, ``extensions``) to the task's
        chain, for history kept without the runtime; its checkpoint id."""
        return await self._append(task_id, agent_id, _sections(state, "state"), phase=phase)

    async def update_checkpoint(self, checkpoint_id: str, partial_state: Mapping[str, Any]
                                ) -> str:
        """Records are immutable: append a record that amends ``checkpoint_id`` with
        ``partial_state`` merged over its sections; the new record's id."""
        partial = _sections(partial_state, "partial_state")
        base = await self.get_checkpoint(checkpoint_id)
        document = base.model_dump(mode="json")
        state: dict[str, Any] = {}
        for section in AGENT_SECTIONS:
            # What the agent part of the amended record said (meshpoint's own fields
            # are filled anew), with the amendment over it.
            kept = {k: v for k, v in document.get(section, {}).items()
                    if k not in MESHPOINT_FIELDS[section]}
            state[section] = {**kept, **partial.get(section, {})}
        state["extensions"] = {**state["extensions"], "amends": checkpoint_id}
        return await self._append(base.metadata.task_id, base.metadata.agent_id, state,
                                  phase=state["execution_state"].get("phase"))

    async def finalize_checkpoint(self, checkpoint_id: str, status: str) -> str:
        """Append the task's last record, with its outcome ``status`` (completed,
        failed, canceled or expired), and mark its head ended; the new record's id."""
        if status not in END_PHASES:
            raise InvalidArgumentError(f"status must be one of {END_PHASES}, got {status!r}")
        base = await self.get_checkpoint(checkpoint_id)
        return await self._append(base.metadata.task_id, base.metadata.agent_id,
                                  {"extensions": {"finalizes": checkpoint_id}},
                                  phase=status, outcome=status)

    async def link_checkpoints(self, parent_id: str, child_id: str) -> str:
        """Record that ``child_id``'s chain continues ``parent_id``'s (a handoff to a
        fresh iteration): a record appended to the child's chain names the parent
        record and its hash, so the link is verifiable; the new record's id."""
        if parent_id == child_id:
            raise InvalidArgumentError(f"a record cannot be linked to itself ({parent_id!r})")
        parent = await self.get_checkpoint(parent_id)
        child = await self.get_checkpoint(child_id)
        return await self._append(child.metadata.task_id, child.metadata.agent_id, {
            "extensions": {"link": {"parent": parent_id, "parent_task": parent.metadata.task_id,
                                    "parent_hash": parent.compliance.hash,
                                    "child": child_id}}})

    async def _append(self, task_id: str, agent_id: str, state: dict[str, Any], *,
                      phase: str | None = None, outcome: str | None = None) -> str:
        check_id("task_id", task_id)
        check_id("agent_id", agent_id)
        if not self.options.enabled:
            raise InvalidArgumentError("this store keeps no history (HistoryOptions("
                                       "enabled=False))")
        said = phase or (state.get("execution_state") or {}).get("phase")
        if outcome is None and said in END_PHASES:
            raise InvalidArgumentError(
                f"phase {said!r} ends a chain: end it with finalize_checkpoint(id, "
                f"{said!r}), which also marks its head ended")
        keys = self._keys(p_task=task_id, p_agent=agent_id)

        def body(conn: Connection) -> str:
            if q.TASK_STATE.first(conn, keys) is not None:
                raise CheckpointConflictError(
                    f"task {task_id!r} is live (paused or running in the runtime): its "
                    "records are written by its checkpoints, and the agent adds to them "
                    "through ctx.history (docs/history.md); these appends are for "
                    "chains kept without the runtime")
            row, last = stored_last(conn, keys)
            ended = (row.outcome if row is not None else None) or (
                said_outcome(last.document) if last is not None else None)
            if ended is not None:
                raise CheckpointConflictError(
                    f"the history of task {task_id!r} was finalized ({ended}): an "
                    "ended chain takes no more records")
            if last is None and row is not None:
                raise HistoryIntegrityError("its head names a record that is not stored",
                                            task_id=task_id)
            head = None if last is None else head_of(last, row)
            now = self._clock()
            planned = plan_record(
                tenant_id=self.tenant_id, task_id=task_id, agent_name=agent_id,
                status=outcome or "recorded", phase=phase,
                doc={"history": {"record": state}}, context_sha256=None,
                session_event_count=0, head=head, now=now, options=self.options,
                compress_threshold=self._compress_threshold, snapshot_context=None)
            try:
                write_record(conn, {**keys, "p_now": now,
                                    **record_params(planned, outcome=outcome)})
            except exc.IntegrityError as error:
                if not is_unique_violation(error):
                    raise
                raise HeadMovedError("record n was taken by a concurrent append") from None
            return planned.checkpoint_id

        doing = f"appending to the history of task {task_id!r}"
        for attempt in range(_APPEND_ATTEMPTS):
            try:
                return str(await self._write(doing, body))
            except HeadMovedError:  # planned on a head that moved: plan it again
                await asyncio.sleep(random.uniform(0, 0.002 * (attempt + 1)))
        raise CheckpointConflictError(
            f"the history of task {task_id!r} moved under each of {_APPEND_ATTEMPTS} "
            "tries to append to it (other writers appending at the same time): append "
            "again")

    # -- helpers ------------------------------------------------------------------------

    def _parent_hash(self, record: StoredRecord, parent: RecordRow | None,
                     head: HeadRow | None) -> str | None:
        """The hash ``record`` must name as its parent: its stored parent's, the
        purge's anchor for the first record kept, or the empty genesis."""
        if record.seq == 1:
            return ""
        if head is not None and record.seq == head.pruned_through + 1:
            return head.pruned_hash
        if parent is None:
            raise HistoryIntegrityError(f"record {record.seq - 1}, its parent, is missing",
                                        task_id=record.task_id, checkpoint_id=record.checkpoint_id,
                                        seq=record.seq)
        return parent.hash

    def _check(self, record: StoredRecord, parent_hash: str | None) -> None:
        why = verify_record(record, self.options, parent_hash=parent_hash)
        if why is not None:
            raise HistoryIntegrityError(why, task_id=record.task_id,
                                        checkpoint_id=record.checkpoint_id, seq=record.seq)



def _sections(state: Any, name: str) -> dict[str, Any]:
    """``state``, an agent's sections of a record, as a dict of dicts;
    InvalidArgumentError naming what is wrong (each section's fields are checked when
    the record is planned: :func:`meshpoint.history.planning.agent_part`)."""
    if not isinstance(state, Mapping):
        raise InvalidArgumentError(f"{name} must be a dict of record sections "
                                   f"{AGENT_SECTIONS}, got {type(state).__name__}")
    unknown = sorted(map(str, set(state) - set(AGENT_SECTIONS)))
    if unknown:
        raise InvalidArgumentError(f"{name}: {', '.join(unknown)}: not a section an "
                                   f"agent fills {AGENT_SECTIONS}")
    for section, values in state.items():
        if not isinstance(values, Mapping):
            raise InvalidArgumentError(f"{name}[{section!r}] must be a dict, got "
                                       f"{type(values).__name__}")
    return {section: dict(values) for section, values in state.items()}
