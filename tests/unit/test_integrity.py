"""The history's integrity and encryption primitives (no I/O): RFC 8785 canonical JSON,
the hash chain, Ed25519 key rings, AES-GCM envelopes bound to where they belong."""

from __future__ import annotations

import base64
import hashlib
import json
from dataclasses import replace
from decimal import Decimal
from pathlib import Path

import pytest
import rfc8785
from hypothesis import given
from hypothesis import strategies as st

from meshpoint._json import Undecodable
from meshpoint.errors import (
    ConfigurationError,
    CorruptCheckpointError,
    HistoryIntegrityError,
    InvalidArgumentError,
    KeyMissingError,
    UnreadableValueError,
)
from meshpoint.history.costs import Prices, amount
from meshpoint.history.encryption import (
    EncryptionKeys,
    is_envelope,
    is_sealed,
    load_keyring,
    save_keyring,
)
from meshpoint.history.integrity import SigningKeys, _plain, canonical, chain_hash, private_seed
from meshpoint.history.planning import HistoryOptions, parse_retention, plan_record
from meshpoint.history.verification import StoredHead, StoredRecord, verify_chain
from meshpoint.store.sealing import RESULT, UNREADABLE, Sealer

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53) + 1, 2**53 - 1)
    | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner,
                                                                 max_size=4),
    max_leaves=20)


@given(json_values)
def test_canonical_json_is_the_same_whatever_the_key_order_or_spacing(value: object) -> None:
    text = json.dumps(value, indent=2, sort_keys=False)
    reordered = json.loads(json.dumps(json.loads(text), sort_keys=True))
    assert canonical(value) == canonical(reordered) == rfc8785.dumps(value)


plain_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53) + 1, 2**53 - 1) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
        st.text(alphabet=st.characters(max_codepoint=0xD7FF)), inner, max_size=4),
    max_leaves=30)


@given(plain_values)
def test_the_fast_path_writes_exactly_what_rfc8785_writes(value: object) -> None:
    """The store's documents (no floats, no key past U+D7FF) take orjson's sorted
    output, which must be the reference's byte for byte: any string, any key below
    U+D800, any safe integer."""
    assert _plain(value)
    assert canonical(value) == rfc8785.dumps(value)


def test_the_reference_takes_over_where_the_fast_path_would_differ() -> None:
    for value in ({"x": 1.0}, {"x": [1e16]}, {"\ue000": 1, "\U0001f600": 2},
                  {"x": -0.0}, {"x": 1.5e-6}):
        assert not _plain(value)
        assert canonical(value) == rfc8785.dumps(value)
    assert not _plain({"x": 2**60})  # the reference refuses it (below)


def test_canonical_json_refuses_what_it_cannot_represent() -> None:
    for bad in (float("nan"), 2**60, {1: "x"}):
        with pytest.raises(InvalidArgumentError):
            canonical({"x": bad})


def test_the_chain_hash_is_sha256_of_the_parent_hash_and_the_record() -> None:
    record = {"b": 1, "a": "x"}
    first = chain_hash("", canonical(record))
    assert first == hashlib.sha256(b'{"a":"x","b":1}').hexdigest()
    second = chain_hash(first, canonical(record))
    assert second == hashlib.sha256(bytes.fromhex(first) + b'{"a":"x","b":1}').hexdigest()
    with pytest.raises(InvalidArgumentError, match="hex"):
        chain_hash("not hex", b"{}")


def test_signing_keys_from_the_config_forms(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    ring = SigningKeys.generate("k1")
    seed = private_seed(ring.private["k1"])
    pem = ring.public_pem("k1")
    (tmp_path / "k0.pem").write_text(pem)
    monkeypatch.setenv("MP_KEY", seed)
    loaded = SigningKeys.from_config({"k1": "env:MP_KEY", "k0": f"file:{tmp_path}/k0.pem",
                                      "k2": seed}, active="k1")
    key_id, signature = loaded.sign(b"message")
    assert key_id == "k1" and loaded.verify("k1", b"message", signature) is None
    assert loaded.verify("k0", b"message", signature) is None  # the same key, public half
    assert "does not verify" in (loaded.verify("k1", b"other", signature) or "")
    assert "does not hold" in (loaded.verify("k9", b"message", signature) or "")
    with pytest.raises(KeyMissingError, match="MP_MISSING is not set"):
        SigningKeys.from_config({"k1": "env:MP_MISSING"}, active="k1")
    with pytest.raises(KeyMissingError, match="cannot read"):
        SigningKeys.from_config({"k1": f"file:{tmp_path}/nope"}, active=None)
    with pytest.raises(ConfigurationError, match="not an Ed25519 key"):
        SigningKeys.from_config({"k1": "bm90IGEga2V5"}, active=None)
    with pytest.raises(ConfigurationError, match="has no private key"):
        SigningKeys.from_config({"k0": f"file:{tmp_path}/k0.pem"}, active="k0")
    with pytest.raises(KeyMissingError, match="no active signing key"):
        SigningKeys().sign(b"x")


def test_encrypted_values_open_only_where_they_were_sealed() -> None:
    keys = EncryptionKeys.generate("acme", "globex")
    where = {"task": "t1", "record": "r1", "field": "security_context"}
    envelope = keys.encrypt({"token": "s3cret"}, tenant="acme", aad=where)
    assert is_envelope(envelope) and "s3cret" not in json.dumps(envelope)
    assert keys.decrypt(envelope, tenant="acme", aad=where) == {"token": "s3cret"}
    for tenant, aad in (("globex", where), ("acme", {**where, "task": "t2"}),
                        ("acme", {**where, "record": "r2"}),
                        ("acme", {**where, "field": "other"})):
        with pytest.raises((HistoryIntegrityError, KeyMissingError)):
            keys.decrypt(envelope, tenant=tenant, aad=aad)
    flipped = json.loads(json.dumps(envelope))
    ct = bytearray(base64.b64decode(flipped["$encrypted"]["ct"]))
    ct[0] ^= 1
    flipped["$encrypted"]["ct"] = base64.b64encode(bytes(ct)).decode()
    with pytest.raises(HistoryIntegrityError, match="does not decrypt"):
        keys.decrypt(flipped, tenant="acme", aad=where)
    with pytest.raises(KeyMissingError, match="no encryption key 'k1'"):
        keys.shredded("acme").decrypt(envelope, tenant="acme", aad=where)
    with pytest.raises(KeyMissingError, match="no active encryption key"):
        keys.encrypt("x", tenant="initech", aad=where)


def test_sealed_bytes_open_only_in_their_row_and_column() -> None:
    keys = EncryptionKeys.generate("acme", "globex")
    where = {"column": "agent_paused_tasks.context", "task": "t1"}
    sealed = keys.encrypt_bytes(b'{"secret": 1}', tenant="acme", aad=where)
    assert is_sealed(sealed) and b"secret" not in sealed
    assert not is_sealed(b'{"secret": 1}') and not is_sealed(b"x\x9c")  # JSON, zlib
    assert keys.decrypt_bytes(sealed, tenant="acme", aad=where) == b'{"secret": 1}'
    for tenant, aad in (("globex", where), ("acme", {**where, "task": "t2"}),
                        ("acme", {**where, "column": "agent_session_events.data"})):
        with pytest.raises(HistoryIntegrityError, match="does not decrypt"):
            keys.decrypt_bytes(sealed, tenant=tenant, aad=aad)
    flipped = bytearray(sealed)
    flipped[-1] ^= 1
    with pytest.raises(HistoryIntegrityError, match="does not decrypt"):
        keys.decrypt_bytes(bytes(flipped), tenant="acme", aad=where)
    with pytest.raises(KeyMissingError, match="no encryption key 'k1'"):
        keys.shredded("acme").decrypt_bytes(sealed, tenant="acme", aad=where)
    for cut in (sealed[:5], sealed[:9], sealed[:-17]):  # never an IndexError
        with pytest.raises(HistoryIntegrityError, match="does not decrypt"):
            keys.decrypt_bytes(cut, tenant="acme", aad=where)


def test_a_sealer_seals_what_its_families_say_and_reads_clear_values_as_they_are() -> None:
    keys = EncryptionKeys.generate("acme")
    sealer = Sealer("acme", keys, frozenset({"events"}))
    sealed = sealer.seal("calls", {"answer": "42"}, RESULT, sub_task="s1")
    assert is_envelope(sealed)
    assert sealer.open(sealed, RESULT, sub_task="s1") == {"answer": "42"}
    assert sealer.seal("events", "in clear", RESULT, sub_task="s1") == "in clear"
    assert sealer.seal("calls", None, RESULT, sub_task="s1") is None
    assert sealer.open("written before", RESULT, sub_task="s1") == "written before"
    with pytest.raises(CorruptCheckpointError, match="does not decrypt"):
        sealer.open(sealed, RESULT, sub_task="s2")
    assert set(sealer.open(sealed, RESULT, strict=False, sub_task="s2")) == {UNREADABLE}
    keyless = Sealer("acme")
    with pytest.raises(UnreadableValueError, match="no encryption key ring") as caught:
        keyless.open(sealed, RESULT, sub_task="s1")
    assert isinstance(caught.value, KeyMissingError)  # and a CorruptCheckpointError
    unreadable = keyless.open(sealed, RESULT, strict=False, sub_task="s1")
    assert "42" not in json.dumps(unreadable)
    with pytest.raises(InvalidArgumentError, match="'logs' is not a family"):
        HistoryOptions(encrypt_exclude=frozenset({"logs"}))


def test_rotation_keeps_old_keys_and_the_ring_file_round_trips(tmp_path: Path) -> None:
    keys = EncryptionKeys.generate("acme")
    where = {"task": "t1", "record": "r1", "field": "f"}
    old = keys.encrypt("before", tenant="acme", aad=where)
    keys, new_id = keys.rotated("acme")
    assert new_id.startswith("k2-") and keys.active["acme"] == new_id
    new = keys.encrypt("after", tenant="acme", aad=where)
    assert new["$encrypted"]["kid"] == new_id
    # Shredded, then rotated again: the new key never takes a shredded key's id, so
    # what the old keys encrypted reads as a missing key, not as tampering.
    again_after_shred, fresh = keys.shredded("acme").rotated("acme")
    assert fresh.startswith("k1-") and fresh not in keys.keys["acme"]
    with pytest.raises(KeyMissingError, match=f"holds no encryption key '{new_id}'"):
        again_after_shred.decrypt(new, tenant="acme", aad=where)
    path = tmp_path / "keys.json"
    save_keyring(keys, path)
    assert path.stat().st_mode & 0o777 == 0o600
    again = load_keyring(path)
    assert again.decrypt(old, tenant="acme", aad=where) == "before"
    assert again.decrypt(new, tenant="acme", aad=where) == "after"
    with pytest.raises(KeyMissingError, match="does not exist"):
        load_keyring(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text('{"tenants": {"acme": {"keys": {"k1": "AAAA"}}}}')
    with pytest.raises(ConfigurationError, match="not 32"):
        load_keyring(tmp_path / "bad.json")


def test_retention_policies_and_prices() -> None:
    assert parse_retention("days:30") == ("days", 30)
    assert parse_retention("last:5") == ("last", 5)
    assert parse_retention("hold") == ("hold", 0)
    for bad in ("days", "days:0", "last:-1", "forever", "hold:3"):
        with pytest.raises(InvalidArgumentError, match="days:N"):
            parse_retention(bad)
    prices = Prices({"m": {"prompt_tokens": 1.0, "completion_tokens": 4.0,
                           "cached_tokens": 0.5}})
    assert prices.cost("m", {"prompt_tokens": 1_000_000, "cached_tokens": 400_000,
                             "completion_tokens": 100_000}) == Decimal("1.2")
    # floats are read as the decimals they print as, and amounts never rounded
    tiny = Prices({"m": {"prompt_tokens": 0.1, "completion_tokens": 0.0000007}})
    assert tiny.cost("m", {"prompt_tokens": 3, "completion_tokens": 1}) == \
        Decimal("0.0000003000007")
    assert amount(Decimal("3.0000007E-7")) == "0.00000030000007" and amount(Decimal(0)) == "0"
    for bad in (float("nan"), float("inf"), -1, "1"):
        with pytest.raises(InvalidArgumentError, match="a number >= 0"):
            Prices({"m": {"prompt_tokens": bad}})  # type: ignore[dict-item]
    assert prices.cost("unknown", {"prompt_tokens": 5}) is None
    with pytest.raises(InvalidArgumentError, match="not one of"):
        Prices({"m": {"input": 1.0}})
    with pytest.raises(InvalidArgumentError, match="encrypt_fields"):
        HistoryOptions(encrypt_fields=("metadata.task_id",))
    for counts in ("metrics", "metrics.tokens", "metrics.tokens.total"):
        with pytest.raises(InvalidArgumentError, match="token counts, which stay readable"):
            HistoryOptions(encrypt_fields=(counts,))
    HistoryOptions(encrypt_fields=("metrics.cost",))
    # What a restore checks the live row against stays readable too.
    for checked in ("recovery", "recovery.context_sha256", "recovery.snapshot_sha256",
                    "recovery.session_event_count", "recovery.status"):
        with pytest.raises(InvalidArgumentError, match="what a restore checks"):
            HistoryOptions(encrypt_fields=(checked,))
    HistoryOptions(encrypt_fields=("recovery.continuation_prompt",))
    # Which policy a chain follows: a legal hold anywhere wins; else its own, its
    # agent's now, the store's.
    options = HistoryOptions(retention="days:30", agent_retention={"a": "last:2"})
    assert options.retention_of("last:5", "a") == "last:5"
    assert options.retention_of(None, "a") == "last:2"
    assert options.retention_of(None, "b") == "days:30"
    assert HistoryOptions().retention_of(None, "a") is None
    assert HistoryOptions(agent_retention={"a": "hold"}).retention_of("last:1", "a") == "hold"
    assert HistoryOptions(retention="hold").retention_of("days:1", "a") == "hold"
    with pytest.raises(InvalidArgumentError, match=r"agent_retention\['a'\]"):
        HistoryOptions(agent_retention={"a": "forever"})


def _chain(n: int, options: HistoryOptions) -> tuple[list[StoredRecord], StoredHead]:
    records, head = [], None
    for _ in range(n):
        planned = plan_record(
            tenant_id="acme", task_id="t1", agent_name="agent", status="waiting_peers",
            phase=None, doc={}, context_sha256=None, session_event_count=0,
            head=head, now=1_700_000_000.0, options=options, compress_threshold=1 << 20,
            snapshot_context={"a": 1})
        records.append(StoredRecord("acme", planned.checkpoint_id, "t1", planned.seq,
                                    json.loads(json.dumps(planned.document)), planned.hash,
                                    planned.signature, planned.key_id))
        head = planned.head({})
        last = planned
    return records, StoredHead("acme", "t1", n, last.checkpoint_id, last.hash,
                               last.head_signature, last.head_key_id)


def test_a_chain_verifies_and_each_kind_of_damage_is_named() -> None:
    options = HistoryOptions(signing=SigningKeys.generate("k1"))
    records, head = _chain(4, options)
    assert verify_chain("t1", records, head, options).ok
    damaged = [*records[:1], records[2], records[3]]
    report = verify_chain("t1", damaged, head, options)
    assert (report.kind, report.first_bad_seq) == ("broken", 3)
    assert "record 2 is missing" in (report.reason or "")
    report = verify_chain("t1", records[:3], head, options)
    assert report.kind == "broken" and "cut off" in (report.reason or "")
    assert report.last_good_seq == 3
    tampered = replace(records[1], document={**records[1].document, "extensions": {"x": 1}})
    report = verify_chain("t1", [records[0], tampered, *records[2:]], head, options)
    assert (report.kind, report.first_bad_seq, report.last_good_seq) == ("corrupt", 2, 1)
    # A document that does not parse is named as such; a claim that differs only in
    # its type shows both values as they are.
    unreadable = replace(records[2], document=Undecodable("X\"schema_version\"", "bad"))
    report = verify_chain("t1", [*records[:2], unreadable, records[3]], head, options)
    assert (report.kind, report.first_bad_seq) == ("corrupt", 3)
    assert report.reason == "its document is not JSON (bad)"
    meta = {**records[0].document["metadata"], "seq": "1"}
    retyped = replace(records[0], document={**records[0].document, "metadata": meta})
    report = verify_chain("t1", [retyped, *records[1:]], head, options)
    assert report.kind == "broken" and (report.reason or "").startswith(
        "the record says it is record '1' but is stored as record 1 (record 1, ")
    for alike in (True, 1.0):  # equal to 1 in Python, not the same claim
        meta = {**records[0].document["metadata"], "seq": alike}
        retyped = replace(records[0], document={**records[0].document, "metadata": meta})
        report = verify_chain("t1", [retyped, *records[1:]], head, options)
        assert report.kind == "broken" and f"record {alike!r} but" in (report.reason or "")


def test_only_the_history_records_read_unparsable_text_back_as_undecodable() -> None:
    """The lenient JSON type is for the records, which are verified before use; any
    other JSON column still fails its read on text that does not parse."""
    from sqlalchemy.dialects import sqlite

    from meshpoint.store.schema import SqliteJSONDoc, metadata
    lenient = {(table.name, column.name) for table in metadata.tables.values()
               for column in table.columns
               if isinstance(column.type.dialect_impl(sqlite.dialect()), SqliteJSONDoc)}
    assert lenient == {("agent_checkpoints", "data")}


def test_only_a_well_formed_envelope_is_taken_for_an_encrypted_field() -> None:
    keys = EncryptionKeys.generate("acme")
    sealed = keys.encrypt("x", tenant="acme", aad={"task": "t", "field": "f"})
    assert is_envelope(sealed)
    for lookalike in ({"$encrypted": "x"}, {"$encrypted": {"kid": "k1"}},
                      {"$encrypted": {"kid": "k1", "nonce": "n", "ct": 3}}):
        assert not is_envelope(lookalike)


def test_signatures_are_checked_unless_the_verifier_turns_that_off() -> None:
    records, head = _chain(2, HistoryOptions(signing=SigningKeys.generate("k1")))
    keyless = verify_chain("t1", records, head, HistoryOptions())
    assert not keyless.ok and "which the key ring does not hold" in (keyless.reason or "")
    assert verify_chain("t1", records, head, HistoryOptions(check_signatures=False)).ok
    tampered = replace(records[1], document={**records[1].document, "extensions": {"x": 1}})
    report = verify_chain("t1", [records[0], tampered], head,
                          HistoryOptions(check_signatures=False))
    assert (report.kind, report.first_bad_seq) == ("corrupt", 2)  # hashes still checked
