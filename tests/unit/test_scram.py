"""The runtime role's password leaves the client only as a SCRAM-SHA-256 verifier
(RFC 5802 and 7677, in the form PostgreSQL stores): checked here against the RFC's
own exchange, as a server checks a login against what it stored."""

from __future__ import annotations

import base64
import hashlib
import hmac
import re

import pytest

from meshpoint.errors import InvalidArgumentError
from meshpoint.store.scram import scram_verifier

#: RFC 7677, section 3: user "user", password "pencil".
_CLIENT_FIRST_BARE = "n=user,r=rOprNGfwEbeRWgbNEkqO"
_SERVER_FIRST = ("r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
                 "s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096")
_CLIENT_FINAL_BARE = "c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0"
_PROOF = "dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ="
_SERVER_SIGNATURE = "6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="
_VERIFIER = re.compile(r"SCRAM-SHA-256\$(\d+):([A-Za-z0-9+/=]+)\$([A-Za-z0-9+/=]+):"
                       r"([A-Za-z0-9+/=]+)")


def _accepts(verifier: str, proof_b64: str) -> tuple[bool, str]:
    """What a server holding ``verifier`` does with the RFC's exchange: whether the
    client's proof holds, and the server signature it answers with."""
    found = _VERIFIER.fullmatch(verifier)
    assert found is not None, verifier
    stored_key, server_key = (base64.b64decode(found.group(n)) for n in (3, 4))
    auth = f"{_CLIENT_FIRST_BARE},{_SERVER_FIRST},{_CLIENT_FINAL_BARE}".encode()
    signature = hmac.new(stored_key, auth, hashlib.sha256).digest()
    client_key = bytes(a ^ b for a, b in zip(base64.b64decode(proof_b64), signature,
                                             strict=True))
    server_signature = hmac.new(server_key, auth, hashlib.sha256).digest()
    return (hmac.compare_digest(hashlib.sha256(client_key).digest(), stored_key),
            base64.b64encode(server_signature).decode())


def test_the_verifier_is_what_a_server_needs_to_check_the_rfcs_login() -> None:
    salt = base64.b64decode("W22ZaJ0SNY7soEsUEjb6gQ==")
    verifier = scram_verifier("pencil", salt=salt, iterations=4096)
    assert verifier.startswith("SCRAM-SHA-256$4096:W22ZaJ0SNY7soEsUEjb6gQ==$")
    assert _accepts(verifier, _PROOF) == (True, _SERVER_SIGNATURE)
    assert not _accepts(scram_verifier("pencil!", salt=salt), _PROOF)[0]
    assert "pencil" not in verifier


def test_each_verifier_has_a_fresh_salt_and_never_holds_the_password() -> None:
    first, second = scram_verifier("s3cret-pw"), scram_verifier("s3cret-pw")
    assert first != second
    for verifier in (first, second):
        found = _VERIFIER.fullmatch(verifier)
        assert found is not None and int(found.group(1)) >= 4096
        assert len(base64.b64decode(found.group(2))) >= 16
        assert "s3cret" not in verifier


@pytest.mark.parametrize("password", ["", "bell\x07", "\u0627x"])
def test_a_password_saslprep_refuses_is_refused_with_the_reason(password: str) -> None:
    """An empty password, a control character, a right-to-left mark mixed with
    left-to-right text: PostgreSQL would hash such a password unprepared, and some
    clients would then not log in; it is refused here instead, saying why."""
    with pytest.raises(InvalidArgumentError, match="password"):
        scram_verifier(password)
