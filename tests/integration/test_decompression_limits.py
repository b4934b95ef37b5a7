"""A planted blob that inflates past the store's ``max_decompressed_bytes`` is refused,
naming its row and the limit, wherever the store inflates one: a task's context, a
history record's snapshot. The task it belongs to then goes where any task with a
corrupt row goes (restored from its verified snapshot, or blocked), and nothing is
written that could not be read back. On a SQLite file and on PostgreSQL (with and
without its fast paths); the blobs are planted by raw SQL, as someone who can write
the database but holds no key would plant them."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from sqlalchemy import select, update

from meshpoint.errors import (
    CorruptCheckpointError,
    DecompressionLimitError,
    InvalidArgumentError,
    TaskBlockedError,
)
from meshpoint.history.planning import DISABLED
from meshpoint.store import SqlStore
from meshpoint.store.schema import checkpoints, events, paused_tasks
from tests.conftest import _empty_store, row_counts
from tests.integration.test_history import sql
from tests.integration.test_store import AGENT, fan_out
from tests.unit.test_inflate import bomb

pytestmark = pytest.mark.portable_too

LIMIT = 1 << 20
BOMB = bomb(64 << 20)  # 64 KiB that inflate to 64 MiB


@pytest.fixture
async def limited(backend: str, store_url: str,
                  store_options: dict[str, object]) -> AsyncIterator[SqlStore]:
    """A store that inflates at most LIMIT bytes, and compresses past 64 bytes."""
    async with await _empty_store(backend, store_url, store_options,
                                  max_decompressed_bytes=LIMIT,
                                  compress_threshold_bytes=64) as opened:
        yield opened


async def plant_context(store: SqlStore, task_id: str) -> None:
    await sql(store, update(paused_tasks).where(
        paused_tasks.c.logical_task_id == task_id).values(context=BOMB,
                                                          context_encoding="zlib"))


async def resolve_all(store: SqlStore, task_id: str, peers: int = 3) -> None:
    for n in range(peers):
        await store.resolve_peer_sub_task(f"{task_id}/sub-{n}", "x", lease_owner="i-1")


async def test_a_context_blob_inflating_past_the_limit_is_refused(limited: SqlStore) -> None:
    store = limited.with_history(DISABLED)
    await store.checkpoint_task(fan_out("t1"), AGENT)
    await plant_context(store, "t1")
    await resolve_all(store, "t1")
    with pytest.raises(DecompressionLimitError) as refused:
        await store.restore_task("t1", lease_owner="i-1")
    message = str(refused.value)
    assert "the context of task 't1'" in message and f"({LIMIT} bytes)" in message, message
    assert refused.value.task_id == "t1"


async def test_with_the_history_the_task_is_restored_from_its_verified_snapshot(
        limited: SqlStore) -> None:
    await limited.checkpoint_task(fan_out("t1"), AGENT)
    await plant_context(limited, "t1")
    await resolve_all(limited, "t1")
    restored = await limited.restore_task("t1", lease_owner="i-1")
    assert restored.context.task_id == "t1"
    assert len(restored.context.parallel_tool_calls["inv-1"].results) == 4
    (repaired,) = await limited.run(lambda conn: list(conn.execute(
        select(events.c.output_data).where(events.c.event_type == "integrity_repaired"))))
    assert f"max_decompressed_bytes ({LIMIT} bytes)" in repaired.output_data["problem"]


async def test_a_snapshot_blob_inflating_past_the_limit_is_refused_and_the_task_blocked(
        limited: SqlStore) -> None:
    await limited.checkpoint_task(fan_out("t1"), AGENT)
    await plant_context(limited, "t1")
    (record,) = await limited.run(lambda conn: list(conn.execute(select(
        checkpoints.c.checkpoint_id).where(checkpoints.c.logical_task_id == "t1"))))
    await sql(limited, update(checkpoints).where(
        checkpoints.c.checkpoint_id == record.checkpoint_id).values(
            snapshot=BOMB, snapshot_encoding="zlib"))
    report = await limited.history.verify_task("t1")
    assert not report.ok and report.first_bad_id == record.checkpoint_id
    assert f"max_decompressed_bytes ({LIMIT} bytes)" in str(report.reason), report
    await resolve_all(limited, "t1")
    with pytest.raises(TaskBlockedError) as blocked:
        await limited.restore_task("t1", lease_owner="i-1")
    assert record.checkpoint_id in str(blocked.value)
    assert f"max_decompressed_bytes ({LIMIT} bytes)" in str(blocked.value)
    (row,) = await limited.run(lambda conn: list(conn.execute(select(paused_tasks.c.status))))
    assert row.status == "blocked"


async def test_nothing_is_written_that_could_not_be_read_back(limited: SqlStore) -> None:
    """A context (or a snapshot) past the limit would be stored compressed and then
    refused at every read: it is refused when it is written, and nothing is."""
    before = await row_counts(limited)
    for store in (limited, limited.with_history(DISABLED)):
        ctx = fan_out("t1")
        ctx.security_context = {"blob": "x" * (LIMIT + 1)}
        with pytest.raises(InvalidArgumentError, match=r"the context of task 't1' is \d+ "
                           r"bytes, past this store's max_decompressed_bytes"):
            await store.checkpoint_task(ctx, AGENT)
    big = fan_out("t2")
    big.begin_parallel_calls("inv-1", ["local", *(f"call-{n}" for n in range(3)), "big"])
    big.record_parallel_result("inv-1", "big", "x" * (LIMIT + 1))
    with pytest.raises(InvalidArgumentError, match="the snapshot of task 't2'"):
        await limited.checkpoint_task(big, AGENT)
    assert await row_counts(limited) == before


async def test_a_langgraph_value_is_never_inflated(limited: SqlStore) -> None:
    """The LangGraph saver stores its values uncompressed (a delta is the items a
    list gained, joined to the rows it extends): a compressed blob planted as a
    channel's value, even with the digest it must have, is refused as not JSON,
    never inflated."""
    from meshpoint.integrations.langgraph import MeshpointSaver
    from meshpoint.integrations.langgraph.rows import digest
    from meshpoint.integrations.langgraph.tables import graph_blobs
    from tests.integration.test_langgraph_saver import _log_graph, config

    graph = _log_graph().compile(checkpointer=MeshpointSaver(limited))
    for _ in range(3):
        await graph.ainvoke({"log": ["x"]}, config("th"))
    rows = await limited.run(lambda conn: list(conn.execute(select(
        graph_blobs.c.checkpoint_ns, graph_blobs.c.channel, graph_blobs.c.version))))
    for row in rows:
        await sql(limited, update(graph_blobs).where(
            graph_blobs.c.channel == row.channel, graph_blobs.c.version == row.version
        ).values(data=BOMB, digest=digest(b"blob", (row.checkpoint_ns, row.channel,
                                                     row.version), BOMB)))
    with pytest.raises(CorruptCheckpointError, match="not JSON") as refused:
        await graph.aget_state(config("th"))
    assert not isinstance(refused.value, DecompressionLimitError)
