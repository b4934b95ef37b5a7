"""The compression of stored blobs (a task's context past a threshold, history
snapshots), and the one way they are inflated: bounded.

A compressed blob is read before anything checks it (its SHA-256 is of the inflated
bytes), so whoever can write a row could plant a few hundred KiB that inflate to
gigabytes. :func:`inflate` stops at the store's ``max_decompressed_bytes`` (zlib's
``max_length``: at most that much is ever produced) and refuses the blob; the
writers refuse a blob whose inflated size would be past the limit, so that nothing
is written that could not be read back.
"""

from __future__ import annotations

import zlib

from meshpoint.errors import (
    CorruptCheckpointError,
    DecompressionLimitError,
    InvalidArgumentError,
)

#: The default ``max_decompressed_bytes``: far above a real context or snapshot (a
#: conversation is stored apart from its task's context), far below what hurts.
DEFAULT_MAX_DECOMPRESSED_BYTES = 64 << 20


def compress(raw: bytes) -> bytes:
    """``raw`` as the store compresses it (zlib, level 1: the write path's speed)."""
    return zlib.compress(raw, 1)


def inflate(data: bytes, limit: int, what: str, *, task_id: str | None = None) -> bytes:
    """The bytes ``data`` (a zlib stream) inflates to, if that is at most ``limit``;
    DecompressionLimitError otherwise, after producing at most ``limit + 1`` bytes.
    CorruptCheckpointError for a stream that does not decompress or is cut short.
    ``what`` names the row in the errors (``"the context of task 't1'"``)."""
    inflater = zlib.decompressobj()
    try:
        out = inflater.decompress(data, limit + 1)
    except zlib.error as error:
        raise CorruptCheckpointError(f"{what} does not decompress ({error})",
                                     task_id=task_id) from None
    if len(out) > limit:
        raise DecompressionLimitError(
            f"{what} inflates past this store's max_decompressed_bytes ({limit} bytes): "
            "it was refused, having inflated no more than that, and not used. A genuine "
            "one needs a higher limit (store: max_decompressed_bytes, or "
            "open_store(max_decompressed_bytes=...))", task_id=task_id)
    # Below the limit, zlib stopped because the input ran out: a whole stream ends.
    if not inflater.eof:
        raise CorruptCheckpointError(f"{what} is not a whole zlib stream (cut short)",
                                     task_id=task_id)
    return out


def check_inflatable(size: int, limit: int, what: str) -> None:
    """Refuse to store ``what`` compressed if its ``size`` (inflated) is past
    ``limit``: it could not be read back."""
    if size > limit:
        raise InvalidArgumentError(
            f"{what} is {size} bytes, past this store's max_decompressed_bytes ({limit} "
            "bytes): stored, it could not be read back, so nothing was written. Keep "
            "less in it, or raise the limit (store: max_decompressed_bytes, or "
            "open_store(max_decompressed_bytes=...))")
