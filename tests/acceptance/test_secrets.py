"""Broker credentials stay out of what ``serve`` logs and ``submit`` prints: a real
``serve`` and ``submit`` on a private nats-server that requires a user and password,
given through ``${VAR}`` in the config as a deployment would."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from meshpoint.serve import READY
from tests.conftest import service_missing
from tests.nats_server import PrivateNats, free_port, nats_server_binary

pytestmark = [pytest.mark.nats, pytest.mark.timeout(180)]

PASSWORD = "nats-Pa55-w0rd-6650"
WRONG = "not-the-Pa55-w0rd-2113"


@pytest.fixture(scope="module")
def nats_with_password(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrivateNats]:
    binary = nats_server_binary()
    if binary is None:
        service_missing("nats-server is not installed (Debian: apt install nats-server)")
    server = PrivateNats(binary, tmp_path_factory.mktemp("nats"),
                         ["--user", "mesh", "--pass", PASSWORD])
    server.start()
    yield server
    server.stop()


def write_config(tmp_path: Path, port: int, **runtime: float) -> Path:
    path = tmp_path / "mesh.yaml"
    path.write_text(yaml.safe_dump({
        "namespace": f"sec{port}",
        "store": f"sqlite:///{tmp_path / 'mesh.db'}",
        "broker": {"url": f"nats://mesh:${{MESH_NATS_PASSWORD}}@127.0.0.1:{port}",
                   "connect_timeout_s": 2},
        "runtime": runtime,
        "agents": {"echo": {"model": {"kind": "scripted", "persona": "echo"}}}}))
    return path


def meshpoint(*args: str, password: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "meshpoint.cli", *args],
                          env={**os.environ, "MESH_NATS_PASSWORD": password},
                          capture_output=True, text=True, timeout=120)


def test_serve_logs_and_submit_prints_no_broker_password(
        tmp_path: Path, nats_with_password: PrivateNats) -> None:
    config = write_config(tmp_path, nats_with_password.port)
    assert meshpoint("migrate", "--config", str(config), password=PASSWORD).returncode == 0
    log = tmp_path / "serve.log"
    with log.open("wb") as log_file:
        serving = subprocess.Popen(
            [sys.executable, "-m", "meshpoint.cli", "serve", "--config", str(config),
             "--agent", "echo", "--log-level", "debug"],
            env={**os.environ, "MESH_NATS_PASSWORD": PASSWORD},
            stdout=subprocess.PIPE, stderr=log_file)
        try:
            assert serving.stdout is not None
            assert serving.stdout.readline().decode().startswith(READY), log.read_text()
            done = meshpoint("submit", "--config", str(config), "echo", "hello", "--json",
                             password=PASSWORD)
            assert done.returncode == 0, done.stderr
            submitted, answer = map(json.loads, done.stdout.splitlines())
            assert answer["status"]["state"] == "completed"
            assert answer["id"] == submitted["task_id"]
            assert PASSWORD not in done.stdout + done.stderr
            # A wrong password, and no server at all: the error names the server.
            refused = meshpoint("submit", "--config", str(config), "echo", "hello", "--json",
                                password=WRONG)
            assert refused.returncode == 1, refused.stderr
            problem = json.loads(refused.stdout)
            assert problem["kind"] == "BrokerError", problem
            assert f"nats://mesh:***@127.0.0.1:{nats_with_password.port}" in problem["error"]
            assert "Authorization Violation" in problem["error"]  # why, not only a timeout
            assert WRONG not in refused.stdout + refused.stderr
        finally:
            serving.send_signal(signal.SIGTERM)
            assert serving.wait(60) == 0
            serving.stdout.close()  # type: ignore[union-attr]
    said = log.read_text()
    assert f"broker nats://mesh:***@127.0.0.1:{nats_with_password.port}" in said, said
    assert PASSWORD not in said, said

    nobody = write_config(tmp_path, free_port(), startup_timeout_s=1)
    for args in (("submit", "--config", str(nobody), "echo", "hello", "--json"),
                 ("serve", "--config", str(nobody), "--agent", "echo")):
        done = meshpoint(*args, password=PASSWORD)
        assert done.returncode == 1, done.stderr
        assert "cannot reach NATS at nats://mesh:***@127.0.0.1" in " ".join(
            (done.stdout + done.stderr).split()), done
        assert PASSWORD not in done.stdout + done.stderr, done
