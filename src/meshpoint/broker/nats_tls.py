"""How a NATS connection holds to TLS when :mod:`meshpoint.tls` requires it (used by
:meth:`meshpoint.broker.nats.NatsBroker.connect`).

nats-py upgrades a connection to TLS only when the server's INFO requires it; a
server that offers no TLS gets the client's CONNECT in the clear, credentials
included, even with a TLS context configured or a ``tls://`` URL. And a first
connection that fails on TLS is retried until the connect timeout, as if the server
were down. :class:`TlsClient` refuses such a server before CONNECT, on the first
connection and on every reconnection; :func:`first_connection` ends a first
connection at its first TLS failure.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import nats.errors
from nats.aio.client import Client as NatsClient


class NoTls(nats.errors.Error):
    """The server's INFO offers no TLS, and TLS is required."""

    def __str__(self) -> str:
        return "nats: the server offers no TLS"


class ConnectionRefused(Exception):
    """A first connection failed on TLS, or the server refused the user (nats-py
    would retry either forever); ``cause`` is nats-py's error."""

    def __init__(self, cause: Exception) -> None:
        super().__init__(str(cause))
        self.cause = cause


class TlsClient(NatsClient):
    """nats-py's client, holding to TLS when it is required. nats-py upgrades a
    connection to TLS only if the server's INFO requires it, and otherwise goes on in
    the clear, sending CONNECT (with the credentials) as it is: this client refuses a
    server that offers no TLS before that, and upgrades where TLS is optional. Every
    reconnection passes here too."""

    def __init__(self, *, require_tls: bool) -> None:
        super().__init__()
        self.require_tls = require_tls

    async def _process_info(self, info: dict[str, Any],
                            initial_connection: bool = False) -> None:
        # initial_connection: the INFO that opens a connection (a first one or a
        # reconnection), read before CONNECT is sent; later INFOs update the cluster.
        if self.require_tls and initial_connection:
            if not (info.get("tls_required") or info.get("tls_available")):
                # Hang up first: nats-py leaves the socket of a failed reconnection open.
                transport: Any = self._transport  # nats-py leaves it untyped
                if transport is not None:
                    transport.close()
                    with contextlib.suppress(Exception):
                        await transport.wait_closed()
                raise NoTls
            info["tls_required"] = True  # the very dict nats-py reads to upgrade
        await super()._process_info(info, initial_connection)


async def first_connection(nc: NatsClient, settings: dict[str, Any],
                           refused: asyncio.Future[Exception]) -> None:
    """``nc.connect(**settings)``, unless ``refused`` (a TLS failure or a refused
    user, which nats-py would retry forever) comes first: then ConnectionRefused."""
    connecting = asyncio.ensure_future(nc.connect(**settings))
    either: list[asyncio.Future[Any]] = [connecting, refused]
    try:
        await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
    finally:
        if not connecting.done():
            connecting.cancel()
            with contextlib.suppress(BaseException):
                await connecting
    if not connecting.cancelled():
        connecting.result()  # connected, or its own error
        return
    raise ConnectionRefused(refused.result())
