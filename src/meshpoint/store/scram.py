"""A PostgreSQL role's password as the SCRAM-SHA-256 verifier the server stores, computed
on the client, so that the password itself never reaches the server.

``ALTER ROLE ... PASSWORD 'secret'`` sends the password in the statement's text, which
the server may log (``log_statement``, a failed statement's error) and whose verifier
it then computes itself. Given a string already in the verifier's form,
``SCRAM-SHA-256$<iterations>:<salt>$<StoredKey>:<ServerKey>`` (RFC 5802, RFC 7677),
PostgreSQL stores it as it is, and a client logs in with the password as before.
The verifier is computed by ``scramp`` (the SCRAM implementation of pg8000), which
prepares the password with SASLprep (RFC 4013) as clients do when they log in.
"""

from __future__ import annotations

import base64

from meshpoint.errors import InvalidArgumentError

#: PostgreSQL's own default (``scram_iterations``).
ITERATIONS = 4096


def scram_verifier(password: str, *, salt: bytes | None = None,
                   iterations: int = ITERATIONS) -> str:
    """The SCRAM-SHA-256 verifier of ``password``, with a fresh random salt unless
    ``salt`` is given (tests). InvalidArgumentError for a password SASLprep refuses
    (empty, control characters, mixed bidirectional text): PostgreSQL would hash it
    unprepared, and a client that prepares it would then fail to log in."""
    from scramp import ScramException, ScramMechanism

    if not password:
        raise InvalidArgumentError("the role's password is empty")
    try:
        salt_used, stored_key, server_key, rounds = ScramMechanism(
            "SCRAM-SHA-256").make_auth_info(password, iteration_count=iterations, salt=salt)
    except ScramException as error:
        raise InvalidArgumentError(
            f"the role's password cannot be used: SASLprep (RFC 4013) refuses it "
            f"({error}); choose one without control characters or mixed "
            "right-to-left text") from None

    def b64(data: bytes) -> str:
        return base64.b64encode(data).decode("ascii")

    return (f"SCRAM-SHA-256${rounds}:{b64(salt_used)}${b64(stored_key)}:"
            f"{b64(server_key)}")
