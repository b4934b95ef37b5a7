"""``meshpoint dashboard`` as a process: it serves the pages of the store it is given
on 127.0.0.1 by default, read-only without a token, and takes its token from a file
or the environment, never from the command line."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from meshpoint.errors import ConfigurationError
from meshpoint.ops.dashboard.security import TOKEN_ENV, load_token
from tests.acceptance.test_serve import meshpoint


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_the_command_serves_the_pages_on_localhost_read_only_without_a_token(
        tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'd.db'}"
    assert meshpoint("migrate", "--url", url).returncode == 0
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != TOKEN_ENV}
    proc = subprocess.Popen([sys.executable, "-m", "meshpoint.cli", "dashboard", "--url", url,
                             "--port", str(port)], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        end = time.monotonic() + 30
        while True:
            try:
                page = httpx.get(f"http://127.0.0.1:{port}/", timeout=2)
                break
            except httpx.TransportError:
                assert proc.poll() is None, proc.communicate()
                assert time.monotonic() < end, "the dashboard never answered"
                time.sleep(0.1)
        assert page.status_code == 200 and "read-only" in page.text
        for path in ("/tasks", "/approvals", "/events", "/static/dashboard.css",
                     "/static/events.js"):
            assert httpx.get(f"http://127.0.0.1:{port}{path}").status_code == 200, path
        refused = httpx.post(f"http://127.0.0.1:{port}/login", data={"token": "x" * 20})
        assert refused.status_code == 403
        # A page whose name is rebound to 127.0.0.1 is refused: only the loopback's
        # names are served.
        rebound = httpx.get(f"http://127.0.0.1:{port}/", headers={"host": "evil.example"})
        assert rebound.status_code == 400 and "tenant" not in rebound.text
        assert httpx.get(f"http://localhost:{port}/tasks").status_code == 200
        # Bound to the loopback only.
        listening = [c for c in _listening(proc.pid) if c.laddr.port == port]
        assert listening and all(c.laddr.ip == "127.0.0.1" for c in listening)
    finally:
        proc.terminate()
        out, _err = proc.communicate(timeout=20)
    assert f"http://127.0.0.1:{port}/ (read-only)" in out


def _listening(pid: int) -> list[object]:
    import psutil

    return [c for c in psutil.Process(pid).net_connections(kind="tcp")
            if c.status == psutil.CONN_LISTEN]


def test_a_token_is_never_taken_from_the_command_line(tmp_path: Path) -> None:
    given = meshpoint("dashboard", "--url", f"sqlite:///{tmp_path / 'd.db'}",
                      "--token", "s3cret-s3cret-s3cret")
    assert given.returncode == 2 and "No such option" in given.stderr


def test_the_token_comes_from_its_file_or_the_environment_and_is_long_enough(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    assert load_token(None) is None  # read-only
    monkeypatch.setenv(TOKEN_ENV, "from-the-environment-0123")
    assert load_token(None) == "from-the-environment-0123"
    file = tmp_path / "token"
    file.write_text("from-the-file-0123456789\n")
    assert load_token(file) == "from-the-file-0123456789"  # the file wins
    file.write_text("short\n")
    with pytest.raises(ConfigurationError, match="at least 16"):
        load_token(file)
    with pytest.raises(ConfigurationError, match="cannot read"):
        load_token(tmp_path / "missing")


@pytest.mark.parametrize("command", ["dashboard", "gateway"])
def test_a_port_in_use_is_an_error_naming_it(command: str, tmp_path: Path) -> None:
    """The HTTP surfaces bind their port before they start: one in use is a one-line
    error naming the address, exit status 1, not a traceback from uvicorn."""
    config = tmp_path / "mesh.yaml"
    config.write_text(f"store: sqlite:///{tmp_path / 'm.db'}\nbroker: memory://\n"
                      "agents:\n  a: {description: An agent.}\n")
    source = (["--config", str(config)] if command == "gateway"
              else ["--url", f"sqlite:///{tmp_path / 'm.db'}"])
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        ran = meshpoint(command, *source, "--port", str(port))
    assert ran.returncode == 1, ran.stderr
    assert f"cannot listen on 127.0.0.1:{port}" in ran.stderr, ran.stderr
    assert "Traceback" not in ran.stderr
