"""A2A messages: wire round trips, and bad input reported as BadMessageError only."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from meshpoint import a2a
from meshpoint.errors import BadMessageError
from meshpoint.runtime import wire


def send_request() -> a2a.SendMessageRequest:
    return a2a.SendMessageRequest(id="req-1", params=a2a.MessageSendParams(
        message=a2a.Message(role="user", message_id="m-1", context_id="ctx-1",
                            parts=[a2a.TextPart(text="Compare A and B"),
                                   a2a.DataPart(data={"depth": 2})])))


def test_requests_round_trip_in_camel_case() -> None:
    wire = a2a.encode(send_request())
    document = json.loads(wire)
    assert document["params"]["message"]["messageId"] == "m-1"
    assert "message_id" not in wire.decode()
    parsed = a2a.parse_request(wire)
    assert parsed == send_request()
    assert isinstance(parsed, a2a.SendMessageRequest)
    assert parsed.params.message.text == "Compare A and B"
    cancel = a2a.CancelTaskRequest(id=7, params=a2a.TaskIdParams(id="peer-task-9"))
    assert a2a.parse_request(a2a.encode(cancel)) == cancel


@pytest.mark.parametrize("result", [
    a2a.Task(id="t", context_id="c", status=a2a.TaskStatus(state=a2a.TaskState.COMPLETED),
             artifacts=[a2a.Artifact(artifact_id="a", parts=[a2a.TextPart(text="x")])]),
    a2a.TaskStatusUpdateEvent(task_id="t", context_id="c", final=False,
                              status=a2a.TaskStatus(state=a2a.TaskState.WORKING)),
    a2a.TaskArtifactUpdateEvent(task_id="t", context_id="c", last_chunk=True,
                                artifact=a2a.Artifact(artifact_id="a",
                                                      parts=[a2a.DataPart(data={"k": 1})])),
    a2a.Message(role="agent", message_id="m", parts=[a2a.TextPart(text="done")]),
])
def test_responses_round_trip_by_kind(result: a2a.Result) -> None:
    response = a2a.SuccessResponse(id="req-1", result=result)
    assert a2a.parse_response(a2a.encode(response)) == response
    error = a2a.ErrorResponse(id=None, error=a2a.JSONRPCError(code=-32001, message="nope"))
    assert a2a.parse_response(a2a.encode(error)) == error


def test_final_states() -> None:
    assert a2a.TaskState.CANCELED.is_final and not a2a.TaskState.INPUT_REQUIRED.is_final


@pytest.mark.parametrize(("data", "reason"), [
    (b"{", "not valid JSON"),
    (b"[1, 2]", "Input should be an object"),
    (b'{"jsonrpc":"2.0","id":1,"method":"tasks/delete","params":{}}', "unknown method"),
    (b'{"jsonrpc":"1.0","id":1,"method":"tasks/cancel","params":{"id":"x"}}', "jsonrpc"),
    (b'{"jsonrpc":"2.0","id":1,"method":"message/send","params":{"message":'
     b'{"role":"user","parts":[],"messageId":"m"}}}', "parts"),
    (b'{"jsonrpc":"2.0","id":1,"method":"message/send","params":{"message":'
     b'{"role":"robot","parts":[{"kind":"text","text":"x"}],"messageId":"m"}}}', "role"),
    (b'{"jsonrpc":"2.0","id":{"x":1},"method":"tasks/cancel","params":{"id":"x"}}', "id"),
])
def test_bad_requests_name_the_problem(data: bytes, reason: str) -> None:
    with pytest.raises(BadMessageError, match=reason):
        a2a.parse_request(data)


def test_oversized_and_non_bytes_messages_are_refused() -> None:
    wire = a2a.encode(send_request())
    with pytest.raises(BadMessageError, match="larger than the limit of 100"):
        a2a.parse_request(wire, max_bytes=100)
    with pytest.raises(BadMessageError, match="must be bytes"):
        a2a.parse_request(wire.decode())  # type: ignore[arg-type]
    with pytest.raises(BadMessageError, match="kind"):
        a2a.parse_response(b'{"jsonrpc":"2.0","id":"x","result":{"kind":"weird"}}')


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.binary(max_size=300),
                 st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=10),
                              lambda inner: st.lists(inner, max_size=3)
                              | st.dictionaries(st.sampled_from(
                                  ["jsonrpc", "id", "method", "params", "message", "result",
                                   "kind", "parts", "role", "messageId", "text"]), inner,
                                  max_size=5), max_leaves=15).map(
                     lambda value: json.dumps(value).encode())))
def test_any_bytes_parse_or_raise_bad_message_only(data: bytes) -> None:
    for parse in (a2a.parse_request, a2a.parse_response):
        try:
            parse(data)
        except BadMessageError:
            pass


@pytest.mark.parametrize("parse", [a2a.parse_request, a2a.parse_response,
                                   lambda data: wire.parse_control(data)])
def test_json_nested_past_any_parser_s_limit_is_a_bad_message(parse: Any) -> None:
    """Nesting far past the recursion limit is refused as a BadMessageError saying so
    (before: a control message raised RecursionError out of its handler)."""
    deep = b'{"cancel": ' + b"[" * 50_000 + b"]" * 50_000 + b"}"
    with pytest.raises(BadMessageError, match="nested too deeply"):
        parse(deep)


def test_control_messages_are_checked_at_the_boundary() -> None:
    assert wire.parse_control(wire.cancel_broadcast("task-1")) == "task-1"
    for bad, why in ((b'{"cancel": 7}', "cancel: Input should be a valid string"),
                     (b'{"cancel": ""}', "cancel: String should have at least 1"),
                     (b'{"cancel": "t", "also": 1}', "also: Extra inputs"),
                     (b"[]", "invalid control message"), (b"{", "not valid JSON")):
        with pytest.raises(BadMessageError, match=why):
            wire.parse_control(bad)
    with pytest.raises(BadMessageError, match="larger than the limit"):
        wire.parse_control(b" " * 2000, max_bytes=1000)


def test_an_operators_handoff_request_and_its_broadcast_are_checked_at_the_boundary() -> None:
    """``meshpoint/handoff`` is a request an agent's queue takes (its task id and a
    bounded reason), and a control message the instance running the task takes; a
    control message that names a method is held to the handoff's shape, any other to
    the cancel's."""
    request = a2a.parse_request(wire.handoff_request("task-1", "fresh eyes"))
    assert isinstance(request, a2a.HandoffTaskRequest)
    assert (request.params.id, request.params.reason) == ("task-1", "fresh eyes")
    for bad, why in (
            (b'{"jsonrpc":"2.0","id":1,"method":"meshpoint/handoff","params":{}}',
             "params.id: Field required"),
            (b'{"jsonrpc":"2.0","id":1,"method":"meshpoint/handoff","params":{"id":"t",'
             b'"reason":"' + b"x" * 1001 + b'"}}', "at most 1000 characters"),
            (b'{"jsonrpc":"2.0","id":1,"method":"tasks/delete","params":{}}',
             "meshpoint accepts message/send, tasks/cancel, meshpoint/handoff")):
        with pytest.raises(BadMessageError, match=why):
            a2a.parse_request(bad)
    assert wire.parse_control_message(wire.cancel_broadcast("task-1")) == \
        wire.CancelBroadcast(cancel="task-1")
    assert wire.parse_control_message(wire.handoff_broadcast("task-1", "why")) == \
        wire.HandoffBroadcast(task_id="task-1", reason="why")
    for bad, why in ((b'{"method": "meshpoint/cancel", "task_id": "t"}',
                      "handoff.method: Input should be 'meshpoint/handoff'"),
                     (b'{"method": "meshpoint/handoff"}', "handoff.task_id: Field required"),
                     (b'{"cancel": "t", "task_id": "t"}', "task_id: Extra inputs"),
                     (b"[]", "invalid control message"), (b"{", "not valid JSON")):
        with pytest.raises(BadMessageError, match=why):
            wire.parse_control_message(bad)
    with pytest.raises(BadMessageError, match="nested too deeply"):
        wire.parse_control_message(b'{"method": ' + b"[" * 50_000 + b"]" * 50_000 + b"}")
