"""Bad input gets a clear, typed error and changes nothing, on both backends."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from sqlalchemy import delete, update

from meshpoint import TaskExecutionContext
from meshpoint.errors import (
    CheckpointConflictError,
    ContextSerializationError,
    CorruptCheckpointError,
    HistoryIntegrityError,
    InvalidArgumentError,
    MeshpointError,
    NotFoundError,
    UnknownCallError,
    UnknownInvocationError,
    UnknownSubTaskError,
    UnknownTaskError,
)
from meshpoint.history.planning import DISABLED
from meshpoint.store import SqlStore
from meshpoint.store.schema import parallel_invocations, paused_tasks, peer_sub_tasks
from meshpoint.store.schema import session_events as events_table
from tests.conftest import snapshot
from tests.integration.test_store import AGENT, fan_out

#: The store's own suite: also run with PostgreSQL's fast paths off.
pytestmark = pytest.mark.portable_too

Op = Callable[[SqlStore], Awaitable[Any]]

SUB_TASK_OPS: dict[str, Op] = {
    "resolve": lambda s: s.resolve_peer_sub_task("t1/sub-0", "x"),
    "claim": lambda s: s.claim_peer_sub_task("t1/sub-0"),
    "get": lambda s: s.get_peer_sub_task("t1/sub-0"),
    "reset_deadline": lambda s: s.reset_timeout_deadline("t1/sub-0"),
}
TASK_OPS: dict[str, Op] = {
    "restore": lambda s: s.restore_task("t1"),
    "cleanup": lambda s: s.cleanup_task("t1"),
    "take_lease": lambda s: s.take_resume_lease("t1", "o", 5, statuses=["waiting_peers"]),
    "renew_lease": lambda s: s.renew_resume_lease("t1", "o", 5),
    "release_lease": lambda s: s.release_resume_lease("t1", "o"),
    "sub_tasks_for_task": lambda s: s.get_peer_sub_tasks_for_task("t1"),
    "parallel_results": lambda s: s.get_parallel_results("t1", "inv-1"),
    "record_result": lambda s: s.record_parallel_result("t1", "inv-1", "call-0", "x"),
}


async def expect_unchanged(store: SqlStore, op: Op, error: type[MeshpointError],
                           match: str | None = None) -> MeshpointError:
    before = await snapshot(store)
    with pytest.raises(error, match=match) as caught:
        await op(store)
    assert await snapshot(store) == before
    return caught.value


@pytest.mark.parametrize("name", SUB_TASK_OPS)
async def test_unknown_sub_task_ids(store: SqlStore, name: str) -> None:
    await store.checkpoint_task(fan_out("other"), AGENT)
    error = await expect_unchanged(store, SUB_TASK_OPS[name], UnknownSubTaskError, "t1/sub-0")
    assert "never checkpointed" in str(error)


@pytest.mark.parametrize("name", TASK_OPS)
async def test_unknown_task_ids(store: SqlStore, name: str) -> None:
    await store.checkpoint_task(fan_out("other"), AGENT)
    await expect_unchanged(store, TASK_OPS[name], UnknownTaskError, "'t1'")


@pytest.mark.parametrize("name", [*SUB_TASK_OPS, *TASK_OPS])
async def test_another_tenants_ids_are_unknown(store: SqlStore, name: str) -> None:
    await store.checkpoint_task(fan_out("t1"), AGENT)
    ops = {**SUB_TASK_OPS, **TASK_OPS}
    expected = UnknownSubTaskError if name in SUB_TASK_OPS else UnknownTaskError
    await expect_unchanged(store.for_tenant("intruder"), ops[name], expected)
    assert (await store.get_peer_sub_task("t1/sub-0")).status == "pending"


async def test_a_context_that_cannot_be_serialised_writes_nothing(store: SqlStore) -> None:
    ctx = fan_out("t1")
    ctx.a2a_context["reply_to"] = lambda: None
    error = await expect_unchanged(store, lambda s: s.checkpoint_task(ctx, AGENT),
                                   ContextSerializationError)
    assert error.path == "context['a2a_context']['reply_to']"  # type: ignore[attr-defined]
    assert "function" in str(error)


async def test_a_result_that_cannot_be_serialised_resolves_nothing(store: SqlStore) -> None:
    await store.checkpoint_task(fan_out("t1"), AGENT)
    await expect_unchanged(store, lambda s: s.resolve_peer_sub_task("t1/sub-0", {1, 2}),
                           ContextSerializationError, "set")


def _lone_surrogate_in(where: str) -> TaskExecutionContext:
    ctx = fan_out("t2")
    if where == "event":
        ctx.append_session_event({"role": "tool", "text": "caf\udce9"})
    elif where == "context":
        ctx.flags["note"] = "\ud83d"  # half of an emoji's UTF-16 pair
    else:
        ctx.register_peer_sub_task("t2/odd", {"peer_agent_name": "p", "note": "\ud800"})
    return ctx


@pytest.mark.parametrize(("where", "path"), [
    ("event", "['text']"), ("context", "['flags']['note']"), ("correlation", "['note']")])
async def test_a_lone_surrogate_is_named_and_nothing_is_written(
        store: SqlStore, where: str, path: str) -> None:
    """A string with half of a UTF-16 pair (say, bytes decoded with
    errors='surrogateescape') passes the JSON checks but is not UTF-8: no database
    stores it as text. The checkpoint is refused naming where it is, not with a
    driver's UnicodeEncodeError, and nothing is written."""
    await store.checkpoint_task(fan_out("t1"), AGENT)
    ctx = _lone_surrogate_in(where)
    error = await expect_unchanged(store, lambda s: s.checkpoint_task(ctx, AGENT),
                                   ContextSerializationError, "lone surrogate")
    assert path in error.path  # type: ignore[attr-defined]
    await expect_unchanged(
        store, lambda s: s.resolve_peer_sub_task("t1/sub-0", {"text": "\udfff"}),
        ContextSerializationError, r"\$\['text'\] is a string with a lone surrogate")
    assert (await store.get_peer_sub_task("t1/sub-0")).status == "pending"


def _with_sub(correlation_data: dict[str, object]) -> TaskExecutionContext:
    """A paused task with one more peer call whose correlation data is ``correlation_data``."""
    ctx = fan_out("t")
    ctx.register_peer_sub_task("t/odd", {"peer_agent_name": "p", **correlation_data})
    return ctx


@pytest.mark.parametrize(("op", "match"), [
    (lambda s: s.checkpoint_task(fan_out("t"), ""), "agent_name"),
    (lambda s: s.checkpoint_task(fan_out("t"), AGENT, status="sleeping"), "status"),
    (lambda s: s.checkpoint_task(fan_out("t"), AGENT, default_timeout_s=-1), "default_timeout"),
    (lambda s: s.checkpoint_task(fan_out("t", timeout_s=float("inf")), AGENT), "timeout_s"),
    (lambda s: s.resolve_peer_sub_task("", "x"), "sub_task_id"),
    (lambda s: s.resolve_peer_sub_task("x" * 300, "x"), "sub_task_id"),
    # text no database can store: NUL (PostgreSQL), a lone surrogate (not UTF-8)
    (lambda s: s.resolve_peer_sub_task("t1/sub-0\x00", "x"), "sub_task_id .*NUL"),
    (lambda s: s.checkpoint_task(fan_out("t\ud800"), AGENT), "task_id .*lone surrogate"),
    (lambda s: s.checkpoint_task(fan_out("t2"), "agent\x00"), "agent_name .*NUL"),
    (lambda s: s.resolve_peer_sub_task("t1/sub-0", "x", lease_owner="o", lease_ttl_s=0),
     "ttl_s"),
    (lambda s: s.sweep_expired_timeouts(AGENT, limit=0), "limit"),
    (lambda s: s.take_resume_lease("t1", "o", ttl_s=-5), "ttl_s"),
    (lambda s: s.take_resume_lease("t1", "o", 5, statuses=["asleep"]), "statuses"),
    (lambda s: s.take_resume_lease("t1", "o", 5, statuses=[["resuming"]]), "statuses"),
    (lambda s: s.take_resume_lease("t1", "o", 5, statuses=[]), "statuses"),
    (lambda s: s.list_paused_tasks(limit=None), "limit"),
    (lambda s: s.resumable_tasks(AGENT, limit=0), "limit"),
    (lambda s: s.next_deadlines(limit=-1), "limit"),
    (lambda s: s.reset_timeout_deadline("t1/sub-0", timeout_s=float("nan")), "timeout_s"),
    (lambda s: s.checkpoint_task(_with_sub({"peer_agent_name": ""}), AGENT),
     "peer_agent_name of sub-task 't/odd'"),
    (lambda s: s.checkpoint_task(_with_sub({"peer_task_id": "x" * 300}), AGENT),
     "peer_task_id of sub-task 't/odd'"),
    (lambda s: s.checkpoint_task(_with_sub({"function_call_id": ""}), AGENT),
     "function_call_id of sub-task 't/odd'"),
    (lambda s: s.checkpoint_task(_with_sub({"timeout_s": "soon"}), AGENT),
     "timeout_s of sub-task 't/odd'"),
    (lambda s: s.checkpoint_task(_with_sub({"timeout_s": -1}), AGENT),
     "timeout_s of sub-task 't/odd'"),
])
async def test_malformed_arguments_are_named(store: SqlStore, op: Op, match: str) -> None:
    await store.checkpoint_task(fan_out("t1"), AGENT)
    await expect_unchanged(store, op, InvalidArgumentError, match)


async def test_a_join_that_could_never_complete_is_refused(store: SqlStore) -> None:
    ctx = fan_out("t1")
    ctx.begin_parallel_calls("inv-1", ["forgotten"])  # no result, no sub-task
    await expect_unchanged(store, lambda s: s.checkpoint_task(ctx, AGENT),
                           InvalidArgumentError, "forgotten")
    idle = TaskExecutionContext("t2")
    await expect_unchanged(store, lambda s: s.checkpoint_task(idle, AGENT),
                           InvalidArgumentError, "at least one pending peer sub-task")
    await store.checkpoint_task(idle, AGENT, status="input_required")  # other pauses are fine


@pytest.mark.parametrize(("build", "match"), [
    (lambda c: c.register_peer_sub_task("x", {"invocation_id": "older-turn"}),
     "waits on one join"),
    (lambda c: c.parallel_tool_calls["inv-1"].results.update(stray=1), "not in its call_order"),
    (lambda c: c.parallel_tool_calls["inv-1"].call_order.append("local"), "twice"),
    (lambda c: setattr(c, "session_events_persisted", 1), "first time"),
])
async def test_a_checkpoint_that_could_not_be_resumed_is_refused(
        store: SqlStore, build: Any, match: str) -> None:
    ctx = fan_out("t1")
    build(ctx)
    await expect_unchanged(store, lambda s: s.checkpoint_task(ctx, AGENT),
                           InvalidArgumentError, match)


async def test_a_context_nested_too_deeply_is_refused(store: SqlStore) -> None:
    ctx = fan_out("t1")
    ctx.flags["self"] = ctx.flags  # a cycle
    await expect_unchanged(store, lambda s: s.checkpoint_task(ctx, AGENT),
                           ContextSerializationError, "contains itself")


async def test_resuming_is_not_a_status_to_checkpoint_in(store: SqlStore) -> None:
    await expect_unchanged(store, lambda s: s.checkpoint_task(fan_out("t"), AGENT,
                                                              status="resuming"),
                           InvalidArgumentError, "set by the store")


async def test_colliding_ids_write_nothing(store: SqlStore) -> None:
    await store.checkpoint_task(fan_out("t1"), AGENT)
    await expect_unchanged(store, lambda s: s.checkpoint_task(fan_out("t1"), AGENT),
                           CheckpointConflictError, "already checkpointed")
    thief = fan_out("t2")
    thief.register_peer_sub_task("t1/sub-0", {"peer_agent_name": "p"})  # t1's sub-task id
    await expect_unchanged(store, lambda s: s.checkpoint_task(thief, AGENT),
                           CheckpointConflictError, "sub-task id already in use")


async def _corrupt(store: SqlStore, statement: Any) -> None:
    await store.run(lambda conn: conn.execute(statement), write=True)


TASK_ROW = (paused_tasks.c.tenant_id == "default") & (paused_tasks.c.logical_task_id == "t1")


@pytest.mark.parametrize(("damage", "match"), [
    (update(paused_tasks).where(TASK_ROW).values(context=b"\x00\xff garbage"), "SHA-256"),
    (update(paused_tasks).where(TASK_ROW).values(context_encoding="zlib"), "corrupt"),
    (update(paused_tasks).where(TASK_ROW).values(context_encoding="rot13"), "encoding"),
    (update(paused_tasks).where(TASK_ROW).values(context_sha256="0" * 64), "SHA-256"),
    (delete(events_table), "2 conversation events but 0"),
    (update(events_table).values(data=[{"role": "user"}]), "2 conversation events but 1"),
    (update(events_table).values(seq=1), "row at event 1 that does not continue the 0"),
    (update(events_table).values(data={"role": "user"}), "2 conversation events but 1"),
    (update(events_table).values(data="text"), "not a JSON array"),
])
async def test_a_corrupted_task_row_is_never_restored(store: SqlStore, damage: Any,
                                                      match: str) -> None:
    """Without the history, damage to the live rows is refused. With it, a damaged
    context is restored from the task's last history record instead (exactly what was
    checkpointed), and a damaged conversation, which the history does not hold, is
    refused as an HistoryIntegrityError: neither changes anything on a read."""
    ctx = fan_out("t1")
    await store.checkpoint_task(ctx, AGENT)
    await _corrupt(store, damage)
    bare = store.with_history(DISABLED)
    error = await expect_unchanged(bare, lambda s: s.restore_task("t1"),
                                   CorruptCheckpointError, match)
    assert error.task_id == "t1"  # type: ignore[attr-defined]
    if damage.table is paused_tasks:
        before = await snapshot(store)
        restored = await store.restore_task("t1")
        assert restored.context.to_checkpoint_dict() == ctx.to_checkpoint_dict()
        assert await snapshot(store) == before
    else:
        error = await expect_unchanged(store, lambda s: s.restore_task("t1"),
                                       HistoryIntegrityError, match)
        assert error.task_id == "t1"  # type: ignore[attr-defined]


async def test_a_corrupted_sub_task_row_resolves_nothing(store: SqlStore) -> None:
    await store.checkpoint_task(fan_out("t1"), AGENT)
    # JSON that decodes to the wrong shape (both backends); on SQLite also text that
    # is not JSON at all.
    await _corrupt(store, update(peer_sub_tasks).where(peer_sub_tasks.c.sub_task_id == "t1/sub-0")
                   .values(correlation_data=[1, 2]))
    await expect_unchanged(store, lambda s: s.resolve_peer_sub_task("t1/sub-0", "x"),
                           CorruptCheckpointError, "correlation data")
    if store.dialect == "sqlite":
        await store.run(lambda conn: conn.exec_driver_sql(
            "UPDATE agent_peer_sub_tasks SET correlation_data = '{broken' "
            "WHERE sub_task_id = 't1/sub-1'"), write=True)
        await expect_unchanged(store, lambda s: s.resolve_peer_sub_task("t1/sub-1", "x"),
                               CorruptCheckpointError, "does not decode")


async def test_a_missing_invocation_row_resolves_nothing(store: SqlStore) -> None:
    await store.checkpoint_task(fan_out("t1"), AGENT)
    await _corrupt(store, delete(parallel_invocations))
    await expect_unchanged(store, lambda s: s.resolve_peer_sub_task("t1/sub-0", "x"),
                           CorruptCheckpointError, "no row for invocation")
    assert (await store.get_peer_sub_task("t1/sub-0")).status == "pending"


async def test_more_pending_sub_tasks_than_the_join_expects_resolve_only_what_fits(
        store: SqlStore) -> None:
    """Two resolutions racing for the last slot of a join that has one sub-task too
    many: one is counted, the other raises and leaves its sub-task pending (on
    PostgreSQL the one-statement resolution must roll back, not commit half)."""
    await store.checkpoint_task(fan_out("t1", local=False), AGENT)  # 3 calls, 3 subs
    await _corrupt(store, update(parallel_invocations).values(total_expected=2,
                                                              completed_count=1))
    outcomes = await asyncio.gather(
        *(store.resolve_peer_sub_task(f"t1/sub-{n}", "x") for n in (0, 1)),
        return_exceptions=True)
    assert sorted(type(o).__name__ for o in outcomes) == ["CorruptCheckpointError",
                                                          "Resolution"]
    statuses = sorted([(await store.get_peer_sub_task(f"t1/sub-{n}")).status
                       for n in (0, 1, 2)])
    assert statuses == ["pending", "pending", "resolved"]


async def test_an_unknown_invocation_or_call_of_a_known_task_is_not_found(
        store: SqlStore) -> None:
    """The one rule for ids: unknown -> NotFoundError, whichever id it is."""
    await store.checkpoint_task(fan_out("t1"), AGENT)
    error = await expect_unchanged(store, lambda s: s.get_parallel_results("t1", "inv-9"),
                                   UnknownInvocationError, "no parallel invocation 'inv-9'")
    assert isinstance(error, NotFoundError)
    error = await expect_unchanged(
        store, lambda s: s.record_parallel_result("t1", "inv-1", "call-9", "x"),
        UnknownCallError, "no peer call 'call-9'")
    assert isinstance(error, NotFoundError)
