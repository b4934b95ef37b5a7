"""Moving paused tasks from the local SQLite store to the cloud (``meshpoint sync
--move-paused``, docs/sync.md *Moving a paused task*): the cloud's instances then
resume them, and at every moment exactly one side can.

A move is three transactions, each of one database, in this order:

1. **hold** (local): the task's resume lease is taken by ``meshpoint-move:<move id>``
   for ever (no local instance takes a held lease: no resume, recovery or cancel),
   its pending sub-tasks are set ``moving`` (no claim, timeout or announcement check
   takes them; an answer for one is handed back for redelivery, not dropped), and
   the ledger of moves records it ``leaving``. Only a task waiting on peers or for
   approval, that nobody holds, moves.
2. **copy** (cloud): under an advisory lock on the task, unless the cloud's ledger
   has this move ``arrived`` already: the task's rows (task, sub-tasks,
   invocations, conversation, as stored: ciphertexts stay ciphertexts) and its
   history chain (applied and verified as the sync applies chains) are inserted,
   with the cloud's ledger row ``arrived``, in one transaction of the tenant under
   row-level security. The task arrives resumable: lease free, sub-tasks pending.
3. **release** (local): the task's live rows are deleted (they are the move's: its
   lease), the task is remembered in the ledger of ended tasks (so a late copy of
   its request never starts it again here, and a late answer is dropped as late),
   and the ledger of moves records it ``moved``.

A crash between two steps leaves one owner: after 1, the local side, frozen; after
2, the cloud (the local rows are held for ever, no local instance can resume them).
Running the move again completes it: a ``leaving`` move goes on with its id; the
cloud's ``arrived`` row says whether its copy committed. Before step 1, the copy is
tried in a cloud transaction that is rolled back, so a move the cloud would refuse
(it holds the task, the chain does not verify there) is refused with nothing written.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Connection

from meshpoint.compression import DEFAULT_MAX_DECOMPRESSED_BYTES
from meshpoint.errors import InvalidArgumentError
from meshpoint.history.planning import new_checkpoint_id
from meshpoint.store import queries as q
from meshpoint.store.schema import paused_tasks, peer_sub_tasks
from meshpoint.sync import move_queries as mq
from meshpoint.sync import queries as sq
from meshpoint.sync.apply import Chain, apply_chains, as_row
from meshpoint.sync.push import Syncer

#: Who holds a task's lease while it leaves: this prefix and the move's id.
OWNER_PREFIX = "meshpoint-move:"
#: The hold's expiry: 9999-12-31T23:59:59Z, never (and still a date a listing shows).
FOREVER = 253402300799.0
#: The steps after which ``MESHPOINT_SYNC_MOVE_CRASH`` (a test's) kills the process.
STEPS = ("held", "copied", "released")
CRASH_ENV = "MESHPOINT_SYNC_MOVE_CRASH"
#: A move's outcomes, per task.
MOVED, ALREADY, WOULD, SKIPPED = "moved", "already moved", "would move", "skipped"


class MoveRefusedError(InvalidArgumentError):
    """A task named to move cannot move (unknown, not paused, held, of a kind that does
    not move); nothing was written."""


class _Refused(Exception):
    """The cloud would not take the task (raised inside its transaction)."""


@dataclass
class MoveReport:
    """What a move did (or, dry, would do) to one task."""

    task_id: str
    agent_name: str
    status: str
    outcome: str
    move_id: str | None = None
    reason: str | None = None
    peer_calls: int = 0  # pending, asked again by the cloud's instances
    approvals: int = 0  # pending, to decide in the cloud
    resolved: int = 0  # already answered, travelling with their results

    def as_json(self) -> dict[str, Any]:
        return {"task_id": self.task_id, "agent_name": self.agent_name,
                "status": self.status, "outcome": self.outcome, "move_id": self.move_id,
                "reason": self.reason, "peer_calls": self.peer_calls,
                "approvals": self.approvals, "resolved": self.resolved}


@dataclass
class _Local:
    """A task's local rows, as one read of the file had them."""

    task: dict[str, Any] | None
    sub_tasks: list[dict[str, Any]] = field(default_factory=list)
    invocations: list[dict[str, Any]] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    chain: Chain | None = None
    moves: list[dict[str, Any]] = field(default_factory=list)

    @property
    def leaving(self) -> dict[str, Any] | None:
        return next((m for m in self.moves if m["state"] == "leaving"), None)

    @property
    def moved(self) -> dict[str, Any] | None:
        return next((m for m in self.moves if m["state"] == "moved"), None)


def _why_not(rows: _Local, now: float) -> str | None:
    """Why a local task cannot move now, or None."""
    task = rows.task
    assert task is not None
    status = task["status"]
    if status == "handoff":
        return ("it is being handed to a fresh-context iteration (status handoff): move "
                "it once it waits on peers or for approval")
    if status in ("resuming", "working"):
        return (f"a turn of it is running or due (status {status}): move it once it "
                "waits on peers or for approval")
    if status == "blocked":
        return "it is blocked for an operator (meshpoint tasks show)"
    if status not in mq.MOVABLE:
        return f"its status {status!r} does not move"
    if task["owner"] is not None and (task["lease_expires_at"] or 0) > now:
        return f"{task['owner']!r} holds its lease (a cancel or a turn under way)"
    odd = [s for s in rows.sub_tasks if s["status"] in ("claimed", "quarantined")]
    if odd:
        return (f"sub-task {odd[0]['sub_task_id']!r} is {odd[0]['status']}: its result is "
                "not recorded (record it, or cancel the task)")
    return None


class Mover:
    """Moves paused tasks of ``syncer``'s local store to its cloud store (see the
    module docstring). ``destination`` is recorded in the local ledger (the cloud's
    URL as shown, without its password)."""

    def __init__(self, syncer: Syncer, destination: str, *,
                 clock: Callable[[], float] = time.time) -> None:
        self.syncer, self.destination, self.clock = syncer, destination, clock
        self.local, self.cloud, self.tenant = syncer.local, syncer.cloud, syncer.tenant
        crash = os.environ.get(CRASH_ENV)
        self.crash_at = crash if crash in STEPS else None

    # -- choosing ------------------------------------------------------------------------

    async def _read(self, task_id: str) -> _Local:
        keys = {"p_tenant": self.tenant, "p_task": task_id}

        def read(conn: Connection) -> _Local:
            row = mq.TASK_ROW.first(conn, keys)
            moves = [as_row(m) for m in mq.MOVES_OF_TASK.rows(conn, keys)]
            if row is None:
                return _Local(None, moves=moves)
            records = [as_row(r) for r in sq.CHAIN_ROWS.rows(conn, keys)]
            head = sq.HEAD_ROW.first(conn, keys)
            chain = (None if not records and head is None else
                     Chain(task_id, records, None if head is None else as_row(head)))
            return _Local(as_row(row),
                          [as_row(r) for r in mq.SUB_TASK_ROWS.rows(conn, keys)],
                          [as_row(r) for r in mq.INVOCATION_ROWS.rows(conn, keys)],
                          [as_row(r) for r in mq.EVENT_ROWS.rows(conn, keys)],
                          chain, moves)

        return await self.local.transaction(read, doing=f"reading task {task_id!r} to move")

    async def _chosen(self, task_ids: Sequence[str] | None) -> list[str]:
        """The tasks to look at: those named (each checked to be known here), or
        every paused task and every move left half-way."""
        keys = {"p_tenant": self.tenant}
        if task_ids is None:
            def every(conn: Connection) -> list[str]:
                ids = {r.logical_task_id for r in mq.PAUSED.rows(conn, keys)}
                return sorted(ids | {r.logical_task_id for r in mq.LEAVING.rows(conn, keys)})

            return await self.local.transaction(every)
        return list(dict.fromkeys(task_ids))

    # -- a run ---------------------------------------------------------------------------

    async def run(self, task_ids: Sequence[str] | None = None, *,
                  dry_run: bool = False) -> list[MoveReport]:
        """:meth:`plan`, then (unless ``dry_run``) :meth:`move`."""
        plans = await self.plan(task_ids)
        return [report for report, _ in plans] if dry_run else await self.move(plans)

    async def plan(self, task_ids: Sequence[str] | None = None
                   ) -> list[tuple[MoveReport, _Local]]:
        """What would move, writing nothing: the tasks named (None: every paused
        task, and every move left half-way). A task named that is unknown here or
        cannot move raises :class:`MoveRefusedError`; unnamed ones that cannot move
        are reported ``skipped`` with why."""
        named = task_ids is not None
        plans: list[tuple[MoveReport, _Local]] = []
        source = await self.syncer.source_id(create=False)
        for task_id in await self._chosen(task_ids):
            rows = await self._read(task_id)
            if rows.task is None and rows.moved is None and not named:
                continue  # it ended since it was listed
            report = self._plan(task_id, rows)
            if report.outcome == WOULD and rows.leaving is None:
                # Tried in a cloud transaction rolled back: a refusal costs nothing.
                why = await self._try(rows, source)
                if why is not None:
                    report.outcome, report.reason = SKIPPED, why
            if report.outcome == SKIPPED and named:
                raise MoveRefusedError(f"task {task_id!r} cannot move: {report.reason}; "
                                       "nothing was written")
            plans.append((report, rows))
        return plans

    async def move(self, plans: list[tuple[MoveReport, _Local]]) -> list[MoveReport]:
        """Move each task :meth:`plan` found movable; one that changed since (resumed,
        canceled) is reported ``skipped``, the others go on."""
        if any(report.outcome == WOULD for report, _ in plans):
            source = await self.syncer.source_id(create=True)
            assert source is not None
            for report, rows in plans:
                if report.outcome == WOULD:
                    try:
                        await self._move(report, rows, source)
                    except MoveRefusedError as refused:
                        report.outcome, report.reason = SKIPPED, str(refused)
        return [report for report, _ in plans]

    def _plan(self, task_id: str, rows: _Local) -> MoveReport:
        if rows.task is None:
            done = rows.moved
            if done is not None:
                when = datetime.fromtimestamp(done["finished_at"], UTC).isoformat(
                    timespec="seconds")
                return MoveReport(task_id, done["agent_name"], "moved", ALREADY,
                                  done["move_id"], f"moved to {done['destination']} at {when}")
            raise MoveRefusedError(
                f"the local store has no paused task {task_id!r} of tenant "
                f"{self.tenant!r}; nothing was written")
        task = rows.task
        report = MoveReport(task_id, task["agent_name"], task["status"], WOULD)
        for sub in rows.sub_tasks:
            if sub["status"] in ("pending", mq.MOVING):
                if sub["peer_agent_name"] is None:
                    report.approvals += 1
                else:
                    report.peer_calls += 1
            elif sub["status"] == "resolved":
                report.resolved += 1
        leaving = rows.leaving
        if leaving is not None:
            report.move_id, report.reason = leaving["move_id"], "a move left half-way"
            return report
        why = _why_not(rows, self.clock())
        if why is not None:
            report.outcome, report.reason = SKIPPED, why
        return report

    async def _try(self, rows: _Local, source: str | None) -> str | None:
        """Why the cloud would refuse the task's rows, from a copy in a transaction
        rolled back; None if it would take them."""
        class _Fine(Exception):
            pass

        def body(conn: Connection) -> None:
            self._copy(conn, rows, "(tried)", source or "(tried)")
            raise _Fine

        try:
            await self.cloud.transaction(body, write=True, doing="trying a move")
        except _Refused as refused:
            return str(refused)
        except _Fine:
            return None
        return None

    async def _move(self, report: MoveReport, rows: _Local, source: str) -> None:
        assert rows.task is not None
        task_id = report.task_id
        move_id = report.move_id or new_checkpoint_id()
        report.move_id = move_id
        if rows.leaving is None:
            await self._hold(task_id, rows.task["agent_name"], move_id)
            self._crash("held")
            rows = await self._read(task_id)  # as held: what travels
        try:
            await self.cloud.transaction(
                lambda conn: self._copy(conn, rows, move_id, source), write=True,
                doing=f"copying task {task_id!r} to the cloud")
        except _Refused as refused:
            await self._give_back(task_id, move_id)
            report.outcome, report.reason = SKIPPED, f"{refused} (it stays here)"
            return
        self._crash("copied")
        released = await self._release(task_id, move_id)
        self._crash("released")
        report.outcome = MOVED if released else ALREADY

    def _crash(self, step: str) -> None:
        if self.crash_at == step:  # a test's: the process dies here, as if killed
            os.kill(os.getpid(), signal.SIGKILL)

    # -- the steps -----------------------------------------------------------------------

    async def _hold(self, task_id: str, agent: str, move_id: str) -> None:
        keys = {"p_tenant": self.tenant, "p_task": task_id}

        def body(conn: Connection) -> None:
            now = self.clock()
            if mq.HOLD.first(conn, {**keys, "p_owner": OWNER_PREFIX + move_id,
                                    "p_until": FOREVER, "p_now": now}) is None:
                raise MoveRefusedError(f"task {task_id!r} changed meanwhile (resumed, "
                                       "canceled or held): nothing was written")
            odd = [s for s in mq.SUB_TASK_ROWS.rows(conn, keys)
                   if s.status in ("claimed", "quarantined")]
            if odd:
                raise MoveRefusedError(f"sub-task {odd[0].sub_task_id!r} of task "
                                       f"{task_id!r} is {odd[0].status}: nothing was written")
            mq.FREEZE.rowcount(conn, keys)
            mq.ADD.rowcount(conn, {**keys, "p_logical_task_id": task_id, "p_move_id": move_id,
                                   "p_agent_name": agent, "p_state": "leaving",
                                   "p_source_id": None, "p_destination": self.destination,
                                   "p_started_at": now, "p_finished_at": None})

        await self.local.transaction(body, write=True, doing=f"holding task {task_id!r}")

    def _copy(self, conn: Connection, rows: _Local, move_id: str, source: str) -> None:
        """Step 2, in the cloud's transaction: the task's rows and chain, and the
        ledger's ``arrived`` row; nothing if this move arrived already."""
        task = rows.task
        assert task is not None
        task_id = task["logical_task_id"]
        keys = {"p_tenant": self.tenant, "p_task": task_id}
        mq.LOCK.rows(conn, keys)
        if any(m.move_id == move_id and m.state == "arrived"
               for m in mq.MOVES_OF_TASK.rows(conn, keys)):
            return  # its copy committed before a crash: the local rows are to release
        if mq.TASK_ROW.first(conn, keys) is not None:
            raise _Refused(f"the cloud already has a paused task {task_id!r}")
        if mq.ENDED_ROW.first(conn, keys) is not None:
            raise _Refused(f"the cloud's ledger of ended tasks has task {task_id!r}")
        now = self.clock()
        if rows.chain is not None:
            done = apply_chains(conn, [rows.chain], tenant=self.tenant, source=source,
                                options=self.syncer.options, now=now,
                                max_inflate=DEFAULT_MAX_DECOMPRESSED_BYTES)
            if done.conflicts or done.quarantined:
                raise _Refused("its history chain " + (
                    "clashes with the cloud's records" if done.conflicts else
                    "does not verify in the cloud") + " (meshpoint sync reports why)")
        mq.PUT[paused_tasks.name].rowcount(conn, _params(
            {**task, "owner": None, "lease_expires_at": None, "recoveries": 0}))
        for sub in rows.sub_tasks:
            if sub["status"] in ("pending", mq.MOVING):
                sub = {**sub, "status": "pending"}
                if sub["peer_agent_name"] is not None:
                    # The cloud's broker never had the request: its instances ask the
                    # peer again at once (an announcement check due now) and its
                    # timeout runs from its arrival.
                    sub = {**sub, "created_at": now, "timeout_deadline": now}
            mq.PUT[peer_sub_tasks.name].rowcount(conn, _params(sub))
        for table, items in (("agent_parallel_invocations", rows.invocations),
                             ("agent_session_events", rows.events)):
            for item in items:
                mq.PUT[table].rowcount(conn, _params(item))
        mq.ADD.rowcount(conn, {**keys, "p_logical_task_id": task_id, "p_move_id": move_id,
                               "p_agent_name": task["agent_name"], "p_state": "arrived",
                               "p_source_id": source, "p_destination": None,
                               "p_started_at": now, "p_finished_at": now})

    async def _release(self, task_id: str, move_id: str) -> bool:
        """Step 3; False if another run of the same move did it first."""
        keys = {"p_tenant": self.tenant, "p_task": task_id,
                "p_owner": OWNER_PREFIX + move_id, "p_move": move_id}

        def body(conn: Connection) -> bool:
            for statement in (q.DELETE_TASK_SUB_TASKS, q.DELETE_TASK_INVOCATIONS,
                              q.DELETE_TASK_EVENTS):
                statement.rows(conn, keys)
            deleted = q.DELETE_TASK_OF_OWNER.first(conn, keys)
            if deleted is None:
                if any(m.move_id == move_id and m.state == "moved"
                       for m in mq.MOVES_OF_TASK.rows(conn, keys)):
                    return False  # another run of the same move released them first
                raise MoveRefusedError(
                    f"task {task_id!r} is no longer held by its move {move_id!r}: its "
                    "local rows were not released (the cloud has its copy)")
            now = self.clock()
            q.RECORD_ENDED.rows(conn, {**keys, "p_agent": deleted.agent_name, "p_now": now})
            mq.FINISH.rowcount(conn, {**keys, "p_now": now})
            return True

        return await self.local.transaction(
            body, write=True, doing=f"releasing the local rows of task {task_id!r}")

    async def _give_back(self, task_id: str, move_id: str) -> None:
        """The cloud refused the copy: the task is the local side's again."""
        keys = {"p_tenant": self.tenant, "p_task": task_id,
                "p_owner": OWNER_PREFIX + move_id, "p_move": move_id}

        def body(conn: Connection) -> None:
            mq.THAW.rowcount(conn, keys)
            q.RELEASE_LEASE.rows(conn, keys)
            mq.FORGET.rowcount(conn, keys)

        await self.local.transaction(body, write=True,
                                     doing=f"giving task {task_id!r} back to the local side")


def _params(row: dict[str, Any]) -> dict[str, Any]:
    return {("p_tenant" if k == "tenant_id" else f"p_{k}"): v for k, v in row.items()}
