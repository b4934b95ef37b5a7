"""TLS to PostgreSQL and NATS against servers of the test's own, with a CA made in
the test: with the right CA a store operation and a publish/subscribe work over TLS;
a server whose certificate another CA signed, or that names another host (``full``),
is refused; a server that requires a client certificate takes the configured one and
refuses a client without; and when TLS is configured, a server that offers none is
refused before anything is sent to it, naming the setting.

The private servers start once per module (PostgreSQL with ``ssl = on`` and only
``hostssl`` in pg_hba.conf; nats-server with ``--tls``, and one with
``--tlsverify``); the plain ones are the shared servers, which offer no TLS."""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nats.errors as nats_errors
import pytest
import yaml

from meshpoint.broker import ConsumerOptions, Delivery
from meshpoint.broker.nats import NatsBroker
from meshpoint.config import load_config
from meshpoint.context import TaskExecutionContext
from meshpoint.errors import TlsError
from meshpoint.store import SqlStore, open_store
from meshpoint.tls import TlsConfig
from tests.conftest import service_missing
from tests.integration.mesh import eventually
from tests.nats_server import PrivateNats, nats_server_binary
from tests.pg_server import PrivatePostgres, why_not_available
from tests.tls_certs import Certs, make_certs

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return make_certs(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def tls_postgres(certs: Certs) -> Iterator[PrivatePostgres]:
    """PostgreSQL that speaks TLS only, and wants a client certificate the CA signed."""
    why = why_not_available()
    if why is not None:
        service_missing(f"cannot start a private PostgreSQL with TLS: {why}")
    server = PrivatePostgres(
        ["ssl = on", "ssl_cert_file = 'server.pem'", "ssl_key_file = 'server.key'",
         "ssl_ca_file = 'ca.pem'"],
        ["local all all trust",
         "hostssl all all 127.0.0.1/32 trust clientcert=verify-ca"],
        {"server.pem": certs.server_cert, "server.key": certs.server_key, "ca.pem": certs.ca})
    server.start()
    yield server
    server.stop()


def _nats(tmp_path_factory: pytest.TempPathFactory, *args: str) -> Iterator[PrivateNats]:
    binary = nats_server_binary()
    if binary is None:
        service_missing("nats-server is not installed (Debian: apt install nats-server)")
    server = PrivateNats(binary, tmp_path_factory.mktemp("nats"), args)
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def tls_nats(tmp_path_factory: pytest.TempPathFactory, certs: Certs) -> Iterator[PrivateNats]:
    """nats-server requiring TLS of every client."""
    yield from _nats(tmp_path_factory, "--tls", "--tlscert", str(certs.server_cert),
                     "--tlskey", str(certs.server_key))


@pytest.fixture(scope="module")
def mtls_nats(tmp_path_factory: pytest.TempPathFactory, certs: Certs) -> Iterator[PrivateNats]:
    """nats-server requiring TLS and a client certificate its CA signed."""
    yield from _nats(tmp_path_factory, "--tlsverify", "--tlscert", str(certs.server_cert),
                     "--tlskey", str(certs.server_key), "--tlscacert", str(certs.ca))


def client_tls(certs: Certs, **overrides: Any) -> TlsConfig:
    return TlsConfig(**{"ca_file": str(certs.ca), "cert_file": str(certs.client_cert),
                        "key_file": str(certs.client_key), **overrides})


# -- PostgreSQL -----------------------------------------------------------------------

async def _round_trip(store: SqlStore) -> None:
    """A store operation, and the server's word that this connection is TLS."""
    task_id = f"t-{uuid.uuid4().hex[:8]}"
    ctx = TaskExecutionContext(task_id, {"session_id": "s"})
    ctx.current_invocation_id = "turn-1"
    ctx.append_session_event({"role": "user", "content": "over TLS"})
    ctx.register_peer_sub_task(f"{task_id}/a", {"peer_agent_name": "peer"})
    await store.checkpoint_task(ctx, "coordinator")
    restored = await store.restore_task(task_id)
    assert restored.context.session_events == [{"role": "user", "content": "over TLS"}]
    encrypted = await store.run(lambda conn: conn.exec_driver_sql(
        "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()").scalar())
    assert encrypted is True


async def test_a_store_over_tls_works_with_the_right_ca(
        tls_postgres: PrivatePostgres, certs: Certs, tmp_path: Path) -> None:
    url = f"postgresql+asyncpg://postgres@127.0.0.1:{tls_postgres.port}/postgres"
    async with open_store(url, tls=client_tls(certs)) as store:
        await _round_trip(store)
    # The same in libpq's words, in the URL.
    libpq = (f"{url}?sslmode=verify-full&sslrootcert={certs.ca}&sslcert={certs.client_cert}"
             f"&sslkey={certs.client_key}")
    async with open_store(libpq) as store:
        await _round_trip(store)
    # And from the mesh config, as serve and the CLI open it.
    path = tmp_path / "mesh.yaml"
    path.write_text(yaml.safe_dump({
        "store": {"url": url, "tls": {"ca_file": str(certs.ca), "verify": "full",
                                      "cert_file": str(certs.client_cert),
                                      "key_file": str(certs.client_key)}},
        "agents": {"coordinator": {}}}))
    store = await load_config(path).open_store()
    try:
        await _round_trip(store)
    finally:
        await store.close()


async def test_a_store_refuses_a_server_its_ca_did_not_sign_or_another_host(
        tls_postgres: PrivatePostgres, certs: Certs) -> None:
    url = f"postgresql+asyncpg://postgres@127.0.0.1:{tls_postgres.port}/postgres"
    with pytest.raises(TlsError) as refused:
        await open_store(url, tls=client_tls(certs, ca_file=str(certs.other_ca)))
    said = str(refused.value)
    assert "certificate verify failed" in said and "store.tls" in said, said
    # The certificate names 127.0.0.1, not localhost: full refuses, ca takes it.
    by_name = f"postgresql+asyncpg://postgres@localhost:{tls_postgres.port}/postgres"
    with pytest.raises(TlsError, match=r"(?i)hostname|IP address mismatch"):
        await open_store(by_name, tls=client_tls(certs))
    async with open_store(by_name, tls=client_tls(certs, verify="ca")) as store:
        await _round_trip(store)
    # The server wants a client certificate: without one it refuses.
    with pytest.raises(TlsError, match=r"client certificate.*store\.tls"):
        await open_store(url, tls=TlsConfig(ca_file=str(certs.ca)))


async def test_a_store_that_requires_tls_refuses_a_server_offering_none(
        postgres_url: str, pg_schema: str, certs: Certs) -> None:
    # The shared server runs without TLS.
    for tls in (TlsConfig(verify="require"), client_tls(certs)):
        started = time.monotonic()
        with pytest.raises(TlsError) as refused:
            await open_store(postgres_url, schema=pg_schema, tls=tls)
        said = str(refused.value)
        assert "offers no TLS" in said and "store.tls" in said, said
        assert time.monotonic() - started < 30  # refused, not retried until a timeout
    with pytest.raises(TlsError, match="sslmode"):
        await open_store(f"{postgres_url}?sslmode=require", schema=pg_schema)


# -- NATS -------------------------------------------------------------------------------

async def _publish_subscribe(broker: NatsBroker) -> None:
    namespace = f"tls{uuid.uuid4().hex[:8]}"
    got: list[bytes] = []

    async def handler(delivery: Delivery) -> None:
        got.append(delivery.message.data)
        await delivery.ack()

    member = await broker.subscribe(f"{namespace}.a2a.v1.x", f"{namespace}-q", handler,
                                    ConsumerOptions(ack_wait_s=5))
    await broker.publish(f"{namespace}.a2a.v1.x", b"over TLS")
    await eventually(lambda: got == [b"over TLS"], what="the message over TLS")
    await member.stop()
    assert broker.nc.connected_url is not None
    # The connection is TLS: the socket under it is an SSL socket.
    transport = broker.nc._transport
    assert transport is not None and transport._io_writer is not None  # type: ignore[attr-defined]
    assert transport._io_writer.get_extra_info("ssl_object") is not None  # type: ignore[attr-defined]


async def test_a_broker_over_tls_publishes_and_subscribes_with_the_right_ca(
        tls_nats: PrivateNats, mtls_nats: PrivateNats, certs: Certs, tmp_path: Path) -> None:
    for url, tls in ((tls_nats.url, TlsConfig(ca_file=str(certs.ca))),
                     (f"tls://127.0.0.1:{tls_nats.port}", TlsConfig(ca_file=str(certs.ca))),
                     (mtls_nats.url, client_tls(certs))):
        broker = await NatsBroker.connect(url, tls=tls, connect_timeout_s=10)
        try:
            await _publish_subscribe(broker)
        finally:
            await broker.close()
    path = tmp_path / "mesh.yaml"
    path.write_text(yaml.safe_dump({
        "store": "sqlite:///unused.db",
        "broker": {"url": mtls_nats.url, "tls": {"ca_file": str(certs.ca),
                                                 "cert_file": str(certs.client_cert),
                                                 "key_file": str(certs.client_key)}},
        "agents": {"coordinator": {}}}))
    configured = await load_config(path).open_broker()
    try:
        assert isinstance(configured, NatsBroker)
        await _publish_subscribe(configured)
    finally:
        await configured.close()


async def test_a_broker_refuses_a_server_its_ca_did_not_sign_or_another_host(
        tls_nats: PrivateNats, mtls_nats: PrivateNats, certs: Certs) -> None:
    for url, tls, words in (
            (tls_nats.url, TlsConfig(ca_file=str(certs.other_ca)), "certificate verify failed"),
            (f"nats://localhost:{tls_nats.port}", TlsConfig(ca_file=str(certs.ca)),
             "IP address mismatch|hostname"),
            # The server wants a client certificate, and is given none.
            (mtls_nats.url, TlsConfig(ca_file=str(certs.ca)), "certificate")):
        started = time.monotonic()
        with pytest.raises(TlsError) as refused:
            await NatsBroker.connect(url, tls=tls, connect_timeout_s=20)
        said = str(refused.value)
        assert "broker.tls" in said, said
        assert re.search(words, said, re.IGNORECASE), said
        assert time.monotonic() - started < 20  # refused at once, not at the timeout
    broker = await NatsBroker.connect(f"nats://localhost:{tls_nats.port}",
                                      tls=TlsConfig(ca_file=str(certs.ca), verify="ca"))
    try:
        await _publish_subscribe(broker)
    finally:
        await broker.close()


async def test_a_broker_that_requires_tls_refuses_a_server_offering_none(
        nats_url: str, certs: Certs) -> None:
    # The shared server offers no TLS; a tls:// URL requires it as broker.tls does.
    plain_tls_url = nats_url.replace("nats://", "tls://")
    for url, tls in ((nats_url, TlsConfig(ca_file=str(certs.ca))),
                     (nats_url, TlsConfig(verify="require")), (plain_tls_url, None)):
        started = time.monotonic()
        with pytest.raises(TlsError) as refused:
            await NatsBroker.connect(url, tls=tls, connect_timeout_s=20)
        said = str(refused.value)
        assert "offers no TLS" in said, said
        assert ("broker.tls" if tls else "tls:// scheme") in said, said
        assert time.monotonic() - started < 20
    # Without TLS configured it is a plain connection, as before.
    broker = await NatsBroker.connect(nats_url)
    await broker.close()


async def test_a_broker_never_reconnects_in_the_clear(
        tmp_path: Path, certs: Certs) -> None:
    """The server comes back without TLS on the same port (a downgrade, or a
    misconfigured restart): the broker does not reconnect to it, and does once TLS
    is back."""
    binary = nats_server_binary()
    if binary is None:
        service_missing("nats-server is not installed (Debian: apt install nats-server)")
    tls_args = ["--tls", "--tlscert", str(certs.server_cert), "--tlskey",
                str(certs.server_key)]
    server = PrivateNats(binary, tmp_path / "nats", tls_args)
    server.start()
    broker = await NatsBroker.connect(server.url, tls=TlsConfig(ca_file=str(certs.ca)))
    try:
        server.stop()
        server.args = []  # the same port and store, in the clear
        server.start()
        await eventually(lambda: isinstance(broker.nc.last_error, nats_errors.Error)
                         and "offers no TLS" in str(broker.nc.last_error), timeout_s=20,
                         what="the broker refusing the plain server")
        assert not broker.nc.is_connected
        server.stop()
        server.args = tls_args
        server.start()
        await eventually(lambda: broker.nc.is_connected, timeout_s=20,
                         what="the broker reconnecting over TLS")
        await _publish_subscribe(broker)
    finally:
        await broker.close()
        server.stop()
