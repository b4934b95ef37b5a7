"""Bad input on every subject (issue 3 §7): dead-lettered with a logged reason,
no instance crashes, no task changes."""

from __future__ import annotations

import json
import logging

import pytest

from meshpoint import a2a
from meshpoint.broker.base import DEAD_LETTER_REASON, DEAD_LETTER_SUBJECT
from meshpoint.llm import ScriptedModel
from meshpoint.runtime import Agent, Peer, wire
from tests.conftest import snapshot
from tests.integration.mesh import ManualPeer, Mesh, eventually


async def test_bad_messages_on_every_subject_are_dead_lettered_and_change_nothing(
        mesh: Mesh, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="meshpoint")
    ns = mesh.options.namespace
    coordinators = await mesh.run(Agent("coordinator", ScriptedModel(),
                                        peers=[Peer("flights", timeout_s=60)]), 2)
    await mesh.run(Agent("echo", ScriptedModel(persona="echo")))
    flights = await ManualPeer(mesh, "flights").start()
    rid = await mesh.client.submit("coordinator", "Go: somewhere")
    await eventually(lambda: len(flights.requests) == 1, what="the peer request")
    (sub,) = flights.requests
    before = await snapshot(mesh.store, but_alerts=True)

    request = wire.request_subject(ns, "coordinator")
    response = wire.response_subject(ns, "coordinator", sub)
    bad: list[tuple[str, bytes, dict[str, str], str]] = [
        (request, b"{not json", {}, "not valid JSON"),
        (request, json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tasks/explode",
                              "params": {}}).encode(), {}, "unknown method 'tasks/explode'"),
        (request, b" " * (mesh.options.max_message_bytes + 1), {}, "larger than the limit"),
        (request, wire.send_request("r1", "hi"), {wire.REPLY_TO: "not a subject!"},
         "header Meshpoint-Reply-To"),
        (request, json.dumps({"jsonrpc": "2.0", "id": 2, "method": "message/send",
                              "params": {"message": {"role": "user", "parts": [],
                                                     "messageId": "m"}}}).encode(), {},
         "params.message.parts"),
        (response, b"\xff\xfe garbage", {}, "not valid JSON"),
        (response, wire.final_task("someone-else", "t", "c", a2a.TaskState.COMPLETED, "forged",
                                   [], {}), {}, "does not match the sub-task"),
        (response, json.dumps({"jsonrpc": "2.0", "id": sub,
                               "result": {"kind": "bogus"}}).encode(), {}, "invalid A2A"),
        (wire.status_subject(ns, "coordinator", sub), b"[]", {}, "invalid A2A response"),
        (f"{coordinators[0].subjects.inbox('coordinator', coordinators[0].instance_id)}"
         f".response.{sub}", b"null", {}, "invalid A2A response"),
        (wire.control_subject(ns, "coordinator"), b'{"cancel": 7}', {}, "bad control message"),
    ]
    for subject, data, headers, _ in bad:
        await mesh.broker.publish(subject, data, headers)
    # Every copy of a broadcast control message is dead-lettered by its instance.
    expected = len(bad) + len(coordinators) - 1
    await eventually(lambda: len(mesh.dead_letters) == expected, what="the dead letters")

    reasons = [headers[DEAD_LETTER_REASON] for _, headers in mesh.dead_letters]
    for subject, _, _, reason in bad:
        assert any(reason in r for s, r in zip(
            [h[DEAD_LETTER_SUBJECT] for _, h in mesh.dead_letters], reasons, strict=True)
            if s == subject), f"no dead letter from {subject} saying {reason!r}: {reasons}"
    logged = [r.getMessage() for r in caplog.records if "dead-lettering" in r.getMessage()]
    assert len(logged) >= expected
    assert await snapshot(mesh.store, but_alerts=True) == before  # no task changed
    assert all(i.running and len(i._work_queues) + len(i._own_queues) == 5
               for i in coordinators)

    # The instances still work: the paused task finishes, a new task runs.
    await flights.answer(sub, "a real answer")
    task = await mesh.client.wait(rid, 10)
    assert task.status.state is a2a.TaskState.COMPLETED
    assert task.status.message is not None and "a real answer" in task.status.message.text
    echo = await mesh.client.ask("echo", "still alive?", 10)
    assert echo.status.state is a2a.TaskState.COMPLETED
