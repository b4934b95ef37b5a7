"""The broker as a trust boundary: what a publisher can make an instance do.

Every test runs on the in-process broker and on NATS JetStream (a namespace of its
own on the shared server), over a SQLite file and PostgreSQL.
"""

from __future__ import annotations

import pytest

from meshpoint.broker.base import DEAD_LETTER_DELIVERIES, DEAD_LETTER_REASON, DEAD_LETTER_SUBJECT
from meshpoint.llm import ScriptedModel
from meshpoint.runtime import Agent, wire
from tests.integration.mesh import Mesh, eventually

#: Nesting far past any JSON parser's recursion limit (each level is two bytes).
DEPTH = 100_000


def nested(prefix: bytes, suffix: bytes) -> bytes:
    return prefix + b"[" * DEPTH + b"]" * DEPTH + suffix


async def test_a_deeply_nested_message_is_refused_once_and_dead_lettered(
        broker_mesh: Mesh) -> None:
    """A control message (a cancel broadcast), a request and an answer nested far past
    the recursion limit are each refused at once, with a reason that says so, and
    dead-lettered after one delivery: nothing is retried, the instance goes on."""
    mesh = broker_mesh
    ns = mesh.options.namespace
    (instance,) = await mesh.run(Agent("coordinator", ScriptedModel()))
    bad = {
        wire.control_subject(ns, "coordinator"): nested(b'{"cancel": ', b"}"),
        wire.request_subject(ns, "coordinator"): nested(
            b'{"jsonrpc": "2.0", "id": 1, "method": "tasks/cancel", "params": ', b"}"),
        wire.response_subject(ns, "coordinator", "sub1"): nested(
            b'{"jsonrpc": "2.0", "id": "sub1", "result": ', b"}"),
    }
    for subject, data in bad.items():
        await mesh.broker.publish(subject, data)
    await eventually(lambda: len(mesh.dead_letters) == len(bad), what="the dead letters")
    by_subject = {headers[DEAD_LETTER_SUBJECT]: headers for _, headers in mesh.dead_letters}
    assert set(by_subject) == set(bad)
    for subject, headers in by_subject.items():
        assert "nested too deeply" in headers[DEAD_LETTER_REASON], (subject, headers)
        assert headers[DEAD_LETTER_DELIVERIES] == "1", (subject, headers)
    assert instance.running
    answer = await mesh.client.ask("coordinator", "still there?", 20)
    assert answer.status.state.value == "completed"


@pytest.fixture(autouse=True)
def _quiet_dead_letter_warnings(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("ERROR", logger="meshpoint")
