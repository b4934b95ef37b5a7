"""``meshpoint sync`` as a real process: killed with SIGKILL at random points while a
local runtime keeps writing, then run once more, the cloud holds exactly the local
rows and ``meshpoint verify`` passes every chain; a rerun applies nothing; ``sync
status`` and ``sync conflicts`` report; bad input is refused before anything is
written. The 20-kill run: ``MESHPOINT_SYNC_KILLS=20``."""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import insert, select
from sqlalchemy.engine import make_url

from meshpoint.config import load_config
from meshpoint.store import open_store
from meshpoint.store.postgres_tenancy import grant_runtime_role
from meshpoint.store.schema import events
from meshpoint.sync.tables import sync_cursors, sync_sources
from tests.acceptance.test_cli_history import meshpoint
from tests.conftest import fresh_pg_schema, pg_drop_roles, pg_execute_async
from tests.integration.sync_local import (
    TENANT,
    cloud_config,
    graph_step,
    local_config,
    run_tasks,
    tenant_rows,
)

pytestmark = [pytest.mark.postgres, pytest.mark.xdist_group("pg_roles")]
ROOT = Path(__file__).resolve().parents[2]
KILLS = int(os.environ.get("MESHPOINT_SYNC_KILLS", "5"))
#: Tasks the local runtime may run while the syncs are killed: more than it gets to.
TASKS = 100 * KILLS


class Cloud:
    """A cloud schema migrated by its owner, and the runtime role's URL."""

    def __init__(self, owner_url: str, schema: str, role: str) -> None:
        self.owner_url, self.schema, self.role = owner_url, schema, role
        self.url = make_url(owner_url).set(username=role).render_as_string(
            hide_password=False)

    def open(self) -> Any:
        return open_store(self.url, schema=self.schema, tenant_id=TENANT, migrate=False)

    def verifier(self, where: Path, keys: dict[str, Path]) -> Path:
        """A cloud config whose ``history.signing`` holds the local stores' public keys."""
        config = where / "cloud.yaml"
        named = ", ".join(f"{k}: 'file:{v}'" for k, v in keys.items())
        store = json.dumps({"url": self.url, "schema": self.schema, "tenant": TENANT})
        config.write_text(f"store: {store}\nhistory:\n  signing: {{keys: {{{named}}}}}\n")
        return config


@pytest.fixture
async def cloud(postgres_url: str) -> AsyncIterator[Cloud]:
    schema = await fresh_pg_schema()
    role = f"mp_sync_{uuid.uuid4().hex[:10]}"
    owner = await open_store(postgres_url, schema=schema)
    try:
        await grant_runtime_role(owner, role)
        yield Cloud(postgres_url, schema, role)
    finally:
        await owner.close()
        await pg_execute_async(f"DROP SCHEMA {schema} CASCADE")
        await pg_drop_roles(role)


def sync_args(where: Path, cloud: Cloud, *more: str, command: str | None = None
              ) -> list[str]:
    return ["sync", *([command] if command else []), "--from",
            f"sqlite:///{where / 'local.db'}", "--to", cloud.url, "--schema", cloud.schema,
            "--tenant", TENANT, *more]


def run_json(*args: str, cwd: Path) -> tuple[int, Any]:
    done = meshpoint(*args, "--json", cwd=cwd)
    try:
        return done.returncode, json.loads(done.stdout)
    except json.JSONDecodeError:
        raise AssertionError(f"exit {done.returncode}: {done.stdout}{done.stderr}") from None


async def both_sides(where: Path, cloud: Cloud) -> tuple[Any, Any]:
    async with open_store(f"sqlite:///{where / 'local.db'}", tenant_id=TENANT,
                          migrate=False) as local, \
            open_store(cloud.url, schema=cloud.schema, tenant_id=TENANT,
                       migrate=False) as target:
        return await tenant_rows(local), await tenant_rows(target)


async def rows_applied(cloud: Cloud) -> int:
    """Rows the cloud's cursors count as applied, all tables together."""
    async with open_store(cloud.url, schema=cloud.schema, tenant_id=TENANT,
                          migrate=False) as target:
        rows = await target.transaction(lambda conn: list(conn.execute(
            select(sync_cursors.c.rows_applied))))
    return sum(r.rows_applied for r in rows)


async def test_a_sync_killed_at_random_points_while_the_runtime_writes_ends_exact(
        cloud: Cloud, tmp_path: Path) -> None:
    config, public = local_config(tmp_path)
    # The database exists, with something to push: tasks, and LangGraph threads.
    await run_tasks(config, 2, graphs=True)
    verifier = cloud_config(tmp_path, cloud.url, cloud.schema, public)
    writer = subprocess.Popen(  # the local runtime keeps writing meanwhile, threads too
        [sys.executable, "-m", "tests.integration.sync_local", str(config),
         str(TASKS), "2", "0.1", "graphs"], cwd=ROOT, stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE, text=True)
    rng = random.Random(os.environ.get("MESHPOINT_SYNC_SEED", "sync"))
    killed, applied = 0, [0]
    try:
        while killed < KILLS and writer.poll() is None:
            sync = subprocess.Popen(
                [sys.executable, "-m", "meshpoint.cli", *sync_args(
                    tmp_path, cloud, "--batch", "5", "--config", str(verifier), "--json")],
                cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            # Killed once it has committed a batch (so mid-sync, not mid-start-up),
            # a random moment later.
            while sync.poll() is None and await rows_applied(cloud) == applied[-1]:
                await asyncio.sleep(0.02)
            await asyncio.sleep(rng.uniform(0.0, 0.1))
            if sync.poll() is None:
                sync.send_signal(signal.SIGKILL)
                killed += 1
            sync.wait()
            applied.append(await rows_applied(cloud))
        # The runtime was still writing throughout (it stops mid-task now, as a crash
        # would: what it committed is what the last sync must bring, exactly).
        assert writer.poll() is None, writer.communicate()[1]
    finally:
        writer.kill()
        writer.communicate()
    assert killed == KILLS, (killed, applied)  # each after a committed batch

    code, report = run_json(*sync_args(tmp_path, cloud, "--config", str(verifier)),
                            cwd=tmp_path)
    assert code == 0 and report["signatures_checked"] is True, report
    local, target = await both_sides(tmp_path, cloud)
    assert target == local  # exactly the local rows, each once (keys are unique)
    chains = len(local["agent_checkpoint_heads"])
    assert chains > 2 and local["agent_events"] and local["agent_ended_tasks"]
    # The LangGraph threads too, changed in place (pruned) while the syncs were killed.
    assert {k.split("/")[0] for k in local["agent_langgraph_checkpoints"]} == {
        "thread-0", "thread-1", "thread-2"}

    code, verified = run_json("verify", "--all", "--config", str(verifier), cwd=tmp_path)
    assert code == 0 and verified["ok"] == chains, verified
    assert verified["signatures_checked"] is True

    code, again = run_json(*sync_args(tmp_path, cloud, "--unsigned"), cwd=tmp_path)
    assert code == 0 and [t["applied"] for t in again["tables"]] == [0, 0, 0, 0], again
    assert again["signatures_checked"] is False  # --unsigned: no key to check them with
    code, status = run_json(*sync_args(tmp_path, cloud, command="status"), cwd=tmp_path)
    assert code == 0 and [t["behind"] for t in status["tables"]] == [0, 0, 0, 0], status
    assert status["source_id"] == again["source_id"]
    # No kill left a row half-seen: nothing was taken for a conflict or quarantined.
    code, log = run_json("sync", "conflicts", "--to", cloud.url, "--schema", cloud.schema,
                         "--tenant", TENANT, cwd=tmp_path)
    assert code == 0 and log["conflicts"] == [], log


async def test_conflicts_are_reported_listed_and_exit_3(cloud: Cloud, tmp_path: Path) -> None:
    """An event the cloud holds otherwise, and a LangGraph thread written on both sides
    (the file's later: it wins, the cloud's version kept): both reported (exit 3) and
    listed by ``sync conflicts``."""
    config, _ = local_config(tmp_path)
    await run_tasks(config, 1)
    keys = load_config(config).history_options()
    local_url = f"sqlite:///{tmp_path / 'local.db'}"
    async with open_store(local_url, tenant_id=TENANT, migrate=False,
                          history=keys) as store:
        await graph_step(store, "both", "first")
    local, _ = await both_sides(tmp_path, cloud)
    event = next(iter(local["agent_events"].values()))
    async with open_store(cloud.url, schema=cloud.schema, tenant_id=TENANT,
                          migrate=False) as target:
        await target.transaction(lambda conn: conn.execute(insert(events).values(
            {**event, "event_type": "theirs"})), write=True)
    code, report = run_json(*sync_args(tmp_path, cloud, "--unsigned"), cwd=tmp_path)
    assert code == 3 and report["tables"][1]["conflicts"] == [event["event_id"]], report
    assert report["tables"][3]["applied"] == 1, report
    # The thread goes on in the cloud, then on the file.
    async with open_store(cloud.url, schema=cloud.schema, tenant_id=TENANT,
                          migrate=False, history=keys) as target:
        await graph_step(target, "both", "in the cloud")
    async with open_store(local_url, tenant_id=TENANT, migrate=False,
                          history=keys) as store:
        await graph_step(store, "both", "on the file")
    code, report = run_json(*sync_args(tmp_path, cloud, "--unsigned"), cwd=tmp_path)
    (thread_key,) = report["tables"][3]["conflicts"]
    assert code == 3 and report["tables"][3]["table"] == "langgraph_threads", report
    assert thread_key.startswith("both@") and report["tables"][3]["applied"] == 1, report
    code, listed = run_json("sync", "conflicts", "--to", cloud.url, "--schema",
                            cloud.schema, "--tenant", TENANT, cwd=tmp_path)
    assert code == 0, listed
    by_table = {r["table_name"]: r for r in listed["conflicts"]}
    assert set(by_table) == {"agent_events", "langgraph_threads"}, listed
    row = by_table["agent_events"]
    assert (row["kind"], row["row_key"], row["cloud_row"]["event_type"],
            row["local_row"]["event_type"]) == ("conflict", event["event_id"], "theirs",
                                                event["event_type"])
    row = by_table["langgraph_threads"]
    assert (row["kind"], row["row_key"]) == ("conflict", thread_key)
    assert "the source's" in row["reason"] and "replaced the cloud's" in row["reason"]
    assert row["cloud_row"]["version"] < row["local_row"]["version"]
    done = meshpoint("sync", "conflicts", "--to", cloud.url, "--schema", cloud.schema,
                     "--tenant", TENANT, cwd=tmp_path)
    assert done.returncode == 0 and "conflict log of tenant acme: 2 row(s)" in done.stdout


async def test_bad_input_is_a_clear_error_and_nothing_is_written(
        cloud: Cloud, tmp_path: Path) -> None:
    config, _ = local_config(tmp_path)
    await run_tasks(config, 1)
    local_url = f"sqlite:///{tmp_path / 'local.db'}"
    cases = [
        (["--from", cloud.url, "--to", cloud.url], 2, "SQLite"),
        (["--from", local_url, "--to", local_url], 2, "PostgreSQL"),
        (["--from", f"sqlite:///{tmp_path / 'nowhere.db'}", "--to", cloud.url], 2,
         "no SQLite database"),
        (["--from", local_url, "--to", cloud.url, "--schema", cloud.schema,
          "--tenant", "globex", "--unsigned"], 2, "no rows of tenant 'globex'"),
        (["--from", local_url, "--to", "postgresql://nobody@127.0.0.1:1/db",
          "--tenant", TENANT, "--unsigned"], 1, "127.0.0.1"),
        # No key to check the chains' signatures with, and not --unsigned.
        (["--from", local_url, "--to", cloud.url, "--schema", cloud.schema,
          "--tenant", TENANT], 2, "no signing key"),
    ]
    for args, code, said in cases:
        started = time.monotonic()
        done = meshpoint("sync", *args, cwd=tmp_path)
        assert done.returncode == code, (args, done.stdout, done.stderr)
        assert said in " ".join((done.stdout + done.stderr).split()), (args, done.stderr)
        assert time.monotonic() - started < 120
    _, target = await both_sides(tmp_path, cloud)
    assert all(not rows for rows in target.values())
    async with open_store(local_url, tenant_id=TENANT, migrate=False) as store:
        named = await store.run(lambda conn: list(conn.execute(select(sync_sources))))
    assert named == []  # not even the source id was written


async def test_a_tenant_is_found_by_its_langgraph_threads_too(
        cloud: Cloud, tmp_path: Path) -> None:
    """A file of LangGraph threads only: another tenant is refused (exit 2, naming the
    file's), not pushed as nothing; a tenant with threads only, beside another's
    history, is accepted."""
    threads = tmp_path / "threads"
    threads.mkdir()
    async with open_store(f"sqlite:///{threads / 'local.db'}", tenant_id=TENANT) as store:
        await graph_step(store, "t-1", "hello")
    args = ["sync", "--from", f"sqlite:///{threads / 'local.db'}", "--to", cloud.url,
            "--schema", cloud.schema, "--tenant"]
    done = meshpoint(*args, "globex", "--unsigned", cwd=tmp_path)
    said = " ".join((done.stdout + done.stderr).split())
    assert done.returncode == 2 and "no rows of tenant 'globex'" in said, said
    assert "its tenants: acme" in said, said
    _, target = await both_sides(threads, cloud)
    assert all(not rows for rows in target.values())
    async with open_store(f"sqlite:///{threads / 'local.db'}", tenant_id="lg") as store:
        await graph_step(store, "t-1", "hello")
    for tenant, behind in ((TENANT, 1), ("lg", 1)):
        code, out = run_json(*args, tenant, "--dry-run", cwd=tmp_path)
        assert code == 0 and [t["behind"] for t in out["tables"]
                              if t["table"] == "langgraph_threads"] == [behind], out


async def test_follow_waits_out_an_unreachable_cloud_then_keeps_it_caught_up(
        cloud: Cloud, tmp_path: Path) -> None:
    """``--follow`` against a cloud that is not there yet (nothing listens on its port):
    it retries with backoff; once a proxy to PostgreSQL opens the port, it catches up,
    and pushes what the runtime writes next."""
    config, _ = local_config(tmp_path)
    await run_tasks(config, 1)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    real = make_url(cloud.url)
    late = real.set(port=port).render_as_string(hide_password=False)
    err_path = tmp_path / "follow.err"
    err_file = err_path.open("w")
    follower = subprocess.Popen(
        [sys.executable, "-m", "meshpoint.cli", "sync", "--from",
         f"sqlite:///{tmp_path / 'local.db'}", "--to", late, "--schema", cloud.schema,
         "--tenant", TENANT, "--follow", "--interval-s", "0.2", "--unsigned", "--json"],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=err_file, text=True)
    proxy = None
    try:
        # It tries, fails and says so, then backs off (however slowly it starts up).
        deadline = time.monotonic() + 60
        while "unreachable" not in err_path.read_text() and time.monotonic() < deadline:
            assert follower.poll() is None, (follower.communicate(), err_path.read_text())
            await asyncio.sleep(0.1)
        assert follower.poll() is None, follower.communicate()
        proxy = await asyncio.start_server(
            lambda r, w: _pipe(r, w, real.host or "127.0.0.1", real.port or 5432),
            "127.0.0.1", port)
        await _until_equal(tmp_path, cloud)
        await run_tasks(config, 2, start=1)  # written while it follows
        await _until_equal(tmp_path, cloud)
    finally:
        follower.send_signal(signal.SIGINT)
        # Waited for on the event loop, which runs the proxy its connections go through.
        deadline = time.monotonic() + 60
        while follower.poll() is None and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        if follower.poll() is None:
            follower.kill()
        out, _ = follower.communicate(timeout=60)
        err_file.close()
        errors = err_path.read_text()
        if proxy is not None:
            proxy.close()
    assert follower.returncode == 0, errors
    assert "unreachable" in errors, errors
    passes = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert passes and all(t["conflicts"] == [] for p in passes for t in p["tables"])


async def _until_equal(where: Path, cloud: Cloud, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        local, target = await both_sides(where, cloud)
        if local == target:
            return
        assert time.monotonic() < deadline, "the follower did not catch up"
        await asyncio.sleep(0.2)


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, host: str,
                port: int) -> None:
    """A TCP proxy's connection: both directions copied until either side closes."""
    upstream_reader, upstream_writer = await asyncio.open_connection(host, port)

    async def copy(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
        try:
            while data := await source.read(65536):
                sink.write(data)
                await sink.drain()
        except ConnectionError:
            pass
        finally:
            sink.close()

    await asyncio.gather(copy(reader, upstream_writer), copy(upstream_reader, writer))


async def test_serve_on_a_local_store_with_a_sync_section_pushes_in_the_background(
        cloud: Cloud, tmp_path: Path) -> None:
    config, _ = local_config(tmp_path)
    await run_tasks(config, 2)
    with_sync = tmp_path / "serve.yaml"
    with_sync.write_text(config.read_text() + "sync: " + json.dumps(
        {"to": cloud.url, "schema": cloud.schema, "interval_s": 0.2}) + "\n")
    server = subprocess.Popen(
        [sys.executable, "-m", "meshpoint.cli", "serve", "--config", str(with_sync),
         "--agent", "coordinator"], cwd=tmp_path, stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE, text=True)
    try:
        await _until_equal(tmp_path, cloud)
    finally:
        server.send_signal(signal.SIGTERM)
        _, errors = server.communicate(timeout=60)
    assert server.returncode == 0, errors
    assert "sync:" in errors and "row(s) applied" in errors, errors
    # The same file tells ``meshpoint sync`` where from, where to and whose.
    await run_tasks(config, 1, start=2)
    code, status = run_json("sync", "status", "--config", str(with_sync), cwd=tmp_path)
    assert code == 0 and status["tenant"] == TENANT, status
    assert [t["behind"] for t in status["tables"]] != [0, 0, 0], status
    code, report = run_json("sync", "--config", str(with_sync), cwd=tmp_path)
    assert code == 0 and report["tables"][0]["applied"] > 0, report
    await _until_equal(tmp_path, cloud, timeout_s=1)
