"""The A2A project's conformance kit (tests/vendor/a2a_tck) against ``meshpoint
gateway``: every mandatory test of its JSON-RPC run passes; its capability and quality
categories run too, and none of them gets a 500 from the gateway.

The mesh is docs/a2a.md's ("The A2A TCK"): embedded (SQLite, the in-process broker),
a coordinator that waits on a slow peer, so that its tasks stay ``working`` while the
kit lists, cancels and writes to them. The kit runs in a venv of its own
(:mod:`tests.a2a_tck`, built once per machine and cached)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from pathlib import Path

import pytest

from meshpoint.integrations.a2a.app import READY
from tests import a2a_tck
from tests.integration.test_gateway import free_port

pytestmark = [pytest.mark.timeout(1800), pytest.mark.xdist_group("a2a_tck")]

MESH = """\
store: sqlite:///{db}
broker: memory://
agents:
  coordinator:
    description: Plans trips.
    peers: [{{agent: flights, timeout_s: 60}}]
  flights:
    description: Finds flights.
    model: {{kind: scripted, persona: flights, delay_s: 8}}
"""

#: What the gateway's log says when a call crashed it (uvicorn's HTTP 500; the SDK's
#: internal error, which the SDK's dispatcher logs before it answers -32603).
CRASHES = ("Exception in ASGI application", "Unhandled exception", "Code=-32603")


CATEGORIES = ("mandatory", "capabilities", "quality")


@contextmanager
def gateway(where: Path) -> Iterator[tuple[str, Path]]:
    """``meshpoint gateway`` on the kit's mesh (a SQLite file in ``where``): its public
    URL and its log."""
    where.mkdir()
    config = where / "tck.yaml"
    config.write_text(MESH.format(db=where / "tck.db"))
    port = free_port()
    url = f"http://localhost:{port}"  # the kit takes 127.0.0.1 in a card for a leak
    log = where / "gateway.log"
    with log.open("wb") as stderr:  # the child keeps it
        process = subprocess.Popen(
            [sys.executable, "-m", "meshpoint.cli", "gateway", "--config", str(config),
             "--port", str(port), "--root-agent", "coordinator", "--wait", "1",
             "--public-url", url], stdout=subprocess.PIPE, stderr=stderr)
    assert process.stdout is not None
    try:
        deadline = time.monotonic() + 60
        line = b""
        while not line.startswith(READY.encode()):
            assert process.poll() is None and time.monotonic() < deadline, log.read_text()
            line = process.stdout.readline()
        yield url, log
        assert process.poll() is None, f"the gateway died:\n{log.read_text()[-5000:]}"
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(30)
        process.stdout.close()


def test_every_mandatory_test_of_the_a2a_tck_passes(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    python, built = a2a_tck.kit_python()
    # The categories run at once, each against a gateway (and a mesh) of its own: the
    # kit mostly waits on the slow peer, and one category's tasks stay out of another's
    # lists.
    with ExitStack() as stack, ThreadPoolExecutor(len(CATEGORIES)) as pool:
        served = {category: stack.enter_context(gateway(tmp_path / category))
                  for category in CATEGORIES}
        results = list(pool.map(
            lambda category: a2a_tck.run_category(python, category, served[category][0]),
            CATEGORIES))
    venv = "cached" if built is None else f"built in {built:.0f} s"
    with capsys.disabled():
        print(f"\nthe A2A TCK against meshpoint gateway (the kit's venv {venv}):")
        print(a2a_tck.table(results))
        for result in results[1:]:
            for name in result.failing():
                print(f"  {result.category}: failed {name}")
    mandatory = results[0]
    assert mandatory.count("passed") > 0, mandatory.output
    assert not mandatory.failing(), (
        "mandatory tests of the A2A TCK failed:\n  " + "\n  ".join(mandatory.failing()) +
        f"\n\n{mandatory.output[-8000:]}")
    # Whatever the kit sent, no call crashed the gateway: not one HTTP 500 (uvicorn
    # logs the exception) nor an internal error (-32603, the SDK logs it).
    for category, (_, log) in served.items():
        logged = log.read_text(errors="replace")
        for crash in CRASHES:
            assert crash not in logged, (category,
                                         logged[logged.index(crash) - 2000:][:8000])
