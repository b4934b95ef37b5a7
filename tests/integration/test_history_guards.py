"""What keeps the checkpoint history trustworthy when it is used wrongly or attacked
in ways the chain alone does not show (issue 15 §1-2), on a SQLite file and on
PostgreSQL (with and without its fast paths): seed 001's appends kept off live and
finalized chains, an agent's part of a record checked before it is written, a deleted
head, a changed snapshot, a head a purge moved under a writer."""

from __future__ import annotations

import asyncio
import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import delete, select, update

from meshpoint.errors import (
    CheckpointConflictError,
    HistoryIntegrityError,
    InvalidArgumentError,
    TaskBlockedError,
)
from meshpoint.history.planning import HistoryOptions
from meshpoint.store import SqlStore
from meshpoint.store.schema import checkpoint_heads, checkpoints, events, paused_tasks
from tests.conftest import someone_waits_for
from tests.integration.mesh import eventually
from tests.integration.test_history import rows, sql, three_checkpoints
from tests.integration.test_store import AGENT, fan_out

pytestmark = pytest.mark.portable_too


async def head_rows(store: SqlStore, task_id: str = "t1") -> list[object]:
    return await store.run(lambda conn: list(conn.execute(
        select(checkpoint_heads).where(checkpoint_heads.c.logical_task_id == task_id))))


# -- seed 001's appends ------------------------------------------------------------------


async def test_appends_refuse_a_live_task_and_a_finalized_chain(store: SqlStore) -> None:
    await three_checkpoints(store)
    latest = await store.history.get_latest_checkpoint("t1")
    assert latest is not None
    last = latest.metadata.checkpoint_id
    other = await store.history.create_checkpoint("audit", "planner", {})
    for append in (lambda: store.history.create_checkpoint("t1", AGENT, {}),
                   lambda: store.history.update_checkpoint(last, {}),
                   lambda: store.history.finalize_checkpoint(last, "completed"),
                   lambda: store.history.link_checkpoints(other, last)):
        with pytest.raises(CheckpointConflictError, match="'t1' is live"):
            await append()
    assert len(await rows(store)) == 3  # nothing appended, and the task restores
    for n in range(2):
        await store.resolve_peer_sub_task(f"t1/again-3-{n}", "done", lease_owner="i-2")
    assert (await store.restore_task("t1", lease_owner="i-2")).status == "resuming"

    done = await store.history.finalize_checkpoint(other, "completed")
    for append in (lambda: store.history.finalize_checkpoint(done, "failed"),
                   lambda: store.history.update_checkpoint(other, {}),
                   lambda: store.history.create_checkpoint("audit", "planner", {})):
        with pytest.raises(CheckpointConflictError, match="finalized \\(completed\\)"):
            await append()
    (head,) = await head_rows(store, "audit")
    assert (head.records, head.outcome) == (2, "completed")  # type: ignore[attr-defined]
    with pytest.raises(InvalidArgumentError, match="linked to itself"):
        await store.history.link_checkpoints(last, last)
    # An end is written by finalize, which marks the head ended too.
    for append in (lambda: store.history.create_checkpoint("audit-2", "planner", {},
                                                           phase="completed"),
                   lambda: store.history.create_checkpoint("audit-2", "planner", {
                       "execution_state": {"phase": "failed"}})):
        with pytest.raises(InvalidArgumentError, match="ends a chain: end it with "
                                                       "finalize_checkpoint"):
            await append()


async def test_appends_at_once_all_land_one_after_the_other(store: SqlStore) -> None:
    first = await store.history.create_checkpoint("audit", "planner", {})
    ids = await asyncio.gather(*(store.history.create_checkpoint(
        "audit", "planner", {"extensions": {"n": n}}) for n in range(8)))
    chain = await store.history.get_checkpoint_history("audit")
    assert sorted(r.metadata.seq for r in chain) == list(range(1, 10))
    assert {r.metadata.checkpoint_id for r in chain} == {first, *ids}
    assert (await store.history.verify_task("audit")).ok


async def test_an_agents_part_of_a_record_is_checked_before_it_is_written(
        store: SqlStore) -> None:
    for state, problem in (
            ({"metrics": {"tests_status": "green"}}, "metrics.tests_status: Input should be "
                                                     "a valid dictionary"),
            ({"context_summary": {"key_decisions": "one"}}, "key_decisions: Input should be "
                                                            "a valid list"),
            ({"execution_state": {"phase": 5}}, "phase: Input should be a valid string"),
            ({"recovery": {"continuation_prompt": {"a": 1}}}, "continuation_prompt"),
            ({"metrics": {"cost": {"total": "0"}}}, "cost is filled by meshpoint"),
            ({"recovery": {"context_sha256": "0" * 64}}, "context_sha256 is filled by"),
            ({"metrics": [1]}, r"state\['metrics'\] must be a dict"),
            ({"metadata": {}}, "metadata: not a section an agent fills"),
            ("hello", "state must be a dict of record sections")):
        with pytest.raises(InvalidArgumentError, match=problem):
            await store.history.create_checkpoint("audit", "planner", state)  # type: ignore[arg-type]
    assert await store.history.get_checkpoint_history("audit") == []  # nothing written
    first = await store.history.create_checkpoint("audit", "planner", {
        "metrics": {"tests_status": {"passed": 3}, "files_modified": ["a.py"]},
        "context_summary": {"key_decisions": ["SQLite first"]}})
    with pytest.raises(InvalidArgumentError, match="partial_state must be a dict"):
        await store.history.update_checkpoint(first, "hello")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="bogus: not a section"):
        await store.history.update_checkpoint(first, {"bogus": {}})
    amended = await store.history.get_checkpoint(await store.history.update_checkpoint(
        first, {"metrics": {"tests_status": {"passed": 4}}}))
    # The agent's part is carried forward and amended; meshpoint's own is filled anew.
    assert amended.metrics.tests_status == {"passed": 4}
    assert amended.metrics.files_modified == ["a.py"]
    assert amended.context_summary.key_decisions == ["SQLite first"]
    assert amended.extensions["amends"] == first

    # Through a task's context: refused at the checkpoint, which writes nothing.
    ctx = fan_out("t1")
    ctx.history = {"record": {"metrics": {"tokens_consumed": 0}}}
    with pytest.raises(InvalidArgumentError, match="tokens_consumed is filled by meshpoint"):
        await store.checkpoint_task(ctx, AGENT)
    assert set((await store.live_row_counts()).values()) == {0}
    assert await rows(store) == []


# -- a deleted head, a changed snapshot ----------------------------------------------------


async def test_a_deleted_head_does_not_pass_for_a_task_without_a_history(
        store: SqlStore) -> None:
    await three_checkpoints(store)
    await sql(store, delete(checkpoint_heads).where(checkpoint_heads.c.logical_task_id == "t1"))
    # The live row replaced as well, with a matching hash: only the records can tell.
    forged = b'{"a2a_context": {"session_id": "hijacked"}}'
    await sql(store, update(paused_tasks).where(paused_tasks.c.logical_task_id == "t1")
              .values(context=forged, context_encoding="json",
                      context_sha256=hashlib.sha256(forged).hexdigest()))
    with pytest.raises(HistoryIntegrityError, match="records but no head"):
        await store.restore_task("t1")
    for n in range(2):
        await store.resolve_peer_sub_task(f"t1/again-3-{n}", "done", lease_owner="i-2")
    with pytest.raises(TaskBlockedError, match="records but no head"):
        await store.restore_task("t1", lease_owner="i-2")
    # A chain walk of the whole tenant finds it, although no head lists it.
    assert await store.history.task_ids() == []
    assert await store.history.headless_task_ids() == ["t1"]
    report = await store.history.verify_task("t1")
    assert (report.ok, report.kind) == (False, "broken")


async def test_a_changed_snapshot_is_found_and_never_restored_from(store: SqlStore) -> None:
    await three_checkpoints(store)
    last = (await rows(store))[-1]
    await sql(store, update(checkpoints).where(
        checkpoints.c.checkpoint_id == last.checkpoint_id).values(
        snapshot=bytes(last.snapshot).replace(b"inv-3", b"inv-9")))
    report = await store.history.verify_task("t1")
    assert (report.ok, report.kind, report.first_bad_seq) == (False, "corrupt", 3)
    assert "its snapshot does not hash" in str(report.reason)
    # With the live row damaged too, the holder's restore cannot repair from record
    # 3's snapshot: it rewinds to record 2, whose snapshot verifies.
    await sql(store, update(paused_tasks).where(paused_tasks.c.logical_task_id == "t1")
              .values(context=b"{}", context_sha256="0" * 64))
    for n in range(2):
        await store.resolve_peer_sub_task(f"t1/again-3-{n}", "done", lease_owner="i-2")
    restored = await store.restore_task("t1", lease_owner="i-2")
    assert restored.context.current_invocation_id == "inv-2"
    logged = await store.run(lambda conn: [r.event_type for r in conn.execute(
        select(events).where(events.c.logical_task_id == "t1"))])
    assert logged == ["integrity_rewound"]


async def test_by_agent_reads_check_their_range_and_the_column_they_search(
        store: SqlStore) -> None:
    await store.history.create_checkpoint("audit", "planner", {})
    for since, until, problem in (("yesterday", None, "since must be epoch seconds"),
                                  (float("nan"), None, "since must be epoch seconds"),
                                  (10.0, 5.0, r"since \(10.0\) is after until \(5.0\)"),
                                  (0, float("inf"), "until must be epoch seconds"),
                                  (10**400, None, "since must be epoch seconds")):
        with pytest.raises(InvalidArgumentError, match=problem):
            await store.history.get_checkpoints_by_agent("planner", since=since, until=until)
    with pytest.raises(InvalidArgumentError, match="limit must be an int from 1 to"):
        await store.history.get_checkpoints_by_agent("planner", limit=2**63)
    await sql(store, update(checkpoints).values(agent_name="intruder"))
    with pytest.raises(HistoryIntegrityError, match="stored under agent 'intruder' but says it is "
                                             "agent 'planner'"):
        await store.history.get_checkpoints_by_agent("intruder")


# -- a head moved under a writer -------------------------------------------------------------


@pytest.mark.parametrize("backend", [
    pytest.param(name, marks=pytest.mark.postgres)
    for name in ("postgres", "postgres-portable")], indirect=True)
async def test_a_re_checkpoint_whose_head_a_purge_removed_meanwhile_writes_nothing(
        store: SqlStore) -> None:
    """A transaction doing what a purge of the whole chain does holds the head while
    the lease holder checkpoints again: once it commits, the checkpoint must not write
    a record without a head (PostgreSQL's one-statement form found the head gone only
    as it updated it). On SQLite the write lock serialises the two."""
    ctx = await three_checkpoints(store)
    for n in range(2):
        await store.resolve_peer_sub_task(f"t1/again-3-{n}", "done", lease_owner="i-2")
    restored = await store.restore_task("t1", lease_owner="i-2")
    ctx, ctx_version = restored.context, restored.version
    ctx.current_invocation_id = "inv-4"
    ctx.register_peer_sub_task("t1/again-4-0", {"peer_agent_name": "peer-0"})
    engine = store._db.engine  # the test's own connection, as the purge's
    async with engine.connect() as purge:
        await purge.execute(delete(checkpoint_heads).where(
            checkpoint_heads.c.logical_task_id == "t1"))
        writer = asyncio.create_task(store.checkpoint_task(ctx, AGENT, lease_owner="i-2"))
        await eventually(lambda: someone_waits_for(purge),
                         what="the writer to wait for the head row")
        assert not writer.done()
        await purge.commit()
    with pytest.raises(CheckpointConflictError, match="no longer ends at record 3"):
        await writer
    assert [r.seq for r in await rows(store)] == [1, 2, 3]  # no record 4, headless
    live = await store.run(lambda conn: conn.execute(select(paused_tasks.c.version)).scalar())
    assert live == ctx_version  # the re-checkpoint was rolled back whole


def test_verify_all_reports_a_chain_whose_head_was_deleted(tmp_path: Path) -> None:
    path = tmp_path / "h.db"
    url = f"sqlite:///{path}"

    async def setup() -> None:
        from meshpoint import open_store

        async with open_store(url, history=HistoryOptions()) as opened:
            await three_checkpoints(opened)
            await opened.history.create_checkpoint("audit", "planner", {})
            await sql(opened, delete(checkpoint_heads).where(
                checkpoint_heads.c.logical_task_id == "t1"))

    asyncio.run(setup())
    done = subprocess.run([sys.executable, "-m", "meshpoint.cli", "verify", "--all",
                           "--url", url, "--json"], capture_output=True, text=True,
                          check=False)
    assert done.returncode == 1, done.stderr
    found = json.loads(done.stdout)
    assert (found["chains"], found["failed"]) == (2, 1)
    (bad,) = [r for r in found["reports"] if not r["ok"]]
    assert (bad["task_id"], bad["kind"]) == ("t1", "broken")
    assert "no head" in bad["reason"]


async def test_a_task_whose_context_holds_a_bad_record_part_still_ends(
        store: SqlStore, caplog: pytest.LogCaptureFixture) -> None:
    ctx = fan_out("t1", peers=1)
    await store.checkpoint_task(ctx, AGENT)
    # Set on the context directly (not through a hook, which is checked), or written
    # before the check existed: the task's end is recorded without it.
    ctx.history["record"] = {"metrics": {"cost": {}}, "extensions": {"note": "kept?"}}
    await store.cleanup_task("t1", ctx=ctx)
    assert set((await store.live_row_counts()).values()) == {0}
    latest = await store.history.get_latest_checkpoint("t1")
    assert latest is not None and latest.execution_state.phase == "completed"
    assert latest.extensions == {} and latest.metrics.cost["total"] == "0"
    assert "its record is written without what ctx.history sets" in caplog.text
