"""What the LangGraph saver does to whole threads (delete, delete runs, copy, prune) and
the history of a delta channel: the extended capabilities of ``BaseCheckpointSaver``.

Each is one transaction of the store's tenant. A channel version is shared by every
checkpoint at that version and may be the base of deltas (:mod:`.rows`), so deleting
checkpoints deletes only the channel versions no remaining checkpoint reaches, with
the versions their deltas extend (:func:`_collect`).

``prune(strategy="keep_latest")`` keeps the latest checkpoint of each namespace and,
hidden, the ancestors a ``DeltaChannel`` of it still replays: LangGraph rebuilds such
a channel from the writes of the ancestors back to the nearest one that stores its
value (``get_delta_channel_history``), and a naive prune would make it empty without
an error (LangGraph's ``BaseCheckpointSaver.prune`` warns of it). The delta channels
are those the kept checkpoint's metadata counts (``counters_since_delta_snapshot``).
Hidden checkpoints are never listed nor read; only that walk sees them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import orjson
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    CheckpointTuple,
    DeltaChannelHistory,
    PendingWrite,
    get_checkpoint_id,
)
from sqlalchemy import Connection, exc

from meshpoint.errors import CheckpointConflictError, CorruptCheckpointError, InvalidArgumentError
from meshpoint.integrations.langgraph import queries as lq
from meshpoint.integrations.langgraph.rows import (
    StoredBlob,
    assemble,
    checked,
    digest,
    thread_keys,
)
from meshpoint.integrations.langgraph.serde import SafeSerializer
from meshpoint.integrations.langgraph.tables import LG_BLOB, LG_CHECKPOINT, LG_METADATA, LG_WRITE
from meshpoint.store.sealing import Sealer
from meshpoint.store.sqlstore import SqlStore


class MeshpointSaver(Protocol):
    """What these functions use of :class:`.saver.MeshpointSaver` (passed in, so that
    this module does not import the saver back)."""

    store: SqlStore
    serde: SafeSerializer

    def forget(self, thread: str) -> None: ...

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None: ...

STRATEGIES = ("keep_latest", "delete")
#: Ancestors a delta channel's history walks per statement.
WALK = 1000


def missing_value(thread: str, checkpoint_id: str, channel: str,
                  version: str) -> CorruptCheckpointError:
    return CorruptCheckpointError(
        f"checkpoint {checkpoint_id!r} of thread {thread!r} names version {version!r} of "
        f"channel {channel!r}, which is not stored (deleted outside the saver?); it is "
        "not read")


# -- delta channel history -----------------------------------------------------------------

async def delta_history(saver: MeshpointSaver, config: RunnableConfig,
                        channels: Sequence[str]) -> Mapping[str, DeltaChannelHistory]:
    """``get_delta_channel_history`` in one read transaction: the parent chain of the
    checkpoint walked by a recursive statement (not a read per ancestor), the writes
    of the ancestors up to each channel's seed in one more, and each seed's value
    chain in one each."""
    if not channels:
        return {}
    thread, ns = thread_keys(config)
    target = get_checkpoint_id(config)
    if target is None:
        latest = await saver.aget_tuple(config)
        if latest is None:
            return {channel: {"writes": []} for channel in channels}
        target = latest.config["configurable"]["checkpoint_id"]
    keys = {"p_tenant": saver.store.tenant_id, "p_thread": thread, "p_ns": ns}
    wanted = list(dict.fromkeys(channels))
    sealer = saver.store.sealer

    def body(conn: Connection) -> dict[str, DeltaChannelHistory]:
        seed_at: dict[str, tuple[int, str]] = {}  # channel -> (depth, version)
        depth = 0
        start: str | None = target
        offset = 0
        while start is not None and len(seed_at) < len(wanted):
            rows = lq.ANCESTORS.rows(conn, {**keys, "p_checkpoint": start,
                                            "p_max_depth": WALK})
            if not rows:
                break
            for _id, _parent, blobs, level in rows:
                depth = offset + level
                if depth == 1:
                    continue  # the target's own values are not its history
                for channel, version in orjson.loads(blobs).items():
                    if channel in wanted and channel not in seed_at:
                        seed_at[channel] = (depth, version)
            offset = depth
            start = rows[-1][1] if len(rows) == WALK else None
        deepest = max([depth, *(d for d, _ in seed_at.values())])
        collected: dict[str, list[Any]] = {channel: [] for channel in wanted}
        if deepest >= 2:
            for row in lq.ANCESTOR_WRITES.rows(conn, {**keys, "p_checkpoint": target,
                                                      "p_max_depth": deepest}):
                if row.depth < 2 or row.channel not in collected:
                    continue
                if row.channel in seed_at and row.depth > seed_at[row.channel][0]:
                    continue
                collected[row.channel].append(row)
        result: dict[str, DeltaChannelHistory] = {}
        for channel in wanted:
            ordered = sorted(collected[channel],
                             key=lambda w: (-w.depth, w.task_path, w.task_id, w.idx))
            writes: list[PendingWrite] = [
                (w.task_id, w.channel, saver.serde.loads(sealer.open_bytes(checked(
                    b"write", (ns, w.checkpoint_id, w.task_id, str(w.idx)), w.data, w.digest,
                    f"a write of checkpoint {w.checkpoint_id!r}"), LG_WRITE, thread=thread,
                    ns=ns, checkpoint=w.checkpoint_id, task=w.task_id, idx=str(w.idx))))
                for w in ordered]
            entry: DeltaChannelHistory = {"writes": writes}
            if channel in seed_at:
                version = seed_at[channel][1]
                chain = {r.version: StoredBlob(r.version, r.base_version, r.root_version,
                                               r.depth, r.items, r.data, r.digest)
                         for r in lq.BLOB_CHAIN.rows(conn, {**keys, "p_channel": channel,
                                                            "p_version": version})}
                built = assemble(thread, ns, channel, version, chain, sealer)
                if built is None:
                    raise missing_value(thread, target, channel, version)
                entry["seed"] = saver.serde.loads(built[0])
            result[channel] = entry
        return result

    return await saver.store.transaction(
        body, doing=f"reading the delta channel history of thread {thread!r}")


# -- whole threads ---------------------------------------------------------------------------

async def delete_thread(saver: MeshpointSaver, thread: str) -> None:
    """Every checkpoint, value and write of ``thread``, in every namespace."""
    keys = {"p_tenant": saver.store.tenant_id, "p_thread": thread}

    def body(conn: Connection) -> None:
        for statement in lq.DELETE_THREAD.values():
            statement.rowcount(conn, keys)

    await saver.store.transaction(body, write=True, doing=f"deleting thread {thread!r}")
    saver.forget(thread)


async def delete_for_runs(saver: MeshpointSaver, run_ids: Sequence[str]) -> None:
    """The checkpoints the runs wrote (any thread of the tenant), their writes, and the
    values no other checkpoint needs."""
    if not run_ids:
        return
    tenant = saver.store.tenant_id

    def body(conn: Connection) -> set[str]:
        threads: set[str] = set()
        for run_id in dict.fromkeys(run_ids):
            for thread, ns, checkpoint_id in lq.RUN_CHECKPOINTS.rows(
                    conn, {"p_tenant": tenant, "p_run": run_id}):
                key = {"p_tenant": tenant, "p_thread": thread, "p_ns": ns,
                       "p_checkpoint": checkpoint_id}
                lq.DELETE_CHECKPOINT_WRITES.rowcount(conn, key)
                lq.DELETE_CHECKPOINT.rowcount(conn, key)
                threads.add(thread)
        for thread in threads:
            _collect(conn, tenant, thread)
        return threads

    for thread in await saver.store.transaction(body, write=True,
                                                doing="deleting the checkpoints of runs"):
        saver.forget(thread)


async def copy_thread(saver: MeshpointSaver, source: str, target: str) -> None:
    """Every row of ``source`` copied to ``target`` (which must have none): checkpoint
    ids, parents and writes as they are, so the copy lists and resumes as the source
    does."""
    if source == target:
        raise InvalidArgumentError("copy_thread needs two different thread ids")
    keys = {"p_tenant": saver.store.tenant_id, "p_thread": source, "p_target": target}
    sealer = saver.store.sealer

    def body(conn: Connection) -> None:
        if lq.THREAD_EXISTS.first(conn, {**keys, "p_thread": target}) is not None:
            raise CheckpointConflictError(
                f"thread {target!r} already has checkpoints: copy_thread copies into a new "
                "thread (delete_thread it first to replace it)")
        try:
            if sealer.keys is None:  # the rows as they are, in SQL
                for statement in lq.COPY_THREAD.values():
                    statement.rowcount(conn, keys)
            else:  # each row sealed again, bound to its new thread
                for table, rows in lq.THREAD_ROWS.items():
                    copies = [_resealed(sealer, table, row._asdict(), target)
                              for row in rows.rows(conn, keys)]
                    if copies:
                        lq.INSERT_ROW[table].execute_many(conn, copies)
        except exc.IntegrityError as error:
            raise CheckpointConflictError(
                f"thread {target!r} already has rows: {error.orig}") from None

    await saver.store.transaction(body, write=True,
                                  doing=f"copying thread {source!r} to {target!r}")
    saver.forget(target)


async def prune(saver: MeshpointSaver, thread_ids: Sequence[str], strategy: str) -> None:
    """``delete``: every checkpoint of the threads. ``keep_latest``: the latest of each
    namespace, and hidden, the ancestors its delta channels replay (module docstring)."""
    if strategy not in STRATEGIES:
        raise InvalidArgumentError(f"strategy must be one of {STRATEGIES}, got {strategy!r}")
    tenant = saver.store.tenant_id
    for thread in dict.fromkeys(thread_ids):
        if strategy == "delete":
            await delete_thread(saver, thread)
            continue

        def body(conn: Connection, thread: str = thread) -> None:
            _keep_latest(conn, tenant, thread, saver.store.sealer)
            _collect(conn, tenant, thread)

        await saver.store.transaction(body, write=True, doing=f"pruning thread {thread!r}")
        saver.forget(thread)


def _keep_latest(conn: Connection, tenant: str, thread: str, sealer: Sealer) -> None:
    rows = lq.THREAD_CHECKPOINTS.rows(conn, {"p_tenant": tenant, "p_thread": thread})
    by_ns: dict[str, dict[str, Any]] = {}
    for row in rows:
        by_ns.setdefault(row.checkpoint_ns, {})[row.checkpoint_id] = row
    for ns, checkpoints in by_ns.items():
        visible = [c for c in checkpoints.values() if not c.hidden]
        if not visible:
            continue
        latest = max(visible, key=lambda c: c.checkpoint_id)
        keep = {latest.checkpoint_id}
        # Strict: a prune that cannot read which channels replay deltas changes nothing.
        metadata = sealer.open(latest.metadata, LG_METADATA, thread=thread, ns=ns,
                               checkpoint=latest.checkpoint_id)
        metadata = metadata if isinstance(metadata, dict) else {}
        unseeded = set(metadata.get("counters_since_delta_snapshot") or ()) - set(
            orjson.loads(latest.blobs))
        hide = []
        cursor = checkpoints.get(latest.parent_checkpoint_id or "")
        while unseeded and cursor is not None and cursor.checkpoint_id not in keep:
            keep.add(cursor.checkpoint_id)
            hide.append(cursor.checkpoint_id)
            unseeded -= set(orjson.loads(cursor.blobs))
            cursor = checkpoints.get(cursor.parent_checkpoint_id or "")
        for checkpoint_id in checkpoints:
            key = {"p_tenant": tenant, "p_thread": thread, "p_ns": ns,
                   "p_checkpoint": checkpoint_id}
            if checkpoint_id in hide:
                lq.HIDE_CHECKPOINT.rowcount(conn, key)
            elif checkpoint_id not in keep:
                lq.DELETE_CHECKPOINT_WRITES.rowcount(conn, key)
                lq.DELETE_CHECKPOINT.rowcount(conn, key)


def _resealed(sealer: Sealer, table: str, row: dict[str, Any], target: str
              ) -> dict[str, Any]:
    """A row of ``table`` for ``target`` (a copy of another thread's): its sealed values
    opened and sealed again bound to ``target``, its digest of what is stored now."""
    source, ns = row["thread_id"], row["checkpoint_ns"]
    digest_key: tuple[str, ...]
    if table == "agent_langgraph_checkpoints":
        key = {"ns": ns, "checkpoint": row["checkpoint_id"]}
        row["metadata"] = sealer.seal("langgraph", sealer.open(
            row["metadata"], LG_METADATA, thread=source, **key), LG_METADATA,
            thread=target, **key)
        column, kind, digest_key = LG_CHECKPOINT, b"checkpoint", (ns, row["checkpoint_id"])
    elif table == "agent_langgraph_blobs":
        key = {"ns": ns, "channel": row["channel"], "version": row["version"]}
        column, kind, digest_key = LG_BLOB, b"blob", (ns, row["channel"], row["version"])
    else:
        key = {"ns": ns, "checkpoint": row["checkpoint_id"], "task": row["task_id"],
               "idx": str(row["idx"])}
        column, kind = LG_WRITE, b"write"
        digest_key = (ns, row["checkpoint_id"], row["task_id"], str(row["idx"]))
    data = checked(kind, digest_key, bytes(row["data"]), row["digest"],
                   f"a row of thread {source!r} ({table})")
    data = sealer.seal_bytes("langgraph", sealer.open_bytes(data, column, thread=source,
                                                            **key), column, thread=target,
                             **key)
    return {f"p_col_{name}": value for name, value in {
        **row, "thread_id": target, "data": data,
        "digest": digest(kind, digest_key, data)}.items()}


def _collect(conn: Connection, tenant: str, thread: str) -> None:
    """Delete the channel versions of ``thread`` that no checkpoint reaches (directly,
    or as the base of a delta it reaches)."""
    keys = {"p_tenant": tenant, "p_thread": thread}
    needed: set[tuple[str, str, str]] = set()
    for row in lq.THREAD_CHECKPOINTS.rows(conn, keys):
        needed.update((row.checkpoint_ns, channel, version)
                      for channel, version in orjson.loads(row.blobs).items())
    bases = {(ns, channel, version): base
             for ns, channel, version, base in lq.THREAD_BLOBS.rows(conn, keys)}
    frontier = list(needed)
    while frontier:
        ns, channel, version = frontier.pop()
        base = bases.get((ns, channel, version))
        if base is not None and (ns, channel, base) not in needed:
            needed.add((ns, channel, base))
            frontier.append((ns, channel, base))
    garbage = [{**keys, "p_ns": ns, "p_channel": channel, "p_version": version}
               for ns, channel, version in bases if (ns, channel, version) not in needed]
    if garbage:
        lq.DELETE_BLOB.execute_many(conn, garbage)

