"""The TLS option group (meshpoint.tls): what each verify mode checks, the same
settings from the YAML, the Python API and a libpq URL, and mistakes named."""

from __future__ import annotations

import ssl
from pathlib import Path

import pytest
from pydantic import ValidationError
from sqlalchemy.engine import make_url

from meshpoint.broker import open_broker
from meshpoint.config import load_config
from meshpoint.errors import ConfigurationError
from meshpoint.store import open_store
from meshpoint.tls import TlsConfig, from_url_query
from tests.tls_certs import Certs, make_certs


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return make_certs(tmp_path_factory.mktemp("pki"))


def test_each_verify_mode_checks_what_it_says(certs: Certs) -> None:
    full = TlsConfig(ca_file=str(certs.ca)).ssl_context("store.tls")
    assert (full.verify_mode, full.check_hostname) == (ssl.CERT_REQUIRED, True)
    chain = TlsConfig(ca_file=str(certs.ca), verify="ca").ssl_context("store.tls")
    assert (chain.verify_mode, chain.check_hostname) == (ssl.CERT_REQUIRED, False)
    on = TlsConfig(verify="require").ssl_context("store.tls")
    assert (on.verify_mode, on.check_hostname) == (ssl.CERT_NONE, False)
    for context in (full, chain, on):
        assert context.minimum_version >= ssl.TLSVersion.TLSv1_2
    assert full.get_ca_certs()[0]["subject"] == ((("commonName", "meshpoint test CA"),),)
    system = TlsConfig().ssl_context("broker.tls")  # no ca_file: the system's CAs
    assert system.verify_mode == ssl.CERT_REQUIRED and system.check_hostname


def test_mistakes_are_named(certs: Certs, tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="key_file is the key of cert_file"):
        TlsConfig(key_file=str(certs.client_key))
    with pytest.raises(ValidationError, match="verify: require checks no certificate"):
        TlsConfig(verify="require", ca_file=str(certs.ca))
    with pytest.raises(ValidationError):
        TlsConfig(verify="verify-full")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match=r"^store\.tls\.ca_file: cannot load "):
        TlsConfig(ca_file=str(tmp_path / "missing.pem")).ssl_context("store.tls")
    with pytest.raises(ConfigurationError, match=r"^broker\.tls\.cert_file: cannot load"):
        TlsConfig(ca_file=str(certs.ca), cert_file=str(certs.ca)).ssl_context("broker.tls")


def test_libpq_parameters_in_a_store_url(certs: Certs) -> None:
    def parsed(query: str) -> tuple[TlsConfig | None, str | None]:
        return from_url_query(make_url(f"postgresql://h/db?{query}").query)

    assert parsed(f"sslmode=verify-full&sslrootcert={certs.ca}&sslcert={certs.client_cert}"
                  f"&sslkey={certs.client_key}") == (TlsConfig(
        verify="full", ca_file=str(certs.ca), cert_file=str(certs.client_cert),
        key_file=str(certs.client_key)), None)
    assert parsed("sslmode=verify-ca") == (TlsConfig(verify="ca"), None)
    assert parsed("ssl=require") == (TlsConfig(verify="require"), None)
    assert parsed("sslmode=prefer") == (None, "prefer")
    assert parsed("application_name=x") == (None, None)
    for query, words in (("sslmode=verify", "not one of verify-full"),
                         ("sslrootcert=/ca.pem", "without sslmode"),
                         ("sslmode=prefer&sslrootcert=/ca.pem", "checks no certificate"),
                         ("sslmode=require&sslrootcert=/ca.pem", "verify: require checks"),
                         ("ssl=require&sslmode=require", "both ssl and sslmode"),
                         ("sslmode=require&sslmode=verify-ca", "more than once")):
        with pytest.raises(ConfigurationError, match=words):
            parsed(query)


async def test_tls_given_twice_or_without_a_network_is_refused(certs: Certs,
                                                              tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="configured twice"):
        await open_store("postgresql+asyncpg://h/db?sslmode=require",
                         tls=TlsConfig(verify="require"))
    with pytest.raises(ConfigurationError, match=r"store\.tls is for PostgreSQL"):
        await open_store(f"sqlite:///{tmp_path / 'x.db'}", tls=TlsConfig(verify="require"))
    assert not (tmp_path / "x.db").exists()
    with pytest.raises(ConfigurationError, match=r"broker\.tls is for NATS"):
        await open_broker("memory://", tls=TlsConfig(verify="require"))


def test_the_config_has_tls_for_the_store_and_the_broker(certs: Certs, tmp_path: Path) -> None:
    path = tmp_path / "mesh.yaml"
    path.write_text(
        "store: {url: 'postgresql+asyncpg://h/db', tls: {ca_file: /etc/ca.pem}}\n"
        "broker: {url: 'nats://n:4222', tls: {verify: ca, ca_file: /etc/ca.pem, "
        "cert_file: /etc/c.pem, key_file: /etc/c.key}}\n"
        "agents: {coordinator: {}}\n")
    config = load_config(path)
    assert config.store.tls == TlsConfig(ca_file="/etc/ca.pem")
    assert config.broker.tls == TlsConfig(verify="ca", ca_file="/etc/ca.pem",
                                          cert_file="/etc/c.pem", key_file="/etc/c.key")
    path.write_text("store: {url: 'postgresql://h/db', tls: {verify: yes, ca: x}}\n"
                    "agents: {coordinator: {}}\n")
    with pytest.raises(ConfigurationError) as refused:
        load_config(path)
    said = str(refused.value)
    assert "store.tls.ca: unknown key; expected one of: ca_file, cert_file, key_file, " \
           "verify" in said, said
    assert "store.tls.verify: Input should be 'full', 'ca' or 'require'" in said, said
