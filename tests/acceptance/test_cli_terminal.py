"""What a requester writes never reaches an operator's terminal as markup or as a
control sequence: a hostile request goes through the real runtime into the store,
and the real ``meshpoint`` commands (subprocesses) show it without crashing and
without a raw ESC, BEL, C1 or bidirectional control in their output."""

from __future__ import annotations

import asyncio
import re
import sys

from meshpoint.llm import ScriptedModel
from meshpoint.runtime import Agent, LocalTool, Peer
from meshpoint.store import SqlStore
from tests.acceptance.test_cli_tasks import ok_json, where  # noqa: F401 (a fixture)
from tests.integration.mesh import ManualPeer, Mesh, eventually
from tests.integration.test_approvals import SCHEMA, SideEffects

#: Rich markup that does not parse (``[/]``) and that would (``[bold]``), an OSC
#: title change ended by BEL, a clear screen, a C1 CSI, a right-to-left override.
HOSTILE = "[/][bold]x\x1b]0;owned\x07\x1b[2J\x9b31m\u202eevil[/bold]"
#: How the operator sees it: the text, each control character as its escape.
SHOWN = "[/][bold]x\\x1b]0;owned\\x07\\x1b[2J\\x9b31m\\u202eevil[/bold]"
#: What must not be in anything a command prints (rich prints no styles to a pipe).
RAW = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


async def meshpoint(where: list[str], *args: str) -> tuple[int, str, str]:  # noqa: F811
    """``meshpoint ARGS`` on the store ``where`` names, as a subprocess."""
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "meshpoint.cli", *args, *where,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(process.communicate(), 120)
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


def assert_clean(out: str, err: str, what: object) -> None:
    """No crash, and no raw control character in stdout or stderr."""
    assert "Traceback" not in err and "MarkupError" not in err, (what, err)
    for stream in (out, err):
        found = RAW.search(stream)
        assert found is None, (what, stream[max(0, found.start() - 40):found.end() + 40])


async def test_hostile_text_reaches_no_terminal_as_markup_or_control_codes(
        mesh: Mesh, live_store: SqlStore, where: list[str]) -> None:  # noqa: F811
    peer = await ManualPeer(mesh, "researcher").start()
    tool = LocalTool("send", "Send it (needs approval).", SideEffects(), parameters=SCHEMA,
                     needs_approval=True)
    await mesh.run(Agent("coordinator", ScriptedModel(), tools=[tool],
                         peers=[Peer("researcher", timeout_s=60)], events=True))
    # The model calls the peer with the topic after the colon, and the tool with the
    # words before it: the hostile text is in the conversation, a peer's query, a
    # tool's arguments and the event log.
    request_id = await mesh.client.submit("coordinator", f"{HOSTILE}: {HOSTILE}")
    pending = await mesh.client.wait_input(request_id, timeout_s=10)
    task_id = mesh.client.task_id("coordinator", request_id)
    await eventually(lambda: len(peer.requests) == 1, what="the peer's request")
    # An answer names who gave it, as the answering client says; the task still
    # waits on its peer, and shows the answer.
    decision = await mesh.client.approve(task_id, pending[0]["call_id"], by=HOSTILE)
    assert decision["claimed_by"] == HOSTILE  # no approvers: a claim
    assert (await ok_json(where, "show", task_id))["answered"][0]["claimed_by"] == HOSTILE

    for args in (("tasks", "list"), ("tasks", "show", task_id),
                 ("tasks", "show", task_id, "--json"), ("tasks", "reconstruct", task_id),
                 ("tasks", "cost", task_id), ("stats",), ("recover", "--dry-run"),
                 ("events",), ("events", "--task", task_id), ("events", "--json"),
                 ("verify", "--task", task_id)):
        code, out, err = await meshpoint(where, *args)
        assert code == 0, (args, err)
        assert_clean(out, err, args)

    # The operator still reads what was written.
    _, out, _ = await meshpoint(where, "tasks", "show", task_id)
    assert SHOWN in "".join(out.split()), out
    _, out, _ = await meshpoint(where, "tasks", "reconstruct", task_id)
    assert SHOWN in out, out

    # An id is quoted back in an error, which is printed too.
    code, out, err = await meshpoint(where, "tasks", "show", HOSTILE)
    assert code == 1 and "no paused task" in err, err
    assert_clean(out, err, "an unknown id")
