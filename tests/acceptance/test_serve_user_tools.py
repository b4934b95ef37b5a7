"""``meshpoint serve`` imports the user's tools from next to ``mesh.yaml``: a real
process, started from another directory with no PYTHONPATH to them, serves an agent
whose tool is ``tools:shout`` in the config's directory, and runs it."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from meshpoint import a2a
from meshpoint.broker.nats import NatsBroker
from meshpoint.runtime import Client
from meshpoint.serve import READY

pytestmark = [pytest.mark.nats, pytest.mark.timeout(180)]

SRC = Path(__file__).parents[2] / "src"


async def test_serve_runs_a_tool_that_lives_next_to_its_config(
        tmp_path: Path, namespace: str, nats_url: str) -> None:
    app = tmp_path / "app"
    app.mkdir()
    (app / "tools.py").write_text(textwrap.dedent("""\
        def shout(arguments):
            \"\"\"Say it louder.\"\"\"
            return arguments["query"].upper() + "!"
        """))
    config = app / "mesh.yaml"
    config.write_text(textwrap.dedent(f"""\
        namespace: {namespace}
        store: sqlite:///{app / 'mesh.db'}
        broker: {nats_url}
        agents:
          helper:
            model: {{kind: scripted, persona: helper}}
            tools: [{{name: shout, function: 'tools:shout'}}]
        """))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    # Only meshpoint's own source: nothing points at the app's directory.
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    cli = [sys.executable, "-m", "meshpoint.cli"]
    migrated = subprocess.run([*cli, "migrate", "--config", str(config)], cwd=elsewhere,
                              env=env, capture_output=True, text=True, timeout=60)
    assert migrated.returncode == 0, migrated.stderr
    serve = subprocess.Popen([*cli, "serve", "--config", str(config), "--agent", "helper"],
                             cwd=elsewhere, env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE)
    broker = await NatsBroker.connect(nats_url)
    try:
        assert serve.stdout is not None
        first = await asyncio.to_thread(serve.stdout.readline)
        assert first.startswith(READY.encode()), (first, serve.stderr and serve.stderr.read())
        async with Client(broker, namespace=namespace) as client:
            request_id = await client.submit("helper", "hello there")
            answer = await client.wait(request_id, timeout_s=30)
    finally:
        await broker.close()
        serve.send_signal(signal.SIGTERM)
        code = await asyncio.to_thread(serve.wait, 30)
        for pipe in (serve.stdout, serve.stderr):
            if pipe is not None:
                pipe.close()
    assert answer.status.state is a2a.TaskState.COMPLETED
    assert "HELLO THERE!" in answer.status.message.text  # type: ignore[union-attr]
    assert code == 0
