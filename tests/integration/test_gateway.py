"""``meshpoint gateway`` embedded (SQLite, the in-process broker, the agents in the
gateway's process), served by a real uvicorn on a real port: a stock a2a-sdk client
and plain httpx (the wire format, A2A 0.3 and 1.0 method names) send, get, cancel,
stream and answer input-required; every task is read from the store, so a second
gateway on the same file answers for the first's tasks; bad input gets a JSON-RPC
error and changes nothing; a bearer token is required when configured."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from a2a.client import ClientConfig, create_client
from a2a.compat.v0_3.types import AgentCard as V03AgentCard
from a2a.types.a2a_pb2 import (
    CancelTaskRequest,
    GetTaskRequest,
    Message,
    Part,
    Role,
    SendMessageRequest,
    TaskState,
)
from google.protobuf.json_format import ParseDict
from sqlalchemy import func, select

from meshpoint.config import load_config
from meshpoint.integrations.a2a.app import (
    Credential,
    Guard,
    build_app,
    load_tokens,
    open_meshes,
)
from meshpoint.store.schema import paused_tasks
from tests.integration.mesh import eventually

CONFIG = """\
store: sqlite:///{db}
broker: memory://
agents:
  coordinator:
    description: Plans trips by asking the specialists.
    peers: [{{agent: flights, timeout_s: 30}}]
    tools: [{{name: send, function: 'os:getcwd', needs_approval: true}}]
  flights:
    description: Finds flights.
    model: {{kind: scripted, persona: flights, delay_s: 0.3}}  # a stream sees it work
"""
V1 = {"A2A-Version": "1.0"}


#: The meshes of the gateways the tests started, the latest last.
opened: list[dict[str, Any]] = []


async def forgot_everything(meshes: dict[str, Any]) -> bool:
    """Whether no gateway client keeps anything of a request (its answers recorded)."""
    return all(not (m.client.answers or m.client.input_required or m.client.updates)
               for m in meshes.values())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@contextlib.asynccontextmanager
async def gateway(path: Path, tokens: list[Credential] | None = None,
                  root_agent: str | None = None) -> AsyncIterator[str]:
    """A gateway on ``path``'s config, served by uvicorn; yields its base URL."""
    config = load_config(path)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    tenants = {c.tenant for c in tokens or [] if c.tenant is not None}
    async with open_meshes(config, tenants, wait_s=20.0) as meshes:
        opened.append(meshes)
        server = uvicorn.Server(uvicorn.Config(
            build_app(config, meshes, base_url=base, tokens=tokens, root_agent=root_agent),
            host="127.0.0.1",
            port=port, log_level="warning", lifespan="off"))
        serving = asyncio.create_task(server.serve())
        while not server.started:
            assert not serving.done()
            await asyncio.sleep(0.02)
        try:
            yield base
        finally:
            server.should_exit = True
            await serving


@pytest.fixture
def mesh_file(tmp_path: Path) -> Path:
    path = tmp_path / "mesh.yaml"
    path.write_text(CONFIG.format(db=tmp_path / "mesh.db"))
    return path


async def rpc(http: httpx.AsyncClient, url: str, method: str, params: Any,
              headers: dict[str, str] | None = None) -> dict[str, Any]:
    response = await http.post(url, json={"jsonrpc": "2.0", "id": 7, "method": method,
                                          "params": params}, headers=headers)
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    assert body["id"] == 7 and body["jsonrpc"] == "2.0"
    return body


def text_message(text: str, **extra: Any) -> dict[str, Any]:
    """A 0.3 user message (``message/send``)."""
    return {"kind": "message", "role": "user", "messageId": f"m-{text[:8]}",
            "parts": [{"kind": "text", "text": text}], **extra}


def pending_of(task: dict[str, Any]) -> list[dict[str, Any]]:
    parts = task["status"]["message"]["parts"]
    return next(p["data"]["pending_approvals"] for p in parts if "data" in p)


async def test_the_card_says_what_the_agent_is_and_can(mesh_file: Path) -> None:
    async with gateway(mesh_file) as base, httpx.AsyncClient() as http:
        card = (await http.get(f"{base}/agents/coordinator/.well-known/agent-card.json")
                ).json()
        missing = await http.get(f"{base}/agents/nobody/.well-known/agent-card.json")
    assert card["name"] == "coordinator"
    assert card["description"] == "Plans trips by asking the specialists."
    assert card["capabilities"] == {"streaming": True, "pushNotifications": False}
    url = f"{base}/agents/coordinator/"
    assert card["supportedInterfaces"] == [
        {"url": url, "protocolBinding": "JSONRPC", "protocolVersion": version}
        for version in ("1.0", "0.3")]
    # A 0.3 client reads the card too (0.3's AgentCard requires url and its version).
    legacy = V03AgentCard.model_validate(card)
    assert (legacy.url, legacy.protocol_version, legacy.preferred_transport) == \
        (url, "0.3", "JSONRPC")
    assert card["skills"][0]["tags"] == ["send", "flights"]
    assert "securitySchemes" not in card
    assert missing.status_code == 404


async def test_send_and_get_on_the_wire_with_either_protocol_version(
        mesh_file: Path) -> None:
    async with gateway(mesh_file) as base, httpx.AsyncClient(timeout=30) as http:
        url = f"{base}/agents/flights/"
        sent = (await rpc(http, url, "message/send",
                          {"message": text_message("flights to Lisbon")}))["result"]
        assert sent["kind"] == "task" and sent["status"]["state"] == "completed"
        assert sent["status"]["message"]["parts"][0]["text"].startswith(
            "[flights] flights to Lisbon")
        assert sent["artifacts"][0]["name"] == "flights answer"
        assert [m["role"] for m in sent["history"]] == ["user", "agent"]
        one = (await rpc(http, url, "tasks/get", {"id": sent["id"], "historyLength": 1})
               )["result"]
        assert [m["role"] for m in one["history"]] == ["agent"]
        # A2A 1.0: the method names of the proto service, enums by name.
        v1 = (await rpc(http, url, "SendMessage", {"message": {
            "role": "ROLE_USER", "messageId": "m1", "parts": [{"text": "flights to Oslo"}]}},
            V1))["result"]["task"]
        assert v1["status"]["state"] == "TASK_STATE_COMPLETED"
        got = (await rpc(http, url, "GetTask", {"id": v1["id"]}, V1))["result"]
        assert got["status"]["message"]["parts"][0]["text"].startswith(
            "[flights] flights to Oslo")
        await eventually(lambda: forgot_everything(opened[-1]),
                         what="the gateway's client forgetting the answered requests")
    # Another gateway on the same store (this one gone) reads the task alike.
    async with gateway(mesh_file) as base, httpx.AsyncClient(timeout=30) as http:
        again = (await rpc(http, f"{base}/agents/flights/", "tasks/get",
                           {"id": sent["id"]}))["result"]
    assert again["status"] == sent["status"] and again["artifacts"] == sent["artifacts"]


async def test_a_root_agent_is_served_at_the_hosts_root_too(mesh_file: Path) -> None:
    """``--root-agent``: a client that knows only the host finds the agent's card at
    ``/.well-known/agent-card.json``; a 1.0 method without ``A2A-Version`` is 1.0."""
    async with gateway(mesh_file, root_agent="flights") as base, \
            httpx.AsyncClient(timeout=30) as http:
        card = (await http.get(f"{base}/.well-known/agent-card.json")).json()
        assert card["name"] == "flights"
        assert card["supportedInterfaces"][0]["url"] == f"{base}/"
        sent = (await rpc(http, f"{base}/", "SendMessage", {"message": {
            "role": "ROLE_USER", "messageId": "m1", "parts": [{"text": "flights"}]}}))
        assert sent["result"]["task"]["status"]["state"] == "TASK_STATE_COMPLETED"
        other = (await http.get(f"{base}/agents/coordinator/.well-known/agent-card.json"))
        assert other.json()["name"] == "coordinator"


async def test_list_reads_the_agents_tasks_from_the_store(mesh_file: Path) -> None:
    async with gateway(mesh_file) as base, httpx.AsyncClient(timeout=30) as http:
        url = f"{base}/agents/flights/"
        sent = [(await rpc(http, url, "SendMessage", {"message": {
            "role": "ROLE_USER", "messageId": f"m{n}", "contextId": f"ctx-{n % 2}",
            "parts": [{"text": f"flights {n}"}]}}, V1))["result"]["task"] for n in range(3)]
        listed = (await rpc(http, url, "ListTasks", {}, V1))["result"]
        assert [t["id"] for t in listed["tasks"]] == [t["id"] for t in reversed(sent)]
        assert listed["totalSize"] == 3 and "artifacts" not in listed["tasks"][0]
        page = (await rpc(http, url, "ListTasks", {"contextId": "ctx-0", "pageSize": 1,
                                                   "includeArtifacts": True}, V1))["result"]
        assert [t["id"] for t in page["tasks"]] == [sent[2]["id"]] and page["totalSize"] == 2
        assert page["tasks"][0]["artifacts"]
        rest = (await rpc(http, url, "ListTasks", {"contextId": "ctx-0", "pageSize": 1,
                                                   "pageToken": page["nextPageToken"]},
                          V1))["result"]
        assert [t["id"] for t in rest["tasks"]] == [sent[0]["id"]]
        assert not rest.get("nextPageToken")
        for bad in ({"pageSize": 0}, {"pageSize": 101}, {"pageToken": "nope"},
                    {"historyLength": -1}, {"status": "NOT_A_STATE"}):
            # (An unknown status, which the SDK alone would drop, listing every task.)
            assert (await rpc(http, url, "ListTasks", bad, V1))["error"]["code"] == -32602
        completed = (await rpc(http, url, "ListTasks", {"status": "TASK_STATE_COMPLETED"},
                               V1))["result"]
        assert completed["totalSize"] == 3
        # Another agent's list has none of them.
        other = (await rpc(http, f"{base}/agents/coordinator/", "ListTasks", {}, V1))
        assert other["result"].get("tasks", []) == []


async def decided_trip(http: httpx.AsyncClient, url: str, decision: str) -> Any:
    """A trip sent to the coordinator at ``url`` (it pauses on its tool), then its
    pending call decided (``approve`` or ``deny``) by a message on the task: the task
    that call returns."""
    task = (await rpc(http, url, "message/send",
                      {"message": text_message("Trip: flights")}))["result"]
    assert task["status"]["state"] == "input-required"
    [call] = pending_of(task)
    return (await rpc(http, url, "message/send", {"message": {
        "kind": "message", "role": "user", "messageId": f"m-{decision}",
        "taskId": task["id"], "parts": [{"kind": "data", "data": {
            "decision": decision, "call_id": call["call_id"]}}]}}))["result"]


async def test_a_send_wakes_on_what_its_gateway_hears_not_at_its_next_read(
        mesh_file: Path) -> None:
    """A ``message/send`` waits for the task to end or pause by reading the store again,
    and at once when the gateway records what its inbox heard of the task: with reads
    an hour apart, each call still returns the task ended, or waiting for input, within
    the gateway's 20-second wait (without the wake-up it would return it unfinished)."""
    async with gateway(mesh_file) as base, httpx.AsyncClient(timeout=30) as http:
        for mesh in opened[-1].values():
            mesh.poll_s = 3600.0
        sent = (await rpc(http, f"{base}/agents/flights/", "message/send",
                          {"message": text_message("flights to Rome")}))["result"]
        assert sent["status"]["state"] == "completed"
        assert sent["artifacts"][0]["name"] == "flights answer"
        done = await decided_trip(http, f"{base}/agents/coordinator/", "deny")
        assert done["status"]["state"] == "completed"
        assert all(not mesh._hearing for mesh in opened[-1].values())  # none left behind


async def test_a_task_ended_by_its_history_waits_for_the_answer_its_gateway_heard(
        mesh_file: Path) -> None:
    """A task that paused has its end in its history before the gateway that sent it
    records the answer it heard (with the artifacts): a read in between waits for that
    record (once, up to a grace), so a send or a stream never ends with the task's
    state and without its artifacts. Here the record is held back 1.5 s."""
    async with gateway(mesh_file) as base, httpx.AsyncClient(timeout=30) as http:
        for mesh in opened[-1].values():
            note = mesh.log.note

            async def late(agent: str, task_id: str, kind: str, body: dict[str, Any],
                           note: Any = note, **options: Any) -> None:
                if kind == "status" and body.get("artifacts"):
                    await asyncio.sleep(1.5)
                await note(agent, task_id, kind, body, **options)
            mesh.log.note = late  # type: ignore[method-assign]
        done = await decided_trip(http, f"{base}/agents/coordinator/", "approve")
        assert done["status"]["state"] == "completed"
        assert done.get("artifacts"), done


async def test_input_required_is_answered_by_a_message_on_the_task(mesh_file: Path) -> None:
    async with gateway(mesh_file) as base, httpx.AsyncClient(timeout=30) as http:
        url = f"{base}/agents/coordinator/"
        task = (await rpc(http, url, "message/send",
                          {"message": text_message("Trip: flights")}))["result"]
        assert task["status"]["state"] == "input-required"
        [call] = pending_of(task)
        assert call["tool"] == "send"
        # A bad answer is refused and changes nothing: an unknown call, a bad decision.
        for data, says in (({"decision": "approve", "call_id": "nope"}, "no pending call"),
                           ({"decision": "maybe", "call_id": call["call_id"]}, "one of")):
            refused = await rpc(http, url, "message/send", {"message": {
                "kind": "message", "role": "user", "messageId": "m-bad",
                "taskId": task["id"], "parts": [{"kind": "data", "data": data}]}})
            assert refused["error"]["code"] == -32602 and says in refused["error"]["message"]
        still = (await rpc(http, url, "tasks/get", {"id": task["id"]}))["result"]
        assert still["status"]["state"] == "input-required"
        assert pending_of(still) == [call]
        done = (await rpc(http, url, "message/send", {"message": {
            "kind": "message", "role": "user", "messageId": "m-ok", "taskId": task["id"],
            "contextId": task["contextId"],
            "parts": [{"kind": "data", "data": {"decision": "deny",
                                                "call_id": call["call_id"],
                                                "reason": "not today"}}]}}))["result"]
        assert done["status"]["state"] == "completed"
        assert "ask_flights(flights)" in done["status"]["message"]["parts"][0]["text"]
        # The answer is in the task's history, between the request and the answer.
        assert [m["role"] for m in done["history"]] == ["user", "user", "agent"]
        ended = await rpc(http, url, "message/send", {"message": text_message(
            "more", taskId=task["id"])})
        assert ended["error"]["code"] == -32004  # UnsupportedOperation: it has ended


async def test_a_further_message_to_a_working_task_joins_its_history(tmp_path: Path) -> None:
    """A2A lets a client send more messages to a task that has not ended: a task still
    working takes one into its history (in order, its contextId inferred), and the
    call returns the task as A2A says (once it ended or waits, here); a contextId not
    the task's is refused and changes nothing. (The agent does not read it.)"""
    path = tmp_path / "mesh.yaml"
    path.write_text(CONFIG.format(db=tmp_path / "mesh.db").replace(
        "    tools: [{name: send, function: 'os:getcwd', needs_approval: true}]\n", "")
        .replace("delay_s: 0.3", "delay_s: 2"))
    async with gateway(path) as base, httpx.AsyncClient(timeout=30) as http:
        url = f"{base}/agents/coordinator/"
        client = await create_client(url, ClientConfig(httpx_client=http, streaming=False,
                                                       polling=True))
        [first] = [e async for e in client.send_message(SendMessageRequest(message=Message(
            role=Role.ROLE_USER, message_id="w1", parts=[Part(text="Trip: flights")])))]
        task = first.task
        assert task.status.state in (TaskState.TASK_STATE_SUBMITTED,
                                     TaskState.TASK_STATE_WORKING)
        wrong = await rpc(http, url, "SendMessage", {"message": {
            "role": "ROLE_USER", "messageId": "w-bad", "taskId": task.id,
            "contextId": "another-context", "parts": [{"text": "and a hotel"}]}}, V1)
        assert wrong["error"]["code"] == -32602 and "contextId" in wrong["error"]["message"]
        [further] = [e async for e in client.send_message(SendMessageRequest(message=Message(
            role=Role.ROLE_USER, message_id="w2", task_id=task.id,
            parts=[Part(text="window seat, please")])))]
        assert further.task.id == task.id and further.task.context_id == task.context_id
        ended = await client.get_task(GetTaskRequest(id=task.id))
        for _ in range(100):
            if ended.status.state == TaskState.TASK_STATE_COMPLETED:
                break
            await asyncio.sleep(0.1)
            ended = await client.get_task(GetTaskRequest(id=task.id))
        await client.close()
    assert ended.status.state == TaskState.TASK_STATE_COMPLETED
    assert [(m.role, m.message_id) for m in ended.history[:2]] == \
        [(Role.ROLE_USER, "w1"), (Role.ROLE_USER, "w2")]
    assert ended.history[1].parts[0].text == "window seat, please"
    assert ended.history[1].context_id == task.context_id
    assert [m.role for m in ended.history] == [Role.ROLE_USER] * 2 + [Role.ROLE_AGENT]
    # The refused message is nowhere.
    assert "w-bad" not in {m.message_id for m in ended.history}

def last_state(events: list[Any]) -> Any:
    last = events[-1]
    return last.status_update.status.state if last.HasField("status_update") \
        else last.task.status.state


async def test_a_stock_a2a_client_sends_streams_answers_and_cancels(mesh_file: Path) -> None:
    async with gateway(mesh_file) as base, httpx.AsyncClient(timeout=30) as http:
        client = await create_client(f"{base}/agents/coordinator/",
                                     ClientConfig(httpx_client=http, streaming=True))
        request = SendMessageRequest(message=Message(
            role=Role.ROLE_USER, message_id="s1", parts=[Part(text="Trip: flights")]))
        events = [event async for event in client.send_message(request)]
        # The task first (perhaps already waiting: the agents are quick), then each
        # change of its status; a stream ends where the task waits for input.
        assert events[0].HasField("task")
        assert last_state(events) == TaskState.TASK_STATE_INPUT_REQUIRED
        task_id = events[0].task.id
        task = await client.get_task(GetTaskRequest(id=task_id))
        call_id = task.status.message.parts[1].data.struct_value["pending_approvals"][0][
            "call_id"]
        answer = SendMessageRequest(message=Message(
            role=Role.ROLE_USER, message_id="s2", task_id=task_id,
            parts=[ParseDict({"data": {"decision": "approve", "call_id": call_id}}, Part())]))
        answered = [e async for e in client.send_message(answer)]
        assert last_state(answered) == TaskState.TASK_STATE_COMPLETED
        assert any(e.HasField("artifact_update") for e in answered) or \
            answered[-1].task.artifacts
        # A task paused for input is canceled through the mesh's cancel path.
        paused = [e async for e in client.send_message(SendMessageRequest(message=Message(
            role=Role.ROLE_USER, message_id="s3", parts=[Part(text="Trip: flights")])))]
        canceled = await client.cancel_task(CancelTaskRequest(id=paused[0].task.id))
        assert canceled.status.state == TaskState.TASK_STATE_CANCELED
        async with httpx.AsyncClient(timeout=30) as plain:  # the SDK set its version
            again = await plain.post(f"{base}/agents/coordinator/", json={
                "jsonrpc": "2.0", "id": 1, "method": "tasks/cancel",
                "params": {"id": paused[0].task.id}})
        assert again.json()["error"]["code"] == -32002, again.text  # not cancelable: ended
        await client.close()


async def test_streaming_on_the_wire_is_sse_of_json_rpc_responses(mesh_file: Path) -> None:
    async with gateway(mesh_file) as base, httpx.AsyncClient(timeout=30) as http:
        async with http.stream("POST", f"{base}/agents/flights/", json={
                "jsonrpc": "2.0", "id": 3, "method": "message/stream",
                "params": {"message": text_message("flights to Rome")}}) as response:
            assert response.headers["content-type"].startswith("text/event-stream")
            events = [json.loads(line[5:]) async for line in response.aiter_lines()
                      if line.startswith("data:")]
    assert all(e["id"] == 3 and e["jsonrpc"] == "2.0" for e in events)
    results = [e["result"] for e in events]
    assert results[0]["kind"] == "task"
    assert results[-1]["kind"] == "status-update" and results[-1]["final"] is True
    assert results[-1]["status"]["state"] == "completed"


async def counts(path: Path) -> tuple[int, int]:
    """Live task rows and event-log rows of the gateway's store."""
    from meshpoint.store import open_store
    from meshpoint.store.schema import events as events_table

    store = await open_store(load_config(path).store.url)
    try:
        def read(conn: Any) -> tuple[int, int]:
            return (conn.execute(select(func.count()).select_from(paused_tasks)).scalar_one(),
                    conn.execute(select(func.count()).select_from(events_table)).scalar_one())
        return await store.transaction(read)
    finally:
        await store.close()


def deep_send(depth: int) -> bytes:
    """A SendMessage whose data part nests ``depth`` objects."""
    data = '{"a":' * depth + "1" + "}" * depth
    return ('{"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": {"message": '
            '{"role": "ROLE_USER", "messageId": "x", "parts": [{"text": "hi"}, {"data": '
            f'{data}}}]}}}}}}').encode()


async def test_a_body_that_never_ends_is_cut_off(mesh_file: Path) -> None:
    """A client sending its body a byte at a time (or never finishing it) gets 408
    once the body's time is up; the request never reaches the agent."""
    reached: list[Any] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        reached.append(scope)

    async def trickle() -> dict[str, Any]:
        await asyncio.sleep(0.01)
        return {"type": "http.request", "body": b" ", "more_body": True}
    sent: list[dict[str, Any]] = []

    async def send(event: dict[str, Any]) -> None:
        sent.append(event)
    guard = Guard(app, tokens=[], body_timeout_s=0.2)
    await guard({"type": "http", "method": "POST", "headers": [
        (b"content-type", b"application/json")]}, trickle, send)
    assert sent[0]["status"] == 408 and not reached
    assert json.loads(sent[1]["body"])["error"]["code"] == -32600


async def test_bad_input_gets_a_json_rpc_error_and_changes_nothing(mesh_file: Path) -> None:
    async with gateway(mesh_file) as base, httpx.AsyncClient(timeout=30) as http:
        url = f"{base}/agents/coordinator/"
        task = (await rpc(http, url, "message/send",
                          {"message": text_message("Trip: flights")}))["result"]
        before = await counts(mesh_file)
        cases: list[tuple[dict[str, Any], int, int]] = [
            ({"content": b"{not json",
              "headers": {"content-type": "application/json"}}, 200, -32700),
            ({"json": {"jsonrpc": "1.0", "id": 1, "method": "message/send"}}, 200, -32600),
            ({"json": [{"jsonrpc": "2.0", "id": 1, "method": "tasks/get"}]}, 200, -32600),
            ({"json": {"jsonrpc": "2.0", "id": 1, "method": "tasks/nothing"}}, 200, -32601),
            ({"json": {"jsonrpc": "2.0", "id": 1, "method": "tasks/get",
                       "params": {"id": "coordinator-" + "0" * 32}}}, 200, -32001),
            ({"json": {"jsonrpc": "2.0", "id": 1, "method": "tasks/get",
                       "params": {"id": 5}}}, 200, -32600),  # the SDK's 0.3 adapter's code
            ({"json": {"jsonrpc": "2.0", "id": 1, "method": "GetTask", "params": {"id": {}}},
              "headers": V1}, 200, -32602),
            ({"json": {"jsonrpc": "2.0", "id": 1, "method": "CancelTask", "params": {}},
              "headers": V1}, 200, -32602),  # no id: not an unknown task
            ({"json": {"jsonrpc": "2.0", "id": 1, "method": "tasks/get", "params": {"id": ""}}},
             200, -32602),
            ({"json": {"jsonrpc": "2.0", "id": 1, "method": "message/send",
                       "params": {"message": {"kind": "message"}}}}, 200, -32600),
            ({"json": {"jsonrpc": "2.0", "id": 1, "method": "SendMessage",
                       "params": {"message": {"role": "ROLE_USER", "messageId": "x",
                                              "parts": [{"data": {"no": "text"}}]}}},
              "headers": V1}, 200, -32602),
            # A2A requires a message's messageId and role (protobuf reads them as empty).
            ({"json": {"jsonrpc": "2.0", "id": 1, "method": "SendMessage",
                       "params": {"message": {"role": "ROLE_USER",
                                              "parts": [{"text": "no id"}]}}},
              "headers": V1}, 200, -32602),
            ({"json": {"jsonrpc": "2.0", "id": 1, "method": "SendMessage",
                       "params": {"message": {"messageId": "x",
                                              "parts": [{"text": "no role"}]}}},
              "headers": V1}, 200, -32602),
            ({"json": {"jsonrpc": "2.0", "id": 1, "method": "tasks/cancel",
                       "params": {"id": "flights-" + "0" * 32}}}, 200, -32001),
            ({"content": b"x" * 1_000_001,
              "headers": {"content-type": "application/json"}}, 413, -32600),
            ({"content": b"{}", "headers": {"content-type": "text/plain"}}, 415, -32600),
            # Nested past the parser's recursion: refused before any parse (no 500),
            # with or without the A2A-Version header.
            ({"content": b"[" * 100_000 + b"]" * 100_000,
              "headers": {"content-type": "application/json"}}, 400, -32600),
            ({"content": deep_send(50_000), "headers": {"content-type": "application/json",
                                                        **V1}}, 400, -32600),
            ({"content": deep_send(33), "headers": {"content-type": "application/json"}},
             400, -32600),
        ]
        for kwargs, status, code in cases:
            response = await http.post(url, **kwargs)
            assert response.status_code == status, (kwargs, response.text)
            assert response.json()["error"]["code"] == code, (kwargs, response.text)
        # A task of another agent is unknown at this one.
        other = await rpc(http, f"{base}/agents/flights/", "tasks/get", {"id": task["id"]})
        assert other["error"]["code"] == -32001
        assert await counts(mesh_file) == before
        # Every read of the paused task gives the same status (its message's id and
        # time are those of the pause, not of the read).
        still = (await rpc(http, url, "tasks/get", {"id": task["id"]}))["result"]
        assert still["status"]["state"] == "input-required"
        assert still["status"] == task["status"]


async def test_a_bearer_token_is_required_when_the_gateway_has_tokens(
        mesh_file: Path) -> None:
    token = "s3cret-token-of-alice"
    async with gateway(mesh_file, [Credential("alice", token)]) as base, \
            httpx.AsyncClient(timeout=30) as http:
        url = f"{base}/agents/flights/"
        card = (await http.get(f"{url}.well-known/agent-card.json")).json()
        # (no word a checker of public cards takes for a leak: token, secret, key…)
        said = "issued by the gateway's operator, one per client"
        assert card["securitySchemes"] == {"bearer": {  # 1.0's form, then 0.3's
            "httpAuthSecurityScheme": {"scheme": "Bearer", "description": said},
            "type": "http", "scheme": "Bearer", "description": said}}
        assert card["securityRequirements"] == [{"schemes": {"bearer": {}}}]
        assert card["security"] == [{"bearer": []}]  # 0.3's
        body = {"jsonrpc": "2.0", "id": 1, "method": "message/send",
                "params": {"message": text_message("flights")}}
        for headers in ({}, {"authorization": "Bearer wrong-token-wrong-token"},
                        {"authorization": f"Basic {token}"},
                        {"authorization": token}):
            refused = await http.post(url, json=body, headers=headers)
            assert refused.status_code == 401 and refused.json()["error"]["code"] == -32600
            assert refused.headers["www-authenticate"].startswith("Bearer")
        before = await counts(mesh_file)
        assert before[1] == 0  # nothing was sent, nothing logged
        ok = await http.post(url, json=body, headers={"authorization": f"Bearer {token}"})
        assert ok.json()["result"]["status"]["state"] == "completed"


@pytest.mark.postgres
async def test_each_credential_reaches_its_own_tenants_tasks_only(
        tmp_path: Path, postgres_url: str, pg_schema: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """On PostgreSQL, a credential per tenant: each client's tasks are stored under its
    tenant, and another tenant's client cannot read, answer or cancel them (the task
    is unknown to it), nor a client without a token reach anything."""
    path = tmp_path / "mesh.yaml"
    path.write_text(CONFIG.format(db="x").replace(
        "store: sqlite:///x", f"store: {{url: '{postgres_url}', schema: {pg_schema}}}"))
    monkeypatch.setenv("GATEWAY_TOKENS", "alice@acme:token-of-alice-0001\n"
                                         "bob@globex:token-of-bob-00002\n")
    tokens = load_tokens("env:GATEWAY_TOKENS")
    assert [(c.name, c.tenant) for c in tokens] == [("alice", "acme"), ("bob", "globex")]
    alice = {"authorization": "Bearer token-of-alice-0001"}
    bob = {"authorization": "Bearer token-of-bob-00002"}
    async with gateway(path, tokens) as base, httpx.AsyncClient(timeout=30) as http:
        url = f"{base}/agents/coordinator/"
        task = (await rpc(http, url, "message/send",
                          {"message": text_message("Trip: flights")}, alice))["result"]
        assert task["status"]["state"] == "input-required"
        [call] = pending_of(task)
        for method, params in (
                ("tasks/get", {"id": task["id"]}),
                ("tasks/cancel", {"id": task["id"]}),
                ("message/send", {"message": {
                    "kind": "message", "role": "user", "messageId": "x",
                    "taskId": task["id"], "parts": [{"kind": "data", "data": {
                        "decision": "approve", "call_id": call["call_id"]}}]}})):
            refused = await rpc(http, url, method, params, bob)
            assert refused["error"]["code"] == -32001, (method, refused)
        mine = (await rpc(http, url, "tasks/get", {"id": task["id"]}, alice))["result"]
        assert mine["status"]["state"] == "input-required" and pending_of(mine) == [call]
        # bob's own tasks run in his tenant, beside alice's.
        his = (await rpc(http, f"{base}/agents/flights/", "message/send",
                         {"message": text_message("flights")}, bob))["result"]
        assert his["status"]["state"] == "completed"
        assert (await rpc(http, f"{base}/agents/flights/", "tasks/get", {"id": his["id"]},
                          alice))["error"]["code"] == -32001
        canceled = (await rpc(http, url, "tasks/cancel", {"id": task["id"]}, alice))["result"]
        assert canceled["status"]["state"] == "canceled"
