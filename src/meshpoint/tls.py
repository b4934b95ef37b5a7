"""TLS to PostgreSQL and NATS: one option group, :class:`TlsConfig`, for both.

In the mesh config it is ``store.tls`` and ``broker.tls``; from Python,
``open_store(url, tls=TlsConfig(...))`` and ``NatsBroker.connect(url, tls=...)``::

    store:
      url: postgresql+asyncpg://meshpoint@db.internal/mesh
      tls: {ca_file: /etc/meshpoint/ca.pem, verify: full}
    broker:
      url: nats://nats.internal:4222
      tls: {ca_file: /etc/meshpoint/ca.pem, cert_file: client.pem, key_file: client.key}

``verify`` says what is checked of the server: ``full`` (the default) its
certificate chain up to ``ca_file`` (or the system's CAs) and that the certificate
names the host connected to; ``ca`` the chain only; ``require`` nothing, TLS only
encrypts (a man in the middle can read everything). ``cert_file`` and ``key_file``
present a client certificate to a server that asks for one.

With TLS configured, a server that offers no TLS is refused before anything is sent
to it (a password, a query, a message), and so is one whose certificate does not
verify: :class:`~meshpoint.errors.TlsError`, naming the setting.

A PostgreSQL URL may say the same in libpq's words, which PostgreSQL users know:
``?sslmode=verify-full&sslrootcert=ca.pem&sslcert=client.pem&sslkey=client.key``
(``verify-full``, ``verify-ca`` and ``require`` are ``full``, ``ca`` and
``require``; ``disable``, ``allow`` and ``prefer`` are passed to asyncpg as they
are, and are not TLS that meshpoint requires). A NATS URL of scheme ``tls://``
requires TLS as ``broker.tls`` does, with ``verify: full`` unless that says otherwise.
"""

from __future__ import annotations

import ssl
from collections.abc import Mapping
from typing import Literal

from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

from meshpoint.errors import ConfigurationError

TlsVerify = Literal["full", "ca", "require"]
#: libpq's sslmode for each ``verify`` (and back).
SSLMODES: Mapping[str, TlsVerify] = {"verify-full": "full", "verify-ca": "ca",
                                     "require": "require"}
#: sslmodes meshpoint leaves to asyncpg: no TLS, or TLS if the server offers it,
#: unverified. Neither is a requirement a server can be refused for.
OPPORTUNISTIC = ("disable", "allow", "prefer")
#: A store URL's query parameters that configure TLS (libpq's names; ``ssl`` is what
#: SQLAlchemy's documentation gives for asyncpg).
URL_PARAMETERS = ("sslmode", "ssl", "sslrootcert", "sslcert", "sslkey")
#: The URL parameter of each file, in libpq's words.
LIBPQ_NAMES: Mapping[str, str] = {"ca_file": "sslrootcert", "cert_file": "sslcert",
                                  "key_file": "sslkey"}
#: What :func:`tls_failure` says of a server that offers no TLS.
NO_TLS = "the server offers no TLS"


class TlsConfig(BaseModel):
    """TLS to a server (see the module docstring). Frozen; unknown keys are refused."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    #: ``full`` (chain and host name), ``ca`` (chain only) or ``require`` (no check).
    verify: TlsVerify = "full"
    #: The CA certificates (PEM) the server's certificate must chain to; unset: the
    #: system's.
    ca_file: str | None = None
    #: A client certificate (PEM), for a server that asks for one.
    cert_file: str | None = None
    #: Its private key (PEM); unset: in ``cert_file``.
    key_file: str | None = None

    @model_validator(mode="after")
    def _consistent(self) -> TlsConfig:
        if self.key_file is not None and self.cert_file is None:
            raise ValueError("key_file is the key of cert_file, which is not set")
        if self.verify == "require" and self.ca_file is not None:
            raise ValueError("verify: require checks no certificate, so ca_file would not "
                             "be used: say verify: ca or full to check the server against it")
        return self

    def describe(self) -> str:
        """The settings, as an error names them."""
        shown = [f"verify: {self.verify}"] + [
            f"{key}: {value}" for key, value in (("ca_file", self.ca_file),
                                                 ("cert_file", self.cert_file),
                                                 ("key_file", self.key_file)) if value]
        return ", ".join(shown)

    def ssl_context(self, where: str, *, in_url: bool = False) -> ssl.SSLContext:
        """A client context for these settings (TLS 1.2 at least); ConfigurationError,
        naming the key (``store.tls.ca_file`` for ``where="store.tls"``; libpq's name in
        a store URL, ``in_url``), if a file cannot be loaded."""
        def key(name: str) -> str:
            return f"the store URL's {LIBPQ_NAMES[name]}" if in_url else f"{where}.{name}"

        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        if self.verify == "require":
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        else:
            context.check_hostname = self.verify == "full"
            context.verify_mode = ssl.CERT_REQUIRED
            try:
                if self.ca_file is None:
                    context.load_default_certs(ssl.Purpose.SERVER_AUTH)
                else:
                    context.load_verify_locations(cafile=self.ca_file)
            except (OSError, ValueError) as error:
                raise ConfigurationError(f"{key('ca_file')}: cannot load {self.ca_file}: "
                                         f"{_reason(error)}") from None
        if self.cert_file is not None:
            try:
                context.load_cert_chain(self.cert_file, self.key_file)
            except (OSError, ValueError) as error:
                raise ConfigurationError(
                    f"{key('cert_file')}: cannot load the client certificate "
                    f"{self.cert_file} with its key ({key('key_file')}: "
                    f"{self.key_file or 'unset, so in the same file'}): "
                    f"{_reason(error)}") from None
        return context


def _reason(error: BaseException) -> str:
    return getattr(error, "strerror", None) or getattr(error, "reason", None) or str(error)


def from_url_query(query: Mapping[str, str | tuple[str, ...]],
                   ) -> tuple[TlsConfig | None, str | None]:
    """The TLS a PostgreSQL URL's query asks for in libpq's words: a TlsConfig (for
    ``verify-full``, ``verify-ca``, ``require``), or the sslmode asyncpg handles
    itself (``disable``, ``allow``, ``prefer``), or neither. ConfigurationError names
    a parameter that cannot be used."""
    values: dict[str, str] = {}
    for key in URL_PARAMETERS:
        value = query.get(key)
        if isinstance(value, tuple):
            raise ConfigurationError(f"the store URL gives {key} more than once")
        if value is not None:
            values[key] = value
    if not values:
        return None, None
    if "ssl" in values and "sslmode" in values:
        raise ConfigurationError("the store URL gives both ssl and sslmode: give sslmode")
    mode = values.get("sslmode", values.get("ssl"))
    files = {"ca_file": values.get("sslrootcert"), "cert_file": values.get("sslcert"),
             "key_file": values.get("sslkey")}
    if mode is None:
        raise ConfigurationError(
            "the store URL gives sslrootcert, sslcert or sslkey without sslmode: add "
            "sslmode=verify-full (or verify-ca, require)")
    if mode in OPPORTUNISTIC:
        if any(files.values()):
            raise ConfigurationError(
                f"the store URL's sslmode={mode} checks no certificate, so its "
                "sslrootcert, sslcert and sslkey would not be used: say sslmode=verify-full")
        return None, mode
    if mode not in SSLMODES:
        raise ConfigurationError(
            f"the store URL's sslmode={mode!r} is not one of {', '.join(SSLMODES)}, "
            f"{', '.join(OPPORTUNISTIC)}")
    try:
        return TlsConfig(verify=SSLMODES[mode], **files), None
    except ValidationError as error:
        problem = error.errors(include_url=False)[0]["msg"].removeprefix("Value error, ")
        raise ConfigurationError(f"the store URL's TLS parameters: {problem}") from None


def postgres_ssl(query: Mapping[str, str | tuple[str, ...]], tls: TlsConfig | None,
                 ) -> ssl.SSLContext | str | None:
    """asyncpg's ``ssl`` for a store: a context that requires TLS (from ``tls``, or the
    URL's libpq parameters in ``query``), an sslmode asyncpg handles itself
    (``prefer``), or None (asyncpg's default). ConfigurationError if both say."""
    in_url, sslmode = from_url_query(query)
    if tls is not None and (in_url or sslmode):
        raise ConfigurationError("TLS is configured twice, as store.tls and in the store "
                                 "URL's sslmode: give one")
    required = tls or in_url
    if required is not None:
        return required.ssl_context("store.tls", in_url=tls is None)
    return sslmode


def tls_failure(error: BaseException) -> str | None:
    """What went wrong, if ``error`` (or what it wraps) is a TLS failure: a server that
    refused to speak TLS, or a handshake that failed (a certificate that does not
    verify, a client certificate refused)."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, ssl.SSLError):
            return f"the TLS handshake failed: {current}"
        if isinstance(current, ConnectionError) and "rejected SSL upgrade" in str(current):
            return NO_TLS
        orig = getattr(current, "orig", None)
        current = orig if isinstance(orig, BaseException) else (
            current.__cause__ or current.__context__)
    return None
