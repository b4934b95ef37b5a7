"""The OpenAI-compatible adapter against a local HTTP server that speaks chat
completions with tool calls (no network, no API key)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from meshpoint import a2a
from meshpoint.errors import ModelError
from meshpoint.llm import ToolSpec
from meshpoint.llm.openai import OpenAIModel
from meshpoint.llm.scripted import ScriptedModel
from meshpoint.runtime import Agent, Peer
from tests.integration.mesh import Mesh


class ChatServer:
    """Answers POST /v1/chat/completions. With tools and no tool results yet it
    calls every tool at once; with results it answers from them. ``mode`` can make
    it misbehave."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.mode = "ok"
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                server.requests.append(body)
                if server.mode == "error":
                    self.send_response(500)
                    self.send_header("Content-Type", "application/json")
                    self.end_headers()
                    self.wfile.write(b'{"error": {"message": "boom", "type": "server_error"}}')
                    return
                payload = json.dumps(server.reply(body)).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_port}/v1"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def reply(self, body: dict[str, Any]) -> dict[str, Any]:
        messages = body["messages"]
        results = [m for m in messages if m["role"] == "tool"]
        message: dict[str, Any]
        if body.get("tools") and not results:
            arguments = "not json" if self.mode == "bad-arguments" else json.dumps(
                {"query": messages[-1]["content"]})
            message = {"role": "assistant", "content": None, "tool_calls": [
                {"id": f"call_{i}", "type": "function",
                 "function": {"name": tool["function"]["name"], "arguments": arguments}}
                for i, tool in enumerate(body["tools"])]}
        else:
            message = {"role": "assistant",
                       "content": "Summary: " + " / ".join(m["content"] for m in results)}
        return {"id": "cmpl-1", "object": "chat.completion", "created": 0,
                "model": body["model"] + "-0613",
                "choices": [{"index": 0, "finish_reason": "stop", "message": message}],
                "usage": {"prompt_tokens": 100, "completion_tokens": 20, "total_tokens": 120,
                          "prompt_tokens_details": {"cached_tokens": 40}}}

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def chat() -> Iterator[ChatServer]:
    server = ChatServer()
    yield server
    server.close()


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
async def test_openai_model_plans_a_fan_out_and_answers_through_the_mesh(
        mesh: Mesh, chat: ChatServer) -> None:
    model = OpenAIModel("gpt-test", base_url=chat.url, max_retries=0)
    agent = Agent("coordinator", model, peers=[Peer("flights"), Peer("hotels")],
                  system_prompt="You plan trips.")
    await mesh.run(agent, 2)
    await mesh.run(Agent("flights", ScriptedModel(persona="flights")))
    await mesh.run(Agent("hotels", ScriptedModel(persona="hotels")))
    task = await mesh.client.ask("coordinator", "Lisbon in May", 15)
    await model.close()

    assert task.status.state is a2a.TaskState.COMPLETED
    assert task.status.message is not None
    assert task.status.message.text.startswith("Summary: [flights] Lisbon in May")
    assert "[hotels] Lisbon in May" in task.status.message.text
    first, second = chat.requests
    assert first["messages"][0] == {"role": "system", "content": "You plan trips."}
    assert [t["function"]["name"] for t in first["tools"]] == ["ask_flights", "ask_hotels"]
    # The second call carries the tool calls and their results in the wire layout.
    assistant = second["messages"][2]
    assert assistant["tool_calls"][0]["function"] == {
        "name": "ask_flights", "arguments": json.dumps({"query": "Lisbon in May"})}
    assert [m["tool_call_id"] for m in second["messages"][3:]] == ["call_0", "call_1"]
    usage = (task.metadata or {})["token_usage"]
    assert usage["by_model"]["gpt-test-0613"] == {
        "prompt_tokens": 200, "completion_tokens": 40, "cached_tokens": 80}
    assert usage["by_source"]["coordinator"]["prompt_tokens"] == 200
    assert {"flights", "hotels"} <= set(usage["by_source"])


async def test_openai_model_reports_bad_tool_arguments_and_server_errors(
        chat: ChatServer) -> None:
    model = OpenAIModel("gpt-test", base_url=chat.url, max_retries=0)
    tools = [ToolSpec("ask_x", "x", kind="peer")]
    chat.mode = "bad-arguments"
    with pytest.raises(ModelError, match="'ask_x' with arguments that are not JSON"):
        await model.complete([{"role": "user", "content": "hi"}], tools)
    chat.mode = "error"
    with pytest.raises(ModelError, match="model 'gpt-test' failed"):
        await model.complete([{"role": "user", "content": "hi"}], tools)
    chat.mode = "ok"
    response = await model.complete([{"role": "user", "content": "hi"}], [])
    assert response.text == "Summary: " and response.usage.cached_tokens == 40
    await model.close()


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
async def test_a_failing_model_fails_the_task_with_its_reason(mesh: Mesh,
                                                              chat: ChatServer) -> None:
    chat.mode = "error"
    model = OpenAIModel("gpt-test", base_url=chat.url, max_retries=0)
    await mesh.run(Agent("coordinator", model))
    task = await mesh.client.ask("coordinator", "hello", 15)
    await model.close()
    assert task.status.state is a2a.TaskState.FAILED
    assert task.status.message is not None
    assert "ModelError: model 'gpt-test' failed" in task.status.message.text
