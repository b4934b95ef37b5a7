"""Secrets stay out of what meshpoint prints: the repr of the config, the history's
options and both key rings holds no key material and no password; a URL in an
error or a log line has its credentials replaced by ``***``."""

from __future__ import annotations

import base64
import logging
from pathlib import Path

import pytest

from meshpoint._redact import redact_url
from meshpoint.cli.common import PlainFormatter, plain, shown
from meshpoint.config import load_config
from meshpoint.errors import ConfigurationError
from meshpoint.history.encryption import EncryptionKeys
from meshpoint.history.integrity import SigningKeys, private_seed
from meshpoint.history.planning import HistoryOptions
from meshpoint.store.engine import parse_url

PASSWORD = "pg-Pa55-w0rd-7431"
NATS_PASSWORD = "nats-Pa55-w0rd-9917"
TOKEN = "nats-t0ken-5521"
API_KEY = "sk-live-8c1f0e"


@pytest.mark.parametrize(("url", "shown_as"), [
    (f"postgresql+asyncpg://app:{PASSWORD}@db:5432/mesh", "postgresql+asyncpg://app:***@db:5432/mesh"),
    (f"postgresql://app@db/mesh?password={PASSWORD}&sslmode=verify-full",
     "postgresql://app@db/mesh?password=***&sslmode=verify-full"),
    (f"nats://mesh:{NATS_PASSWORD}@nats:4222", "nats://mesh:***@nats:4222"),
    (f"nats://{TOKEN}@nats:4222", "nats://***@nats:4222"),
    (f"tls://a:{NATS_PASSWORD}@n1:4222,tls://b:{PASSWORD}@n2:4222",
     "tls://a:***@n1:4222,tls://b:***@n2:4222"),
    (f"postgresql://app:{PASSWORD}@[::1:5432/mesh", "postgresql://***@[::1:5432/mesh"),
    ("sqlite:///var/lib/mesh.db", "sqlite:///var/lib/mesh.db"),
    ("nats://127.0.0.1:4222", "nats://127.0.0.1:4222"),
    ("memory://", "memory://"),
])
def test_a_url_is_shown_without_its_credentials(url: str, shown_as: str) -> None:
    assert redact_url(url) == shown_as


@pytest.mark.parametrize("url", [
    f"postgresql+asyncpg://app:{PASSWORD}@db:port/mesh",  # a port that is not a number
    f"mysql://app:{PASSWORD}@db/mesh",
])
def test_a_store_url_refused_is_named_without_its_password(url: str) -> None:
    with pytest.raises(ConfigurationError) as refused:
        parse_url(url)
    assert PASSWORD not in str(refused.value)


def test_the_key_rings_and_history_options_print_no_key() -> None:
    signing = SigningKeys.generate("k1")
    seed = private_seed(signing.private["k1"])
    encryption = EncryptionKeys.generate("acme", key_id="e1")
    aes = encryption.keys["acme"]["e1"]
    options = HistoryOptions(signing=signing, encryption=encryption)
    for value in (encryption, options, signing):
        for text in (repr(value), str(value)):
            assert seed not in text and repr(aes) not in text
            assert base64.b64encode(aes).decode() not in text and aes.hex() not in text
            assert "Ed25519PrivateKey object" not in text
    # What the reprs say instead: which keys there are.
    assert repr(signing) == "SigningKeys(active='k1', private=['k1'], public=[])"
    assert repr(encryption) == "EncryptionKeys(keys={'acme': ['e1']}, active={'acme': 'e1'})"


def test_the_config_prints_no_secret_it_read_from_the_environment(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seed = private_seed(SigningKeys.generate().private["k1"])
    monkeypatch.setenv("MESH_PG_PASSWORD", PASSWORD)
    monkeypatch.setenv("MESH_NATS_PASSWORD", NATS_PASSWORD)
    monkeypatch.setenv("MESH_SIGNING_SEED", seed)
    monkeypatch.setenv("MESH_API_KEY", API_KEY)
    path = tmp_path / "mesh.yaml"
    path.write_text(
        "store: postgresql+asyncpg://app:${MESH_PG_PASSWORD}@db:5432/mesh\n"
        "broker: nats://mesh:${MESH_NATS_PASSWORD}@nats:4222\n"
        "history: {signing: {active: k1, keys: {k1: '${MESH_SIGNING_SEED}'}}}\n"
        "agents:\n"
        "  coordinator:\n"
        "    model: {kind: python, factory: 'tests.unit.test_secrets:model',\n"
        "            options: {api_key: '${MESH_API_KEY}'}}\n")
    config = load_config(path)
    for value in (config, config.store, config.broker, config.history,
                  config.history.signing, config.agents["coordinator"]):
        for text in (repr(value), str(value)):
            for secret in (PASSWORD, NATS_PASSWORD, seed, API_KEY):
                assert secret not in text, (type(value).__name__, text)
    assert "app:***@db:5432" in repr(config.store)
    assert "mesh:***@nats:4222" in repr(config.broker)
    # The config still holds them, for the code that connects and signs.
    assert PASSWORD in config.store.url and NATS_PASSWORD in config.broker.url
    assert config.history.signing.keys["k1"].get_secret_value() == seed
    assert config.history_options().signing.signs


def model(**_options: str) -> None:  # pragma: no cover - never built here
    raise AssertionError


def test_terminal_text_escapes_markup_and_control_characters() -> None:
    assert plain("a\x1b[2Jb\x07c\x9bd\u202ee\nf\tg") == "a\\x1b[2Jb\\x07c\\x9bd\\u202ee\nf\tg"
    assert shown("[/]\x1b]0;x") == "\\[/]\\x1b]0;x"
    record = logging.LogRecord("meshpoint", logging.WARNING, __file__, 1,
                               "task %s failed: %s", ("t-1", "\x1b]0;owned\x07"), None)
    assert PlainFormatter("%(message)s").format(record) == "task t-1 failed: \\x1b]0;owned\\x07"
