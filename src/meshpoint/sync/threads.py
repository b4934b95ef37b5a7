"""The LangGraph saver's threads, carried by the sync (:mod:`meshpoint.sync.push` runs
this inside the cloud transaction that also moves the threads' cursor).

A thread travels whole: its rows of the saver's three tables (checkpoints, channel
values, pending writes), as one snapshot of the source had them. Its rows are not
append-only (prune hides a checkpoint or deletes it; a special write replaces another),
so the unit compared is the thread, by its **fingerprint**: the SHA-256 of its rows,
each row's columns but its bytes, which its ``digest`` (the SHA-256 of the bytes, as
the saver stored them: ciphertext when encrypted) stands for.

What a changed thread gets in the cloud:

* the same fingerprint there: nothing (``identical``);
* no rows there, or the rows this source last left there (the fingerprint recorded in
  ``meshpoint_sync_threads``) and a version (below) not newer than the source's: the
  cloud's thread becomes the source's, row by row (rows that differ deleted, the
  source's inserted), ``applied``;
* anything else: the thread was written on both sides since, or went back on the
  source (an older copy of it put back). **Last write wins by version**: a thread's
  version is its newest checkpoint id (LangGraph makes them UUIDv6, ordered by the
  time the step was written), compared as text; the larger one wins, and on a tie
  the cloud's stays. The losing version, whole (bytes as base64, encrypted ones as
  their ciphertext), goes to the conflict log with the winner's, as a ``conflict``,
  and the pass reports it.

A thread deleted on the source (no rows left) is not deleted in the cloud, which keeps
its own retention, as for a purge. Every body here is a synchronous function of the
transaction's connection; none commits.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection

from meshpoint.integrations.langgraph import queries as lq
from meshpoint.integrations.langgraph.rows import digest
from meshpoint.sync import queries as sq
from meshpoint.sync.apply import CONFLICT, QUARANTINE, Applied, as_row, jsonable, log

#: The name the threads' cursor, reports and conflict log go by.
THREADS = "langgraph_threads"
_CHECKPOINTS = "agent_langgraph_checkpoints"
#: Per saver table: the kind and the key columns its rows' digests cover (as the saver
#: computes them).
_DIGESTS: dict[str, tuple[bytes, tuple[str, ...]]] = {
    _CHECKPOINTS: (b"checkpoint", ("checkpoint_ns", "checkpoint_id")),
    "agent_langgraph_blobs": (b"blob", ("checkpoint_ns", "channel", "version")),
    "agent_langgraph_writes": (b"write", ("checkpoint_ns", "checkpoint_id", "task_id",
                                          "idx")),
}


@dataclass(frozen=True)
class Thread:
    """A thread's rows as the source's snapshot had them, per saver table."""

    thread_id: str
    rows: dict[str, list[dict[str, Any]]]

    @property
    def empty(self) -> bool:
        return not any(self.rows.values())


def read_thread(conn: Connection, tenant: str, thread_id: str) -> Thread:
    """A thread's rows, whole, from the source (in the caller's read transaction)."""
    keys = {"p_tenant": tenant, "p_thread": thread_id}
    return Thread(thread_id, {name: [as_row(r) for r in statement.rows(conn, keys)]
                              for name, statement in lq.THREAD_ROWS.items()})


#: How far ahead of the sync's clock a checkpoint id's time may be (clocks differ).
CLOCK_SKEW_S = 300.0
#: The Gregorian epoch of UUID times (1582-10-15), in 100 ns ticks before 1970.
_UUID_EPOCH_TICKS = 0x01B21DD213814000


def id_time(checkpoint_id: str) -> float | None:
    """The time (seconds since 1970) a time-ordered UUID (versions 1, 6 and 7; LangGraph
    makes version 6) was made at, or None if ``checkpoint_id`` is not one."""
    try:
        value = uuid.UUID(checkpoint_id)
    except ValueError:
        return None
    number = value.int
    if value.version == 6:
        ticks = ((number >> 96) << 28) | (((number >> 80) & 0xFFFF) << 12) | (
            (number >> 64) & 0x0FFF)
    elif value.version == 1:
        ticks = value.time
    elif value.version == 7:
        return (number >> 80) / 1000.0
    else:
        return None
    return (ticks - _UUID_EPOCH_TICKS) / 1e7


def unsound(thread: Thread, now: float) -> str | None:
    """Why the thread cannot travel, or None: a row whose bytes do not hash to its
    stored digest (changed or moved after the saver wrote it), which the fingerprint,
    made of digests, would not see and a saver in the cloud would refuse to read; or a
    checkpoint id that is not a time-ordered UUID, or whose time is ahead of ``now``
    (by more than :data:`CLOCK_SKEW_S`): the thread's version, which would win every
    later comparison (a forged one, or a file from a clock gone wrong)."""
    for row in thread.rows.get(_CHECKPOINTS, ()):
        made = id_time(str(row["checkpoint_id"]))
        if made is None:
            return (f"checkpoint {str(row['checkpoint_id'])[:80]!r} is not a time-ordered "
                    "UUID, as LangGraph makes them")
        if made > now + CLOCK_SKEW_S:
            return (f"checkpoint {row['checkpoint_id']} is dated {made - now:.0f} s ahead "
                    "of this sync's clock: as the thread's version it would win every "
                    "later comparison")
    for table, rows in thread.rows.items():
        kind, names = _DIGESTS[table]
        for row in rows:
            if digest(kind, tuple(str(row[n]) for n in names),
                      bytes(row["data"])) != row["digest"]:
                key = "/".join(str(row[n]) for n in names)
                return (f"a row of {table} ({key}) does not hash to its stored digest: it "
                        "was changed or moved after the saver wrote it")
    return None


def _sign(row: Mapping[str, Any]) -> str:
    """A row's signature: its columns but tenant and bytes, as canonical JSON."""
    kept = {k: v for k, v in row.items() if k not in ("tenant_id", "data")}
    return json.dumps(jsonable(kept), sort_keys=True, separators=(",", ":"), default=str)


def _key(table: str, row: Mapping[str, Any]) -> tuple[Any, ...]:
    return tuple(row[k] for k in sq.GRAPH_KEYS[table])


def _signs(rows: Mapping[str, Iterable[Mapping[str, Any]]]
           ) -> dict[str, dict[tuple[Any, ...], str]]:
    return {table: {_key(table, r): _sign(r) for r in found} for table, found in rows.items()}


def fingerprint(signs: Mapping[str, Mapping[tuple[Any, ...], str]]) -> str:
    """The thread's fingerprint: the SHA-256 of its rows' signatures, in order."""
    digest = hashlib.sha256()
    for table in sorted(signs):
        for sign in sorted(signs[table].values()):
            digest.update(f"{table}\n{sign}\n".encode())
    return digest.hexdigest()


def version(signs: Mapping[str, Mapping[tuple[Any, ...], str]]) -> str:
    """The thread's version: its newest checkpoint id ('' without a checkpoint)."""
    ids = [str(key[-1]) for key in signs.get(_CHECKPOINTS, {})]  # (namespace, id)
    return max(ids, default="")


def apply_threads(conn: Connection, threads: Iterable[Thread], *, tenant: str,
                  source: str, now: float) -> Applied:
    """Apply changed threads (see the module docstring)."""
    done = Applied()
    for thread in threads:
        if thread.empty:
            continue  # deleted on the source: the cloud keeps its own retention
        ours = _signs(thread.rows)
        why = unsound(thread, now)
        if why is not None:  # never applied: the cloud's thread stays as it is
            key = f"{thread.thread_id}@{fingerprint(ours)[:16]}"
            done.quarantined.append(key)
            log(conn, tenant=tenant, source=source, table=THREADS, key=key,
                kind=QUARANTINE, reason=f"thread {thread.thread_id!r} not applied: {why}",
                local={"version": version(ours), "rows": thread.rows}, cloud=None, now=now)
            continue
        keys = {"p_tenant": tenant, "p_thread": thread.thread_id, "p_source": source}
        sq.LOCK_THREAD.rows(conn, keys)  # two files pushing one thread take turns
        theirs = _signs({name: [r._asdict() for r in statement.rows(conn, keys)]
                         for name, statement in sq.THREAD_SIGNS.items()})
        mine, cloud = fingerprint(ours), fingerprint(theirs)
        ours_v, theirs_v = version(ours), version(theirs)
        if mine == cloud:
            done.identical += 1
            _record(conn, keys, ours_v, mine, now)
            continue
        base = sq.GET_THREAD_BASE.first(conn, keys)
        ours_last = base is not None and base.fingerprint == cloud
        if not any(theirs.values()) or (ours_last and ours_v >= theirs_v):
            _replace(conn, tenant, thread, ours, theirs)
            done.applied += 1
            _record(conn, keys, ours_v, mine, now)
            continue
        # Written on both sides, or gone back on this source (an older copy of the
        # file put back): never a newer version replaced by an older one.
        local_wins = ours_v > theirs_v
        cloud_rows = {name: [r._asdict() for r in statement.rows(conn, keys)]
                      for name, statement in lq.THREAD_ROWS.items()}
        loser = cloud if local_wins else mine
        key = f"{thread.thread_id}@{loser[:16]}"
        done.conflicts.append(key)
        log(conn, tenant=tenant, source=source, table=THREADS, key=key, kind=CONFLICT,
            reason=(f"thread {thread.thread_id!r} "
                    + ("went back on this source (an older copy of the file, or its "
                       "latest run deleted): the cloud's is what this source last left "
                       "there" if ours_last else
                       "was written on both sides (the cloud's is not what this source "
                       "last left there)")
                    + ": last write wins by version, the newest checkpoint id: the "
                    + (f"source's ({ours_v}) replaced the cloud's ({theirs_v}), kept here"
                       if local_wins else
                       f"cloud's ({theirs_v}) stays over the source's ({ours_v}), kept "
                       "here")),
            local={"version": ours_v, "rows": thread.rows},
            cloud={"version": theirs_v, "rows": cloud_rows}, now=now)
        if local_wins:
            _replace(conn, tenant, thread, ours, theirs)
            done.applied += 1
            _record(conn, keys, ours_v, mine, now)
    return done


def _record(conn: Connection, keys: dict[str, Any], version_: str, fingerprint_: str,
            now: float) -> None:
    sq.PUT_THREAD_BASE.rowcount(conn, {**keys, "p_version": version_,
                                       "p_fingerprint": fingerprint_, "p_now": now})


def _replace(conn: Connection, tenant: str, thread: Thread,
             ours: Mapping[str, Mapping[tuple[Any, ...], str]],
             theirs: Mapping[str, Mapping[tuple[Any, ...], str]]) -> None:
    """Make the cloud's thread the source's: rows it lacks or holds otherwise deleted
    (writes, values, then checkpoints), the source's inserted (checkpoints first), so
    the unique index on ``continues`` never sees both versions at once."""
    for table in (t.name for t in sq.GRAPH_TABLES):
        names = sq.GRAPH_KEYS[table]
        gone = [key for key, sign in theirs[table].items() if ours[table].get(key) != sign]
        if gone:
            sq.DELETE_THREAD_ROW[table].execute_many(conn, [
                {"p_tenant": tenant, "p_thread": thread.thread_id,
                 **{f"p_{n}": v for n, v in zip(names, key, strict=True)}} for key in gone])
    for table in reversed([t.name for t in sq.GRAPH_TABLES]):
        new = [row for row in thread.rows[table]
               if theirs[table].get(_key(table, row)) != ours[table][_key(table, row)]]
        if new:
            sq.PUT_THREAD_ROW[table].execute_many(conn, [
                {"p_tenant": tenant, **{f"p_{k}": v for k, v in row.items()
                                        if k != "tenant_id"}} for row in new])
