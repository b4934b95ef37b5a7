"""Integrity of the checkpoint history (docs/history.md, "Integrity").

Every checkpoint of a task appends one record to its history. The records of a task
form a hash chain::

    hash(n) = SHA-256(hash(n - 1) ‖ canonical(n))

where ``hash(n - 1)`` enters as raw bytes (the 32 bytes its 64 hex digits encode, not
the hex text), ``canonical(n)`` is the RFC 8785 canonical JSON of record *n* without
its hash and signature (the ``rfc8785`` package, the maintained implementation of the
JSON Canonicalization Scheme: one byte string for one JSON value, whatever the key
order or number formatting it was stored with), and the first record's parent hash is
empty (no bytes). A record's signature signs its hash's 32 raw bytes. A record
names its parent's hash, so changing, removing or reordering a record breaks the
chain at that point.

A hash chain alone cannot tell a chain whose tail was cut off from a shorter one,
and anyone who can write the table can recompute it. So each task also has a
*head* (its tenant, task, number of records and last hash), and with a
:class:`SigningKeys` ring configured every record hash and every head is signed
with Ed25519 (``cryptography``), each signature naming its key id so that keys can
be rotated: a truncated tail no longer matches the signed head, and a forged record
has no valid signature.

Nothing here does I/O: the store computes hashes and signatures before it writes,
and verifies what it reads before it decodes it (:mod:`meshpoint.history.planning`).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import rfc8785
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)

from meshpoint.errors import ConfigurationError, InvalidArgumentError, KeyMissingError

__all__ = [
    "GENESIS",
    "SigningKeys",
    "canonical",
    "chain_hash",
    "hashes_equal",
    "head_message",
    "load_key",
]

#: The parent hash of a task's first record.
GENESIS = ""


#: The largest integer RFC 8785 represents exactly (an IEEE 754 double's 53 bits).
_SAFE_INTEGER = 2**53 - 1


def canonical(document: Any) -> bytes:
    """The RFC 8785 canonical JSON of ``document``; InvalidArgumentError naming the
    problem for what JSON cannot represent canonically (NaN, infinities, integers
    beyond 2**53, keys that are not strings).

    The ``rfc8785`` package is the reference, and is what runs for any document that
    holds a float (ES6 formats numbers its own way: ``1.0`` as ``1``, ``1e16`` in full)
    or a key with a character from U+D800 up (RFC 8785 sorts keys by UTF-16 code
    units, which put U+E000-U+FFFF after the astral planes). For every other document
    (strings, integers, booleans, null; what the store writes, whose costs are decimal
    strings) orjson's sorted, compact output is byte for byte the same, about thirty
    times faster: its string escapes are RFC 8785's for every character, and its key
    order is code-point order, which equals UTF-16 order below U+D800.
    ``tests/unit/test_integrity.py`` proves the two agree on generated documents of
    that kind, and that the reference takes over outside it."""
    if _plain(document):
        return orjson.dumps(document, option=orjson.OPT_SORT_KEYS)
    try:
        return rfc8785.dumps(document)
    except rfc8785.CanonicalizationError as error:
        raise InvalidArgumentError(f"a history record must be canonical JSON: {error}") from None
    except TypeError as error:
        raise InvalidArgumentError(f"a history record must be JSON: {error}") from None


def _plain(document: Any) -> bool:
    """Whether ``document`` holds only dicts with keys below U+D800, lists, strings,
    integers within RFC 8785's range, booleans and null (see :func:`canonical`)."""
    stack = [document]
    while stack:
        value = stack.pop()
        kind = type(value)
        if kind is dict:
            for key in value:
                if type(key) is not str or (not key.isascii() and max(key) >= "\ud800"):
                    return False
            stack.extend(value.values())
        elif kind is list:
            stack.extend(value)
        elif kind is int:
            if not -_SAFE_INTEGER <= value <= _SAFE_INTEGER:
                return False
        elif kind is not str and kind is not bool and value is not None:
            return False
    return True


def chain_hash(parent_hash: str, canonical_record: bytes) -> str:
    """``SHA-256(parent hash ‖ canonical record)`` as hex; ``parent_hash`` is hex
    (:data:`GENESIS` for a task's first record) and is hashed as the raw bytes it
    encodes."""
    try:
        parent = bytes.fromhex(parent_hash)
    except ValueError:
        raise InvalidArgumentError(f"a parent hash is hex, got {parent_hash!r}") from None
    return hashlib.sha256(parent + canonical_record).hexdigest()


def hashes_equal(a: str, b: str) -> bool:
    """Compare two hex hashes in constant time."""
    return hmac.compare_digest(a.encode(), b.encode())


def head_message(tenant_id: str, task_id: str, count: int, head_hash: str,
                 pruned_through: int = 0, pruned_hash: str = GENESIS) -> bytes:
    """What a task's signed head signs: its tenant, task, number of records and last
    hash, and where a purge left its chain starting (the last record removed and its
    hash), canonically."""
    return canonical({"head_hash": head_hash, "pruned_hash": pruned_hash,
                      "pruned_through": pruned_through, "records": count,
                      "task_id": task_id, "tenant_id": tenant_id})


@dataclass(frozen=True)
class SigningKeys:
    """An Ed25519 key ring: the key that signs new records (``active``) and every key
    whose signatures can still be verified, by key id.

    Keys are rotated by adding a new private key and making it active; the old one
    stays (its public half is enough) so that records it signed still verify.
    Without any key, records are hashed but not signed."""

    active: str | None = None
    private: Mapping[str, Ed25519PrivateKey] = field(default_factory=dict)
    public: Mapping[str, Ed25519PublicKey] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.active is not None and self.active not in self.private:
            raise ConfigurationError(
                f"the active signing key {self.active!r} has no private key in the ring "
                f"(private keys: {sorted(self.private) or 'none'})")

    def __repr__(self) -> str:
        # Key ids only: never a key, nor an object a debugger could dump one from.
        return (f"SigningKeys(active={self.active!r}, private={sorted(self.private)!r}, "
                f"public={sorted(self.public)!r})")

    @property
    def signs(self) -> bool:
        """Whether new records are signed."""
        return self.active is not None

    @property
    def verifies(self) -> bool:
        """Whether the ring holds any key to check a signature with (a private key or
        only its public half): a verifier holding one cannot take an unsigned record
        or head for a signed one."""
        return bool(self.private or self.public)

    @classmethod
    def generate(cls, key_id: str = "k1") -> SigningKeys:
        """A ring of one new key (for tests and first setups)."""
        return cls(active=key_id, private={key_id: Ed25519PrivateKey.generate()})

    @classmethod
    def from_config(cls, keys: Mapping[str, str], active: str | None) -> SigningKeys:
        """A ring from ``key id -> key``, each key one of: ``env:NAME`` (an
        environment variable), ``file:PATH``, or the key itself; a key is a PEM
        private or public key, or the base64 of a raw 32-byte private seed."""
        private: dict[str, Ed25519PrivateKey] = {}
        public: dict[str, Ed25519PublicKey] = {}
        for key_id, source in keys.items():
            key = _load_key(key_id, _read_source(key_id, source))
            if isinstance(key, Ed25519PrivateKey):
                private[key_id] = key
            else:
                public[key_id] = key
        return cls(active=active, private=private, public=public)

    def sign(self, message: bytes) -> tuple[str, str]:
        """``(key id, base64 signature)`` of ``message`` with the active key."""
        if self.active is None:
            raise KeyMissingError("no active signing key: configure history.signing")
        signature = self.private[self.active].sign(message)
        return self.active, base64.b64encode(signature).decode()

    def verify(self, key_id: str, message: bytes, signature: str) -> str | None:
        """None if ``signature`` is ``key_id``'s signature of ``message``, else why not
        (an unknown key id counts as a failure: a record signed by a key the ring
        does not hold cannot be trusted)."""
        key = self.public.get(key_id)
        if key is None and key_id in self.private:
            key = self.private[key_id].public_key()
        if key is None:
            return f"signed with key {key_id!r}, which the key ring does not hold"
        try:
            key.verify(base64.b64decode(signature, validate=True), message)
        except (InvalidSignature, ValueError):
            return f"the signature does not verify with key {key_id!r}"
        return None

    def public_pem(self, key_id: str) -> str:
        """The public half of a key, PEM-encoded (to give verifiers)."""
        key = self.public.get(key_id)
        if key is None:
            if key_id not in self.private:
                raise KeyMissingError(f"no signing key {key_id!r} in the key ring")
            key = self.private[key_id].public_key()
        return key.public_bytes(serialization.Encoding.PEM,
                                serialization.PublicFormat.SubjectPublicKeyInfo).decode()


def private_seed(key: Ed25519PrivateKey) -> str:
    """The base64 of a private key's raw 32-byte seed (what :meth:`SigningKeys.from_config`
    reads)."""
    raw = key.private_bytes(serialization.Encoding.Raw, serialization.PrivateFormat.Raw,
                            serialization.NoEncryption())
    return base64.b64encode(raw).decode()


def _read_source(key_id: str, source: str) -> str:
    if source.startswith("env:"):
        value = os.environ.get(source[4:])
        if not value:
            raise KeyMissingError(f"signing key {key_id!r}: the environment variable "
                                  f"{source[4:]} is not set")
        return value
    if source.startswith("file:"):
        try:
            return Path(source[5:]).expanduser().read_text()
        except OSError as error:
            raise KeyMissingError(f"signing key {key_id!r}: cannot read {source[5:]}: "
                                  f"{error.strerror}") from None
    return source


def _load_key(key_id: str, text: str) -> Ed25519PrivateKey | Ed25519PublicKey:
    text = text.strip()
    try:
        if text.startswith("-----BEGIN"):
            data = text.encode()
            loaded: Any = (serialization.load_pem_private_key(data, password=None)
                           if "PRIVATE" in text else serialization.load_pem_public_key(data))
        else:
            loaded = Ed25519PrivateKey.from_private_bytes(base64.b64decode(text,
                                                                           validate=True))
    except ValueError as error:
        raise ConfigurationError(f"signing key {key_id!r} is not an Ed25519 key (PEM, or "
                                 f"the base64 of a 32-byte seed): {error}") from None
    if not isinstance(loaded, Ed25519PrivateKey | Ed25519PublicKey):
        raise ConfigurationError(f"signing key {key_id!r} is a {type(loaded).__name__}, "
                                 "not an Ed25519 key")
    return loaded


def load_key(name: str, source: str) -> Ed25519PrivateKey | Ed25519PublicKey:
    """An Ed25519 key from ``source`` as :meth:`SigningKeys.from_config` reads each of
    its keys (``env:NAME``, ``file:PATH``, or the key itself: PEM private or public,
    or the base64 of a 32-byte seed); ``name`` says whose key it is in errors. The
    approvers' keys (:mod:`meshpoint.runtime.approvers`) are read this way too."""
    return _load_key(name, _read_source(name, source))
