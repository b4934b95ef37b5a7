"""Applying one batch of source rows to the cloud, inside the cloud transaction that
also moves the batch's cursor (:mod:`meshpoint.sync.push` runs it).

What each table's rows get:

* events (immutable): inserted, a batch in one statement; if an id is taken, the
  batch is compared with the cloud's rows instead, and a taken id holding other
  content is a ``conflict``: both versions go to the conflict log, the cloud's stays.
* ended tasks (immutable: a task ends once): inserted unless the cloud holds the
  task's end; one that says otherwise (another ``ended_at`` or agent) is logged as
  ``kept`` and the cloud's stays. The ledger is not signed, so a later end written
  into the file by someone without a key must not replace the cloud's.
* history records (immutable, hash-chained): a record travels with its task's whole
  chain and head, as the source's snapshot had them. A chain that extends the
  cloud's as it should (the records the cloud holds are the file's, by id, place,
  hash and signature) has its new records verified after the cloud's head (hashes,
  links, claims, columns, snapshots, signatures with the cloud's keys, its new head)
  and inserted with the batch's other such chains in one statement. Anything else is
  applied chain by chain under a savepoint and read back and verified in the cloud
  before the savepoint is released: a record whose id or place is taken by other
  content rolls the chain back as a ``conflict``, a chain that does not verify is
  rolled back as a ``quarantine``. Nothing already in the cloud is overwritten, and
  nothing unverified is applied.

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
from sqlalchemy.exc import IntegrityError
from sqlalchemy.util.concurrency import await_, in_greenlet

from meshpoint._json import Undecodable
from meshpoint.history.planning import HistoryOptions
from meshpoint.history.verification import ChainReport, verify_chain
from meshpoint.store.history_chain import read_chain, stored_head, whole_record
from meshpoint.store.rows import HeadRow
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
    """Apply a batch of events. The fast way, when the cloud holds none of their ids
    (a batch after the cursor, as a pass finds it): one pipelined insert under a
    savepoint. If an id is taken (a rerun after a purge under the cursor, or another
    writer's row), the savepoint is rolled back and the batch goes the careful way
    (:func:`_apply_events_carefully`)."""
    if not rows:
        return Applied()
    savepoint = conn.begin_nested()
    try:
        sq.ADD_EVENT.execute_many(conn, [_params(r, tenant) for r in rows])
    except IntegrityError:
        savepoint.rollback()
        return _apply_events_carefully(conn, rows, tenant=tenant, source=source, now=now)
    savepoint.commit()
    return Applied(applied=len(rows))


def _apply_events_carefully(conn: Connection, rows: list[dict[str, Any]], *, tenant: str,
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


def apply_chains(conn: Connection, chains: list[Chain], *, tenant: str, source: str,
                 options: HistoryOptions, now: float, max_inflate: int) -> Applied:
    """Apply whole chains, none of them unverified (see the module docstring).

    The fast way, for the chains that extend the cloud's as they should: the cloud's
    heads and its records' ids, places and hashes for the batch's tasks are read in
    two statements; a chain whose records the cloud holds are the file's (same id,
    place, hash and signature), whose head starts where the cloud's does, and whose
    new records verify after the cloud's head (hashes, links, signatures, snapshots,
    columns, its new head), has only those new records inserted, with every such
    chain's, in one pipelined statement, and its head moved, under one savepoint.
    Anything else (a chain the cloud has records of but no head, one that differs,
    one that does not verify, an insert that finds an id or place taken meanwhile)
    goes the careful way, chain by chain (:func:`_apply_chain`), which names the
    conflict or the quarantine."""
    done = Applied()
    if not chains:
        return done
    keys = {"p_tenant": tenant, "p_tasks": [c.task_id for c in chains]}
    heads = {r.logical_task_id: r for r in sq.GET_HEADS.rows(conn, keys)}
    marks: dict[str, dict[int, Any]] = {}
    for mark in sq.GET_MARKS.rows(conn, keys):
        marks.setdefault(mark.logical_task_id, {})[mark.seq] = mark
    fast: list[tuple[Chain, list[dict[str, Any]]]] = []
    careful: list[Chain] = []
    for chain in chains:
        new = _new_records(chain, heads.get(chain.task_id), marks.get(chain.task_id, {}),
                           tenant=tenant, options=options, max_inflate=max_inflate)
        if new is None:
            careful.append(chain)
        elif new:
            fast.append((chain, new))
        else:
            done.identical += len(chain.records)
    if fast and not _insert_verified(conn, fast, tenant):
        careful += [chain for chain, _ in fast]
    else:
        for chain, new in fast:
            done.applied += len(new)
            done.identical += len(chain.records) - len(new)
    for chain in careful:
        done.add(_apply_chain(conn, chain, tenant=tenant, source=source, options=options,
                              now=now, max_inflate=max_inflate))
    return done


def _new_records(chain: Chain, cloud_head: Any, cloud_marks: dict[int, Any], *,
                 tenant: str, options: HistoryOptions, max_inflate: int
                 ) -> list[dict[str, Any]] | None:
    """The records of ``chain`` the cloud lacks, verified after the cloud's head
    (``[]``: the cloud holds the chain as the file does); None if the chain must go
    the careful way."""
    head = chain.head
    if head is None:
        return None
    if cloud_head is None:
        if cloud_marks:
            return None  # records without a head: the careful way names what is there
        after, start = None, 0
    else:
        if (cloud_head.pruned_through, cloud_head.pruned_hash) != (
                head["pruned_through"], head["pruned_hash"]):
            return None
        start = int(cloud_head.records)
        after = (start, str(cloud_head.head_hash))
        if head["records"] < start or len(cloud_marks) != start - cloud_head.pruned_through:
            return None
    held = [r for r in chain.records if r["seq"] <= start]
    if len(held) != len(cloud_marks) or any(
            (m := cloud_marks.get(r["seq"])) is None
            or (m.checkpoint_id, m.hash, m.signature, m.key_id)
            != (r["checkpoint_id"], r["hash"], r["signature"], r["key_id"]) for r in held):
        return None
    new = [r for r in chain.records if r["seq"] > start]
    if not new:
        same = (cloud_head is not None and cloud_head.head_id == head["head_id"]
                and cloud_head.head_hash == head["head_hash"])
        return [] if same else None
    report = _verify(chain.task_id, [whole_record({**r, "tenant_id": tenant}) for r in new],
                     stored_head(HeadRow._make(tenant if k == "tenant_id" else head[k]
                                               for k in HeadRow._fields)),
                     options, snapshots=True, max_inflate=max_inflate, after=after)
    return new if report.ok else None


def _insert_verified(conn: Connection, fast: list[tuple[Chain, list[dict[str, Any]]]],
                     tenant: str) -> bool:
    """Insert the verified new records of ``fast`` and move their heads, under one
    savepoint; False (everything rolled back) if a record's id or place was taken
    meanwhile or a head did not move to the chain's (another writer was first)."""
    savepoint = conn.begin_nested()
    try:
        sq.ADD_RECORD.execute_many(conn, [_params(r, tenant) for _, new in fast for r in new])
    except IntegrityError:
        savepoint.rollback()
        return False
    sq.PUT_HEAD.execute_many(conn, [_params(chain.head, tenant) for chain, _ in fast
                                    if chain.head is not None])
    moved = {r.logical_task_id: r for r in sq.GET_HEADS.rows(
        conn, {"p_tenant": tenant, "p_tasks": [chain.task_id for chain, _ in fast]})}
    if any(chain.head is None or (m := moved.get(chain.task_id)) is None
           or (m.head_id, m.head_hash, m.records) != (
               chain.head["head_id"], chain.head["head_hash"], chain.head["records"])
           for chain, _ in fast):
        savepoint.rollback()
        return False
    savepoint.commit()
    return True


def _apply_chain(conn: Connection, chain: Chain, *, tenant: str, source: str,
                 options: HistoryOptions, now: float, max_inflate: int) -> Applied:
    """Apply one chain the careful way: under a savepoint, its records inserted
    unless their id or place is taken (other content there: a conflict, rolled
    back), its head moved if it names a longer chain, then the cloud's whole chain
    read back and verified (one that fails is rolled back and quarantined)."""
    done = Applied()
    table = checkpoints.name
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
        return done
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
        return done
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
