"""``meshpoint migrate / serve / submit`` as real processes on PostgreSQL + NATS: the
example config runs as examples/README.md says, SIGTERM drains, mistakes are clear."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from meshpoint import a2a
from meshpoint.broker.nats import NatsBroker
from meshpoint.runtime import Client
from tests.cluster import Cluster, mesh_config
from tests.conftest import pg_execute_async
from tests.integration.mesh import eventually

pytestmark = [pytest.mark.nats, pytest.mark.timeout(300)]

EXAMPLE = Path(__file__).parents[2] / "examples" / "mesh.yaml"


def meshpoint(*args: str, env: dict[str, str] | None = None,
              timeout_s: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "meshpoint.cli", *args], env=env,
                          capture_output=True, text=True, timeout=timeout_s)


async def test_the_example_runs_as_its_readme_says(
        tmp_path: Path, namespace: str, postgres_url: str, nats_url: str) -> None:
    schema = f"mp_{namespace}"
    env = {**os.environ, "MESHPOINT_NAMESPACE": namespace, "MESHPOINT_STORE_URL": postgres_url,
           "MESHPOINT_STORE_SCHEMA": schema, "MESHPOINT_BROKER_URL": nats_url}
    cluster = Cluster(EXAMPLE, tmp_path, env=env)
    try:
        migrated = meshpoint("migrate", "--config", str(EXAMPLE), env=env)
        assert migrated.returncode == 0, migrated.stderr
        assert "schema is up to date" in migrated.stdout
        cluster.start({"coordinator": 1, "flights": 1, "hotels": 1, "weather": 1})
        answer = meshpoint("submit", "--config", str(EXAMPLE), "coordinator",
                           "Plan a trip to Lisbon: flights, hotels, weather", env=env)
        assert answer.returncode == 0, answer.stderr
        lines = answer.stdout.splitlines()
        assert lines[0] == "Answer to 'Plan a trip to Lisbon: flights, hotels, weather':"
        assert [line.split("(")[0] for line in lines[1:]] == [
            "- ask_flights", "- ask_hotels", "- ask_weather"]
    finally:
        codes = cluster.stop()
        await pg_execute_async(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
    assert set(codes.values()) == {0}, cluster.logs()


async def test_sigterm_lets_the_work_in_hand_finish(
        tmp_path: Path, namespace: str, nats_url: str) -> None:
    """Only one `flights` process ever runs. It is SIGTERMed while it holds four slow
    requests: it finishes them (the answers arrive, long before their ack wait could
    redeliver them anywhere) and exits 0."""
    config = mesh_config(namespace, {"url": f"sqlite:///{tmp_path / 'mesh.db'}"}, nats_url,
                         peer_delay_s=1.5, request_ack_wait_s=120.0)
    cluster = Cluster.write(tmp_path / "cluster", config)
    cluster.start({"coordinator": 1, "flights": 1})
    flights = next(p for p in cluster.procs if p.agent == "flights")
    broker = await NatsBroker.connect(nats_url)
    try:
        async with Client(broker, namespace=namespace) as client:
            ids = [await client.submit("coordinator", f"Trip {n}: flights") for n in range(4)]
            await held_by_flights(broker, namespace, 4)  # flights is thinking
            flights.popen.send_signal(signal.SIGTERM)
            answers = await asyncio.wait_for(
                asyncio.gather(*(client.wait(i) for i in ids)), 30)
            assert await asyncio.to_thread(flights.popen.wait, 30) == 0
    finally:
        await broker.close()
        codes = cluster.stop()
    assert all(a.status.state == a2a.TaskState.COMPLETED for a in answers)
    assert all("- ask_flights(flights) = [flights]" in a.status.message.parts[0].text  # type: ignore[union-attr]
               for a in answers)
    assert set(codes.values()) == {0}, cluster.logs()


async def held_by_flights(broker: NatsBroker, namespace: str, count: int) -> None:
    """Wait until the flights queue has ``count`` deliveries in hand, un-acked."""
    async def holding() -> bool:
        info = await broker.js.consumer_info(broker.stream_name(namespace),
                                             f"{namespace}-flights-requests")
        return info.num_ack_pending == count

    await eventually(holding, timeout_s=15, what=f"flights holding {count} requests")


async def test_submit_and_serve_explain_what_is_wrong(
        tmp_path: Path, namespace: str, nats_url: str) -> None:
    config = mesh_config(namespace, {"url": f"sqlite:///{tmp_path / 'mesh.db'}"}, nats_url)
    path = Cluster.write(tmp_path, config).config_path
    unknown = meshpoint("submit", "--config", str(path), "hotel", "hi")
    assert unknown.returncode == 1 and "no agent 'hotel' in the config" in unknown.stderr
    nobody = meshpoint("submit", "--config", str(path), "coordinator", "hi", "--timeout", "1")
    assert nobody.returncode == 1  # no serve ever ran in the namespace: no stream is made
    assert f"namespace '{namespace}' has no stream" in " ".join(nobody.stderr.split())
    # with --json, a script reads the error as JSON on stdout (its last line), whichever
    for args, kind, words in (
            (("hotel", "hi"), "ConfigurationError", "no agent 'hotel' in the config"),
            (("coordinator", "hi", "--timeout", "1"), "NamespaceNotServedError",
             "no `meshpoint serve` has run in it")):
        done = meshpoint("submit", "--config", str(path), *args, "--json")
        assert done.returncode == 1, done.stderr
        problem = json.loads(done.stdout.splitlines()[-1])
        assert problem["kind"] == kind and words in problem["error"], problem
    # the coordinator runs, its peers do not: the task waits on them, and is named;
    # a request to a peer no instance takes times out naming it and the namespace
    cluster = Cluster.write(tmp_path, config)
    cluster.migrate()
    cluster.start({"coordinator": 1})
    try:
        waiting = meshpoint("submit", "--config", str(path), "coordinator", "hi: flights",
                            "--timeout", "3")
        untaken = meshpoint("submit", "--config", str(path), "hotels", "hi", "--timeout", "1",
                            "--json")
    finally:
        cluster.stop()
    assert untaken.returncode == 1
    submitted, problem = map(json.loads, untaken.stdout.splitlines())
    assert problem["kind"] == "TimeoutError" and problem["task_id"] == submitted["task_id"]
    assert f"no answer from hotels (namespace {namespace}) within 1s" in problem["error"]
    assert waiting.returncode == 1
    assert "is paused, waiting on flights" in " ".join(waiting.stderr.split()), waiting.stderr
    bad = tmp_path / "bad.yaml"
    bad.write_text(path.read_text().replace("lease_ttl_s", "lease_ttl"))
    refused = meshpoint("serve", "--config", str(bad), "--agent", "coordinator")
    assert refused.returncode == 1
    assert "runtime.lease_ttl: unknown key" in refused.stderr
