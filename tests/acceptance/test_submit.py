"""``meshpoint submit`` as a user's first hour meets it, against ``meshpoint serve``
processes on PostgreSQL + NATS: the task id at once, each pause for a human with
the exact commands that answer it (which work as printed), ``--no-wait``, several
submits at once whose lines say which task they are, and a namespace nobody serves."""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from meshpoint.broker.nats import NatsBroker
from tests.cluster import Cluster
from tests.conftest import forget_namespace, pg_execute_async
from tests.integration.mesh import eventually

pytestmark = [pytest.mark.nats, pytest.mark.timeout(300)]


def send(arguments: dict[str, Any]) -> str:
    """Sends the message (the test's tool; a human approves each call)."""
    return f"sent {arguments['query']!r}"


SEND = {"type": "object", "properties": {"query": {"type": "string"}},
        "required": ["query"], "additionalProperties": False}


def approving_config(namespace: str, store: dict[str, Any], nats_url: str) -> dict[str, Any]:
    """An assistant whose one tool, ``send``, waits for a human's approval."""
    return {
        "namespace": namespace, "store": store, "broker": {"url": nats_url},
        "runtime": {"lease_ttl_s": 3.0, "recovery_interval_s": 0.5, "sweep_interval_s": 0.5,
                    "request_ack_wait_s": 5.0, "response_ack_wait_s": 5.0,
                    "drain_timeout_s": 10.0},
        "agents": {"assistant": {
            "model": {"kind": "scripted", "persona": "assistant"},
            "tools": [{"name": "send", "function": "tests.acceptance.test_submit:send",
                       "parameters": SEND, "needs_approval": True}]}},
    }


@pytest.fixture
async def deployment(tmp_path: Path, nats_url: str, postgres_url: str
                     ) -> AsyncIterator[Cluster]:
    """A migrated PostgreSQL schema and one ``serve`` process of the assistant."""
    namespace = f"sb{uuid.uuid4().hex[:10]}"
    schema = f"mp_{namespace}"
    cluster = Cluster.write(tmp_path / "mesh", approving_config(
        namespace, {"url": postgres_url, "schema": schema}, nats_url))
    try:
        cluster.migrate()
        cluster.start({"assistant": 1})
        yield cluster
    finally:
        codes = cluster.stop()
        await forget_namespace(nats_url, namespace)
        await pg_execute_async(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
    assert set(codes.values()) == {0}, cluster.logs()


class Submit:
    """A ``meshpoint submit`` process whose stdout and stderr are read line by line."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process

    @classmethod
    async def start(cls, config: Path, *args: str) -> Submit:
        return cls(await asyncio.create_subprocess_exec(
            sys.executable, "-m", "meshpoint.cli", "submit", "--config", str(config), *args,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE))

    async def line(self, stream: str = "stderr") -> str:
        reader = getattr(self.process, stream)
        line = await asyncio.wait_for(reader.readline(), 60)
        assert line, f"{stream} ended; the process exited {await self.process.wait()}"
        return str(line.decode().rstrip("\n"))

    async def lines_until(self, end: str) -> list[str]:
        """stderr lines up to the first one containing ``end``."""
        lines = [await self.line()]
        while end not in lines[-1]:
            lines.append(await self.line())
        return lines

    async def finish(self) -> tuple[int, str, str]:
        out, err = await asyncio.wait_for(self.process.communicate(), 120)
        assert self.process.returncode is not None
        return self.process.returncode, out.decode(), err.decode()


async def run(command: str) -> tuple[int, str]:
    """A command line as submit printed it, run by a shell as the user would paste it
    (``meshpoint`` is this interpreter's); its exit code and output, unwrapped."""
    meshpoint = f"{shlex.quote(sys.executable)} -m meshpoint.cli"
    assert command.startswith("meshpoint ")
    process = await asyncio.create_subprocess_shell(
        meshpoint + command[len("meshpoint"):], stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT)
    out, _ = await asyncio.wait_for(process.communicate(), 120)
    return process.returncode or 0, " ".join(out.decode().split())  # unwrapped


async def test_submit_tells_the_task_id_and_each_pause_with_commands_that_answer_it(
        deployment: Cluster) -> None:
    submit = await Submit.start(deployment.config_path, "assistant", "Send the report",
                                "--timeout", "120")
    first = await submit.line()
    task_id = first.split(":")[0]
    assert task_id.startswith("assistant-") and "submitted to agent assistant" in first
    told = await submit.lines_until("or answer in words")
    assert all(line.startswith(f"{task_id}: ") for line in told), told
    said = [line[len(task_id) + 2:].strip() for line in told]
    assert said[0].startswith("waits for a human to answer 1 call(s)")
    call_line = said[1]
    assert call_line.endswith('send {"query": "Send the report"}'), said
    call_id = call_line.split()[1].rstrip(":")
    config = shlex.quote(str(deployment.config_path))
    assert said[2] == (f"approve: meshpoint tasks approve {task_id} {call_id} "
                       f"--config {config}")
    assert said[3] == (f"deny:    meshpoint tasks deny {task_id} {call_id} --reason REASON "
                       f"--config {config}")
    assert said[4] == f"or answer in words: meshpoint tasks reply {task_id} TEXT --config {config}"
    # the command works as printed; submit, still waiting, prints the answer
    code, out = await run(said[2].removeprefix("approve:").strip())
    assert code == 0 and f"call {call_id} of task {task_id}: approved" in out, out
    code, out, err = await submit.finish()
    assert code == 0, err
    assert "sent 'Send the report'" in out
    assert f"{task_id}: ended completed; its answer:" in err


async def test_json_lines_say_submitted_then_each_pause_then_the_task(
        deployment: Cluster) -> None:
    submit = await Submit.start(deployment.config_path, "assistant", "Send the memo", "--json")
    submitted = json.loads(await submit.line("stdout"))
    assert submitted["event"] == "submitted" and submitted["agent"] == "assistant"
    task_id = submitted["task_id"]
    pause = json.loads(await submit.line("stdout"))
    assert pause["event"] == "input_required" and pause["task_id"] == task_id
    [call] = pause["pending"]
    assert (call["tool"], call["arguments"]) == ("send", {"query": "Send the memo"})
    code, out = await run(call["deny"].replace("REASON", "'not today'"))
    assert code == 0 and "denied (not today)" in out, out
    code, out, err = await submit.finish()
    assert code == 0, err
    task = json.loads(out.splitlines()[-1])
    assert task["id"] == task_id and task["status"]["state"] == "completed"
    assert "not approved: not today" in json.dumps(task)


async def test_no_wait_returns_the_task_id_and_several_submits_say_which_task_is_which(
        deployment: Cluster) -> None:
    submits = [await Submit.start(deployment.config_path, "assistant", f"Send memo {n}",
                                  "--no-wait") for n in range(3)]
    results = [await s.finish() for s in submits]
    assert [code for code, _, _ in results] == [0, 0, 0], results
    task_ids = [out.strip() for _, out, _ in results]
    assert len(set(task_ids)) == 3 and all(t.startswith("assistant-") for t in task_ids)
    for task_id, (_, _, err) in zip(task_ids, results, strict=True):
        assert err.startswith(f"{task_id}: submitted to agent assistant"), err
    # two submits that wait, in one terminal: each of their lines names its task
    waiting = [await Submit.start(deployment.config_path, "assistant", f"Send note {n}")
               for n in range(2)]
    told = [await w.lines_until("or answer in words") for w in waiting]
    ids = [lines[0].split(":")[0] for lines in told]
    assert ids[0] != ids[1]
    for task_id, lines in zip(ids, told, strict=True):
        assert all(line.startswith(f"{task_id}: ") for line in lines), lines
    for lines in told:
        reply = lines[-1].split("or answer in words: ")[1].replace("TEXT", "'not needed'")
        code, out = await run(reply)
        assert code == 0 and "answered in words" in out, out
    for w in waiting:
        code, out, err = await w.finish()
        assert code == 0 and "not needed" in out, err
    for task_id in task_ids:  # each --no-wait task was accepted: it waits for its human
        async def paused(task_id: str = task_id) -> bool:
            code, out = await run(f"meshpoint tasks show {task_id} --json --config "
                                  f"{shlex.quote(str(deployment.config_path))}")
            return code == 0 and json.loads(out)["status"] == "input_required"

        await eventually(paused, timeout_s=30, what=f"{task_id} waiting for approval")


async def test_submit_to_a_namespace_nobody_serves_says_so_and_creates_nothing(
        tmp_path: Path, nats_url: str) -> None:
    namespace = f"none{uuid.uuid4().hex[:10]}"
    cluster = Cluster.write(tmp_path, approving_config(
        namespace, {"url": f"sqlite:///{tmp_path / 'mesh.db'}"}, nats_url))
    env = {**os.environ}
    for args in ((), ("--no-wait",), ("--json",)):
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "meshpoint.cli", "submit", "--config",
            str(cluster.config_path), "assistant", "hi", "--timeout", "5", *args,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env)
        out, err = await asyncio.wait_for(process.communicate(), 120)
        assert process.returncode == 1
        said = " ".join((out.decode() if "--json" in args else err.decode()).split())
        assert f"namespace '{namespace}' has no stream" in said, said
        assert "no `meshpoint serve` has run in it" in said
    broker = await NatsBroker.connect(nats_url)
    try:
        streams = await broker.js.streams_info()
        assert broker.stream_name(namespace) not in {s.config.name for s in streams}
    finally:
        await broker.close()
