"""``meshpoint tasks``, run as a subprocess against the store of a running mesh
(issue 14 §4): an operator lists and inspects paused tasks and answers approvals
from another process; an instance of the mesh resumes the task."""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

import pytest

from meshpoint import a2a
from meshpoint.store import SqlStore
from tests.integration.mesh import Mesh
from tests.integration.test_approvals import SideEffects, approving, paused
from tests.integration.test_runtime import no_rows_left

pytestmark = pytest.mark.parametrize("backend", ["sqlite"], indirect=True)


async def tasks(url: str, *args: str) -> tuple[int, str, str]:
    """``meshpoint tasks ARGS --url URL``; the event loop keeps serving the mesh."""
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "meshpoint.cli", "tasks", *args, "--url", url,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(process.communicate(), 120)
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


async def ok_json(url: str, *args: str) -> Any:
    code, out, err = await tasks(url, *args, "--json")
    assert code == 0, err
    return json.loads(out)


async def test_an_operator_lists_shows_and_approves_from_another_process(
        mesh: Mesh, live_store: SqlStore, store_url: str) -> None:
    effects = SideEffects()
    await mesh.run(approving(effects), 2)
    request_id, task_id, pending = await paused(mesh, "Send the report")
    call_id = pending[0]["call_id"]

    listed = await ok_json(store_url, "list", "--status", "input_required")
    assert [t["task_id"] for t in listed["tasks"]] == [task_id]
    assert (await ok_json(store_url, "list", "--status", "waiting_peers"))["tasks"] == []
    shown = await ok_json(store_url, "show", task_id)
    assert shown["status"] == "input_required"
    assert [(w["kind"], w["call_id"], w["tool"]) for w in shown["waiting_on"]] == [
        ("approval", call_id, "send")]
    assert shown["conversation"][0] == {"role": "user", "content": "Send the report"}

    for args, reason in (
            (("approve", task_id, call_id, "--arguments", '{"query": 5}'),
             "do not satisfy its schema: query: 5 is not of type 'string'"),
            (("approve", task_id, call_id, "--arguments", "[1]"), "must be a JSON object"),
            (("approve", task_id, "nope"), "has no pending call 'nope'"),
            (("approve", "coordinator-" + "0" * 32, call_id), "no paused task"),
            (("deny", task_id, call_id), "Missing option '--reason'")):
        code, out, err = await tasks(store_url, *args)
        assert code != 0 and reason in " ".join((out + err).split()), (args, out, err)
    assert not effects.runs and (await ok_json(store_url, "show", task_id))["answered"] == []

    done = await ok_json(store_url, "approve", task_id, call_id, "--arguments",
                         '{"query": "Send the fixed report"}', "--by", "ops")
    assert [(d["decision"], d["by"], d["edited"]) for d in done["decisions"]] == [
        ("approved", "ops", True)]
    answer = await mesh.client.wait(request_id, timeout_s=20)  # recovery resumes it
    assert answer.status.state is a2a.TaskState.COMPLETED
    assert list(effects.runs.values()) == [1]
    await no_rows_left(live_store)
    code, _, err = await tasks(store_url, "approve", task_id, call_id)
    assert code == 1 and "no paused task" in err


async def test_deny_and_reply_from_the_command_line(
        mesh: Mesh, live_store: SqlStore, store_url: str) -> None:
    effects = SideEffects()
    await mesh.run(approving(effects))
    denied_request, denied, pending = await paused(mesh, "Send the report")
    replied_request, replied, _ = await paused(mesh, "Send the memo")
    code, out, err = await tasks(store_url, "deny", denied, pending[0]["call_id"],
                                 "--reason", "not today")
    assert code == 0 and "denied (not today)" in out, err
    code, out, err = await tasks(store_url, "reply", replied, "Ask Dana first")
    assert code == 0 and "answered in words" in out, err
    for request_id, expected in ((denied_request, "not approved: not today"),
                                 (replied_request, "Ask Dana first")):
        answer = await mesh.client.wait(request_id, timeout_s=20)
        assert expected in answer.status.message.text  # type: ignore[union-attr]
    assert not effects.runs
