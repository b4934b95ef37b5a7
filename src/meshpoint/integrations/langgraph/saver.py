"""``MeshpointSaver``: LangGraph's ``BaseCheckpointSaver`` on meshpoint's store.

The saver is async first: each ``a*`` method is one transaction of the store's
tenant (on PostgreSQL the tenant is set first, so row-level security holds every
statement), and a read is one statement (:mod:`meshpoint.integrations.langgraph.queries`).
LangGraph's synchronous methods run the async ones on the event loop the store
belongs to (:mod:`meshpoint.integrations.langgraph.loop`), as LangGraph's own async
savers do. Rows are written and read by :mod:`.rows`, values by :mod:`.serde`; the
operations on whole threads (delete, copy, prune) are in :mod:`.maintenance`.

What it does that LangGraph's own savers do not: a list channel that grows (a
conversation) is stored as the items it gained, not whole at every step; nothing
read is unpickled or imports a module, and every row is checked against its digest
before it is decoded; ``list`` reads a page of checkpoints per statement, with their
values and writes, never one query per checkpoint; SQLite runs with WAL, a busy
timeout and ``BEGIN IMMEDIATE`` (the store's), so several processes share a file;
and a loop step that would continue a checkpoint another loop step already continued
(two workers resuming one thread) is refused with
:class:`~meshpoint.errors.ThreadSupersededError` instead of forking the thread.
docs/langgraph.md has each guarantee beside the test that proves it.
"""

from __future__ import annotations

import random
import time
from collections.abc import AsyncIterator, Iterable, Iterator, Mapping, Sequence
from typing import Any, cast

import orjson
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    DeltaChannelHistory,
    PendingWrite,
    get_checkpoint_id,
    get_serializable_checkpoint_metadata,
)
from sqlalchemy import Connection, exc

from meshpoint.errors import InvalidArgumentError, ThreadSupersededError
from meshpoint.integrations.langgraph import maintenance
from meshpoint.integrations.langgraph import queries as lq
from meshpoint.integrations.langgraph.loop import OwnerLoop
from meshpoint.integrations.langgraph.rows import (
    BlobRow,
    StoredBlob,
    ValueCache,
    assemble,
    checked,
    digest,
    plan,
    thread_keys,
)
from meshpoint.integrations.langgraph.serde import SafeSerializer
from meshpoint.integrations.langgraph.tables import LG_CHECKPOINT, LG_METADATA, LG_WRITE
from meshpoint.store import SqlStore

#: Checkpoints a listing reads per statement.
PAGE = 100


def contains(document: Any, wanted: Any) -> bool:
    """Whether JSON ``document`` contains ``wanted`` as PostgreSQL's ``@>`` says: an
    object's every key with a contained value, an array's every item contained in
    one of the document's items, any other value equal."""
    if isinstance(wanted, dict):
        return isinstance(document, dict) and all(
            key in document and contains(document[key], value)
            for key, value in wanted.items())
    if isinstance(wanted, list):
        return isinstance(document, list) and all(
            any(contains(item, value) for item in document) for value in wanted)
    return bool(document == wanted) and isinstance(document, bool) == isinstance(wanted, bool)


def _config(thread: str, ns: str, checkpoint_id: str) -> RunnableConfig:
    return {"configurable": {"thread_id": thread, "checkpoint_ns": ns,
                             "checkpoint_id": checkpoint_id}}


class MeshpointSaver(BaseCheckpointSaver[str]):
    """A LangGraph checkpoint saver on a meshpoint store (SQLite or PostgreSQL).

    ``store`` is an open :class:`~meshpoint.store.SqlStore` (its tables include the
    saver's since migration 0010); use :meth:`open` to open one from a URL, or
    :func:`~meshpoint.integrations.langgraph.get_checkpointer`. ``types`` are the
    pydantic models, dataclasses, enums and named tuples of the graph's state that
    are stored as themselves (see :mod:`.serde`). ``cache_size`` is how many
    (thread, namespace, channel) values the saver remembers, to store the next
    version of each as a delta.
    """

    def __init__(self, store: SqlStore, *, types: Iterable[type] = (),
                 cache_size: int = 256, owns_store: bool = False,
                 loop: OwnerLoop | None = None) -> None:
        super().__init__(serde=SafeSerializer(types))
        self.serde: SafeSerializer = self.serde
        self.store = store
        self._owns_store = owns_store
        self._cache = ValueCache(cache_size)
        self._loop = loop if loop is not None else OwnerLoop.current()

    @classmethod
    async def open(cls, url: str, *, tenant_id: str = "default",
                   types: Iterable[type] = (), cache_size: int = 256,
                   **store_options: Any) -> MeshpointSaver:
        """A saver on a store of its own at ``url`` (migrated: its tables are created),
        closed with the saver; ``store_options`` go to :func:`meshpoint.open_store`."""
        from meshpoint.store import open_store

        store = await open_store(url, tenant_id=tenant_id, **store_options)
        return cls(store, types=types, cache_size=cache_size, owns_store=True)

    def __repr__(self) -> str:
        return f"MeshpointSaver({self.store!r})"

    # -- LangGraph's hooks -------------------------------------------------------------

    def get_next_version(self, current: str | None, channel: None = None) -> str:
        """A version after ``current``: its number plus one, and a random fraction so
        that two branches of a thread never share a version string (as LangGraph's
        own savers do)."""
        if current is None:
            number = 0
        elif isinstance(current, int):
            number = current
        else:
            number = int(str(current).split(".")[0])
        return f"{number + 1:032}.{random.random():016}"

    def with_allowlist(self, extra_allowlist: Any) -> MeshpointSaver:
        """LangGraph's msgpack allow-list, as registered types: the classes it names
        whose modules are already imported (nothing is imported here or on reads)."""
        serde = self.serde.with_loaded(extra_allowlist)
        if serde is self.serde:
            return self
        clone = MeshpointSaver(self.store, types=serde.types, owns_store=False,
                               loop=self._loop)
        clone._cache = self._cache
        return clone

    # -- writing ------------------------------------------------------------------------

    async def aput(self, config: RunnableConfig, checkpoint: Checkpoint,
                   metadata: CheckpointMetadata,
                   new_versions: ChannelVersions) -> RunnableConfig:
        return await self._loop.run(self._put(config, checkpoint, metadata, new_versions))

    async def _put(self, config: RunnableConfig, checkpoint: Checkpoint,
                   metadata: CheckpointMetadata,
                   new_versions: ChannelVersions) -> RunnableConfig:
        thread, ns = thread_keys(config)
        parent = get_checkpoint_id(config)
        checkpoint_id = str(checkpoint["id"])
        values = checkpoint["channel_values"]
        versions = checkpoint["channel_versions"]
        meta = get_serializable_checkpoint_metadata(config, metadata)
        doc = {key: value for key, value in checkpoint.items() if key != "channel_values"}
        sealer = self.store.sealer
        where = {"thread": thread, "ns": ns, "checkpoint": checkpoint_id}
        data = sealer.seal_bytes("langgraph", self.serde.dumps([doc, meta]), LG_CHECKPOINT,
                                 **where)
        rows: list[BlobRow] = []
        for channel, version in new_versions.items():
            if channel in values:
                value = values[channel]
                rows.append(plan(self._cache.get((thread, ns, channel)), channel,
                                 str(version), value, self.serde.dumps(value)))
        run_id = meta.get("run_id")
        params = {
            "p_thread": thread, "p_ns": ns, "p_checkpoint": checkpoint_id,
            "p_parent": parent,
            "p_continues": parent if meta.get("source") == "loop" else None,
            "p_run": None if run_id is None else str(run_id),
            "p_blobs": {ch: str(versions[ch]) for ch in values if ch in versions},
            "p_metadata": sealer.seal("langgraph", self.serde.to_json(meta), LG_METADATA,
                                      **where), "p_data": data,
            "p_digest": digest(b"checkpoint", (ns, checkpoint_id), data),
            "p_now": time.time(), "p_tenant": self.store.tenant_id}
        blobs = [row.params(thread, ns, sealer) for row in rows]  # sealed once

        def body(conn: Connection) -> list[BlobRow]:
            try:
                lq.PUT_CHECKPOINT.rowcount(conn, params)
            except exc.IntegrityError:
                # The only constraint an upsert by primary key can still hit.
                raise ThreadSupersededError(thread, ns, str(parent)) from None
            stored = []
            for row, sealed in zip(rows, blobs, strict=True):
                if lq.PUT_BLOB.rowcount(conn, {**params, **sealed}):
                    stored.append(row)
                elif row.base is not None:  # its base is gone (or the version stored)
                    whole = row.as_whole()
                    if lq.PUT_BLOB.rowcount(conn, {**params,
                                                   **whole.params(thread, ns, sealer)}):
                        stored.append(whole)
            return stored

        stored = await self.store.transaction(
            body, write=True, short=True, doing=f"saving a checkpoint of thread {thread!r}")
        for row in stored:
            self._cache.put((thread, ns, row.channel), row.cached())
        return _config(thread, ns, checkpoint_id)

    async def aput_writes(self, config: RunnableConfig, writes: Sequence[tuple[str, Any]],
                          task_id: str, task_path: str = "") -> None:
        await self._loop.run(self._put_writes(config, writes, task_id, task_path))

    async def _put_writes(self, config: RunnableConfig, writes: Sequence[tuple[str, Any]],
                          task_id: str, task_path: str) -> None:
        thread, ns = thread_keys(config)
        checkpoint_id = get_checkpoint_id(config)
        if checkpoint_id is None:
            raise InvalidArgumentError("put_writes needs configurable.checkpoint_id")
        # Special writes (error, interrupt, ...) replace the task's earlier one; others
        # are stored once, as LangGraph's savers do.
        statement = lq.UPSERT_WRITE if all(ch in WRITES_IDX_MAP for ch, _ in writes) \
            else lq.PUT_WRITE
        rows = []
        sealer = self.store.sealer
        for index, (channel, value) in enumerate(writes):
            idx = WRITES_IDX_MAP.get(channel, index)
            data = sealer.seal_bytes("langgraph", self.serde.dumps(value), LG_WRITE,
                                     thread=thread, ns=ns, checkpoint=checkpoint_id,
                                     task=task_id, idx=str(idx))
            rows.append({
                "p_tenant": self.store.tenant_id, "p_thread": thread, "p_ns": ns,
                "p_checkpoint": checkpoint_id, "p_task": task_id, "p_idx": idx,
                "p_channel": channel, "p_task_path": task_path, "p_data": data,
                "p_digest": digest(b"write", (ns, checkpoint_id, task_id, str(idx)), data)})
        if rows:
            await self.store.transaction(
                lambda conn: statement.execute_many(conn, rows), write=True, short=True,
                doing=f"saving writes of thread {thread!r}")

    # -- reading ------------------------------------------------------------------------

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        return await self._loop.run(self._get_tuple(config))

    async def _get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        thread, ns = thread_keys(config)
        checkpoint_id = get_checkpoint_id(config)
        params = {"p_thread": thread, "p_ns": ns, "p_checkpoint": checkpoint_id}
        statement = lq.GET_LATEST if checkpoint_id is None else lq.GET_CHECKPOINT
        rows = await self.store.statement(
            statement, params, doing=f"reading a checkpoint of thread {thread!r}")
        tuples = self._tuples(rows, remember=True)
        return tuples[0] if tuples else None

    async def alist(self, config: RunnableConfig | None, *,
                    filter: dict[str, Any] | None = None,
                    before: RunnableConfig | None = None,
                    limit: int | None = None) -> AsyncIterator[CheckpointTuple]:
        """Checkpoints newest first, read a page of :data:`PAGE` at a time (each page
        one statement, with the checkpoints' values and writes)."""
        configurable = (config or {}).get("configurable") or {}
        # Sealed metadata cannot be matched in SQL: with a key ring, the filter is
        # applied here, to the metadata each checkpoint's row holds.
        here = bool(filter) and self.store.sealer.keys is not None
        wanted = self.serde.to_json(filter) if here else None
        params: dict[str, Any] = {
            "p_filter": None if not filter or here else orjson.dumps(
                self.serde.to_json(filter)).decode(),
            "p_before": None if before is None else get_checkpoint_id(before),
            "p_after_thread": None, "p_after_ns": None}
        if "thread_id" not in configurable:
            statement = lq.LIST_ALL
        else:
            params["p_thread"] = str(configurable["thread_id"])
            if configurable.get("checkpoint_ns") is None:
                statement = lq.LIST_THREAD
            else:
                statement = lq.LIST_NS
                params["p_ns"] = str(configurable["checkpoint_ns"])
        left = limit
        while left is None or left > 0:
            page = PAGE if left is None or here else min(PAGE, left)
            rows = await self._loop.run(self.store.statement(
                statement, {**params, "p_limit": page}, doing="listing checkpoints"))
            tuples = self._tuples(rows, remember=False)
            for found in tuples:
                if here and not contains(self.serde.to_json(found.metadata), wanted):
                    continue
                yield found
                if left is not None:
                    left -= 1
                    if not left:
                        return
            if len(tuples) < page:
                return
            last = tuples[-1].config["configurable"]
            params.update(p_before=last["checkpoint_id"], p_after_thread=last["thread_id"],
                          p_after_ns=last["checkpoint_ns"])

    def _tuples(self, rows: list[Any], *, remember: bool) -> list[CheckpointTuple]:
        """The checkpoint tuples of a read's rows, newest first (see lq.read)."""
        heads = []
        chains: dict[tuple[str, str, str], dict[str, StoredBlob]] = {}
        writes: dict[tuple[str, str, str], list[Any]] = {}
        for row in rows:
            if row.kind == 0:
                heads.append(row)
            elif row.kind == 1:
                chains.setdefault((row.thread_id, row.checkpoint_ns, row.a), {})[row.b] = \
                    StoredBlob(row.b, row.c, row.d, row.n, row.m, row.data, row.digest)
            else:
                writes.setdefault((row.thread_id, row.checkpoint_ns, row.a), []).append(row)
        # The statement's order: newest id first, then thread and namespace ascending.
        heads.sort(key=lambda r: (r.thread_id, r.checkpoint_ns))
        heads.sort(key=lambda r: r.a, reverse=True)
        wholes: dict[tuple[str, str, str, str], bytes] = {}
        sealer = self.store.sealer
        found = []
        for head in heads:
            thread, ns, checkpoint_id = head.thread_id, head.checkpoint_ns, head.a
            data = checked(b"checkpoint", (ns, checkpoint_id), head.data, head.digest,
                           f"checkpoint {checkpoint_id!r} of thread {thread!r}")
            doc, meta = self.serde.loads(sealer.open_bytes(
                data, LG_CHECKPOINT, thread=thread, ns=ns, checkpoint=checkpoint_id))
            values = {}
            for channel, version in orjson.loads(head.c).items():
                key = (thread, ns, channel, version)
                whole = wholes.get(key)
                if whole is None:
                    built = assemble(thread, ns, channel, version,
                                     chains.get((thread, ns, channel), {}), sealer)
                    if built is None:
                        raise maintenance.missing_value(thread, checkpoint_id, channel,
                                                        version)
                    whole, cached = built
                    wholes[key] = whole
                    if remember and cached.items:
                        self._cache.put((thread, ns, channel), cached)
                values[channel] = self.serde.loads(whole)
            pending: list[PendingWrite] = []
            for w in sorted(writes.get((thread, ns, checkpoint_id), ()),
                            key=lambda w: (w.d, w.b, w.n)):
                value = checked(b"write", (ns, checkpoint_id, w.b, str(w.n)), w.data,
                                w.digest, f"a write of checkpoint {checkpoint_id!r}")
                pending.append((w.b, w.c, self.serde.loads(sealer.open_bytes(
                    value, LG_WRITE, thread=thread, ns=ns, checkpoint=checkpoint_id,
                    task=w.b, idx=str(w.n)))))
            found.append(CheckpointTuple(
                config=_config(thread, ns, checkpoint_id),
                checkpoint=cast(Checkpoint, {**doc, "channel_values": values}), metadata=meta,
                parent_config=None if head.b is None else _config(thread, ns, head.b),
                pending_writes=pending))
        return found

    async def aget_delta_channel_history(
            self, *, config: RunnableConfig,
            channels: Sequence[str]) -> Mapping[str, DeltaChannelHistory]:
        return await self._loop.run(maintenance.delta_history(self, config, channels))

    # -- whole threads --------------------------------------------------------------------

    async def adelete_thread(self, thread_id: str) -> None:
        await self._loop.run(maintenance.delete_thread(self, str(thread_id)))

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        await self._loop.run(maintenance.delete_for_runs(self, [str(r) for r in run_ids]))

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        await self._loop.run(maintenance.copy_thread(self, str(source_thread_id),
                                                     str(target_thread_id)))

    async def aprune(self, thread_ids: Sequence[str], *,
                     strategy: str = "keep_latest") -> None:
        await self._loop.run(maintenance.prune(self, [str(t) for t in thread_ids], strategy))

    def forget(self, thread_id: str) -> None:
        """Drop what the saver remembers of ``thread_id`` (its rows changed)."""
        self._cache.forget_thread(thread_id)

    # -- LangGraph's synchronous methods ----------------------------------------------------

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        return self._loop.call(self._get_tuple(config))

    def list(self, config: RunnableConfig | None, *,
             filter: dict[str, Any] | None = None,
             before: RunnableConfig | None = None,
             limit: int | None = None) -> Iterator[CheckpointTuple]:
        yield from self._loop.iterate(self.alist(config, filter=filter, before=before,
                                                 limit=limit))

    def put(self, config: RunnableConfig, checkpoint: Checkpoint,
            metadata: CheckpointMetadata, new_versions: ChannelVersions) -> RunnableConfig:
        return self._loop.call(self._put(config, checkpoint, metadata, new_versions))

    def put_writes(self, config: RunnableConfig, writes: Sequence[tuple[str, Any]],
                   task_id: str, task_path: str = "") -> None:
        self._loop.call(self._put_writes(config, writes, task_id, task_path))

    def delete_thread(self, thread_id: str) -> None:
        self._loop.call(maintenance.delete_thread(self, str(thread_id)))

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        self._loop.call(maintenance.delete_for_runs(self, [str(r) for r in run_ids]))

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        self._loop.call(maintenance.copy_thread(self, str(source_thread_id),
                                                str(target_thread_id)))

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        self._loop.call(maintenance.prune(self, [str(t) for t in thread_ids], strategy))

    def get_delta_channel_history(
            self, *, config: RunnableConfig,
            channels: Sequence[str]) -> Mapping[str, DeltaChannelHistory]:
        return self._loop.call(maintenance.delta_history(self, config, channels))

    # -- closing ----------------------------------------------------------------------------

    async def aclose(self) -> None:
        """Close the store if the saver opened it (and its private loop, if any); a
        second close does nothing, and a call after it raises StoreError."""
        if self._loop.stopped:
            return
        if self._owns_store:
            await self._loop.run(self.store.close())
        self._loop.stop()

    def close(self) -> None:
        """:meth:`aclose` from synchronous code."""
        if self._loop.stopped:
            return
        if self._owns_store:
            self._loop.call(self.store.close())
        self._loop.stop()

    async def __aenter__(self) -> MeshpointSaver:
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.aclose()

    def __enter__(self) -> MeshpointSaver:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()
