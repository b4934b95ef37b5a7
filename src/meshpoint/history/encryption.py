"""Encryption at rest of chosen fields of the checkpoint history (docs/history.md).

A field is replaced by an envelope::

    {"$encrypted": {"alg": "A256GCM", "kid": "k2-3f9a1c", "nonce": "...", "ct": "..."}}

AES-256-GCM (``cryptography``) with a fresh 96-bit nonce per value. The associated
data binds the ciphertext to its tenant, task, record and field: a ciphertext moved
to another tenant's row, another task, another record or another field does not
decrypt. The record's hash is computed over the envelope, so the history stays
verifiable without any key, and deleting a tenant's keys (crypto-shredding) makes its
encrypted fields unreadable for good while every chain still verifies.

Keys are held per tenant, each with an id; the tenant's *active* key encrypts, and
every key it still holds decrypts, so rotating (``meshpoint keys rotate``) means
adding a key and making it active. A value encrypted under a key the ring no longer
holds raises :class:`~meshpoint.errors.KeyMissingError`: never plaintext, never a
silent placeholder.

The same keys seal the store's columns that carry user content
(:mod:`meshpoint.store.sealing`): a JSON value as the envelope above, and bytes (a
context blob, a LangGraph row) in a binary form, :data:`SEALED_PREFIX`, the key id's
length and the key id, the nonce, then the ciphertext and its tag.
"""

from __future__ import annotations

import base64
import json
import os
import secrets
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeGuard

import orjson
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from meshpoint.errors import (
    ConfigurationError,
    HistoryIntegrityError,
    InvalidArgumentError,
    KeyMissingError,
)

#: The key of an encrypted value's envelope.
ENVELOPE = "$encrypted"
ALGORITHM = "A256GCM"
#: The first bytes of a value sealed as bytes: no JSON text and no zlib stream
#: starts with a NUL, so sealed bytes are never taken for a value stored in clear.
SEALED_PREFIX = b"\x00mpe1"
_NONCE_BYTES = 12
#: The families of columns a tenant's encryption covers, each of which a deployment
#: may leave in clear by name (``history.encryption.exclude``); what each holds is in
#: :mod:`meshpoint.store.sealing`.
FAMILIES = ("context", "conversation", "calls", "snapshots", "events", "langgraph")


def check_families(names: Any) -> frozenset[str]:
    """``names`` as a set of families; InvalidArgumentError naming one that is not."""
    unknown = [names] if isinstance(names, str) else [
        name for name in names if name not in FAMILIES]
    if unknown:
        raise InvalidArgumentError(
            f"encryption exclude: {unknown[0]!r} is not a list of families of columns "
            f"(they are {', '.join(FAMILIES)})" if isinstance(names, str) else
            f"encryption exclude: {', '.join(map(repr, unknown))} is not a family of "
            f"columns (they are {', '.join(FAMILIES)})")
    return frozenset(names)


def is_envelope(value: Any) -> TypeGuard[dict[str, Any]]:
    """Whether ``value`` is an encrypted field's envelope: ``{"$encrypted": {"kid",
    "nonce", "ct", ...}}`` (an agent's own value that only starts like one is not)."""
    if not (isinstance(value, dict) and len(value) == 1 and ENVELOPE in value):
        return False
    body = value[ENVELOPE]
    return isinstance(body, dict) and all(
        isinstance(body.get(key), str) for key in ("kid", "nonce", "ct"))


@dataclass(frozen=True)
class EncryptionKeys:
    """AES-256 keys by tenant and key id, and each tenant's active key id (see the
    module docstring). Build one with :meth:`generate`, :meth:`from_mapping` or
    :func:`load_keyring`."""

    keys: Mapping[str, Mapping[str, bytes]] = field(default_factory=dict)
    active: Mapping[str, str] = field(default_factory=dict)
    #: An AESGCM object per (tenant, key id), built once: a checkpoint seals several
    #: values, and building one costs about as much as sealing a small value.
    _ciphers: Mapping[tuple[str, str], AESGCM] = field(
        init=False, repr=False, compare=False, default_factory=dict)

    def __post_init__(self) -> None:
        for tenant, ring in self.keys.items():
            for key_id in ring:
                if not 0 < len(key_id.encode()) < 256:
                    raise ConfigurationError(f"tenant {tenant!r}: encryption key id "
                                             f"{key_id!r:.80} must have 1 to 255 bytes")
        for tenant, key_id in self.active.items():
            if key_id not in self.keys.get(tenant, {}):
                raise ConfigurationError(f"tenant {tenant!r}: the active encryption key "
                                         f"{key_id!r} is not in its key ring")
        for tenant, ring in self.keys.items():
            for key_id, key in ring.items():
                if len(key) != 32:
                    raise ConfigurationError(f"tenant {tenant!r}: encryption key {key_id!r} "
                                             f"has {len(key)} bytes, not 32 (AES-256)")
        object.__setattr__(self, "_ciphers", {
            (tenant, key_id): AESGCM(key)
            for tenant, ring in self.keys.items() for key_id, key in ring.items()})

    def __repr__(self) -> str:
        # Key ids only: the keys themselves are raw bytes a log would keep.
        ids = {tenant: sorted(ring) for tenant, ring in self.keys.items()}
        return f"EncryptionKeys(keys={ids!r}, active={dict(self.active)!r})"

    @classmethod
    def generate(cls, *tenants: str, key_id: str = "k1") -> EncryptionKeys:
        """A ring with one new key for each of ``tenants`` (for tests and first setups)."""
        return cls(keys={t: {key_id: AESGCM.generate_key(bit_length=256)} for t in tenants},
                   active=dict.fromkeys(tenants, key_id))

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> EncryptionKeys:
        """A ring from its JSON form: ``{"tenants": {tenant: {"active": id, "keys":
        {id: base64 key}}}}``."""
        tenants = data.get("tenants")
        if not isinstance(tenants, dict):
            raise ConfigurationError('an encryption key ring is {"tenants": {tenant: '
                                     '{"active": key id, "keys": {key id: base64}}}}')
        keys: dict[str, dict[str, bytes]] = {}
        active: dict[str, str] = {}
        for tenant, entry in tenants.items():
            if not isinstance(entry, dict) or not isinstance(entry.get("keys"), dict):
                raise ConfigurationError(f"tenant {tenant!r} of the key ring has no keys")
            try:
                keys[tenant] = {kid: base64.b64decode(k, validate=True)
                                for kid, k in entry["keys"].items()}
            except (ValueError, TypeError):
                raise ConfigurationError(f"tenant {tenant!r}: a key is not base64") from None
            if entry.get("active") is not None:
                active[tenant] = str(entry["active"])
        return cls(keys=keys, active=active)

    def to_mapping(self) -> dict[str, Any]:
        """The JSON form :meth:`from_mapping` reads."""
        return {"tenants": {t: {"active": self.active.get(t),
                                "keys": {kid: base64.b64encode(k).decode()
                                         for kid, k in ring.items()}}
                            for t, ring in sorted(self.keys.items())}}

    def rotated(self, tenant: str, key_id: str | None = None) -> tuple[EncryptionKeys, str]:
        """This ring with a new key for ``tenant``, made active (the old keys stay to
        decrypt what they encrypted); and the new key's id.

        A generated id is ``k<n>-<6 random hex digits>``: never the id of a key that
        was shredded, or lost with a ring file deleted by hand, so that what such a
        key encrypted reads as a missing key, never as a field that does not decrypt
        with the new one (which looks like tampering)."""
        ring = dict(self.keys.get(tenant, {}))
        key_id = key_id or f"k{len(ring) + 1}-{secrets.token_hex(3)}"
        while key_id in ring:
            key_id = f"{key_id}-{secrets.token_hex(2)}"
        ring[key_id] = AESGCM.generate_key(bit_length=256)
        return (EncryptionKeys(keys={**self.keys, tenant: ring},
                               active={**self.active, tenant: key_id}), key_id)

    def shredded(self, tenant: str) -> EncryptionKeys:
        """This ring without any key of ``tenant`` (crypto-shredding)."""
        return EncryptionKeys(keys={t: r for t, r in self.keys.items() if t != tenant},
                              active={t: k for t, k in self.active.items() if t != tenant})

    def encrypt(self, value: Any, *, tenant: str, aad: Mapping[str, str]) -> dict[str, Any]:
        """The envelope of ``value`` (any JSON value) under ``tenant``'s active key;
        ``aad`` (tenant, task, record id, field) is bound to it."""
        key_id, cipher = self._active(tenant)
        nonce = secrets.token_bytes(_NONCE_BYTES)
        ciphertext = cipher.encrypt(nonce, orjson.dumps(value), _aad(tenant, aad))
        return {ENVELOPE: {"alg": ALGORITHM, "kid": key_id,
                           "nonce": base64.b64encode(nonce).decode(),
                           "ct": base64.b64encode(ciphertext).decode()}}

    def decrypt(self, envelope: Mapping[str, Any], *, tenant: str,
                aad: Mapping[str, str]) -> Any:
        """The value in ``envelope``; KeyMissingError if its key is not held (or was
        shredded), HistoryIntegrityError if it does not decrypt under that key with this
        ``aad`` (tampered, or moved from another tenant, task, record or field)."""
        body = envelope[ENVELOPE]
        key_id = str(body.get("kid"))
        cipher = self._held(tenant, key_id, aad)
        try:
            plain = cipher.decrypt(base64.b64decode(body["nonce"]),
                                   base64.b64decode(body["ct"]), _aad(tenant, aad))
        except (InvalidTag, KeyError, ValueError):
            raise _tampered(key_id, aad) from None
        return orjson.loads(plain)

    def encrypt_bytes(self, data: bytes, *, tenant: str, aad: Mapping[str, str]) -> bytes:
        """``data`` sealed under ``tenant``'s active key, ``aad`` bound to it (the
        binary form: see the module docstring)."""
        key_id, cipher = self._active(tenant)
        kid = key_id.encode()
        nonce = secrets.token_bytes(_NONCE_BYTES)
        return b"".join((SEALED_PREFIX, bytes((len(kid),)), kid, nonce,
                         cipher.encrypt(nonce, data, _aad(tenant, aad))))

    def decrypt_bytes(self, data: bytes, *, tenant: str, aad: Mapping[str, str]) -> bytes:
        """What :meth:`encrypt_bytes` sealed; KeyMissingError or HistoryIntegrityError as
        :meth:`decrypt` raises them."""
        start = len(SEALED_PREFIX) + 1
        size = data[start - 1] if len(data) >= start else 0
        key_id = data[start:start + size].decode(errors="replace")
        nonce_at = start + size
        if len(data) < nonce_at + _NONCE_BYTES + 16:  # 16: the tag
            raise _tampered(key_id, aad)  # cut short
        cipher = self._held(tenant, key_id, aad)
        try:
            return cipher.decrypt(data[nonce_at:nonce_at + _NONCE_BYTES],
                                  data[nonce_at + _NONCE_BYTES:], _aad(tenant, aad))
        except (InvalidTag, ValueError):
            raise _tampered(key_id, aad) from None

    def _active(self, tenant: str) -> tuple[str, AESGCM]:
        key_id = self.active.get(tenant)
        if key_id is None:
            raise KeyMissingError(
                f"tenant {tenant!r} has no active encryption key, and the store is "
                "configured to encrypt: add one (meshpoint keys rotate --tenant "
                f"{tenant}); nothing was written")
        return key_id, self._ciphers[(tenant, key_id)]

    def _held(self, tenant: str, key_id: str, aad: Mapping[str, str]) -> AESGCM:
        cipher = self._ciphers.get((tenant, key_id))
        if cipher is None:
            raise KeyMissingError(
                f"tenant {tenant!r} holds no encryption key {key_id!r}: the field "
                f"{_what(aad)!r} cannot be read (its key was never given to this "
                "process, or was deleted)")
        return cipher


def is_sealed(data: bytes) -> bool:
    """Whether ``data`` is in the binary sealed form (:meth:`EncryptionKeys.encrypt_bytes`)."""
    return data[:len(SEALED_PREFIX)] == SEALED_PREFIX


def _what(aad: Mapping[str, str]) -> str | None:
    return aad.get("field") or aad.get("column")


def _tampered(key_id: str, aad: Mapping[str, str]) -> HistoryIntegrityError:
    return HistoryIntegrityError(
        f"the encrypted field {_what(aad)!r} does not decrypt with key {key_id!r} for "
        "this tenant and row (tampered, or moved here from another row or column)",
        task_id=aad.get("task"))


def _aad(tenant: str, aad: Mapping[str, str]) -> bytes:
    return orjson.dumps({**aad, "tenant": tenant}, option=orjson.OPT_SORT_KEYS)


def load_keyring(path: str | Path) -> EncryptionKeys:
    """The key ring in the JSON file at ``path`` (see :meth:`EncryptionKeys.from_mapping`)."""
    path = Path(path).expanduser()
    try:
        return EncryptionKeys.from_mapping(json.loads(path.read_text()))
    except FileNotFoundError:
        raise KeyMissingError(f"the encryption key ring {path} does not exist: create it "
                              "with meshpoint keys rotate --keyring "
                              f"{path} --tenant TENANT") from None
    except (OSError, ValueError) as error:
        raise ConfigurationError(f"cannot read the encryption key ring {path}: "
                                 f"{error}") from None


def save_keyring(keys: EncryptionKeys, path: str | Path) -> None:
    """Write ``keys`` to ``path`` atomically, readable by its owner only."""
    path = Path(path).expanduser()
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as out:
            json.dump(keys.to_mapping(), out, indent=1)
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
