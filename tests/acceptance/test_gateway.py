"""``meshpoint gateway`` on PostgreSQL + NATS: two gateway processes (real uvicorn) in
front of real ``meshpoint serve`` processes. A task sent through one is read, answered
and canceled through the other; a gateway SIGKILLed mid-stream loses nothing: the
client resubscribes through the other and gets the rest of the task, its end once."""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from meshpoint.integrations.a2a.app import READY
from tests.cluster import Cluster, mesh_config
from tests.integration.test_gateway import free_port, pending_of, text_message

pytestmark = [pytest.mark.nats, pytest.mark.postgres, pytest.mark.timeout(180)]


TOKEN = "token-of-the-test-client"
AUTH = {"authorization": f"Bearer {TOKEN}"}


def spawn_gateway(cluster: Cluster, port: int) -> subprocess.Popen[bytes]:
    tokens = cluster.workdir / "tokens"
    tokens.write_text(f"# the test's client\ntester:{TOKEN}\n")
    with (cluster.workdir / f"gateway-{port}.log").open("wb") as log:  # the child keeps it
        process = subprocess.Popen(
            cluster.command("gateway", "--config", str(cluster.config_path),
                            "--port", str(port), "--tokens", f"file:{tokens}"),
            stdout=subprocess.PIPE, stderr=log, env=cluster.env)
    assert process.stdout is not None
    deadline = time.monotonic() + 60
    line = b""
    while not line.startswith(READY.encode()):
        assert process.poll() is None and time.monotonic() < deadline, \
            (cluster.workdir / f"gateway-{port}.log").read_text()
        line = process.stdout.readline()
    return process


@pytest.fixture
def gateways(tmp_path: Path, namespace: str, nats_url: str, postgres_url: str,
             pg_schema: str) -> Iterator[tuple[Cluster, list[str],
                                               list[subprocess.Popen[bytes]]]]:
    """The mesh served (peers that think 1.5 s), and two gateways on it: their base
    URLs and processes."""
    config = mesh_config(namespace, {"url": postgres_url, "schema": pg_schema}, nats_url,
                         peer_delay_s=1.5)
    config["agents"]["coordinator"]["tools"] = [
        {"name": "send", "function": "os:getcwd", "needs_approval": True}]
    cluster = Cluster.write(tmp_path / "cluster", config)
    cluster.start({"coordinator": 1, "flights": 1, "hotels": 1, "weather": 1})
    ports = [free_port(), free_port()]
    processes = [spawn_gateway(cluster, port) for port in ports]
    try:
        yield cluster, [f"http://127.0.0.1:{p}/agents/coordinator/" for p in ports], processes
    finally:
        for process in processes:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
                try:
                    process.wait(30)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait(30)
            assert process.stdout is not None
            process.stdout.close()
        codes = cluster.stop()
        assert set(codes.values()) == {0}, cluster.logs()


def call(url: str, method: str, params: dict[str, Any]) -> dict[str, Any]:
    body: dict[str, Any] = httpx.post(url, json={"jsonrpc": "2.0", "id": 1, "method": method,
                                                 "params": params}, headers=AUTH,
                                      timeout=60).json()
    return body


def sse(response: httpx.Response) -> Iterator[dict[str, Any]]:
    for line in response.iter_lines():
        if line.startswith("data:"):
            yield json.loads(line[5:])["result"]


def test_one_gateway_answers_for_the_others_tasks(
        gateways: tuple[Cluster, list[str], list[subprocess.Popen[bytes]]]) -> None:
    _, (a, b), _ = gateways
    task = call(a, "message/send", {"message": text_message("Trip: flights")})["result"]
    assert task["status"]["state"] == "input-required"
    [pending] = pending_of(task)
    seen = call(b, "tasks/get", {"id": task["id"]})["result"]
    assert seen["status"]["state"] == "input-required" and pending_of(seen) == [pending]
    done = call(b, "message/send", {"message": {
        "kind": "message", "role": "user", "messageId": "answer", "taskId": task["id"],
        "parts": [{"kind": "data", "data": {"decision": "deny", "call_id": pending["call_id"],
                                            "reason": "no"}}]}})["result"]
    assert done["status"]["state"] == "completed"
    assert "ask_flights(flights) = [flights]" in done["status"]["message"]["parts"][0]["text"]
    again = call(a, "tasks/get", {"id": task["id"]})["result"]
    assert again["status"]["state"] == "completed"
    # Canceled through the other gateway than the one it was sent through.
    other = call(b, "message/send", {"message": text_message("Trip: hotels")})["result"]
    canceled = call(a, "tasks/cancel", {"id": other["id"]})["result"]
    assert canceled["status"]["state"] == "canceled"
    assert call(b, "tasks/get", {"id": other["id"]})["result"]["status"]["state"] == \
        "canceled"


def test_a_stream_cut_by_a_killed_gateway_goes_on_through_the_other(
        gateways: tuple[Cluster, list[str], list[subprocess.Popen[bytes]]]) -> None:
    _, (a, b), processes = gateways
    with httpx.Client(timeout=60, headers=AUTH) as http:
        # The coordinator asks two slow peers and waits for a human to approve a call.
        request = {"jsonrpc": "2.0", "id": 9, "method": "message/stream",
                   "params": {"message": text_message("Plan: weather, hotels")}}
        with http.stream("POST", a, json=request) as response:
            first = next(sse(response))
            task_id = first["id"]
            assert first["kind"] == "task"
            processes[0].send_signal(signal.SIGKILL)  # mid-stream
            processes[0].wait(30)
        resubscribe = {"jsonrpc": "2.0", "id": 10, "method": "tasks/resubscribe",
                       "params": {"id": task_id}}
        with http.stream("POST", b, json=resubscribe) as response:
            events = list(sse(response))
    # The task as it stands, then its changes; it stops where it waits for a human.
    assert events[0]["kind"] == "task" and events[0]["id"] == task_id
    states = [events[0]["status"]["state"]] + [
        e["status"]["state"] for e in events[1:] if e["kind"] == "status-update"]
    assert states[-1] == "input-required" and states.count("input-required") == 1
    [pending] = pending_of(call(b, "tasks/get", {"id": task_id})["result"])
    answer = {"jsonrpc": "2.0", "id": 11, "method": "message/stream", "params": {"message": {
        "kind": "message", "role": "user", "messageId": "ok", "taskId": task_id,
        "parts": [{"kind": "data", "data": {"decision": "deny",
                                            "call_id": pending["call_id"]}}]}}}
    with httpx.Client(timeout=60, headers=AUTH) as http, \
            http.stream("POST", b, json=answer) as response:
        rest = list(sse(response))
    ends = [e for e in rest if e["kind"] == "status-update" and e["final"]]
    assert [e["status"]["state"] for e in ends] == ["completed"]  # its end, once
    text = ends[0]["status"]["message"]["parts"][0]["text"]
    assert "ask_flights(weather) = [flights]" in text and "ask_hotels(hotels)" in text
    # The gateway that sent it died before it heard the answer: the history has it.
    got = call(b, "tasks/get", {"id": task_id})["result"]
    assert got["status"]["state"] == "completed" and got["status"]["message"]["parts"][0][
        "text"] == text


def test_the_command_line_keeps_tokens_off_it(tmp_path: Path) -> None:
    """A token written in the command line is refused (ps shows it to every user), as
    is a tokens file that says nothing usable."""
    config = tmp_path / "mesh.yaml"
    config.write_text(f"store: sqlite:///{tmp_path / 'mesh.db'}\nbroker: memory://\n"
                      "agents: {flights: {}}\n")
    command = [sys.executable, "-m", "meshpoint.cli", "gateway", "--config", str(config)]
    bare = subprocess.run([*command, "--tokens", TOKEN], capture_output=True, text=True,
                          timeout=60)
    assert bare.returncode == 2 and "command line" in " ".join(bare.stderr.split())
    assert TOKEN not in bare.stderr
    (tmp_path / "tokens").write_text("alice:short\n")
    short = subprocess.run([*command, "--tokens", f"file:{tmp_path / 'tokens'}"],
                           capture_output=True, text=True, timeout=60)
    assert short.returncode == 1 and "at least 16 characters" in short.stderr


def test_the_cards_name_a_url_clients_reach(tmp_path: Path) -> None:
    """Listening on every address, the gateway cannot tell its own URL: it is refused
    without --public-url (a card naming 0.0.0.0 sends a stock client nowhere); given,
    the cards name it."""
    config = tmp_path / "mesh.yaml"
    config.write_text(f"store: sqlite:///{tmp_path / 'mesh.db'}\nbroker: memory://\n"
                      "agents: {flights: {}}\n")
    command = [sys.executable, "-m", "meshpoint.cli", "gateway", "--config", str(config)]
    wild = subprocess.run([*command, "--host", "0.0.0.0"], capture_output=True, text=True,
                          timeout=60)
    assert wild.returncode == 1 and "--public-url" in wild.stderr
    bad = subprocess.run([*command, "--public-url", "gw.example.com"], capture_output=True,
                         text=True, timeout=60)
    assert bad.returncode == 1 and "not an http(s) URL" in bad.stderr
    port = free_port()
    with (tmp_path / "gateway.log").open("wb") as log:
        process = subprocess.Popen(
            [*command, "--port", str(port), "--public-url", "https://gw.example.com/a2a/"],
            stdout=log, stderr=subprocess.STDOUT)
    try:
        card = None
        for _ in range(300):
            with contextlib.suppress(httpx.HTTPError):
                card = httpx.get(f"http://127.0.0.1:{port}/agents/flights/"
                                 ".well-known/agent-card.json").json()
                break
            assert process.poll() is None, (tmp_path / "gateway.log").read_text()
            time.sleep(0.1)
        assert card is not None
        assert card["supportedInterfaces"][0]["url"] == \
            "https://gw.example.com/a2a/agents/flights/"
    finally:
        process.terminate()
        process.wait(timeout=30)
