"""``meshpoint sync`` as real processes against what a cloud does to it: a PostgreSQL
restarted while batches are in flight (a one-off pass and ``--follow``, on a
PostgreSQL server of the test's own, stopped and started with ``pg_ctl`` on its
port), waited out with backoff, the sync ending with the cloud holding exactly the
local rows and every chain verifying; and two local stores syncing into one cloud
tenant at once, the cloud ending with their union, each source's cursor its own,
nothing taken for a conflict (docs/sync.md)."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.engine import make_url

from meshpoint.store import open_store
from meshpoint.store.postgres_tenancy import grant_runtime_role
from meshpoint.sync.tables import sync_cursors
from tests.acceptance import test_cli_sync
from tests.acceptance.test_cli_history import meshpoint
from tests.conftest import service_missing
from tests.integration.sync_local import TENANT, local_config, run_tasks, tenant_rows
from tests.pg_server import PrivatePostgres, why_not_available

cloud = test_cli_sync.cloud  # the fixture: a fresh schema, a runtime role granted on it
Cloud = test_cli_sync.Cloud

pytestmark = [pytest.mark.postgres, pytest.mark.timeout(600)]
ROOT = Path(__file__).resolve().parents[2]
SCHEMA = "cloud"


# -- PostgreSQL restarted mid-sync ---------------------------------------------------------

@pytest.fixture
def private_postgres() -> Iterator[PrivatePostgres]:
    """A PostgreSQL of this test's own: it is stopped and started under the sync (the
    shared server, which other tests use, never is)."""
    why = why_not_available()
    if why is not None:
        service_missing(f"a private PostgreSQL cannot be started: {why}")
    server = PrivatePostgres([], ["local all all trust", "host all all 127.0.0.1/32 trust"])
    server.start()
    try:
        yield server
    finally:
        server.stop()


async def _migrated(server: PrivatePostgres) -> Cloud:
    import asyncpg

    conn = await asyncpg.connect(host="127.0.0.1", port=server.port, user="postgres",
                                 database="postgres")
    try:
        await conn.execute(f"CREATE SCHEMA {SCHEMA}")
    finally:
        await conn.close()
    role = "mp_sync_rt"
    async with open_store(server.url(), schema=SCHEMA) as owner:  # migrates
        await grant_runtime_role(owner, role)
    return Cloud(server.url(), SCHEMA, role)


async def _rows_applied(cloud: Cloud) -> dict[str, int]:
    """Rows each source's cursors count as applied (0 while the cloud is down)."""
    try:
        async with cloud.open() as target:
            rows = await target.transaction(lambda conn: list(conn.execute(
                select(sync_cursors.c.source_id, sync_cursors.c.rows_applied))))
    except Exception:  # down, or starting: the caller polls again
        return {}
    out: dict[str, int] = {}
    for r in rows:
        out[r.source_id] = out.get(r.source_id, 0) + int(r.rows_applied)
    return out


async def _both_sides(where: Path, cloud: Cloud) -> tuple[Any, Any]:
    async with open_store(f"sqlite:///{where / 'local.db'}", tenant_id=TENANT,
                          migrate=False) as local, cloud.open() as target:
        return await tenant_rows(local), await tenant_rows(target)


async def _lock_cursors(cloud: Cloud) -> Any:
    """A connection (the schema's owner) holding the cursor table in ACCESS EXCLUSIVE
    mode, in an open transaction: every read of a cursor waits until it closes."""
    import asyncpg

    dsn = make_url(cloud.owner_url).set(drivername="postgresql").render_as_string(
        hide_password=False)
    gate = await asyncpg.connect(dsn, timeout=10)
    await gate.execute("BEGIN")
    await gate.execute(f"LOCK TABLE {cloud.schema}.{sync_cursors.name} "
                       "IN ACCESS EXCLUSIVE MODE")
    return gate


async def _until_waiting(gate: Any, cloud: Cloud, count: int, syncs: list[Any]) -> None:
    """Until ``count`` sessions wait for the lock ``gate`` holds (within 120 s)."""
    deadline = time.monotonic() + 120
    while True:
        waiting = await gate.fetchval(
            "SELECT count(*) FROM pg_locks WHERE NOT granted AND relation = $1::regclass",
            f"{cloud.schema}.{sync_cursors.name}")
        if waiting >= count:
            return
        assert all(s.poll() is None for s in syncs), [s.communicate() for s in syncs]
        assert time.monotonic() < deadline, f"{waiting} sync(s) reached the cloud"
        await asyncio.sleep(0.05)


def _sync(where: Path, cloud: Cloud, *more: str) -> list[str]:
    return [sys.executable, "-m", "meshpoint.cli", "sync", "--from",
            f"sqlite:///{where / 'local.db'}", "--to", cloud.url, "--schema", cloud.schema,
            "--tenant", TENANT, *more]


def _assert_verified(where: Path, verifier: Path, chains: int) -> None:
    done = meshpoint("verify", "--all", "--config", str(verifier), "--json", cwd=where)
    verified = json.loads(done.stdout)
    assert done.returncode == 0 and verified["ok"] == chains, verified
    assert verified["signatures_checked"] is True, verified


@pytest.mark.parametrize("mode", ["one-off", "follow"])
async def test_a_postgresql_restarted_mid_sync_is_waited_out_and_the_sync_ends_exact(
        private_postgres: PrivatePostgres, tmp_path: Path, mode: str) -> None:
    """The server is stopped (``pg_ctl stop -m immediate``: every session ends at once,
    as a crash would) once the sync has committed a batch and while it is still
    pushing, kept down two seconds and started again on its port. The sync says the
    cloud is unreachable and when it tries next, tries again with a growing wait, and
    ends with the cloud holding exactly the local rows, each once, every chain
    verifying with its signatures, nothing taken for a conflict."""
    cloud = await _migrated(private_postgres)
    config, public = local_config(tmp_path)
    await run_tasks(config, 30)  # ~800 rows: 160 batches of 5
    verifier = cloud.verifier(tmp_path, {"k1": public})
    writer = None
    if mode == "follow":
        args = _sync(tmp_path, cloud, "--batch", "5", "--config", str(verifier), "--follow",
                     "--interval-s", "0.2", "--json")
        writer = subprocess.Popen(  # the local runtime keeps writing meanwhile
            [sys.executable, "-m", "tests.integration.sync_local", str(config), "20", "100",
             "0.1"], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    else:
        args = _sync(tmp_path, cloud, "--batch", "5", "--config", str(verifier), "--json")
    sync = subprocess.Popen(args, cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while sum((await _rows_applied(cloud)).values()) == 0:
            assert sync.poll() is None, sync.communicate()
            assert time.monotonic() < deadline, "the sync committed no batch"
            await asyncio.sleep(0.02)
        applied_before = sum((await _rows_applied(cloud)).values())
        private_postgres.down("immediate")
        assert sync.poll() is None, "the sync ended before the restart: too few rows"
        await asyncio.sleep(2.0)
        private_postgres.up()
        if mode == "follow":
            assert writer is not None
            _, errors = await asyncio.to_thread(writer.communicate, timeout=300)
            assert writer.returncode == 0, errors
            local, target = await _until_equal(tmp_path, cloud)
            sync.send_signal(signal.SIGINT)
        out, errors = await asyncio.to_thread(sync.communicate, timeout=300)
    finally:
        for process in (sync, writer):
            if process is not None and process.poll() is None:
                process.kill()
                process.communicate()
    assert sync.returncode == 0, errors
    # It waited the outage out with backoff: tries named with their growing waits.
    waits = [float(line.rsplit("next try in ", 1)[1].split()[0])
             for line in errors.splitlines() if "unreachable" in line and "next try in" in line]
    assert waits and waits == sorted(waits), errors
    assert len(waits) >= 2 and waits[-1] > waits[0], errors
    passes = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert passes and all(not (t["conflicts"] or t["quarantined"])
                          for p in passes for t in p["tables"]), out
    local, target = await _both_sides(tmp_path, cloud)
    assert target == local  # exactly the local rows, hashes and signatures included
    assert sum((await _rows_applied(cloud)).values()) > applied_before
    chains = len(local["agent_checkpoint_heads"])
    assert chains >= 30
    _assert_verified(tmp_path, verifier, chains)
    done = meshpoint("sync", "conflicts", "--to", cloud.url, "--schema", cloud.schema,
                     "--tenant", TENANT, "--json", cwd=tmp_path)
    assert done.returncode == 0 and json.loads(done.stdout)["conflicts"] == [], done.stdout


async def _until_equal(where: Path, cloud: Cloud, timeout_s: float = 120.0
                       ) -> tuple[Any, Any]:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            local, target = await _both_sides(where, cloud)
        except Exception:
            local, target = None, {}
        if local == target:
            return local, target
        assert time.monotonic() < deadline, "the follower did not catch up"
        await asyncio.sleep(0.2)


# -- two local stores syncing into one cloud tenant at once --------------------------------

@pytest.fixture(scope="module")
def two_stores(tmp_path_factory: pytest.TempPathFactory) -> list[tuple[Path, Path]]:
    """Two local deployments of tenant acme, each with its own runtime-written tasks,
    history (signed with its own key) and event logs; each round copies their files.
    Returns (folder, public key) of each."""
    made = []
    for n, key_id in enumerate(("k1", "k2")):
        where = tmp_path_factory.mktemp(f"store{n}")
        config, public = local_config(where, key_id=key_id)
        asyncio.run(run_tasks(config, 20, start=1000 * n))
        made.append((where, public))
    return made


@pytest.mark.xdist_group("pg_roles")
@pytest.mark.parametrize("round_", range(3))
async def test_two_local_stores_syncing_into_one_tenant_at_once_land_their_union(
        two_stores: list[tuple[Path, Path]], cloud: Cloud, tmp_path: Path,
        round_: int) -> None:
    """Two ``meshpoint sync`` processes, one per local file, started together and seen
    both mid-sync at once (each has committed a batch, neither has ended): the cloud
    ends with the union of the files' rows, exactly; each source's cursors count its
    own rows and stand at its own last rows; no conflict, quarantine or kept end."""
    wheres = []
    for n, (made, _) in enumerate(two_stores):
        where = tmp_path / f"store{n}"
        where.mkdir()
        (where / "local.db").write_bytes((made / "local.db").read_bytes())
        wheres.append(where)
    verifier = cloud.verifier(tmp_path, {"k1": two_stores[0][1], "k2": two_stores[1][1]})
    # Both start at once whatever the machine's load: the cursor table is locked until
    # both syncs wait on it (their first cloud statement reads their cursor).
    gate = await _lock_cursors(cloud)
    syncs = [subprocess.Popen(_sync(where, cloud, "--batch", "5", "--config", str(verifier),
                                    "--json"), cwd=where, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for where in wheres]
    try:
        try:
            await _until_waiting(gate, cloud, 2, syncs)
        finally:
            await gate.close()  # the lock goes with its transaction
        overlapped = False
        while all(s.poll() is None for s in syncs):
            applied = await _rows_applied(cloud)
            if len(applied) == 2 and all(applied.values()):
                overlapped = all(s.poll() is None for s in syncs)
                break
            await asyncio.sleep(0.01)
        results = [await asyncio.to_thread(s.communicate, timeout=300) for s in syncs]
    finally:
        for s in syncs:
            if s.poll() is None:
                s.kill()
                s.communicate()
    assert overlapped, "the two syncs did not run at once"
    reports = []
    for s, (out, errors) in zip(syncs, results, strict=True):
        assert s.returncode == 0, errors
        reports.append(json.loads(out))
    assert all(not (t["conflicts"] or t["quarantined"] or t["kept"])
               for r in reports for t in r["tables"]), reports

    sides = []
    for where in wheres:
        async with open_store(f"sqlite:///{where / 'local.db'}", tenant_id=TENANT,
                              migrate=False) as local:
            sides.append(await tenant_rows(local))
    async with cloud.open() as target:
        after = await tenant_rows(target)
        cursors = await target.transaction(lambda conn: list(conn.execute(
            select(sync_cursors))))
    for name in after:
        assert not set(sides[0][name]) & set(sides[1][name]), name  # distinct rows
        assert after[name] == {**sides[0][name], **sides[1][name]}, name
    # Each source's cursors: its own rows, counted once, and its own position.
    sources = [r["source_id"] for r in reports]
    assert len(set(sources)) == 2
    for source, side, report in zip(sources, sides, reports, strict=True):
        mine = {c.table_name: c for c in cursors if c.source_id == source}
        # These files hold no LangGraph thread: none travelled, no cursor for them.
        tables = [t for t in report["tables"] if t["table"] != "langgraph_threads"]
        assert [t["applied"] for t in report["tables"]
                if t["table"] == "langgraph_threads"] == [0]
        assert sorted(mine) == sorted(t["table"] for t in tables)
        for t in tables:
            assert mine[t["table"]].rows_applied == len(side[t["table"]]) == t["applied"]
            assert mine[t["table"]].position == t["position"]
    chains = len(after["agent_checkpoint_heads"])
    assert chains == 40
    _assert_verified(tmp_path, verifier, chains)
