"""A private nats-server for tests that restart NATS or must not share it."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def nats_server_binary() -> str | None:
    found = shutil.which("nats-server")
    if found:
        return found
    return "/usr/sbin/nats-server" if os.access("/usr/sbin/nats-server", os.X_OK) else None


class PrivateNats:
    """nats-server with JetStream on a free port, storing under ``store_dir``; it can
    be stopped and started again on the same port and store. ``args`` are more of
    nats-server's options (``--user``/``--pass``, ``--tls...``); ``extra_config`` (text
    of nats-server's config format, e.g. an ``authorization`` block) is added to its
    config, and ``env`` to its environment (the passwords such a block names)."""

    def __init__(self, binary: str, store_dir: Path, args: Sequence[str] = (), *,
                 extra_config: str = "", env: dict[str, str] | None = None) -> None:
        self.binary = binary
        self.store_dir = store_dir
        self.args = list(args)
        self.port = free_port()
        self.url = f"nats://127.0.0.1:{self.port}"
        self.process: subprocess.Popen[bytes] | None = None
        self.extra_config = extra_config
        self.env = env or {}

    def start(self) -> None:
        self.store_dir.mkdir(parents=True, exist_ok=True)
        config = self.store_dir / "nats-server.conf"
        config.write_text(f"host: 127.0.0.1\nport: {self.port}\n"
                          f"jetstream {{ store_dir: {json.dumps(str(self.store_dir))} }}\n"
                          f"{self.extra_config}")
        self.process = subprocess.Popen(
            [self.binary, "-c", str(config), *self.args], env={**os.environ, **self.env},
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"nats-server did not start on port {self.port}")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            self.process.wait(15)
        self.process = None
