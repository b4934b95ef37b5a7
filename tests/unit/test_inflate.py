"""Every decompression of a stored blob is bounded: a small blob that would inflate
past the limit is refused after inflating at most that much (never inflated whole
and measured after)."""

from __future__ import annotations

import tracemalloc
import zlib

import pytest

from meshpoint.compression import inflate
from meshpoint.errors import CorruptCheckpointError, DecompressionLimitError


def bomb(inflated_bytes: int) -> bytes:
    """A zlib stream of ``inflated_bytes`` zeros, built a MiB at a time."""
    squeeze = zlib.compressobj(9)
    chunk = bytes(1 << 20)
    parts = [squeeze.compress(chunk) for _ in range(inflated_bytes >> 20)]
    return b"".join([*parts, squeeze.flush()])


def test_a_blob_inflating_past_the_limit_is_refused_having_inflated_at_most_that() -> None:
    data = bomb(256 << 20)  # 256 MiB from about 256 KiB
    assert len(data) < 300_000
    tracemalloc.start()
    try:
        with pytest.raises(DecompressionLimitError, match=r"the context of task 't1'.*"
                           r"max_decompressed_bytes \(1048576 bytes\)") as refused:
            inflate(data, 1 << 20, "the context of task 't1'", task_id="t1")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 8 << 20, peak  # not the 256 MiB a whole inflate would have taken
    assert refused.value.task_id == "t1"


def test_what_fits_the_limit_inflates_and_a_damaged_stream_is_corrupt() -> None:
    raw = b'{"a": "' + b"x" * 5000 + b'"}'
    packed = zlib.compress(raw, 1)
    assert inflate(packed, len(raw), "a blob") == raw  # exactly at the limit
    with pytest.raises(DecompressionLimitError):
        inflate(packed, len(raw) - 1, "a blob")
    with pytest.raises(CorruptCheckpointError, match="a blob is not a whole zlib stream"):
        inflate(packed[:-8], len(raw), "a blob")
    with pytest.raises(CorruptCheckpointError, match="a blob does not decompress"):
        inflate(b"not zlib at all", len(raw), "a blob")
