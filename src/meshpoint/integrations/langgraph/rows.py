"""The rows the LangGraph saver writes, and reading them back: digests checked before
anything is decoded, channel values stored whole or as the items a list gained.

A row's ``digest`` is the SHA-256 of its kind, its key within the thread (namespace,
and the checkpoint id, or the channel and version, or the checkpoint, task and
index) and its bytes: a changed byte, or a row's bytes moved under another key, is
found before the bytes are decoded (:class:`~meshpoint.errors.CorruptCheckpointError`).
The thread id is left out, so that ``copy_thread`` copies rows without rewriting them.

**Encryption.** With the store's encryption on (:mod:`meshpoint.store.sealing`,
family ``langgraph``), a row's bytes are sealed bound to its tenant, column and whole
key, thread included (``copy_thread`` then seals each row again for its new thread),
and the digest is of the sealed bytes: a digest of the plain bytes would let a
reader of the database confirm a guess of a small value.

**Deltas.** A channel whose value is a list that only grows (a conversation) would
otherwise be stored whole at every step: LangGraph's savers store it at each
version, so their tables grow with the square of the conversation. The saver keeps,
per thread, namespace and channel, the bytes of the last version it wrote or read
(:class:`ValueCache`); a new version whose bytes extend that list by whole items is
stored as those items and the version it extends. A chain of deltas starts at a
whole value and is cut by a new whole value once it has more rows than
``max(DELTA_RUN, items of its root)``: a read then fetches at most that many rows
after the root (never more rows than the value has items, past the first
``DELTA_RUN``), and the whole values stored over a growing list add up to about
twice its final size, not its square. Nothing is assumed about lineage: the
base is whatever stored version the bytes extend, so forks and several processes
stay correct (a process that has not seen a thread stores one whole value first).
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from meshpoint.errors import CorruptCheckpointError, InvalidArgumentError
from meshpoint.integrations.langgraph.tables import LG_BLOB
from meshpoint.store.sealing import Sealer

#: A delta chain may grow to this many rows at least before a whole value cuts it.
DELTA_RUN = 64


def thread_keys(config: Any) -> tuple[str, str]:
    """The thread id and namespace a LangGraph config names (namespace ``""``: the
    root graph)."""
    configurable = config.get("configurable") or {}
    thread = configurable.get("thread_id")
    if thread is None:
        raise InvalidArgumentError(
            "a LangGraph config needs configurable.thread_id, for example "
            "{'configurable': {'thread_id': 'my-thread'}}")
    return str(thread), str(configurable.get("checkpoint_ns") or "")


def digest(kind: bytes, key: tuple[str, ...], data: bytes) -> str:
    """The SHA-256 (hex) of a row's kind, key and bytes."""
    h = hashlib.sha256(kind)
    for part in key:
        h.update(b"\x00")
        h.update(part.encode())
    h.update(b"\x01")
    h.update(data)
    return h.hexdigest()


def checked(kind: bytes, key: tuple[str, ...], data: bytes, stored: str, what: str) -> bytes:
    """``data`` if it hashes to ``stored``; otherwise CorruptCheckpointError."""
    if digest(kind, key, data) != stored:
        raise CorruptCheckpointError(
            f"{what} does not hash to its stored digest: it was changed or moved after it "
            "was written, and is not read")
    return data


@dataclass(frozen=True)
class Cached:
    """The last version of a channel this process wrote or read, as whole bytes."""

    version: str
    data: bytes  # the whole value's bytes (a JSON array when ``items`` counts)
    items: int  # items of the list
    root: str  # the whole value its chain starts at
    depth: int  # deltas since the root
    root_items: int  # items of the root


class ValueCache:
    """The :class:`Cached` version of each (thread, namespace, channel), least recently
    used first out past ``size`` entries."""

    def __init__(self, size: int) -> None:
        self._size = size
        self._entries: OrderedDict[tuple[str, str, str], Cached] = OrderedDict()

    def get(self, key: tuple[str, str, str]) -> Cached | None:
        entry = self._entries.get(key)
        if entry is not None:
            self._entries.move_to_end(key)
        return entry

    def put(self, key: tuple[str, str, str], entry: Cached) -> None:
        if self._size <= 0:
            return
        self._entries[key] = entry
        self._entries.move_to_end(key)
        while len(self._entries) > self._size:
            self._entries.popitem(last=False)

    def forget_thread(self, thread_id: str) -> None:
        for key in [k for k in self._entries if k[0] == thread_id]:
            del self._entries[key]


@dataclass(frozen=True)
class BlobRow:
    """A channel version to store: whole, or as a delta on ``base``."""

    channel: str
    version: str
    whole: bytes  # the whole value's bytes, whatever is stored
    items: int  # items of the whole list (0 if it is not a list)
    base: str | None  # the version a delta extends; None for a whole value
    data: bytes  # what is stored: ``whole``, or the items gained as a JSON array
    row_items: int  # items in ``data``
    root: str
    depth: int
    root_items: int

    def params(self, thread: str, ns: str, sealer: Sealer) -> dict[str, Any]:
        data = sealer.seal_bytes("langgraph", self.data, LG_BLOB, thread=thread, ns=ns,
                                 channel=self.channel, version=self.version)
        return {"p_channel": self.channel, "p_version": self.version, "p_base": self.base,
                "p_root": self.root, "p_depth": self.depth, "p_items": self.row_items,
                "p_data": data,
                "p_digest": digest(b"blob", (ns, self.channel, self.version), data)}

    def as_whole(self) -> BlobRow:
        return BlobRow(self.channel, self.version, self.whole, self.items, None, self.whole,
                       self.items, self.version, 0, self.items)

    def cached(self) -> Cached:
        return Cached(self.version, self.whole, self.items, self.root, self.depth,
                      self.root_items)


def plan(cached: Cached | None, channel: str, version: str, value: Any,
         whole: bytes) -> BlobRow:
    """How to store ``value`` (``whole`` is its bytes) at ``version``: the items it
    gained over ``cached`` if it extends that list and the chain may grow, else whole."""
    items = len(value) if type(value) is list else 0
    row = BlobRow(channel, version, whole, items, None, whole, items, version, 0, items)
    if cached is None or not items or cached.version == version or not cached.items \
            or items <= cached.items:
        return row
    if cached.depth + 1 > max(DELTA_RUN, cached.root_items):
        return row
    old = cached.data
    cut = len(old) - 1  # old without its closing bracket
    if whole[cut:cut + 1] != b"," or not whole.startswith(old[:cut]):
        return row
    return BlobRow(channel, version, whole, items, cached.version, b"[" + whole[cut + 1:],
                   items - cached.items, cached.root, cached.depth + 1, cached.root_items)


@dataclass(frozen=True)
class StoredBlob:
    """A row of ``agent_langgraph_blobs`` as read (digest not checked yet)."""

    version: str
    base: str | None
    root: str
    depth: int
    items: int
    data: bytes
    digest: str


def assemble(thread: str, ns: str, channel: str, version: str,
             chain: dict[str, StoredBlob], sealer: Sealer) -> tuple[bytes, Cached] | None:
    """The whole bytes of ``version`` from the rows of its chain, each checked against
    its digest and opened; None if the version is not among them."""
    row = chain.get(version)
    if row is None:
        return None
    parts: list[bytes] = []
    items = 0
    seen = 0
    top = row
    while True:
        data = checked(b"blob", (ns, channel, row.version), row.data, row.digest,
                       f"the value of channel {channel!r} at version {row.version!r}")
        parts.append(sealer.open_bytes(data, LG_BLOB, thread=thread, ns=ns, channel=channel,
                                       version=row.version))
        items += row.items
        if row.base is None:
            break
        base = chain.get(row.base)
        seen += 1
        if base is None or seen > len(chain):
            raise CorruptCheckpointError(
                f"the value of channel {channel!r} at version {version!r} extends version "
                f"{row.base!r}, which is missing: it was deleted by hand, and is not read")
        row = base
    root = row
    if len(parts) == 1:
        whole = parts[0]
    else:
        # root "[a,b]" + deltas "[c]" "[d,e]" (newest first in parts) -> "[a,b,c,d,e]"
        whole = b",".join([parts[-1][:-1], *(p[1:-1] for p in reversed(parts[:-1]))]) + b"]"
    return whole, Cached(version, whole, items, root.version, top.depth, root.items)
