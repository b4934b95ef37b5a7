"""The sync against someone who can write the local SQLite file but holds no signing
key (docs/sync.md): what they change in the file after a sync, and what they add to
a chain the cloud already verified, is kept aside, never applied over the cloud's
rows."""

from __future__ import annotations

import copy
import hashlib
import uuid
from pathlib import Path
from typing import Any

import pytest
import rfc8785
from sqlalchemy import delete, insert, select, update

from meshpoint.history.planning import HistoryOptions
from meshpoint.store import SqlStore, open_store
from meshpoint.store.schema import checkpoint_heads, checkpoints, ended_tasks, events
from meshpoint.sync.push import Syncer
from meshpoint.sync.tables import sync_conflicts, sync_sources
from tests.integration.sync_local import TENANT, run_tasks, tenant_rows
from tests.integration.test_sync import Cloud, cloud, local, options, ran

pytestmark = [pytest.mark.postgres, pytest.mark.xdist_group("pg_roles")]
__all__ = ["cloud", "local", "ran"]  # the fixtures this module uses


async def _log(target: SqlStore, kind: str) -> dict[str, Any]:
    rows = await target.transaction(lambda conn: list(conn.execute(
        select(sync_conflicts).where(sync_conflicts.c.kind == kind))))
    return {r.row_key: r for r in rows}


async def test_a_forged_later_end_of_a_synced_task_never_replaces_the_clouds(
        local: SqlStore, cloud: Cloud, ran: tuple[Path, Path]) -> None:
    async with cloud.open(history=options(ran)) as target:
        await Syncer(local, target).run()
        before = await tenant_rows(target)
        # The first end (not the one at the cursor: deleted and written again, that
        # one would take its rowid back, and a cursor that sees its key there reads on).
        task, row = min(before["agent_ended_tasks"].items(), key=lambda t: t[1]["ended_at"])

        # The ledger is not signed: the attacker writes a later end (a new row, so
        # that its rowid is after the cursor), hoping last write wins.
        def forge(conn: Any) -> None:
            conn.execute(delete(ended_tasks).where(ended_tasks.c.logical_task_id == task))
            conn.execute(insert(ended_tasks).values(
                {**row, "agent_name": "attacker", "ended_at": row["ended_at"] + 1e6}))

        await local.run(forge, write=True)
        _, reports = await Syncer(local, target).run()
        assert reports[2].kept == [task] and reports[2].applied == 0
        after = await tenant_rows(target)
        assert after["agent_ended_tasks"] == before["agent_ended_tasks"]
        kept = await _log(target, "kept")
        assert kept[task].local_row["agent_name"] == "attacker"
        assert kept[task].cloud_row["agent_name"] == row["agent_name"]


async def test_a_forged_record_appended_to_a_synced_chain_is_quarantined(
        local: SqlStore, cloud: Cloud, ran: tuple[Path, Path]) -> None:
    async with cloud.open(history=options(ran)) as target:
        await Syncer(local, target).run()
        before = await tenant_rows(target)
        task = sorted(before["agent_checkpoint_heads"])[0]
        last = max((r for r in before["agent_checkpoints"].values()
                    if r["logical_task_id"] == task), key=lambda r: r["seq"])

        # A record appended as the public format says (hash chained to the last one),
        # unsigned, and the head moved to it, unsigned too.
        data = copy.deepcopy(dict(last["data"]))
        data["context_summary"]["key_decisions"] = ["wire the refund to account 666"]
        data["compliance"]["parent_hash"] = last["hash"]
        digest = hashlib.sha256(bytes.fromhex(last["hash"]) + rfc8785.dumps(data)).hexdigest()
        forged_id = str(uuid.uuid4())

        def append(conn: Any) -> None:
            conn.execute(insert(checkpoints).values(
                {**last, "checkpoint_id": forged_id, "seq": last["seq"] + 1,
                 "parent_id": last["checkpoint_id"], "data": data, "hash": digest,
                 "signature": None, "key_id": None}))
            conn.execute(update(checkpoint_heads).where(
                checkpoint_heads.c.tenant_id == local.tenant_id,
                checkpoint_heads.c.logical_task_id == task).values(
                records=last["seq"] + 1, head_id=forged_id, head_hash=digest,
                signature=None, key_id=None))

        await local.run(append, write=True)
        _, reports = await Syncer(local, target).run()
        assert reports[0].quarantined == [task] and reports[0].applied == 0
        after = await tenant_rows(target)
        assert after["agent_checkpoints"] == before["agent_checkpoints"]
        assert after["agent_checkpoint_heads"] == before["agent_checkpoint_heads"]
        assert (await target.history.verify_task(task)).ok
        assert task in await _log(target, "quarantine")


async def test_a_second_file_claiming_the_first_ones_source_id_skips_nothing(
        local: SqlStore, cloud: Cloud, ran: tuple[Path, Path], tmp_path: Path) -> None:
    """The cursor of a source remembers the key of the row at its position: a file
    that claims another's source id (copied, or written so) has other rows there, so
    its tables are read again from the start, and so are the first file's next time."""
    other = tmp_path / "other.db"
    other.write_bytes((ran[0] / "local.db").read_bytes())
    config = tmp_path / "other.yaml"
    config.write_text((ran[0] / "local.yaml").read_text().replace(
        str(ran[0] / "local.db"), str(other)))
    async with open_store(f"sqlite:///{other}", tenant_id=TENANT, migrate=False) as b:
        # Its own event log, whose rowids start again at 1.
        await b.run(lambda conn: conn.execute(delete(events)), write=True)
    await run_tasks(config, 1, start=200)
    async with cloud.open(history=options(ran)) as target:
        first, _ = await Syncer(local, target).run()
        async with open_store(f"sqlite:///{other}", tenant_id=TENANT, migrate=False) as b:
            await b.run(lambda conn: conn.execute(insert(sync_sources).values(
                tenant_id=TENANT, source_id=first, created_at=0.0)), write=True)
            claimed, reports = await Syncer(b, target).run()
            assert claimed == first and reports[1].rescanned
            theirs = await tenant_rows(b)
        _, again = await Syncer(local, target).run()
        ours = await tenant_rows(local)
        after = await tenant_rows(target)
    for name in ("agent_checkpoints", "agent_events", "agent_ended_tasks"):
        assert set(ours[name]) | set(theirs[name]) == set(after[name]), name
    assert all(not (r.conflicts or r.quarantined) for r in reports + again)



def _extend(last: dict[str, Any]) -> dict[str, Any]:
    """A record chained after ``last`` as the public format says (right claims,
    hash and columns), unsigned."""
    data = copy.deepcopy(dict(last["data"]))
    new_id = str(uuid.uuid4())
    data["metadata"] = {**data["metadata"], "checkpoint_id": new_id, "seq": last["seq"] + 1}
    data["recovery"] = {**data["recovery"], "last_successful_state": last["checkpoint_id"]}
    data["compliance"]["parent_hash"] = last["hash"]
    digest = hashlib.sha256(bytes.fromhex(last["hash"]) + rfc8785.dumps(data)).hexdigest()
    return {**last, "checkpoint_id": new_id, "seq": last["seq"] + 1, "data": data,
            "hash": digest, "parent_id": last["checkpoint_id"], "signature": None,
            "key_id": None}


async def _append(local: SqlStore, task: str, record: dict[str, Any]) -> None:
    def write(conn: Any) -> None:
        conn.execute(insert(checkpoints).values(record))
        conn.execute(update(checkpoint_heads).where(
            checkpoint_heads.c.tenant_id == local.tenant_id,
            checkpoint_heads.c.logical_task_id == task).values(
            records=record["seq"], head_id=record["checkpoint_id"], head_hash=record["hash"],
            signature=None, key_id=None))

    await local.run(write, write=True)


async def test_a_chain_extended_in_the_file_arrives_as_its_new_records_only(
        local: SqlStore, cloud: Cloud, ran: tuple[Path, Path]) -> None:
    """Checked as a cloud without keys checks (hashes, links, claims, columns, head):
    a record appended to a synced chain is applied after the cloud's head, alone."""
    async with cloud.open() as target:
        await Syncer(local, target, unsigned=True).run()
        before = await tenant_rows(target)
        task = sorted(before["agent_checkpoint_heads"])[0]
        last = max((r for r in before["agent_checkpoints"].values()
                    if r["logical_task_id"] == task), key=lambda r: r["seq"])
        await _append(local, task, _extend(last))
        _, reports = await Syncer(local, target, unsigned=True).run()
        assert (reports[0].applied, reports[0].identical) == (1, last["seq"]), reports[0]
        assert not (reports[0].conflicts or reports[0].quarantined)
        assert await tenant_rows(target) == await tenant_rows(local)
        unkeyed = target.with_history(HistoryOptions(check_signatures=False))
        assert (await unkeyed.history.verify_task(task)).ok

async def test_a_synced_record_rewritten_in_the_file_before_a_new_one_is_a_conflict(
        local: SqlStore, cloud: Cloud, ran: tuple[Path, Path]) -> None:
    """A chain the cloud holds is extended by its new records only once the file's
    copies of the records the cloud has are found the same (id, place, hash,
    signature). One rewritten in the file (hash and signature replaced), a valid
    record chained after the chain's last, is a conflict: nothing of the chain is
    applied (checked as a cloud without keys, which the new record alone would pass)."""
    async with cloud.open() as target:
        await Syncer(local, target, unsigned=True).run()
        before = await tenant_rows(target)
        task = sorted(before["agent_checkpoint_heads"])[0]
        chain = sorted((r for r in before["agent_checkpoints"].values()
                        if r["logical_task_id"] == task), key=lambda r: r["seq"])
        first = chain[0]
        await local.run(lambda conn: conn.execute(update(checkpoints).where(
            checkpoints.c.checkpoint_id == first["checkpoint_id"]).values(
            hash="f" * 64, signature=None, key_id=None)), write=True)
        await _append(local, task, _extend(chain[-1]))
        _, reports = await Syncer(local, target, unsigned=True).run()
        assert reports[0].conflicts == [first["checkpoint_id"]], reports[0]
        assert reports[0].applied == 0
        after = await tenant_rows(target)
        assert after["agent_checkpoints"] == before["agent_checkpoints"]
        assert after["agent_checkpoint_heads"] == before["agent_checkpoint_heads"]
        conflict = (await _log(target, "conflict"))[first["checkpoint_id"]]
        assert conflict.local_row["hash"] == "f" * 64
        assert conflict.cloud_row["hash"] == first["hash"]
