"""The listening socket of an HTTP surface (the gateway, the dashboard), bound before
the server starts, so that a port in use or an address the host does not have is a
:class:`~meshpoint.errors.ConfigurationError` naming it, not a traceback from inside
uvicorn's startup."""

from __future__ import annotations

import socket

from meshpoint.errors import ConfigurationError


def listen(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host``:``port`` (IPv6 when ``host`` has a colon), for
    ``uvicorn.Server.serve(sockets=[...])``."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except OSError as error:
        sock.close()
        raise ConfigurationError(
            f"cannot listen on {host}:{port}: {error.strerror or error}; pick another "
            f"--port (or --host)") from None
    sock.set_inheritable(True)
    return sock
