"""Applying one batch of source rows to the cloud, inside the cloud transaction that
also moves the batch's cursor (:mod:`meshpoint.sync.push` runs it).

What each table's rows get:

* events (immutable): inserted unless their id is taken; a taken id holding other
  content is a ``conflict``: both versions go to the conflict log, the cloud's stays.
* ended tasks (immutable: a task ends once): inserted unless the cloud holds the
  task's end; one that says otherwise (another ``ended_at`` or agent) is logged as
  ``kept`` and the cloud's stays. The ledger is not signed, so a later end written
  into the file by someone without a key must not replace the cloud's.
* history records (immutable, hash-chained): a record travels with its task's whole
  chain and head, as the source's snapshot had them. Each chain is applied under a
  savepoint and read back and verified in the cloud (hashes, links, head, snapshots,
  and signatures with the cloud's keys) before the savepoint is released: a record
  whose id or place is taken by other content rolls the chain back as a ``conflict``,
  a chain that does not verify is rolled back as a ``quarantine``. Nothing already in
  the cloud is overwritten, and nothing unverified is applied.

Every body here is a synchronous function of the transaction's connection; none
commits. No I/O of its own beyond the statements it runs.
"""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Connection
from sqlalchemy.util.concurrency import await_, in_greenlet

from meshpoint._json import Undecodable
from meshpoint.history.planning import HistoryOptions
from meshpoint.history.verification import ChainReport, verify_chain
from meshpoint.store.history_chain import read_chain, stored_head
from meshpoint.store.schema import checkpoints, ended_tasks, events
from meshpoint.sync import queries as sq

#: The kinds of the conflict log.
CONFLICT, QUARANTINE, KEPT = "conflict", "quarantine", "kept"


@dataclass
class Applied:
    """What one batch did: rows newly applied, rows the cloud had already (the same),
    and the keys logged as conflicts, quarantined or kept."""

    applied: int = 0
    identical: int = 0
    conflicts: list[str] = field(default_factory=list)
    quarantined: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)

    def add(self, other: Applied) -> None:
        self.applied += other.applied
        self.identical += other.identical
        self.conflicts += other.conflicts
        self.quarantined += other.quarantined
        self.kept += other.kept


@dataclass(frozen=True)
class Chain:
    """A task's chain as the source's snapshot had it: its records (rows, oldest
    first) and its head row (None: headless, which does not verify)."""

    task_id: str
    records: list[dict[str, Any]]
    head: dict[str, Any] | None


def as_row(row: Any) -> dict[str, Any]:
    """A result row as a dict of its columns, without the source's ``sync_rowid``."""
    return {k: v for k, v in row._asdict().items() if k != "sync_rowid"}


def jsonable(value: Any) -> Any:
    """``value`` as JSON can hold it: bytes as ``{"base64": ...}``, an undecodable
    document as ``{"undecodable": error}``, containers walked."""
    if isinstance(value, bytes | bytearray | memoryview):
        return {"base64": base64.b64encode(bytes(value)).decode()}
    if isinstance(value, Undecodable):
        return {"undecodable": str(value.error)}
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    return value


def _params(row: Mapping[str, Any], tenant: str) -> dict[str, Any]:
    return {"p_tenant": tenant, **{f"p_{k}": v for k, v in row.items() if k != "tenant_id"}}


def _same(local: Mapping[str, Any], cloud: Any) -> bool:
    """Whether the cloud's row says what the source's does, column by column (JSON by
    value: PostgreSQL's JSONB may reorder keys or respell numbers)."""
    theirs = cloud._asdict()
    return all(_equal(v, theirs.get(k)) for k, v in local.items() if k != "tenant_id")


def _equal(a: Any, b: Any) -> bool:
    if isinstance(a, bytes | bytearray | memoryview) or isinstance(b, bytes | bytearray |
                                                                   memoryview):
        return a is not None and b is not None and bytes(a) == bytes(b)
    return bool(a == b)


def row_key(table: str, row: Mapping[str, Any]) -> str:
    """The row's key as the conflict log and the cursor name it."""
    return "/".join(str(row[k]) for k in sq.KEYS[table])


def log(conn: Connection, *, tenant: str, source: str, table: str, key: str, kind: str,
        reason: str, local: Any, cloud: Any, now: float) -> None:
    """Add a row to the conflict log (once per key and kind: a rerun adds nothing)."""
    sq.ADD_CONFLICT.rowcount(conn, {
        "p_tenant": tenant, "p_source_id": source, "p_table_name": table,
        "p_row_key": key[:255], "p_kind": kind, "p_reason": reason,
        "p_local_row": jsonable(local), "p_cloud_row": jsonable(cloud),
        "p_detected_at": now})


def apply_events(conn: Connection, rows: list[dict[str, Any]], *, tenant: str,
                 source: str, now: float) -> Applied:
    """Apply a batch of events in three round trips: the cloud's rows of the batch's
    ids (compared: identical or a conflict), one insert of the others (unless their id
    was taken meanwhile), and those read back and compared (another writer's row under
    the same id, inserted between the two, is a conflict too, never lost)."""
    done = Applied()
    table = events.name

    def cloud_rows(ids: list[str]) -> dict[str, Any]:
        if not ids:
            return {}
        return {r.event_id: r for r in sq.GET_EVENTS.rows(conn, {"p_tenant": tenant,
                                                                 "p_ids": ids})}

    there = cloud_rows([r["event_id"] for r in rows])
    missing = [r for r in rows if r["event_id"] not in there]
    if missing:
        sq.PUT[table].execute_many(conn, [_params(r, tenant) for r in missing])
    landed = cloud_rows([r["event_id"] for r in missing])
    for row in rows:
        key = row["event_id"]
        found = there.get(key)
        new = found is None
        if new:
            found = landed.get(key)
        if found is not None and _same(row, found):
            if new:
                done.applied += 1
            else:
                done.identical += 1
            continue
        done.conflicts.append(key)
        log(conn, tenant=tenant, source=source, table=table, key=key, kind=CONFLICT,
            reason="the cloud holds another row under this id: it stays, both versions "
            "are kept here", local=row, cloud=None if found is None else found._asdict(),
            now=now)
    return done


def apply_ended(conn: Connection, rows: Iterable[dict[str, Any]], *, tenant: str,
                source: str, now: float) -> Applied:
    """Apply ended tasks: inserted unless the cloud holds the task's end, which stays
    and is logged as ``kept`` if it says otherwise."""
    done = Applied()
    table = ended_tasks.name
    put, get = sq.PUT[table], sq.GET[table]
    for row in rows:
        params = _params(row, tenant)
        if put.rowcount(conn, params):
            done.applied += 1
            continue
        there = get.first(conn, params)
        if there is not None and _same(row, there):
            done.identical += 1
            continue
        key = row_key(table, row)
        done.kept.append(key)
        log(conn, tenant=tenant, source=source, table=table, key=key, kind=KEPT,
            reason="the cloud holds another end of this task: it stays (an end "
            "is never replaced)", local=row, cloud=None if there is None else there._asdict(),
            now=now)
    return done


def apply_chains(conn: Connection, chains: Iterable[Chain], *, tenant: str, source: str,
                 options: HistoryOptions, now: float, max_inflate: int) -> Applied:
    """Apply whole chains, each verified in the cloud before it stays (see the module
    docstring)."""
    done = Applied()
    table = checkpoints.name
    for chain in chains:
        savepoint = conn.begin_nested()
        inserted, identical, clashes = 0, 0, []
        for record in chain.records:
            params = _params(record, tenant)
            if sq.PUT[table].rowcount(conn, params):
                inserted += 1
                continue
            there = (sq.GET[table].first(conn, params)
                     or sq.GET_RECORD_AT_SEQ.first(conn, params))
            if there is not None and _same(record, there):
                identical += 1
            else:
                clashes.append((record, there))
        if clashes:
            savepoint.rollback()
            for record, there in clashes:
                key = row_key(table, record)
                done.conflicts.append(key)
                same_id = there is not None and there.checkpoint_id == record["checkpoint_id"]
                log(conn, tenant=tenant, source=source, table=table, key=key,
                    kind=CONFLICT, reason=(
                        f"the cloud holds another record "
                        f"{'under this id' if same_id else 'at this place'} of task "
                        f"{chain.task_id!r}'s chain (record {record['seq']}): the "
                        "cloud's stays, the task's chain was not applied"),
                    local=record, cloud=None if there is None else there._asdict(),
                    now=now)
            continue
        if chain.head is not None:
            sq.PUT_HEAD.rowcount(conn, _params(chain.head, tenant))
        records, head = read_chain(conn, {"p_tenant": tenant, "p_task": chain.task_id})
        report = _verify(chain.task_id, records,
                         None if head is None else stored_head(head), options,
                         snapshots=True, max_inflate=max_inflate)
        if not report.ok:
            savepoint.rollback()
            done.quarantined.append(chain.task_id)
            where = ("its head" if report.first_bad_seq is None
                     else f"record {report.first_bad_seq} ({report.first_bad_id})")
            log(conn, tenant=tenant, source=source, table=table, key=chain.task_id,
                kind=QUARANTINE, reason=f"the chain does not verify ({report.kind}): "
                f"{where}: {report.reason}; nothing of it was applied",
                local={"records": chain.records, "head": chain.head}, cloud=None, now=now)
            continue
        savepoint.commit()
        done.applied += inserted
        done.identical += identical
    return done


def _verify(*args: Any, **kwargs: Any) -> ChainReport:
    """``verify_chain``, on a worker thread when called inside the cloud's async
    transaction (which runs this module's bodies in a greenlet on the event loop's
    thread): a long chain's hashes, signatures and snapshots would otherwise hold the
    loop, and with it every task of a ``serve`` that syncs in the background (143 ms
    for a chain of 200 records, measured). Elsewhere (a synchronous connection), here."""
    if in_greenlet():
        return await_(asyncio.to_thread(verify_chain, *args, **kwargs))
    return verify_chain(*args, **kwargs)
