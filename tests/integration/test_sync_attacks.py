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

from meshpoint.store import SqlStore
from meshpoint.store.schema import checkpoint_heads, checkpoints, ended_tasks
from meshpoint.sync.push import Syncer
from meshpoint.sync.tables import sync_conflicts
from tests.integration.sync_local import tenant_rows
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
        task, row = sorted(before["agent_ended_tasks"].items())[0]

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
