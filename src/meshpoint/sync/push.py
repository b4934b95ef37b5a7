"""One sync pass: a local SQLite store's rows pushed to a cloud PostgreSQL store, table
by table, batch by batch, each batch applied in one cloud transaction that also moves
its cursor.

Exactly once. A batch is read from the source in one snapshot (rows after the cursor,
in rowid order: commit order, :mod:`meshpoint.sync.queries`), and applied in one cloud
transaction that first takes the source table's advisory lock and checks that the
cursor is still where the batch started, then applies the rows
(:mod:`meshpoint.sync.apply`) and moves the cursor to the batch's last row. A sync
killed anywhere has either committed the batch and its cursor or neither; the next
run starts from the cursor. Two syncs of one source wait for each other and the
second re-reads. Applying is idempotent too (a row the cloud has, the same, is
counted ``identical``), which makes the one case a cursor cannot follow safe: a purge
or prune on the source that removed the row at the cursor (SQLite then may give its
rowid to a new row). The cursor remembers that row's key; when it is gone or another
row holds its rowid, the table is read again from its start, and only what the cloud
lacks is applied.

The LangGraph saver's threads follow a cursor of their own, the change sequence the
saver's triggers keep (:mod:`meshpoint.sync.tables`): a thread changed again moves
past the cursor and is read again, whole (:mod:`meshpoint.sync.threads`). A file
whose sequence is behind the cursor (an older copy put back) is read again from its
start.

The tenant is the same on both sides: a history record's hash covers its tenant, and
an encrypted field is bound to it, so a record moved to another tenant would verify
and decrypt nowhere.
"""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from sqlalchemy import Connection

from meshpoint.compression import DEFAULT_MAX_DECOMPRESSED_BYTES
from meshpoint.errors import ConfigurationError
from meshpoint.history.planning import HistoryOptions, new_checkpoint_id
from meshpoint.store import SqlStore
from meshpoint.store.schema import checkpoints, ended_tasks, events
from meshpoint.sync import queries as sq
from meshpoint.sync.apply import (
    Applied,
    Chain,
    apply_chains,
    apply_ended,
    apply_events,
    as_row,
)
from meshpoint.sync.threads import THREADS, Thread, apply_threads, read_thread

#: The tables that travel, in the order a pass pushes them (the LangGraph saver's
#: threads last, under the name of their cursor).
ORDER = (checkpoints.name, events.name, ended_tasks.name, THREADS)
#: Source rows read and applied per cloud transaction.
DEFAULT_BATCH = 500

#: ``progress(table, rows, behind)``: called as ``rows`` more rows of ``table`` are
#: pushed (0 at its start), ``behind`` being what the pass found to push.
Progress = Callable[[str, int, int], None]


class _CursorMoved(Exception):
    """Another sync of the same source moved the cursor meanwhile: read again."""


class UnsignedSyncError(ConfigurationError):
    """A sync that could not check the chains' signatures, not allowed to go unsigned."""


@dataclass
class TableReport:
    """What a pass did to one table (``behind``: rows it found after the cursor
    before it started; after a rescan, every row of the table)."""

    table: str
    behind: int = 0
    position: int = 0
    rescanned: bool = False
    applied: int = 0
    identical: int = 0
    conflicts: list[str] = field(default_factory=list)
    quarantined: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)

    def take(self, done: Applied) -> None:
        self.applied += done.applied
        self.identical += done.identical
        self.conflicts += done.conflicts
        self.quarantined += done.quarantined
        self.kept += done.kept

    def as_json(self) -> dict[str, Any]:
        return {"table": self.table, "behind": self.behind, "position": self.position,
                "rescanned": self.rescanned, "applied": self.applied,
                "identical": self.identical, "conflicts": self.conflicts,
                "quarantined": self.quarantined, "kept": self.kept}


@dataclass(frozen=True)
class TableStatus:
    """One source table's cursor in the cloud, and the source rows after it."""

    table: str
    position: int
    rows_applied: int
    updated_at: float | None
    behind: int
    rescan: bool

    def as_json(self) -> dict[str, Any]:
        return {"table": self.table, "position": self.position,
                "rows_applied": self.rows_applied, "updated_at": self.updated_at,
                "behind": self.behind, "rescan": self.rescan}


@dataclass(frozen=True)
class _Batch:
    start: int  # the cursor the batch was read after (what the cloud must still hold)
    rows: list[dict[str, Any]]
    last: int  # the rowid of its last row
    chains: list[Chain]
    threads: list[Thread] = field(default_factory=list)
    last_key: str = ""  # the key of its last row, as the cursor remembers it


@dataclass(frozen=True)
class _Cursor:
    """A cursor as a batch applied in this pass left it (the cloud's row, known)."""

    position: int
    position_key: str


class Syncer:
    """Pushes the tenant's rows of ``local`` (a SQLite store) to ``cloud`` (a
    PostgreSQL store of the same tenant). ``options``: how chains are verified on
    arrival (by default the cloud store's history options; signatures are checked
    only if they hold a key, as ``meshpoint verify`` does). Without a key a pass is
    refused (:class:`UnsignedSyncError`, before anything is written) unless
    ``unsigned``: a chain re-hashed by anyone who can write the file would pass."""

    def __init__(self, local: SqlStore, cloud: SqlStore, *, batch: int = DEFAULT_BATCH,
                 options: HistoryOptions | None = None, unsigned: bool = False,
                 clock: Callable[[], float] = time.time) -> None:
        if local.tenant_id != cloud.tenant_id:
            raise ValueError("the local and the cloud store must be of one tenant")
        self.local, self.cloud, self.batch, self.clock = local, cloud, batch, clock
        chosen = options if options is not None else cloud.history.options
        self.options = (chosen if chosen.signing.verifies
                        else replace(chosen, check_signatures=False))
        self.unsigned = unsigned
        self.tenant = local.tenant_id

    # -- the source id ---------------------------------------------------------------

    async def source_id(self, *, create: bool) -> str | None:
        """This local database's id as a sync source; made now if it has none and
        ``create`` (else None)."""
        keys = {"p_tenant": self.tenant}
        found = await self.local.transaction(lambda conn: sq.GET_SOURCE.scalar(conn, keys))
        if found is not None or not create:
            return None if found is None else str(found)
        made = new_checkpoint_id()

        def add(conn: Connection) -> str:
            there = sq.GET_SOURCE.scalar(conn, keys)
            if there is not None:
                return str(there)
            sq.ADD_SOURCE.rowcount(conn, {**keys, "p_source": made, "p_now": self.clock()})
            return made

        return await self.local.transaction(add, write=True, doing="naming the sync source")

    # -- status ----------------------------------------------------------------------

    async def status(self) -> tuple[str | None, list[TableStatus]]:
        """The source id and, per table, the cloud's cursor and the rows behind it."""
        source = await self.source_id(create=False)
        out = []
        for table in ORDER:
            cursor = None if source is None else await self._cursor(source, table)
            position = 0 if cursor is None else int(cursor.position)
            behind, rescan = await self.local.transaction(
                functools.partial(self._behind, table=table, cursor=cursor))
            out.append(TableStatus(table, position,
                                   0 if cursor is None else int(cursor.rows_applied),
                                   None if cursor is None else float(cursor.updated_at),
                                   behind, rescan))
        return source, out

    def _behind(self, conn: Connection, table: str, cursor: Any) -> tuple[int, bool]:
        position = 0 if cursor is None else int(cursor.position)
        rescan = position > 0 and not self._still_there(conn, table, cursor)
        after = 0 if rescan else position
        behind = sq.BEHIND_THREADS if table == THREADS else sq.BEHIND[table]
        return int(behind.scalar(conn, {"p_tenant": self.tenant, "p_after": after})), rescan

    def _still_there(self, conn: Connection, table: str, cursor: Any) -> bool:
        if table == THREADS:  # a change moves a thread on: behind the last is enough
            return int(cursor.position) <= int(sq.LAST_THREAD_CHANGE.scalar(
                conn, {"p_tenant": self.tenant}))
        row = sq.KEY_AT[table].first(conn, {"p_tenant": self.tenant,
                                            "p_after": int(cursor.position)})
        return row is not None and _key_text(row._asdict()) == cursor.position_key

    async def _cursor(self, source: str, table: str) -> Any:
        keys = {"p_tenant": self.tenant, "p_source": source, "p_table": table}
        return await self.cloud.transaction(lambda conn: sq.GET_CURSOR.first(conn, keys),
                                            doing="reading the sync cursor")

    # -- a pass ----------------------------------------------------------------------

    async def run(self, *, dry_run: bool = False,
                  progress: Progress | None = None) -> tuple[str | None, list[TableReport]]:
        """One pass over every table; with ``dry_run``, only what is behind is
        counted and nothing is written (not even the source id)."""
        if not dry_run:
            self.refuse_unsigned()
        source = await self.source_id(create=not dry_run)
        if dry_run:
            _, statuses = await self.status()
            return source, [TableReport(s.table, behind=s.behind, position=s.position,
                                        rescanned=s.rescan) for s in statuses]
        assert source is not None
        return source, [await self._push(source, table, progress) for table in ORDER]

    def refuse_unsigned(self) -> None:
        """Raise :class:`UnsignedSyncError` unless signatures are checked on arrival or
        the sync was allowed to go without (``unsigned``)."""
        if not (self.options.check_signatures or self.unsigned):
            raise UnsignedSyncError(
                "no signing key to check the history chains' signatures with on arrival: "
                "give the public halves of the signing keys (--config naming a config "
                "whose history.signing holds them), or --unsigned (sync: unsigned: true) "
                "to push chains whose signatures nobody checks")

    async def _push(self, source: str, table: str, progress: Progress | None) -> TableReport:
        report = TableReport(table)
        cursor = await self._cursor(source, table)
        report.behind, report.rescanned = await self.local.transaction(
            lambda conn: self._behind(conn, table, cursor))
        if progress is not None:
            progress(table, 0, report.behind)
        while True:
            batch = await self.local.transaction(
                functools.partial(self._read, table=table, cursor=cursor),
                doing=f"reading {table} to sync")
            if not batch.rows:
                report.position = batch.start
                return report
            try:
                done = await self.cloud.transaction(
                    functools.partial(self._apply, source=source, table=table, batch=batch),
                    write=True, doing=f"applying a batch of {table}")
            except _CursorMoved:
                cursor = await self._cursor(source, table)
                continue
            report.take(done)
            report.position = batch.last
            if progress is not None:
                progress(table, len(batch.rows), report.behind)
            if len(batch.rows) < self.batch:
                return report  # the table's last rows in the batch's snapshot
            # Where this transaction left the cursor (another sync that moves it
            # meanwhile makes the next batch's check fail, and it is read again).
            cursor = _Cursor(batch.last, batch.last_key)

    def _read(self, conn: Connection, table: str, cursor: Any) -> _Batch:
        """The next batch after ``cursor``, in one snapshot of the source (with the
        whole chain and head of each task a history batch touches)."""
        start = 0 if cursor is None else int(cursor.position)
        after = start
        if start > 0 and not self._still_there(conn, table, cursor):
            after = 0  # the row at the cursor was purged: read the table again
        keys = {"p_tenant": self.tenant}
        read = sq.READ_THREAD_CHANGES if table == THREADS else sq.READ[table]
        raw = read.rows(conn, {**keys, "p_after": after, "p_limit": self.batch})
        rows = [as_row(r) for r in raw]
        chains: list[Chain] = []
        threads = ([read_thread(conn, self.tenant, r["thread_id"]) for r in rows]
                   if table == THREADS else [])
        if table == checkpoints.name:
            for task in sorted({r["logical_task_id"] for r in rows}):
                task_keys = {**keys, "p_task": task}
                head = sq.HEAD_ROW.first(conn, task_keys)
                chains.append(Chain(task, [as_row(r) for r in
                                           sq.CHAIN_ROWS.rows(conn, task_keys)],
                                    None if head is None else as_row(head)))
        last_key = (_key_text({k: rows[-1][k] for k in sq.KEYS.get(table, ("thread_id",))})
                    if rows else "")
        return _Batch(start, rows, int(raw[-1].sync_rowid) if raw else start, chains,
                      threads, last_key)

    def _apply(self, conn: Connection, source: str, table: str, batch: _Batch) -> Applied:
        keys = {"p_tenant": self.tenant, "p_source": source, "p_table": table}
        sq.LOCK_CURSOR.rows(conn, keys)
        cursor = sq.GET_CURSOR.first(conn, keys)
        if (0 if cursor is None else int(cursor.position)) != batch.start:
            raise _CursorMoved
        now = self.clock()
        if table == checkpoints.name:
            done = apply_chains(conn, batch.chains, tenant=self.tenant, source=source,
                                options=self.options, now=now,
                                max_inflate=DEFAULT_MAX_DECOMPRESSED_BYTES)
        elif table == THREADS:
            done = apply_threads(conn, batch.threads, tenant=self.tenant, source=source,
                                 now=now)
        elif table == events.name:
            done = apply_events(conn, batch.rows, tenant=self.tenant, source=source,
                                now=now)
        else:
            done = apply_ended(conn, batch.rows, tenant=self.tenant, source=source, now=now)
        sq.PUT_CURSOR.rowcount(conn, {
            **keys, "p_position": batch.last, "p_position_key": batch.last_key,
            "p_rows": len(batch.rows), "p_now": now})
        return done


def _key_text(key: dict[str, Any]) -> str:
    return json.dumps(key, sort_keys=True)
