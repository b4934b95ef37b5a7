"""The checkpoint history (issue 15 §1-2, DESIGN.md invariant 9), on a SQLite file and on
PostgreSQL: a record at every checkpoint and end, seed 001's operations, and every
kind of tampering detected, by the reads and by the chain walk (``meshpoint verify``
walks the same), and never resumed from."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest
from sqlalchemy import delete, select, update

from meshpoint import TaskExecutionContext
from meshpoint.errors import (
    CheckpointConflictError,
    HistoryIntegrityError,
    InvalidArgumentError,
    KeyMissingError,
    LeaseNotHeldError,
    TaskBlockedError,
    UnknownCheckpointError,
    UnknownHistoryError,
)
from meshpoint.history.encryption import EncryptionKeys
from meshpoint.history.integrity import SigningKeys
from meshpoint.history.planning import HistoryOptions
from meshpoint.history.record import CheckpointRecord
from meshpoint.store import SqlStore
from meshpoint.store.history_restore import LOST_RESULT
from meshpoint.store.schema import checkpoint_heads, checkpoints, events, paused_tasks
from tests.conftest import FakeClock, snapshot
from tests.integration.test_store import AGENT, fan_out

pytestmark = pytest.mark.portable_too


async def three_checkpoints(store: SqlStore, task_id: str = "t1") -> TaskExecutionContext:
    """A task checkpointed three times (waiting on peers each time, its joins answered
    in between), still paused: records 1-3 of its chain."""
    ctx = fan_out(task_id, peers=2)
    await store.checkpoint_task(ctx, AGENT)
    for turn in (2, 3):
        for n in range(2):
            sub = f"{task_id}/sub-{n}" if turn == 2 else f"{task_id}/again-{turn - 1}-{n}"
            await store.resolve_peer_sub_task(sub, {"text": f"answer {n}"}, lease_owner="i-1")
        ctx = (await store.restore_task(task_id, lease_owner="i-1")).context
        ctx.append_session_event({"role": "model", "text": f"turn {turn}"})
        ctx.current_invocation_id = f"inv-{turn}"
        for n in range(2):
            ctx.register_peer_sub_task(f"{task_id}/again-{turn}-{n}",
                                       {"peer_agent_name": f"peer-{n}"})
        ctx.record_token_usage(model="m-1", source=AGENT, prompt_tokens=100 * turn,
                               completion_tokens=10)
        await store.checkpoint_task(ctx, AGENT, lease_owner="i-1")
    return ctx


async def rows(store: SqlStore, task_id: str = "t1") -> list[Any]:
    """The task's records in ``store``'s tenant, by raw SQL."""
    return await store.run(lambda conn: list(conn.execute(
        select(checkpoints).where(checkpoints.c.logical_task_id == task_id,
                                  checkpoints.c.tenant_id == store.tenant_id)
        .order_by(checkpoints.c.seq))))


async def sql(store: SqlStore, statement: Any) -> None:
    await store.run(lambda conn: conn.execute(statement), write=True)


async def flip_a_byte(store: SqlStore, seq: int, task_id: str = "t1") -> None:
    """Change one character of record ``seq``'s document (its phase)."""
    row = (await rows(store, task_id))[seq - 1]
    data = dict(row.data)
    state = dict(data["execution_state"])
    state["phase"] = state["phase"][:-1] + chr(ord(state["phase"][-1]) ^ 1)
    data["execution_state"] = state
    await sql(store, update(checkpoints).where(
        checkpoints.c.checkpoint_id == row.checkpoint_id).values(data=data))


# -- the records ------------------------------------------------------------------------


async def test_every_checkpoint_and_the_end_append_a_linked_record(
        store: SqlStore, clock: FakeClock) -> None:
    started = clock.now
    await three_checkpoints(store)
    history = await store.history.get_checkpoint_history("t1")
    assert [r.metadata.seq for r in history] == [3, 2, 1]  # newest first
    assert [r.recovery.last_successful_state for r in history] == [
        history[1].metadata.checkpoint_id, history[2].metadata.checkpoint_id, None]
    assert [r.compliance.parent_hash for r in history] == [
        history[1].compliance.hash, history[2].compliance.hash, ""]
    latest = history[0]
    assert isinstance(latest, CheckpointRecord) and latest.schema_version == "1.0"
    assert (latest.metadata.task_id, latest.metadata.agent_id, latest.metadata.tenant_id) \
        == ("t1", AGENT, "default")
    assert latest.execution_state.phase == "waiting_peers"
    assert [(i["kind"], i["name"]) for i in latest.execution_state.pending_items] == [
        ("peer", "peer-0"), ("peer", "peer-1")]
    assert latest.context_summary.external_dependencies == ["peer-0", "peer-1"]
    assert latest.metrics.tokens["iteration"]["by_model"]["m-1"]["prompt_tokens"] == 300
    assert latest.metrics.tokens["total"]["totals"]["prompt_tokens"] == 500
    assert latest.metrics.tokens_consumed == 310
    assert (await store.history.get_latest_checkpoint("t1")) == latest
    assert await store.history.get_checkpoint(latest.metadata.checkpoint_id) == latest
    assert len(await store.history.get_checkpoint_history("t1", limit=2)) == 2
    by_agent = await store.history.get_checkpoints_by_agent(AGENT, since=started - 1)
    assert [r.metadata.seq for r in by_agent] == [1, 2, 3]
    assert await store.history.get_checkpoints_by_agent(AGENT, since=clock.now + 1) == []

    await store.cleanup_task("t1", outcome="failed")
    report = await store.history.verify_task("t1")
    assert report.ok and report.records == 4  # the history outlives the task's live rows
    assert (await store.history.get_latest_checkpoint("t1")).execution_state.phase \
        == "failed"  # type: ignore[union-attr]


async def test_seed_001_operations_append_and_never_rewrite(store: SqlStore) -> None:
    first = await store.history.create_checkpoint("audit-1", "planner", {
        "execution_state": {"phase": "planning", "pending_items": ["design"]},
        "context_summary": {"key_decisions": ["use PostgreSQL"]}})
    amended = await store.history.update_checkpoint(first, {
        "execution_state": {"phase": "implementing", "completed_items": ["design"]}})
    other = await store.history.create_checkpoint("audit-2", "coder", {})
    link = await store.history.link_checkpoints(amended, other)
    done = await store.history.finalize_checkpoint(amended, "completed")
    chain = await store.history.get_checkpoint_history("audit-1")
    assert [r.metadata.checkpoint_id for r in chain] == [done, amended, first]
    assert chain[1].extensions["amends"] == first
    assert chain[1].context_summary.key_decisions == ["use PostgreSQL"]
    assert chain[1].execution_state.completed_items == ["design"]
    assert chain[0].execution_state.phase == "completed"
    linked = await store.history.get_checkpoint(link)
    assert linked.extensions["link"]["parent"] == amended
    assert linked.extensions["link"]["parent_hash"] == chain[1].compliance.hash
    assert (await store.history.get_checkpoint(first)).execution_state.phase == "planning"
    with pytest.raises(InvalidArgumentError, match="status must be one of"):
        await store.history.finalize_checkpoint(first, "paused")
    with pytest.raises(UnknownCheckpointError):
        await store.history.get_checkpoint("01936f3c-0000-7000-8000-000000000000")
    with pytest.raises(UnknownHistoryError):
        await store.history.verify_task("never")
    assert await store.history.get_checkpoint_history("never") == []
    other_tenant = store.for_tenant("other")
    with pytest.raises(UnknownCheckpointError):
        await other_tenant.history.get_checkpoint(first)


async def test_an_agent_fills_the_record_through_its_context(store: SqlStore) -> None:
    ctx = fan_out("t1")
    ctx.history = {"agent_type": "qa", "retention_policy": "days:30", "record": {
        "context_summary": {"assumptions": ["the API is stable"]},
        "recovery": {"continuation_prompt": "Run the failing test again"},
        "extensions": {"ticket": "QA-7"}}}
    await store.checkpoint_task(ctx, AGENT)
    record = await store.history.get_latest_checkpoint("t1")
    assert record is not None
    assert record.metadata.agent_type == "qa"
    assert record.context_summary.assumptions == ["the API is stable"]
    assert record.recovery.continuation_prompt == "Run the failing test again"
    assert record.extensions == {"ticket": "QA-7"}
    assert record.compliance.retention_policy == "days:30"
    bad = fan_out("t2")
    bad.history = {"record": {"secrets": {}}}
    with pytest.raises(InvalidArgumentError, match="sections"):
        await store.checkpoint_task(bad, AGENT)
    bad.history = {"retention_policy": "forever"}
    with pytest.raises(InvalidArgumentError, match="retention policy 'forever'"):
        await store.checkpoint_task(bad, AGENT)
    bad.history = {"record": {"extensions": {"x": float("nan")}}}
    with pytest.raises(InvalidArgumentError):
        await store.checkpoint_task(bad, AGENT)
    assert (await store.live_row_counts())["agent_paused_tasks"] == 1  # t2: nothing written


# -- tampering, each detected by the reads and by the chain walk ------------------------


Tamper = Callable[[SqlStore], Any]


async def _delete_middle(store: SqlStore) -> None:
    middle = (await rows(store))[1]
    await sql(store, delete(checkpoints).where(
        checkpoints.c.checkpoint_id == middle.checkpoint_id))


async def _reorder(store: SqlStore) -> None:
    first, second = (await rows(store))[:2]
    for row, seq in ((first, -1), (second, 1), (first, 2)):
        await sql(store, update(checkpoints).where(
            checkpoints.c.checkpoint_id == row.checkpoint_id).values(seq=seq))


async def _truncate(store: SqlStore) -> None:
    last = (await rows(store))[-1]
    await sql(store, delete(checkpoints).where(
        checkpoints.c.checkpoint_id == last.checkpoint_id))


async def _from_another_tenant(store: SqlStore) -> None:
    """Tenant ``other`` has a task t1 too; its last record is moved into ours."""
    other = store.for_tenant("other")
    await three_checkpoints(other)
    ours, theirs = (await rows(store))[-1], (await rows(other))[-1]
    await sql(store, delete(checkpoints).where(
        checkpoints.c.tenant_id == "default",
        checkpoints.c.checkpoint_id == ours.checkpoint_id))
    await sql(store, update(checkpoints).where(
        checkpoints.c.tenant_id == "other",
        checkpoints.c.checkpoint_id == theirs.checkpoint_id).values(tenant_id="default"))


@pytest.mark.parametrize(("tamper", "kind", "seq", "reason", "last"), [
    (lambda store: flip_a_byte(store, 3), "corrupt", 3, "does not hash to its stored hash",
     True),
    (lambda store: flip_a_byte(store, 2), "corrupt", 2, "does not hash to its stored hash",
     False),
    (_delete_middle, "broken", 3, "record 2 is missing", False),
    (_reorder, "broken", 1, "but is stored as", False),
    (_truncate, "broken", None, "tail was cut off", True),
    (_from_another_tenant, "broken", 3, "tenant 'other'", True),
], ids=["flip-last", "flip-middle", "delete-middle", "reorder", "truncate", "swap-tenant"])
async def test_tampering_is_detected_by_reads_and_by_the_walk(
        store: SqlStore, tamper: Tamper, kind: str, seq: int | None, reason: str,
        last: bool) -> None:
    """The walk and the history reads find any of these. A restore verifies the last
    record and the head (walking every record at every restore would cost each pause
    a canonicalisation per record), so it refuses exactly those that touch them."""
    await three_checkpoints(store)
    await tamper(store)
    report = await store.history.verify_task("t1")
    assert not report.ok and report.kind == kind and report.first_bad_seq == seq, report
    assert reason in (report.reason or ""), report
    with pytest.raises(HistoryIntegrityError):
        await store.history.get_checkpoint_history("t1")
    before = await snapshot(store)
    if last:
        with pytest.raises(HistoryIntegrityError):  # a read without a lease changes nothing
            await store.restore_task("t1")
    else:
        assert (await store.restore_task("t1")).context.current_invocation_id == "inv-3"
    assert await snapshot(store) == before


async def test_signatures_detect_a_forged_chain_and_a_wrong_key(store: SqlStore) -> None:
    keys = SigningKeys.generate("k1")
    signed = store.with_history(HistoryOptions(signing=keys))
    await three_checkpoints(signed)
    assert (await signed.history.verify_task("t1")).ok
    assert all(r.compliance.signature and r.compliance.key_id == "k1"
               for r in await signed.history.get_checkpoint_history("t1"))
    # A verifier holding only the public key accepts it.
    public = SigningKeys(public={"k1": keys.private["k1"].public_key()})
    assert (await store.with_history(HistoryOptions(signing=public))
            .history.verify_task("t1")).ok
    # Another key under the same id (a forger's), or a ring without the key, does not.
    forged = SigningKeys.generate("k1")
    report = await store.with_history(HistoryOptions(signing=forged)).history.verify_task("t1")
    assert not report.ok and "does not verify with key 'k1'" in (report.reason or "")
    report = await store.with_history(HistoryOptions(
        signing=SigningKeys.generate("k2"))).history.verify_task("t1")
    assert not report.ok and "which the key ring does not hold" in (report.reason or "")
    # Unsigned records fail where signatures are required: the attacker who rewrites a
    # record and recomputes its hash cannot sign it.
    await three_checkpoints(store, "t2")
    report = await signed.history.verify_task("t2")
    assert not report.ok and "not signed" in (report.reason or "")
    # A truncated tail with a head rewritten to match, but not re-signed.
    last, previous = (await rows(signed))[-1], (await rows(signed))[-2]
    await sql(signed, delete(checkpoints).where(
        checkpoints.c.checkpoint_id == last.checkpoint_id))
    await sql(signed, update(checkpoint_heads).where(
        checkpoint_heads.c.logical_task_id == "t1").values(
        records=2, head_id=previous.checkpoint_id, head_hash=previous.hash))
    report = await signed.history.verify_task("t1")
    assert not report.ok and "its head" in (report.reason or "")


# -- restores never continue from unverified state ------------------------------------


async def test_a_damaged_live_row_is_restored_from_the_history(store: SqlStore) -> None:
    ctx = await three_checkpoints(store)
    await sql(store, update(paused_tasks).where(
        paused_tasks.c.logical_task_id == "t1").values(context=b"{}", context_sha256="0" * 64))
    for n in range(2):
        await store.resolve_peer_sub_task(f"t1/again-3-{n}", "done", lease_owner="i-2")
    restored = (await store.restore_task("t1", lease_owner="i-2")).context
    assert restored.a2a_context == ctx.a2a_context
    assert restored.parallel_tool_calls["inv-3"].results == {
        "t1/again-3-0": "done", "t1/again-3-1": "done"}  # the answers since, kept
    logged = await store.run(lambda conn: [r.event_type for r in conn.execute(
        select(events).where(events.c.logical_task_id == "t1"))])
    assert logged == ["integrity_repaired"]


async def test_a_failing_last_record_rewinds_the_task_to_the_one_before(
        store: SqlStore) -> None:
    await three_checkpoints(store)
    good = (await store.history.get_checkpoint_history("t1"))[1]
    await flip_a_byte(store, 3)
    for n in range(2):
        await store.resolve_peer_sub_task(f"t1/again-3-{n}", "done", lease_owner="i-2")
    restored = await store.restore_task("t1", lease_owner="i-2")
    ctx = restored.context
    # The state of record 2: waiting on the calls of turn 2, whose answers are lost.
    assert restored.status == "resuming" and ctx.current_invocation_id == "inv-2"
    assert ctx.parallel_tool_calls["inv-2"].results == {
        "t1/again-2-0": LOST_RESULT, "t1/again-2-1": LOST_RESULT}
    assert [e.get("text") for e in ctx.session_events][-1] == "turn 2"
    assert ctx.active_peer_sub_tasks == {}
    # A new record says so; the bad record stays, as evidence; restores verify again.
    latest = await store.restore_task("t1")
    assert latest.context.current_invocation_id == "inv-2"
    report = await store.history.verify_task("t1")
    assert not report.ok and report.first_bad_seq == 3
    records = await rows(store)
    assert [r.data["execution_state"]["phase"] for r in records][-1] == "rewound"
    assert records[-1].data["extensions"]["rewound_to"] == good.metadata.checkpoint_id
    # The task goes on from there: checkpointed again by its lease holder.
    ctx.current_invocation_id = "inv-4"
    ctx.register_peer_sub_task("t1/again-4-0", {"peer_agent_name": "peer-0"})
    await store.checkpoint_task(ctx, AGENT, lease_owner="i-2")
    assert (await store.restore_task("t1")).context.current_invocation_id == "inv-4"


async def test_a_broken_chain_blocks_the_task_for_an_operator(store: SqlStore) -> None:
    await three_checkpoints(store)
    await _truncate(store)
    for n in range(2):
        await store.resolve_peer_sub_task(f"t1/again-3-{n}", "done", lease_owner="i-2")
    with pytest.raises(TaskBlockedError, match="tail was cut off") as caught:
        await store.restore_task("t1", lease_owner="i-2")
    assert caught.value.a2a_context == {"session_id": "session-t1"}
    assert [(t.status, t.owner) for t in await store.list_paused_tasks()] == [
        ("blocked", None)]
    assert (await store.stats()).paused_tasks == {(AGENT, "blocked"): 1}
    # Its former lease holder is told why it no longer holds the lease.
    with pytest.raises(LeaseNotHeldError, match="it is blocked: its checkpoint history"):
        await store.restore_task("t1", lease_owner="i-2")
    logged = await store.run(lambda conn: [r.output_data for r in conn.execute(
        select(events).where(events.c.event_type == "integrity_blocked"))])
    assert len(logged) == 1 and "tail was cut off" in logged[0]["problem"]
    # An operator can still end it (a cancel takes any status's lease).
    lease = await store.take_resume_lease("t1", "ops", 30, statuses=("blocked",))
    assert lease is not None
    await store.cleanup_task("t1", lease_owner="ops", outcome="canceled")
    assert set((await store.live_row_counts()).values()) == {0}



# -- encryption at rest ---------------------------------------------------------------


async def test_encrypted_fields_never_rest_in_plain_text_and_shredding_keeps_the_chain(
        store: SqlStore) -> None:
    keys = EncryptionKeys.generate("default")
    fields = ("recovery.continuation_prompt",)
    encrypting = store.with_history(HistoryOptions(encryption=keys, encrypt_fields=fields))
    ctx = fan_out("t1")
    ctx.security_context = {"token": "s3cret-token"}
    ctx.history = {"record": {"recovery": {"continuation_prompt": "the confidential plan"}}}
    await encrypting.checkpoint_task(ctx, AGENT)
    stored = repr(await snapshot(store))  # every row of every table, as stored
    assert "s3cret-token" not in stored and "confidential plan" not in stored
    restored = await encrypting.restore_task("t1")
    assert restored.context.security_context == {"token": "s3cret-token"}
    record = await encrypting.history.get_latest_checkpoint("t1")
    assert record is not None and record.recovery.continuation_prompt == "the confidential plan"
    # Without the key ring: a clear error, never the ciphertext or a blank, whether
    # the task is restored or its record read.
    with pytest.raises(KeyMissingError, match="no encryption key ring"):
        await store.restore_task("t1")
    with pytest.raises(KeyMissingError, match="no encryption key ring"):
        await store.history.get_latest_checkpoint("t1")
    # The record keeps what was encrypted when it was written: a store whose options
    # no longer name the field, with the key, still opens it.
    renamed = store.with_history(HistoryOptions(encryption=keys))
    record = await renamed.history.get_latest_checkpoint("t1")
    assert record is not None and record.recovery.continuation_prompt == "the confidential plan"
    # Crypto-shredding: the tenant's keys deleted, its chains still verify, its
    # encrypted fields are gone for good.
    shredded = store.with_history(HistoryOptions(encryption=keys.shredded("default"),
                                                 encrypt_fields=fields))
    assert (await shredded.history.verify_task("t1")).ok
    with pytest.raises(KeyMissingError, match="holds no encryption key 'k1'"):
        await shredded.history.get_latest_checkpoint("t1")
    # What was not encrypted is still there to read (what `tasks cost` reads): the
    # shredded field stays sealed, never plain text and never a blank.
    [kept] = await shredded.history.get_checkpoint_history("t1", keep_unreadable=True)
    assert kept.recovery.continuation_prompt["$encrypted"]["kid"] == "k1"  # type: ignore
    assert kept.metrics.cost["currency"] == "USD" and kept.metadata.task_id == "t1"
    assert kept.compliance.hash == record.compliance.hash
    # A record written with encryption configured but no key for the tenant: nothing
    # is written.
    keyless = store.for_tenant("other").with_history(HistoryOptions(encryption=keys))
    before = await snapshot(store)
    with pytest.raises(KeyMissingError, match="no active encryption key"):
        await keyless.checkpoint_task(fan_out("t9"), AGENT)
    assert await snapshot(store) == before


async def test_a_record_with_a_whole_section_sealed_reads_back_as_far_as_it_can(
        store: SqlStore) -> None:
    keys = EncryptionKeys.generate("default")
    sealing = store.with_history(HistoryOptions(encryption=keys,
                                                encrypt_fields=("execution_state",)))
    await sealing.checkpoint_task(fan_out("t1"), AGENT)
    shredded = store.with_history(HistoryOptions(encryption=keys.shredded("default")))
    with pytest.raises(KeyMissingError, match="'execution_state'"):
        await shredded.history.get_checkpoint_history("t1")
    [kept] = await shredded.history.get_checkpoint_history("t1", keep_unreadable=True)
    assert set(kept.execution_state) == {"$encrypted"}  # type: ignore[arg-type]
    assert kept.metrics.tokens_consumed == 0 and kept.metadata.seq == 1
    record = await sealing.history.get_latest_checkpoint("t1")
    assert record is not None and record.execution_state.phase == "waiting_peers"


# -- retention --------------------------------------------------------------------------


async def _ended_with(store: SqlStore, task_id: str, retention: str | None,
                      end: bool = True) -> None:
    """A task of three checkpoints and (with ``end``) its end: 4 records."""
    ctx = fan_out(task_id, peers=1)
    ctx.history = {"retention_policy": retention} if retention else {}
    await store.checkpoint_task(ctx, AGENT)
    for turn in (2, 3):
        sub = f"{task_id}/sub-0" if turn == 2 else f"{task_id}/again-2"
        await store.resolve_peer_sub_task(sub, "x", lease_owner="i-1")
        ctx = (await store.restore_task(task_id, lease_owner="i-1")).context
        ctx.current_invocation_id = f"inv-{turn}"
        ctx.register_peer_sub_task(f"{task_id}/again-{turn}", {"peer_agent_name": "p"})
        await store.checkpoint_task(ctx, AGENT, lease_owner="i-1")
    if end:
        await store.cleanup_task(task_id, outcome="completed")


async def test_retention_purges_ended_chains_and_what_stays_verifies(
        store: SqlStore, clock: FakeClock) -> None:
    signed = store.with_history(HistoryOptions(signing=SigningKeys.generate("k1")))
    await _ended_with(signed, "keep-2", "last:2")
    await _ended_with(signed, "a-day", "days:1")
    await _ended_with(signed, "on-hold", "hold")
    await _ended_with(signed, "no-policy", None)
    await _ended_with(signed, "live", "last:1", end=False)
    clock.advance(2 * 86_400)
    before = await snapshot(store)
    planned = await signed.history.purge(dry_run=True)
    assert await snapshot(store) == before  # a dry run removes nothing
    assert sorted((p.task_id, p.removed, p.whole) for p in planned) == [
        ("a-day", 4, True), ("keep-2", 2, False)]
    # Without the signing key, signed chains are left alone, even one that would go
    # whole (tests/integration/test_history_security.py attacks this further).
    unsigned = await store.history.purge()
    assert [(p.task_id, p.skipped is not None) for p in unsigned] == [
        ("a-day", True), ("keep-2", True)]
    purged = await signed.history.purge()
    assert [(p.task_id, p.removed, p.skipped) for p in purged] == [
        ("a-day", 4, None), ("keep-2", 2, None)]
    kept = await signed.history.verify_task("keep-2")
    assert kept.ok and kept.records == 2, kept
    assert [r.metadata.seq for r in await signed.history.get_checkpoint_history("keep-2")] \
        == [4, 3]
    with pytest.raises(UnknownHistoryError):
        await signed.history.verify_task("a-day")
    for task_id, records in (("on-hold", 4), ("no-policy", 4), ("live", 3)):
        report = await signed.history.verify_task(task_id)
        assert report.ok and report.records == records, report
    assert await signed.history.purge() == []  # nothing more to do
    # An agent's policy, set after its tasks were written (so their records carry
    # none), governs their chains; a task's own policy still wins over it.
    by_agent = signed.with_history(replace(signed.history.options,
                                           agent_retention={AGENT: "last:1"}))
    purged = await by_agent.history.purge()
    assert [(p.task_id, p.removed, p.policy) for p in purged] == [("no-policy", 3, "last:1")]
    assert (await by_agent.history.verify_task("on-hold")).records == 4
    # What a purge leaves is as tamper-evident as before: a record removed from the
    # front, with the head's anchor moved to hide it, fails the anchor's signature.
    third = (await rows(store, "keep-2"))[0]
    await sql(store, delete(checkpoints).where(
        checkpoints.c.checkpoint_id == third.checkpoint_id))
    await sql(store, update(checkpoint_heads).where(
        checkpoint_heads.c.logical_task_id == "keep-2").values(
        pruned_through=3, pruned_hash=third.hash))
    report = await signed.history.verify_task("keep-2")
    assert not report.ok and "its head" in (report.reason or ""), report


async def test_a_lease_holders_end_with_its_agent_is_the_bodys_end(store: SqlStore) -> None:
    """Ended by its lease holder with the agent's name (on PostgreSQL, one statement),
    a task ends as the portable body ends it: no live row, the end in the ledger, the
    last record chained and verifying. Another's lease is refused with nothing
    changed; a wrong agent name only costs the one statement (the body ends it)."""
    for task in ("t1", "t2"):
        await store.checkpoint_task(fan_out(task, peers=1), AGENT)
        await store.resolve_peer_sub_task(f"{task}/sub-0", "x", lease_owner="a")
    first = (await store.restore_task("t1", lease_owner="a")).context
    before = await snapshot(store)
    with pytest.raises(LeaseNotHeldError):
        await store.cleanup_task("t1", lease_owner="b", ctx=first, agent_name=AGENT)
    assert await snapshot(store) == before
    await store.cleanup_task("t1", lease_owner="a", ctx=first, agent_name=AGENT)
    second = (await store.restore_task("t2", lease_owner="a")).context
    await store.cleanup_task("t2", lease_owner="a", ctx=second, agent_name="another-agent",
                             outcome="failed")
    assert set((await store.live_row_counts()).values()) == {0}
    assert [await store.task_known(t, AGENT) for t in ("t1", "t2")] == [True, True]
    for task, outcome in (("t1", "completed"), ("t2", "failed")):
        report = await store.history.verify_task(task)
        assert report.ok and report.records == 2
        phases = [r.execution_state.phase
                  for r in await store.history.get_checkpoint_history(task)]
        assert phases == [outcome, "waiting_peers"]


async def test_a_holders_one_statement_end_is_signed_encrypted_and_fenced_by_its_head(
        store: SqlStore) -> None:
    """The last record a lease holder's end writes (one statement on PostgreSQL) is
    signed, its head too, and its encrypted fields never rest in plain text. Ended
    from a stale view of its chain (the head moved on since), the end is refused
    whole (CheckpointConflictError, on every path): no row deleted, no ledger entry, no record on
    the stale head; from the current view it is written."""
    keys = SigningKeys.generate("k1")
    ring = EncryptionKeys.generate("default")
    fields = ("recovery.continuation_prompt",)
    kept = store.with_history(HistoryOptions(signing=keys, encryption=ring,
                                             encrypt_fields=fields))
    for task in ("t1", "t2"):
        ctx = fan_out(task, peers=1)
        ctx.history = {"record": {"recovery": {"continuation_prompt": "the secret plan"}}}
        await kept.checkpoint_task(ctx, AGENT)
        await kept.resolve_peer_sub_task(f"{task}/sub-0", "x", lease_owner="a")
    ctx = (await kept.restore_task("t1", lease_owner="a")).context
    await kept.cleanup_task("t1", lease_owner="a", ctx=ctx, agent_name=AGENT)
    report = await kept.history.verify_task("t1")
    assert report.ok and report.records == 2, report
    last = (await kept.history.get_checkpoint_history("t1"))[0]
    assert last.execution_state.phase == "completed" and last.compliance.key_id == "k1"
    assert last.recovery.continuation_prompt == "the secret plan"
    assert "the secret plan" not in repr(await snapshot(store))
    # t2's holder ends it from a stale view: its chain moved on since (a mid-turn
    # checkpoint from a later copy of its context).
    stale = (await kept.restore_task("t2", lease_owner="a")).context
    ctx = (await kept.restore_task("t2", lease_owner="a")).context
    ctx.append_session_event({"role": "model", "text": "more"})
    await kept.checkpoint_task(ctx, AGENT, status="working", lease_owner="a", holder="a")
    before = await snapshot(store)
    with pytest.raises(CheckpointConflictError, match="moved on"):
        await kept.cleanup_task("t2", lease_owner="a", ctx=stale, agent_name=AGENT)
    assert await snapshot(store) == before
    await kept.cleanup_task("t2", lease_owner="a", ctx=ctx, agent_name=AGENT)
    report = await kept.history.verify_task("t2")
    assert report.ok and report.records == 3, report
    assert set((await store.live_row_counts()).values()) == {0}
