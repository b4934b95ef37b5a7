"""Shared fixtures: which backends exist, and a fresh store on each of them.

PostgreSQL tests use ``MESHPOINT_TEST_POSTGRES_URL`` (default: the local server,
database ``test``). When it is unreachable they skip with a reason, unless
``MESHPOINT_REQUIRE_SERVICES=1`` (set by ``.ci/run``) makes them fail.
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any, NoReturn

import pytest
from sqlalchemy import Connection

from meshpoint.runtime import RuntimeOptions
from meshpoint.store import SqlStore, open_store
from meshpoint.store.schema import metadata
from tests.integration.mesh import Mesh

POSTGRES_URL = os.environ.get("MESHPOINT_TEST_POSTGRES_URL",
                              "postgresql+asyncpg://postgres@127.0.0.1:5432/test")
REQUIRE_SERVICES = os.environ.get("MESHPOINT_REQUIRE_SERVICES") == "1"
NATS_URL = os.environ.get("MESHPOINT_TEST_NATS_URL", "nats://127.0.0.1:4222")
#: LangGraph's conformance suite from source: its test_*.py files are its specs, run by
#: tests/integration/test_langgraph_conformance.py, not tests of their own.
collect_ignore = ["vendor"]


def service_missing(message: str) -> NoReturn:
    """Skip with ``message``, or fail under MESHPOINT_REQUIRE_SERVICES=1 (CI)."""
    if REQUIRE_SERVICES:
        pytest.fail(message + " [MESHPOINT_REQUIRE_SERVICES=1]", pytrace=False)
    pytest.skip(message)


@pytest.fixture(scope="session")
def nats_url() -> str:
    """The NATS URL, or a skip (a failure under MESHPOINT_REQUIRE_SERVICES=1)."""
    from meshpoint.broker.nats import NatsBroker
    from meshpoint.errors import BrokerError

    async def probe() -> None:
        broker = await NatsBroker.connect(NATS_URL, connect_timeout_s=3)
        await broker.close()

    try:
        with ThreadPoolExecutor(1) as pool:
            pool.submit(lambda: asyncio.run(probe())).result()
    except BrokerError as error:
        service_missing(f"{error}. Start it (`make services`) or point "
                        f"MESHPOINT_TEST_NATS_URL at a server")
    return NATS_URL


async def forget_namespace(nats_url: str, namespace: str) -> None:
    """Delete a test's NATS namespace (its stream), as a test's cleanup."""
    from meshpoint.broker.nats import NatsBroker

    broker = await NatsBroker.connect(nats_url)
    try:
        await broker.delete_namespace(namespace)
    finally:
        await broker.close()


async def pg_execute_async(sql: str) -> None:
    """Run one SQL statement on the test PostgreSQL server."""
    import asyncpg

    dsn = POSTGRES_URL.replace("postgresql+asyncpg://", "postgresql://")
    conn = await asyncpg.connect(dsn, timeout=5)
    try:
        await conn.execute(sql)
    finally:
        await conn.close()


async def pg_drop_roles(*roles: str, if_exists: bool = False) -> None:
    """Drop test roles and what they own, under the lock meshpoint's own role grants
    take: ``DROP OWNED BY`` revokes a role's grant on the database, and PostgreSQL
    refuses ("tuple concurrently updated") while another session grants on the same
    database, as a test on another worker does."""
    drops = []
    for role in roles:
        drop = f"DROP OWNED BY {role}; DROP ROLE {role};"
        if if_exists:
            drop = (f"IF EXISTS (SELECT FROM pg_roles WHERE rolname = '{role}') "
                    f"THEN {drop} END IF;")
        drops.append(drop)
    await pg_execute_async(
        "DO $$BEGIN PERFORM pg_advisory_xact_lock(hashtext('meshpoint role grants')); "
        + " ".join(drops) + " END$$")


async def someone_waits_for(holder: Any) -> bool:
    """Whether a PostgreSQL session waits for a lock that ``holder`` (an
    ``AsyncConnection`` in a transaction) holds: how a test knows the statement it
    started is blocked on its rows, with ``eventually()``, rather than sleeping. (The
    server is shared: only sessions blocked by this very connection count.)"""
    from sqlalchemy import text

    waiting = await holder.scalar(text(
        "SELECT count(*) FROM pg_locks WHERE NOT granted "
        "AND pg_backend_pid() = ANY(pg_blocking_pids(pid))"))
    return bool(waiting)


def pg_execute(sql: str) -> None:
    """Run one SQL statement on the test PostgreSQL server from synchronous code.

    Runs its own event loop in a worker thread, so it works even when called while
    a test's loop is running (a session fixture first requested by an async test).
    """
    with ThreadPoolExecutor(1) as pool:
        pool.submit(lambda: asyncio.run(pg_execute_async(sql))).result()


@pytest.fixture
def private_nats(tmp_path: Path) -> Iterator[Any]:
    """A nats-server of this test's own (see tests/nats_server.py)."""
    from tests.nats_server import PrivateNats, nats_server_binary

    binary = nats_server_binary()
    if binary is None:
        service_missing("nats-server is not installed (Debian: apt install nats-server)")
    server = PrivateNats(binary, tmp_path / "nats")
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def postgres_url() -> str:
    """The PostgreSQL URL, or a skip (a failure under MESHPOINT_REQUIRE_SERVICES=1)."""
    try:
        pg_execute("SELECT 1")
    except Exception as error:
        service_missing(f"PostgreSQL is not reachable at {POSTGRES_URL} ({error}). Start "
                        "it (`make services`) or point MESHPOINT_TEST_POSTGRES_URL at a "
                        "server")
    return POSTGRES_URL


@pytest.fixture(scope="session")
def pg_schema(postgres_url: str) -> Iterator[str]:
    """A PostgreSQL schema of this test session, migrated once, dropped at the end."""
    name = f"mp_test_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    pg_execute(f"CREATE SCHEMA {name}")

    async def migrate() -> None:
        store = await open_store(postgres_url, schema=name)
        await store.close()

    with ThreadPoolExecutor(1) as pool:
        pool.submit(lambda: asyncio.run(migrate())).result()
    yield name
    pg_execute(f"DROP SCHEMA {name} CASCADE")


async def fresh_pg_schema() -> str:
    """A new, empty PostgreSQL schema (the caller drops it)."""
    name = f"mp_test_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    await pg_execute_async(f"CREATE SCHEMA {name}")
    return name


@pytest.fixture
async def empty_database(backend: str, request: pytest.FixtureRequest,
                         tmp_path: Path) -> AsyncIterator[tuple[str, dict[str, Any]]]:
    """A URL and options naming a database of its own with no tables at all: a new
    SQLite file, or a new PostgreSQL schema dropped afterwards."""
    if backend == "sqlite":
        yield f"sqlite:///{tmp_path / 'empty.db'}", {}
        return
    url = request.getfixturevalue("postgres_url")
    schema = await fresh_pg_schema()
    try:
        yield url, {"schema": schema, **BACKEND_OPTIONS[backend]}
    finally:
        await pg_execute_async(f"DROP SCHEMA {schema} CASCADE")


#: Every backend a store can run on. ``postgres-portable`` is PostgreSQL with its
#: fast paths off (``open_store(fast_paths=False)``): the portable bodies only. The
#: store's own suites run on it too (the ``portable_too`` marker), so that a fast
#: path that drifts from its portable body fails a test.
BACKEND_OPTIONS: dict[str, dict[str, Any]] = {
    "sqlite": {}, "postgres": {}, "postgres-portable": {"fast_paths": False}}


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "backend" not in metafunc.fixturenames or any(
            "backend" in str(marker.args[0]) for marker in
            metafunc.definition.iter_markers("parametrize")):
        return  # no backend, or the test names its own
    names = list(BACKEND_OPTIONS)
    if metafunc.definition.get_closest_marker("portable_too") is None:
        names.remove("postgres-portable")
    metafunc.parametrize("backend", [
        pytest.param(name, marks=() if name == "sqlite" else pytest.mark.postgres)
        for name in names], indirect=True)


@pytest.fixture
def backend(request: pytest.FixtureRequest) -> str:
    """The backend of this run of the test (see pytest_generate_tests)."""
    return str(request.param)


@pytest.fixture
def store_url(backend: str, request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if backend == "sqlite":
        return f"sqlite:///{tmp_path / 'meshpoint.db'}"
    return str(request.getfixturevalue("postgres_url"))


@pytest.fixture
def store_options(backend: str, request: pytest.FixtureRequest) -> dict[str, object]:
    """Options that put a store on this test's isolated database."""
    if backend == "sqlite":
        return {}
    return {"schema": request.getfixturevalue("pg_schema"), **BACKEND_OPTIONS[backend]}


class FakeClock:
    """A clock the test moves by hand; starts at the real time."""

    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


async def snapshot(store: SqlStore, *, but_alerts: bool = False
                   ) -> dict[str, list[tuple[object, ...]]]:
    """Every row of every table (all tenants), to prove an operation changed nothing;
    ``but_alerts``: the alerts recorded in the event log left out (a dead letter is
    alerted, which changes no task)."""
    def read(conn: Connection) -> dict[str, list[tuple[object, ...]]]:
        out: dict[str, list[tuple[object, ...]]] = {}
        for table in metadata.sorted_tables:
            where = " WHERE event_type <> 'alert'" if (
                but_alerts and table.name == "agent_events") else ""
            # Raw driver values: a corrupted JSON column must not break the snapshot.
            rows = conn.exec_driver_sql(f"SELECT * FROM {table.name}{where}").all()
            out[table.name] = sorted((tuple(row) for row in rows), key=repr)
        return out

    return await store.run(read)


async def row_counts(store: SqlStore) -> dict[str, int]:
    return {name: len(rows) for name, rows in (await snapshot(store)).items()}


async def _empty_store(backend: str, url: str, options: dict[str, object],
                       **extra: object) -> SqlStore:
    """A store on the backend's test database, emptied of every row."""
    opened = await open_store(url, **options, **extra)  # type: ignore[arg-type]
    if backend != "sqlite":
        tables = ", ".join(table.name for table in metadata.sorted_tables)
        await opened.run(lambda conn: conn.exec_driver_sql(f"TRUNCATE {tables}"), write=True)
    return opened


@pytest.fixture
async def store(backend: str, store_url: str, store_options: dict[str, object],
                clock: FakeClock) -> AsyncIterator[SqlStore]:
    """A store on an empty database of the parametrised backend, on a fake clock."""
    async with await _empty_store(backend, store_url, store_options, clock=clock) as opened:
        yield opened


@pytest.fixture
async def live_store(backend: str, store_url: str,
                     store_options: dict[str, object]) -> AsyncIterator[SqlStore]:
    """A store on an empty database of the parametrised backend, on the real clock
    (for the runtime, whose leases and deadlines must really expire)."""
    async with await _empty_store(backend, store_url, store_options) as opened:
        yield opened


@pytest.fixture(params=["inprocess", pytest.param("nats", marks=pytest.mark.nats)])
def broker_kind(request: pytest.FixtureRequest) -> str:
    """The broker a test runs on: the in-process broker, and NATS JetStream."""
    return str(request.param)


@asynccontextmanager
async def mesh_on(kind: str, store: SqlStore, request: pytest.FixtureRequest,
                  options: RuntimeOptions | None = None) -> AsyncIterator[Mesh]:
    """A started :class:`Mesh` on ``store`` and a broker of ``kind``. On NATS the mesh
    has a namespace (so a stream) of its own, deleted afterwards."""
    from tests.integration.mesh import FAST

    options = options or FAST
    if kind == "inprocess":
        started = await Mesh(store, options).start()
        try:
            yield started
        finally:
            await started.close()
        return
    from meshpoint.broker.nats import NatsBroker

    url = request.getfixturevalue("nats_url")
    options = replace(options, namespace=f"t{uuid.uuid4().hex[:12]}")
    broker = await NatsBroker.connect(url, pull_expires_s=0.3)
    started = await Mesh(store, options, broker).start()
    try:
        yield started
    finally:
        await started.close()
        cleanup = await NatsBroker.connect(url)
        await cleanup.delete_namespace(options.namespace)
        await cleanup.close()


@pytest.fixture
async def broker_mesh(broker_kind: str, live_store: SqlStore,
                      request: pytest.FixtureRequest) -> AsyncIterator[Mesh]:
    """A started :class:`Mesh` on an empty store of the parametrised backend and a
    broker of each kind (the in-process broker, NATS)."""
    async with mesh_on(broker_kind, live_store, request) as started:
        yield started


@pytest.fixture
async def mesh(live_store: SqlStore) -> AsyncIterator[Mesh]:
    """A started :class:`~tests.integration.mesh.Mesh` on an empty store of the
    parametrised backend."""
    started = await Mesh(live_store).start()
    try:
        yield started
    finally:
        await started.close()
