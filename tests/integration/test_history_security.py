"""The checkpoint history attacked by someone who can write the database but holds no
signing key (docs/security.md, "Signatures and retention"), on a SQLite file and on
PostgreSQL (with and without its fast paths): a chain forged with its signatures
stripped, columns that nothing hashes changed to steer a purge, a purge run without
the signing key, and an instance without the key meeting a healthy signed task."""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Callable
from typing import Any

import pytest
import rfc8785
from sqlalchemy import update

from meshpoint.errors import HistoryIntegrityError, KeyMissingError
from meshpoint.history.integrity import SigningKeys
from meshpoint.history.planning import HistoryOptions
from meshpoint.store import SqlStore
from meshpoint.store.schema import checkpoint_heads, checkpoints, paused_tasks
from tests.conftest import FakeClock, snapshot
from tests.integration.test_history import _ended_with, rows, sql, three_checkpoints
from tests.integration.test_store import AGENT, fan_out

pytestmark = pytest.mark.portable_too


def public_half(keys: SigningKeys) -> SigningKeys:
    """A verifier's ring: the public halves of ``keys``, no private key."""
    return SigningKeys(public={key_id: key.public_key() for key_id, key in keys.private.items()})


async def forge(store: SqlStore, seq: int, change: Callable[[dict[str, Any]], None],
                task_id: str = "t1") -> None:
    """What an attacker who can write the tables but holds no key does: change record
    ``seq``'s document, recompute the chain from it exactly as the public format says
    (``SHA-256(parent hash as raw bytes ‖ RFC 8785 JSON)``, with the reference
    ``rfc8785`` package), and set the signature and key id of every record it
    rewrote, and of the head, to NULL."""
    records = await rows(store, task_id)
    parent = records[seq - 2].hash if seq > 1 else ""
    for row in records[seq - 1:]:
        data = copy.deepcopy(dict(row.data))
        if row.seq == seq:
            change(data)
        data["compliance"]["parent_hash"] = parent
        digest = hashlib.sha256(bytes.fromhex(parent) + rfc8785.dumps(data)).hexdigest()
        await sql(store, update(checkpoints).where(
            checkpoints.c.tenant_id == store.tenant_id,
            checkpoints.c.checkpoint_id == row.checkpoint_id).values(
            data=data, hash=digest, signature=None, key_id=None))
        parent = digest
    await sql(store, update(checkpoint_heads).where(
        checkpoint_heads.c.tenant_id == store.tenant_id,
        checkpoint_heads.c.logical_task_id == task_id).values(
        head_hash=parent, signature=None, key_id=None))


def _decide(data: dict[str, Any]) -> None:
    data["context_summary"]["key_decisions"] = ["wire the refund to account 666"]


# -- 1. signatures stripped from a forged chain ------------------------------------------


async def test_a_forged_chain_with_its_signatures_stripped_fails_for_a_public_key_verifier(
        store: SqlStore) -> None:
    keys = SigningKeys.generate("k1")
    signed = store.with_history(HistoryOptions(signing=keys))
    await three_checkpoints(signed)
    verifier = store.with_history(HistoryOptions(signing=public_half(keys)))
    assert (await verifier.history.verify_task("t1")).ok
    forged_id = (await rows(store))[1].checkpoint_id

    await forge(store, 2, _decide)
    report = await verifier.history.verify_task("t1")
    assert not report.ok and report.first_bad_seq == 2, report
    assert "not signed" in (report.reason or ""), report
    assert report.last_good_seq == 1 and not report.signatures_checked
    # No read hands the forged decision out.
    for read in (lambda: verifier.history.get_checkpoint_history("t1"),
                 lambda: verifier.history.get_latest_checkpoint("t1"),
                 lambda: verifier.history.get_checkpoint(forged_id),
                 lambda: verifier.history.get_checkpoints_by_agent(AGENT),
                 lambda: verifier.restore_task("t1")):
        with pytest.raises(HistoryIntegrityError, match="not signed"):
            await read()
    # The head alone unsigned (records intact) fails too.
    keys2 = SigningKeys.generate("k1")
    signed2 = store.with_history(HistoryOptions(signing=keys2))
    await three_checkpoints(signed2, "t2")
    await sql(store, update(checkpoint_heads).where(
        checkpoint_heads.c.logical_task_id == "t2").values(signature=None, key_id=None))
    report = await store.with_history(HistoryOptions(signing=public_half(keys2))) \
        .history.verify_task("t2")
    assert not report.ok and "its head" in (report.reason or "") and \
        "not signed" in (report.reason or ""), report


async def test_signatures_checked_says_whether_every_signature_was_checked(
        store: SqlStore) -> None:
    keys = SigningKeys.generate("k1")
    await three_checkpoints(store.with_history(HistoryOptions(signing=keys)))
    public = public_half(keys)
    report = await store.with_history(HistoryOptions(signing=public)).history.verify_task("t1")
    assert report.ok and report.signatures_checked
    # Checked by hashes only (no keys given to verify): the chain is intact, and no
    # signature was checked.
    report = await store.with_history(HistoryOptions(check_signatures=False)) \
        .history.verify_task("t1")
    assert report.ok and not report.signatures_checked
    await forge(store, 3, _decide)
    # The explicit opt-out accepts unsigned records, and says it checked not all.
    optout = store.with_history(HistoryOptions(signing=public, require_signatures=False))
    report = await optout.history.verify_task("t1")
    assert report.ok and not report.signatures_checked, report


async def test_a_store_that_must_sign_but_cannot_writes_nothing(store: SqlStore) -> None:
    """A verifier's configuration (public keys only) requires signatures: a record it
    wrote would fail every verifier, so it writes none."""
    public = store.with_history(HistoryOptions(signing=public_half(SigningKeys.generate())))
    before = await snapshot(store)
    with pytest.raises(KeyMissingError, match="no active signing key"):
        await public.checkpoint_task(fan_out("t1"), AGENT)
    with pytest.raises(KeyMissingError, match="no active signing key"):
        await public.history.create_checkpoint("audit", "planner", {})
    assert await snapshot(store) == before


# -- 2. retention decided by what the records say, never by a column ----------------------


async def _held(store: SqlStore) -> None:
    await _ended_with(store, "held", "hold")


async def _recent(store: SqlStore) -> None:
    await _ended_with(store, "recent", "days:30")


async def _live(store: SqlStore) -> None:
    await _ended_with(store, "live", "last:1", end=False)


async def _no_policy(store: SqlStore) -> None:
    await _ended_with(store, "agents", None)


def _heads(task_id: str, **values: Any) -> Any:
    return update(checkpoint_heads).where(
        checkpoint_heads.c.logical_task_id == task_id).values(**values)


def _records(task_id: str, **values: Any) -> Any:
    return update(checkpoints).where(checkpoints.c.logical_task_id == task_id).values(**values)


@pytest.mark.parametrize(("write", "attack", "task_id", "column"), [
    (_held, _heads("held", retention_policy="last:1"), "held", "retention_policy"),
    (_recent, _records("recent", created_at=checkpoints.c.created_at - 100 * 86_400.0),
     "recent", "created_at"),
    (_live, _heads("live", outcome="completed"), "live", "outcome"),
    (_no_policy, _heads("agents", agent_name="short-lived"), "agents", "agent_name"),
    (_held, _records("held", retention_policy="last:1"), "held", "retention_policy"),
], ids=["head-policy", "created-at", "head-outcome", "head-agent", "record-policy"])
async def test_a_column_nothing_hashes_does_not_steer_a_purge_and_verify_names_it(
        store: SqlStore, clock: FakeClock, write: Callable[[SqlStore], Any], attack: Any,
        task_id: str, column: str) -> None:
    """The records are signed and say what the purge must do with them; a column
    changed to say otherwise is named by verify, and the purge leaves the chain."""
    keys = SigningKeys.generate("k1")
    signed = store.with_history(HistoryOptions(
        signing=keys, agent_retention={"short-lived": "last:1"}))
    await write(signed)
    clock.advance(3600)  # an hour old
    records = len(await rows(store, task_id))
    assert await signed.history.purge() == []  # nothing to do, as the records say
    await sql(store, attack)
    report = await signed.history.verify_task(task_id)
    assert not report.ok and column in (report.reason or ""), report
    purged = await signed.history.purge()
    assert [(p.task_id, p.removed) for p in purged if p.skipped is None] == [], purged
    assert len(await rows(store, task_id)) == records


async def test_a_forged_column_is_not_signed_into_a_tasks_last_record(
        store: SqlStore, clock: FakeClock) -> None:
    """A task ended without its context at hand (a cancel, an expiry) carries its
    policy into its last record, which is signed: taken from the column, a forged
    policy would be laundered into signed content, and verify would see nothing."""
    keys = SigningKeys.generate("k1")
    signed = store.with_history(HistoryOptions(signing=keys))
    await _ended_with(signed, "held", "hold", end=False)
    await sql(store, _heads("held", retention_policy="last:1"))
    await signed.cleanup_task("held", outcome="canceled")  # no ctx: from the store
    last = (await rows(store, "held"))[-1]
    assert last.data["compliance"]["retention_policy"] == "hold"
    clock.advance(3600)
    assert [p for p in await signed.history.purge() if p.skipped is None] == []
    assert len(await rows(store, "held")) == 4


async def test_a_purge_never_cuts_a_chain_that_does_not_verify(
        store: SqlStore, clock: FakeClock) -> None:
    keys = SigningKeys.generate("k1")
    signed = store.with_history(HistoryOptions(signing=keys))
    await _ended_with(signed, "kept-1", "last:1")
    await _ended_with(signed, "fine", "last:1")
    await forge(store, 2, _decide, task_id="kept-1")  # the evidence a purge would remove
    purged = {p.task_id: p for p in await signed.history.purge()}
    assert purged["fine"].removed == 3 and purged["fine"].skipped is None
    assert purged["kept-1"].skipped is not None
    assert "does not verify" in purged["kept-1"].skipped and \
        "not signed" in purged["kept-1"].skipped, purged["kept-1"]
    assert len(await rows(store, "kept-1")) == 4


# -- 3. a purge without the signing key leaves signed chains alone ------------------------


@pytest.mark.parametrize("ring", ["none", "public"])
async def test_a_purge_without_the_signing_key_leaves_signed_chains_alone(
        store: SqlStore, clock: FakeClock, ring: str) -> None:
    keys = SigningKeys.generate("k1")
    signed = store.with_history(HistoryOptions(signing=keys))
    await _ended_with(signed, "a-day", "days:1")  # whole: its head would go too
    await _ended_with(signed, "keep-2", "last:2")
    await _ended_with(store, "unsigned", "last:1")  # written without a key
    clock.advance(2 * 86_400)
    keyless = store if ring == "none" else store.with_history(
        HistoryOptions(signing=public_half(keys)))
    before = await snapshot(store)
    for dry_run in (True, False):
        purged = {p.task_id: p for p in await keyless.history.purge(dry_run=dry_run)}
        for task_id in ("a-day", "keep-2"):
            assert purged[task_id].skipped is not None, purged
            assert "signed" in purged[task_id].skipped and \
                "signing key" in purged[task_id].skipped, purged[task_id]
    after = await snapshot(store)
    for table in ("agent_checkpoints", "agent_checkpoint_heads"):
        kept = [r for r in after[table] if "unsigned" not in r]
        assert kept == [r for r in before[table] if "unsigned" not in r], table
    if ring == "none":  # an unsigned chain is one a keyless purge may cut
        assert purged["unsigned"].skipped is None and purged["unsigned"].removed == 3
    else:  # a verifier requires signatures: an unsigned chain does not verify for it
        assert "does not verify" in (purged["unsigned"].skipped or "")
    # With the key, the purge does what the records say.
    purged = {p.task_id: p for p in await signed.history.purge()}
    assert (purged["a-day"].whole, purged["keep-2"].removed) == (True, 2)


# -- 4. an instance without the signing key meets a healthy signed task -------------------


@pytest.mark.parametrize("ring", ["none", "public"])
async def test_a_restore_without_the_signing_key_is_a_configuration_error_that_writes_nothing(
        store: SqlStore, ring: str) -> None:
    keys = SigningKeys.generate("k1")
    signed = store.with_history(HistoryOptions(signing=keys))
    await signed.checkpoint_task(fan_out("t1", peers=1), AGENT)
    await store.resolve_peer_sub_task("t1/sub-0", "done", lease_owner="i-2")
    keyless = store if ring == "none" else store.with_history(
        HistoryOptions(signing=public_half(keys)))
    before = await snapshot(store)
    with pytest.raises(KeyMissingError, match="signed") as caught:
        await keyless.restore_task("t1", lease_owner="i-2")
    assert "t1" in str(caught.value)
    # What an instance asks before it takes a task's lease to end it.
    with pytest.raises(KeyMissingError, match="signed"):
        await keyless.check_signing_key("t1")
    await signed.check_signing_key("t1")
    if ring == "none":  # an unsigned task is one a keyless store continues
        await store.checkpoint_task(fan_out("t3", peers=1), AGENT)
        await store.check_signing_key("t3")
        before = await snapshot(store)
    assert await snapshot(store) == before  # not blocked, no event, no record
    # The instance that can sign takes it from there.
    restored = await signed.restore_task("t1", lease_owner="i-2")
    assert restored.status == "resuming"
    await signed.cleanup_task("t1", lease_owner="i-2", ctx=restored.context)
    report = await signed.history.verify_task("t1")
    assert report.ok and report.signatures_checked and report.records == 2


async def test_an_unsigned_record_is_never_appended_to_a_signed_chain(store: SqlStore) -> None:
    """A cleanup (a cancel, an expiry) on an instance without the key would end a
    signed chain with an unsigned record that every verifier then rejects."""
    keys = SigningKeys.generate("k1")
    signed = store.with_history(HistoryOptions(signing=keys))
    await signed.checkpoint_task(fan_out("t1", peers=1), AGENT)
    before = await snapshot(store)
    with pytest.raises(KeyMissingError, match="signed"):
        await store.cleanup_task("t1", outcome="canceled")
    assert await snapshot(store) == before
    await signed.cleanup_task("t1", outcome="canceled")
    assert (await signed.history.verify_task("t1")).ok
    assert await store.run(lambda conn: conn.execute(paused_tasks.select()).all()) == []
