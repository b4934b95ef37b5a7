"""``message/send`` through ``meshpoint gateway`` beside a2a-sdk's own example server.

    python benchmarks/bench_gateway.py --mode quick     # part of `make bench`
    python benchmarks/bench_gateway.py --mode full

Each side is a server process of its own, on uvicorn, serving one trivial agent that
answers a request at once and completes its task:

* ``gateway (SQLite)``: ``meshpoint gateway`` (the command, as users run it) on a mesh
  of one agent whose scripted model has no tools (it answers the request itself), on
  SQLite and the in-process broker: the gateway serves the agent in its own process.
* ``gateway (PostgreSQL + NATS)``: the same agent served by a ``meshpoint serve``
  process, the gateway one more client of the mesh; skipped, with a message, when
  PostgreSQL or NATS is down.
* ``a2a-sdk``: the same agent written as a2a-sdk's helloworld sample writes its own
  (an ``AgentExecutor`` that sets the task working, adds the answer as an artifact and
  completes it), served as the sample serves it: ``DefaultRequestHandler`` over an
  ``InMemoryTaskStore``, the SDK's card and JSON-RPC routes on Starlette
  (``_a2a_sdk_server.py``, a process that imports nothing of meshpoint).

One client, the same for every side (``httpx``, async, one connection pool a side),
sends A2A 1.0 ``SendMessage`` (``message/send``) JSON-RPC requests and checks that
each returns the task completed: ``sequential`` requests one after the other (the
latency, p50 and p99), then ``concurrent`` requests with ``concurrency`` in flight
(requests per second). The sides take turns, in rotating order, for ``rounds``
rounds in one run: the machine is shared and its speed drifts, so the ratios to the
SDK's figures are what to compare. A table goes to the terminal, the figures to
``benchmarks/results/<date>-<mode>-gateway.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import yaml
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # for tests.cluster

from tests.cluster import Cluster

from _a2a_sdk_server import READY as SDK_READY
from _results import write_results
from bench_scaleout import NATS_URL, POSTGRES_URL, psql, services_missing
from meshpoint.runtime.stats import percentile

ROOT = Path(__file__).resolve().parents[1]

MODES = {"quick": {"rounds": 3, "sequential": 50, "concurrent": 100, "concurrency": 16,
                   "warmup": 10},
         "full": {"rounds": 5, "sequential": 400, "concurrent": 1000, "concurrency": 16,
                  "warmup": 50}}
SDK = "a2a-sdk"
console = Console(width=150)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def env() -> dict[str, str]:
    """This checkout's code first, in every process started here."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(ROOT / "src"), str(ROOT), os.environ.get("PYTHONPATH", "")])}


def launch(command: list[str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as err:  # the child keeps it
        return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=err, env=env())


def wait_ready(process: subprocess.Popen[bytes], ready: str, log: Path) -> None:
    """Until ``process`` prints the line ``ready`` on its stdout."""
    assert process.stdout is not None
    deadline = time.monotonic() + 60
    line = b""
    while not line.startswith(ready.encode()):
        if process.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"{log.stem} did not start:\n{log.read_text()[-2000:]}")
        line = process.stdout.readline()


def stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(30)
    if process.stdout is not None:
        process.stdout.close()


def write_config(path: Path, store: Any, broker: Any, namespace: str = "bench") -> Path:
    path.write_text(yaml.safe_dump({
        "namespace": namespace, "store": store, "broker": broker,
        "agents": {"echo": {"description": "Answers at once.",
                            "model": {"kind": "scripted", "persona": "echo"}}}}))
    return path


def gateway_command(config: Path) -> list[str]:
    """``meshpoint gateway`` on ``config``, less the port's value."""
    return [sys.executable, "-m", "meshpoint.cli", "gateway", "--config", str(config),
            "--port"]


@contextlib.contextmanager
def servers(workdir: Path, with_services: bool) -> Iterator[dict[str, str]]:
    """Every side's server started (the SDK's, the embedded gateway, and with the
    services, a gateway and a serve process on PostgreSQL + NATS): each side's URL."""
    from meshpoint.integrations.a2a.app import READY

    started: list[tuple[subprocess.Popen[bytes], str, Path]] = []
    cleanups: list[Any] = []
    urls: dict[str, str] = {}

    def start(name: str, command: list[str], ready: str, path: str) -> None:
        port = free_port()
        log = workdir / f"{name}.log"
        started.append((launch([*command, str(port)], log), ready, log))
        urls[name] = f"http://127.0.0.1:{port}{path}"

    try:  # every process starts at once; then each is waited for
        start(SDK, [sys.executable, str(Path(__file__).with_name("_a2a_sdk_server.py"))],
              SDK_READY, "/")
        config = write_config(workdir / "embedded.yaml", f"sqlite:///{workdir}/bench.db",
                              "memory://")
        start("gateway (SQLite)", gateway_command(config), READY, "/agents/echo/")
        if with_services:
            namespace = f"benchgw{uuid.uuid4().hex[:8]}"
            schema = f"mp_{namespace}"
            config = write_config(workdir / "networked.yaml",
                                  {"url": POSTGRES_URL, "schema": schema}, {"url": NATS_URL},
                                  namespace)
            cluster = Cluster(config, workdir, env=env())
            cleanups.append(lambda: drop(cluster, namespace, schema))
            cluster.migrate()
            serving = cluster.spawn("echo")
            start("gateway (PostgreSQL + NATS)", gateway_command(config), READY,
                  "/agents/echo/")
            cluster.wait_ready([serving])
        for process, ready, log in started:
            wait_ready(process, ready, log)
        yield urls
    finally:
        for process, _, _ in started:
            stop(process)
        for cleanup in cleanups:
            cleanup()


def drop(cluster: Cluster, namespace: str, schema: str) -> None:
    from meshpoint.broker.nats import NatsBroker

    cluster.stop()
    psql(f"DROP SCHEMA IF EXISTS {schema} CASCADE")

    async def cleanup() -> None:
        broker = await NatsBroker.connect(NATS_URL)
        await broker.delete_namespace(namespace)
        await broker.close()

    asyncio.run(cleanup())


class Side:
    """One side's client: a JSON-RPC ``SendMessage`` that must complete its task."""

    def __init__(self, url: str, concurrency: int) -> None:
        self.url = url
        self.http = httpx.AsyncClient(timeout=60, limits=httpx.Limits(
            max_connections=concurrency, max_keepalive_connections=concurrency))
        self.sent = 0
        self.latencies: list[float] = []
        self.rates: list[float] = []

    async def send(self) -> float:
        """One request; its milliseconds."""
        self.sent += 1
        body = {"jsonrpc": "2.0", "id": self.sent, "method": "SendMessage", "params": {
            "message": {"messageId": uuid.uuid4().hex, "role": "ROLE_USER",
                        "parts": [{"text": f"hello {self.sent}"}]}}}
        began = time.perf_counter()
        response = await self.http.post(self.url, json=body, headers={"A2A-Version": "1.0"})
        took = (time.perf_counter() - began) * 1000
        state = response.json().get("result", {}).get("task", {}).get("status", {}).get("state")
        if state != "TASK_STATE_COMPLETED":
            raise RuntimeError(f"{self.url}: not completed: {response.text[:500]}")
        return took

    async def sequential(self, count: int, progress: Progress, job: Any) -> None:
        for _ in range(count):
            self.latencies.append(await self.send())
            progress.advance(job)

    async def concurrent(self, count: int, concurrency: int, progress: Progress,
                         job: Any) -> None:
        left = count

        async def worker() -> None:
            nonlocal left
            while left > 0:
                left -= 1
                await self.send()
                progress.advance(job)

        began = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        self.rates.append(count / (time.perf_counter() - began))


async def drive(urls: dict[str, str], mode: dict[str, int],
                progress: Progress) -> dict[str, Any]:
    sides = {name: Side(url, mode["concurrency"]) for name, url in urls.items()}
    try:
        for side in sides.values():  # connections opened, code paths warm
            for _ in range(mode["warmup"]):
                await side.send()
            await asyncio.gather(*(side.send() for _ in range(mode["concurrency"])))
        names = list(sides)
        for number in range(mode["rounds"]):
            turn = names[number % len(names):] + names[:number % len(names)]
            for name in turn:
                side = sides[name]
                job = progress.add_task(f"round {number + 1}: {name}", total=mode[
                    "sequential"] + mode["concurrent"])
                await side.sequential(mode["sequential"], progress, job)
                await side.concurrent(mode["concurrent"], mode["concurrency"], progress, job)
                progress.remove_task(job)
    finally:
        for side in sides.values():
            await side.http.aclose()
    out: dict[str, Any] = {}
    for name, side in sides.items():
        out[name] = {"requests_per_s": round(sum(side.rates) / len(side.rates), 1),
                     "requests_per_s_rounds": [round(r, 1) for r in side.rates],
                     "p50_ms": round(percentile(side.latencies, 50) or 0, 2),
                     "p99_ms": round(percentile(side.latencies, 99) or 0, 2)}
    sdk = out[SDK]
    for figures in out.values():
        figures["ratio_to_sdk"] = {
            "requests_per_s": round(figures["requests_per_s"] / sdk["requests_per_s"], 3),
            "p50": round(figures["p50_ms"] / sdk["p50_ms"], 2),
            "p99": round(figures["p99_ms"] / sdk["p99_ms"], 2)}
    return out


def table(results: dict[str, Any], mode: dict[str, int]) -> Table:
    out = Table(title=f"SendMessage: {mode['sequential']} sequential a round (latency), "
                      f"{mode['concurrent']} with {mode['concurrency']} in flight "
                      f"(requests/s), {mode['rounds']} rounds")
    for column in ("side", "requests/s", "p50 ms", "p99 ms", "requests/s / SDK's",
                   "p50 / SDK's", "p99 / SDK's"):
        out.add_column(column, justify="left" if column == "side" else "right")
    for name, r in results.items():
        ratio = r["ratio_to_sdk"]
        out.add_row(name, f"{r['requests_per_s']:.0f}", f"{r['p50_ms']:.1f}",
                    f"{r['p99_ms']:.1f}", f"{ratio['requests_per_s']:.2f}",
                    f"{ratio['p50']:.2f}", f"{ratio['p99']:.2f}")
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mode", choices=sorted(MODES), default="quick")
    args = parser.parse_args()
    started = time.perf_counter()
    mode = MODES[args.mode]
    missing = services_missing()
    if missing:
        console.print(f"[yellow]skipping the gateway on PostgreSQL + NATS: {missing}[/yellow]")
    with tempfile.TemporaryDirectory() as folder, servers(Path(folder), not missing) as urls, \
            Progress(console=console) as progress:
        results = asyncio.run(drive(urls, mode, progress))
    console.print(table(results, mode))
    write_results("gateway", args.mode, mode, results, started, console)
    return 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
