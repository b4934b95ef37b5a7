"""Real ``meshpoint serve`` processes for acceptance tests and benchmarks.

A :class:`Cluster` writes a mesh config (a coordinator fanning out to three peer
agents), starts serve processes, kills them with SIGKILL, restarts them, and stops
them with SIGTERM, checking each drains and exits 0.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from meshpoint.serve import READY

PEERS = ("flights", "hotels", "weather")


def mesh_config(namespace: str, store: dict[str, Any], broker_url: str, *,
                peer_delay_s: float = 0.02, peer_timeout_s: float = 60.0,
                **runtime: Any) -> dict[str, Any]:
    """A coordinator whose every request fans out to flights, hotels and weather."""
    timings = {"lease_ttl_s": 3.0, "recovery_interval_s": 0.5, "sweep_interval_s": 0.5,
               "request_ack_wait_s": 5.0, "response_ack_wait_s": 5.0, "max_deliver": 5,
               "drain_timeout_s": 10.0, **runtime}
    return {
        "namespace": namespace, "store": store, "broker": {"url": broker_url},
        "runtime": timings,
        "agents": {
            "coordinator": {"model": {"kind": "scripted", "persona": "coordinator"},
                            "peers": [{"agent": p, "timeout_s": peer_timeout_s}
                                      for p in PEERS]},
            **{p: {"model": {"kind": "scripted", "persona": p, "delay_s": peer_delay_s}}
               for p in PEERS},
        },
    }


@dataclass
class Proc:
    agent: str
    popen: subprocess.Popen[bytes]
    log: Path
    log_file: Any
    instance_id: str = ""

    def close(self) -> None:
        """Release the pipe and the log file (the process has exited)."""
        if self.popen.stdout is not None:
            self.popen.stdout.close()
        self.log_file.close()


@dataclass
class Cluster:
    config_path: Path
    workdir: Path
    env: dict[str, str] = field(default_factory=lambda: dict(os.environ))
    procs: list[Proc] = field(default_factory=list)
    #: Killed processes (their logs stay readable).
    dead: list[Proc] = field(default_factory=list)
    kills: int = 0
    spawned: int = 0

    @classmethod
    def write(cls, workdir: Path, config: dict[str, Any]) -> Cluster:
        workdir.mkdir(parents=True, exist_ok=True)
        path = workdir / "mesh.yaml"
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        return cls(path, workdir)

    def command(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "meshpoint.cli", *args]

    def migrate(self) -> None:
        subprocess.run(self.command("migrate", "--config", str(self.config_path)),
                       check=True, env=self.env, capture_output=True, timeout=120)

    def spawn(self, agent: str, *args: str) -> Proc:
        """Start a serve process of ``agent``, with ``args`` added to its command line."""
        self.spawned += 1
        log = self.workdir / f"{agent}-{self.spawned}.log"
        stats = self.workdir / f"{agent}-{self.spawned}.stats.json"
        log_file = log.open("wb")
        popen = subprocess.Popen(
            self.command("serve", "--config", str(self.config_path), "--agent", agent,
                         "--log-level", "warning", "--stats-json", str(stats), *args),
            stdout=subprocess.PIPE, stderr=log_file, env=self.env)
        proc = Proc(agent, popen, log, log_file)
        self.procs.append(proc)
        return proc

    def wait_ready(self, procs: list[Proc], timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        for proc in procs:
            assert proc.popen.stdout is not None
            line = b""
            while not line.startswith(READY.encode()):
                if time.monotonic() > deadline or proc.popen.poll() is not None:
                    raise AssertionError(f"{proc.agent} did not start:\n{self.tail(proc)}")
                line = proc.popen.stdout.readline()
            proc.instance_id = line.decode().split()[-1]

    def start(self, counts: dict[str, int]) -> None:
        started = [self.spawn(agent) for agent, n in counts.items() for _ in range(n)]
        self.wait_ready(started)

    def alive(self) -> list[Proc]:
        return [p for p in self.procs if p.popen.poll() is None]

    def kill_and_restart(self, proc: Proc) -> Proc:
        """SIGKILL ``proc`` (as a crash or a lost host would) and start a replacement."""
        proc.popen.send_signal(signal.SIGKILL)
        proc.popen.wait(30)
        proc.close()
        self.kills += 1
        self.procs.remove(proc)
        self.dead.append(proc)
        return self.spawn(proc.agent)

    def stop(self, timeout_s: float = 60.0) -> dict[str, int | None]:
        """SIGTERM every process, once each is ready (a process killed before it set
        up its signal handlers would not drain); returns each one's exit code (None:
        it did not exit)."""
        with contextlib.suppress(AssertionError):
            self.wait_ready([p for p in self.alive() if not p.instance_id])
        for proc in self.alive():
            proc.popen.send_signal(signal.SIGTERM)
        codes: dict[str, int | None] = {}
        deadline = time.monotonic() + timeout_s
        for proc in self.procs:
            try:
                codes[proc.log.name] = proc.popen.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.popen.kill()
                proc.popen.wait(30)
                codes[proc.log.name] = None
            proc.close()
        return codes

    def stats(self, agent: str) -> list[dict[str, Any]]:
        """The stats each gracefully stopped process of ``agent`` wrote at exit."""
        return [json.loads(path.read_text())
                for path in sorted(self.workdir.glob(f"{agent}-*.stats.json"))]

    def tail(self, proc: Proc, lines: int = 30) -> str:
        text = proc.log.read_text(errors="replace") if proc.log.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def logs(self, lines: int = 15) -> str:
        return "\n".join(f"--- {p.log.name}\n{self.tail(p, lines)}" for p in self.procs)
