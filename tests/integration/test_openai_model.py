"""The OpenAI-compatible adapter against a local HTTP server that speaks chat
completions with tool calls (no network, no API key). The server here is a stand-in
whose replies each test chooses (a broken reply, a 503, a slow one); the same
behaviours against a real model server are in tests/acceptance/test_llm_server.py."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from meshpoint import a2a
from meshpoint.errors import InvalidArgumentError, ModelError
from meshpoint.llm import ToolSpec
from meshpoint.llm.base import (
    ACCOMPLISHED_SECTION,
    CONTINUATION_HEADER,
    REQUEST_SECTION,
    ModelResponse,
    ToolCall,
    Usage,
)
from meshpoint.llm.openai import OpenAIModel
from meshpoint.llm.scripted import ScriptedModel
from meshpoint.runtime import Agent, LocalTool, Peer
from tests.integration.mesh import Mesh


class ChatServer:
    """Answers POST /v1/chat/completions. With tools and no tool results yet it
    calls every tool at once; with results it answers from them. ``mode`` can make
    it misbehave."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.mode = "ok"
        #: Replies to give first, in order, before ``mode`` applies: a dict is the
        #: message of a 200 reply (``finish_reason`` in it is taken out), an int an
        #: HTTP status, a float seconds to wait before answering as ``mode`` says.
        self.script: list[dict[str, Any] | int | float] = []
        #: What ``GET <path>`` answers (a JSON body), and the paths asked; any other
        #: path is a 404, as on a server that does not say its context window.
        self.gets: dict[str, Any] = {}
        self.got: list[str] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                server.got.append(self.path)
                found = server.gets.get(self.path)
                payload = json.dumps(found if found is not None else {
                    "error": {"message": "File Not Found", "type": "not_found_error"}}).encode()
                self.send_response(200 if found is not None else 404)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                server.requests.append(body)
                step = server.script.pop(0) if server.script else None
                if isinstance(step, float):
                    time.sleep(step)
                    step = None
                if isinstance(step, int):
                    self.send_response(step)
                    self.send_header("Content-Type", "application/json")
                    self.end_headers()
                    self.wfile.write(b'{"error": {"message": "busy", "type": "server_error"}}')
                    return
                if server.mode == "error" and step is None:
                    self.send_response(500)
                    self.send_header("Content-Type", "application/json")
                    self.end_headers()
                    self.wfile.write(b'{"error": {"message": "boom", "type": "server_error"}}')
                    return
                reply = server.reply(body) if step is None else server.wrap(body, dict(step))
                payload = json.dumps(reply).encode()
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
        return self.wrap(body, message)

    def wrap(self, body: dict[str, Any], message: dict[str, Any]) -> dict[str, Any]:
        finish = message.pop("finish_reason", "tool_calls" if message.get("tool_calls")
                             else "stop")
        message.setdefault("role", "assistant")
        return {"id": "cmpl-1", "object": "chat.completion", "created": 0,
                "model": body["model"] + "-0613",
                "choices": [{"index": 0, "finish_reason": finish, "message": message}],
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
    assert assistant["content"] == ""
    assert assistant["tool_calls"][0]["function"] == {
        "name": "ask_flights", "arguments": json.dumps({"query": "Lisbon in May"})}
    assert [m["tool_call_id"] for m in second["messages"][3:]] == ["call_0", "call_1"]
    usage = (task.metadata or {})["token_usage"]
    assert usage["by_model"]["gpt-test-0613"] == {
        "prompt_tokens": 200, "completion_tokens": 40, "cached_tokens": 80}
    assert usage["by_source"]["coordinator"]["prompt_tokens"] == 200
    assert {"flights", "hotels"} <= set(usage["by_source"])


HI = [{"role": "user", "content": "hi"}]
ASK_X = [ToolSpec("ask_x", "x", kind="peer")]


async def test_the_context_window_is_read_from_the_server_once_unless_configured(
        chat: ChatServer) -> None:
    """An unconfigured ``context_window`` is asked of the server after the first reply,
    once (llama.cpp's ``/props``, else vLLM's ``/v1/models``); a server that says
    nothing leaves it None without failing a call; a configured one is never asked."""
    chat.gets["/props"] = {"default_generation_settings": {"n_ctx": 2048}, "total_slots": 2}
    model = OpenAIModel("gpt-test", base_url=chat.url, max_retries=0)
    assert model.context_window is None  # not asked before the first call
    await model.complete(HI, [])
    await model.complete(HI, [])
    assert model.context_window == 2048 and chat.got == ["/props"]
    await model.close()

    chat.gets, chat.got = {"/v1/models": {"object": "list", "data": [
        {"id": "other", "max_model_len": 99}, {"id": "gpt-test", "max_model_len": 8192}]}}, []
    vllm = OpenAIModel("gpt-test", base_url=chat.url, max_retries=0)
    await vllm.complete(HI, [])
    assert vllm.context_window == 8192 and chat.got == ["/props", "/v1/models"]
    await vllm.close()

    chat.gets, chat.got = {}, []
    silent = OpenAIModel("gpt-test", base_url=chat.url, max_retries=0)
    for _ in range(2):
        assert (await silent.complete(HI, [])).text
    assert silent.context_window is None and chat.got == ["/props", "/v1/models"]
    await silent.close()

    chat.gets, chat.got = {"/props": {"default_generation_settings": {"n_ctx": 2048}}}, []
    configured = OpenAIModel("gpt-test", base_url=chat.url, max_retries=0,
                             context_window=512)
    await configured.complete(HI, [])
    assert configured.context_window == 512 and chat.got == []
    await configured.close()
    with pytest.raises(InvalidArgumentError, match="context_window must be an int >= 1"):
        OpenAIModel("gpt-test", base_url=chat.url, context_window=0)


def bad_call(arguments: str) -> dict[str, Any]:
    return {"content": None, "tool_calls": [{"id": "c1", "type": "function", "function": {
        "name": "ask_x", "arguments": arguments}}]}


async def test_bad_tool_arguments_are_handed_back_until_the_model_corrects_them(
        chat: ChatServer) -> None:
    model = OpenAIModel("gpt-test", base_url=chat.url, max_retries=0)
    chat.script = [bad_call("not json"), bad_call('{"query": 3}')]  # then a good reply
    response = await model.complete(HI, ASK_X)
    # (the stand-in server calls each tool with the last message as the query)
    assert [c.arguments for c in response.tool_calls] == [
        {"query": chat.requests[2]["messages"][-1]["content"]}]
    # Three requests; the tokens of all three are counted, but the context window held
    # one prompt of the conversation (what the context-utilization trigger reads).
    assert len(chat.requests) == 3 and response.usage.prompt_tokens == 300
    assert response.usage.context_tokens == response.usage.context == 100
    assert model.stats.requests == 3 and model.stats.repaired == 2
    second, third = chat.requests[1]["messages"], chat.requests[2]["messages"]
    assert second[:1] == HI and second[1] == {
        "role": "assistant", "content": "(call ask_x with arguments not json)"}
    assert second[2]["role"] == "user"
    assert "the arguments of 'ask_x' are not valid JSON (Expecting value" in second[2][
        "content"]
    assert "the arguments of 'ask_x' do not match its schema at query: 3 is not of type " \
           "'string'" in third[4]["content"]
    await model.close()


async def test_an_empty_reply_is_handed_back(chat: ChatServer) -> None:
    model = OpenAIModel("gpt-test", base_url=chat.url, max_retries=0)
    chat.script = [{"content": ""}]
    assert (await model.complete(HI, [])).text == "Summary: "
    assert "the reply is empty: call a tool or answer" in chat.requests[1]["messages"][-1][
        "content"]
    await model.close()


async def test_a_model_that_never_corrects_itself_fails_with_every_problem(
        chat: ChatServer) -> None:
    model = OpenAIModel("gpt-test", base_url=chat.url, max_retries=0, repair_attempts=1)
    chat.mode = "bad-arguments"
    with pytest.raises(ModelError, match=r"model 'gpt-test' gave no usable reply in 2 "
                                         r"attempts: the arguments of 'ask_x' are not valid"):
        await model.complete(HI, ASK_X)
    assert len(chat.requests) == 2
    await model.close()


async def test_a_reply_cut_off_at_the_token_limit_is_not_an_answer(chat: ChatServer) -> None:
    model = OpenAIModel("gpt-test", base_url=chat.url, max_retries=0, max_tokens=5)
    chat.script = [{"content": "Lisbon is a city of", "finish_reason": "length"}]
    response = await model.complete(HI, [])
    assert response.text == "Summary: "  # the second, complete reply
    assert chat.requests[0]["max_tokens"] == 5
    assert chat.requests[1]["messages"][1:] == [
        {"role": "assistant", "content": "Lisbon is a city of"},
        {"role": "user", "content": "Your reply above could not be used:\n- the reply was "
                                    "cut off at the token limit (max_tokens=5); reply again, "
                                    "shorter\nReply again, correcting this."}]
    chat.script = [{"content": "a", "finish_reason": "length"}] * 3
    with pytest.raises(ModelError, match="cut off at the token limit"):
        await model.complete(HI, [])
    await model.close()


async def test_server_errors_are_retried_but_a_timed_out_generation_is_not(
        chat: ChatServer) -> None:
    model = OpenAIModel("gpt-test", base_url=chat.url, max_retries=2, timeout_s=0.5)
    chat.script = [503, 429]
    assert (await model.complete(HI, [])).text == "Summary: "
    assert len(chat.requests) == 3
    chat.requests.clear()
    chat.script = [400]
    with pytest.raises(ModelError, match="model 'gpt-test' failed: Error code: 400"):
        await model.complete(HI, [])
    assert len(chat.requests) == 1  # a bad request is not retried
    chat.requests.clear()
    chat.script = [2.0]  # answers after the client gave up
    with pytest.raises(ModelError, match="did not answer within the timeout"):
        await model.complete(HI, [])
    assert len(chat.requests) == 1
    await model.close()
    patient = OpenAIModel("gpt-test", base_url=chat.url, max_retries=1, timeout_s=0.5,
                          retry_timeouts=True)
    chat.requests.clear()
    chat.script = [2.0]
    assert (await patient.complete(HI, [])).text == "Summary: "
    assert len(chat.requests) == 2
    chat.mode = "error"
    with pytest.raises(ModelError, match="model 'gpt-test' failed"):
        await patient.complete(HI, [])
    await patient.close()


async def test_json_mode_holds_a_reply_the_token_limit_cut_off_shorter_next_time(
        chat: ChatServer) -> None:
    model = OpenAIModel("gpt-test", base_url=chat.url, max_retries=0, tool_mode="json",
                        max_tokens=300)
    chat.script = [{"content": '{"ask_x": [{"query": "\\u2019\\u2019', "finish_reason": "length"},
                   {"content": '{"ask_x": [{"query": "\\u2019', "finish_reason": "length"},
                   {"content": json.dumps({"ask_x": [{"query": "a"}], "answer": ""})}]
    response = await model.complete(HI, ASK_X)
    assert [c.arguments for c in response.tool_calls] == [{"query": "a"}]
    bounds = [r["response_format"]["json_schema"]["schema"]["properties"]["answer"]["maxLength"]
              for r in chat.requests]
    assert bounds == [150, 75, 37]  # 300 characters shared by two strings, halved each time


async def test_json_mode_asks_for_a_schema_and_reads_calls_from_it(chat: ChatServer) -> None:
    model = OpenAIModel("gpt-test", base_url=chat.url, max_retries=0, tool_mode="json",
                        max_tool_rounds=1, json_calls_per_tool=2)
    tools = [*ASK_X, ToolSpec("ask_y", "y", kind="peer")]
    chat.script = [{"content": "not json"},
                   {"content": json.dumps({"ask_x": [{"query": "a"}, {"query": "b"}],
                                           "ask_y": [{"query": "c"}], "answer": ""})}]
    system = {"role": "system", "content": "You plan."}
    response = await model.complete([system, *HI], tools)
    assert [(c.id, c.name, c.arguments["query"]) for c in response.tool_calls] == [
        ("call_0_0", "ask_x", "a"), ("call_0_1", "ask_x", "b"), ("call_0_2", "ask_y", "c")]
    assert response.text is None
    first = chat.requests[0]
    assert "tools" not in first
    schema = first["response_format"]["json_schema"]["schema"]
    assert list(schema["properties"]) == ["ask_x", "ask_y", "answer"]
    assert first["messages"][0]["content"].startswith("You plan.\n\nYou can call these tools.")
    assert "the reply is not JSON" in chat.requests[1]["messages"][-1]["content"]
    # After one round the schema has only the answer, and the results are plain text.
    history = [system, *HI, {"role": "assistant", "content": None, "tool_calls": [
        {"id": c.id, "name": c.name, "arguments": c.arguments} for c in response.tool_calls]},
        *[{"role": "tool", "tool_call_id": c.id, "name": c.name, "content": f"r{i}"}
          for i, c in enumerate(response.tool_calls)]]
    chat.script = [{"content": json.dumps({"answer": "All done."})}]
    answer = await model.complete(history, tools)
    assert (answer.text, answer.tool_calls) == ("All done.", ())
    last = chat.requests[-1]
    assert last["response_format"]["json_schema"]["schema"]["properties"] == {
        "answer": {"type": "string", "minLength": 1, "maxLength": 1024}}  # max_tokens chars
    planning = first["response_format"]["json_schema"]["schema"]["properties"]
    assert planning["ask_x"]["items"]["properties"]["query"]["maxLength"] == 1024 // 5
    assert "tools" not in last
    assert [m["role"] for m in last["messages"]] == ["system", "user", "assistant", "user"]
    assert last["messages"][3]["content"].startswith('Tool results:\n- ask_x({"query":"a"}) -> r0')
    await model.close()


async def test_native_mode_sends_the_options_and_stops_offering_tools_after_max_rounds(
        chat: ChatServer) -> None:
    model = OpenAIModel("gpt-test", base_url=chat.url, max_retries=0, tool_choice="required",
                        parallel_tool_calls=True, max_tool_rounds=1, temperature=0.0,
                        extra_body={"cache_prompt": True})
    await model.complete(HI, ASK_X)
    first = chat.requests[0]
    assert (first["tool_choice"], first["parallel_tool_calls"], first["temperature"],
            first["cache_prompt"], first["max_tokens"]) == ("required", True, 0.0, True, 1024)
    history = [*HI, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "name": "ask_x", "arguments": {"query": "hi"}}]},
        {"role": "tool", "tool_call_id": "c1", "name": "ask_x", "content": "r"}]
    await model.complete(history, ASK_X)
    second = chat.requests[1]
    assert second["tool_choice"] == "none" and "parallel_tool_calls" not in second
    assert [t["function"]["name"] for t in second["tools"]] == ["ask_x"]
    # The call-carrying message says "" when it said nothing: never null (issue 17 #4).
    assert second["messages"][1]["content"] == ""
    await model.close()


@pytest.mark.parametrize(("accomplished", "choice"), [
    ('- ask_x({"query": "hi"}) = r', "none"), ("- nothing yet", "required")])
async def test_a_continuation_prompt_listing_calls_counts_as_a_round(
        chat: ChatServer, accomplished: str, choice: str) -> None:
    """A fresh-context iteration (docs/handoff.md) starts from a continuation prompt:
    the calls it lists were a round of the same request, so with ``max_tool_rounds=1``
    the model is asked to answer, not to plan them again (and hand off again); one
    that lists none leaves the tools offered."""
    model = OpenAIModel("gpt-test", base_url=chat.url, max_retries=0, tool_choice="required",
                        max_tool_rounds=1)
    prompt = "\n".join([f"{CONTINUATION_HEADER} (iteration 2; iteration 1 handed off: "
                        "the window). The earlier conversation is not shown.", "",
                        REQUEST_SECTION, "hi", "", ACCOMPLISHED_SECTION, accomplished, "",
                        "## What remains", "- the rest of the request"])
    await model.complete([{"role": "user", "content": prompt}], ASK_X)
    assert chat.requests[0]["tool_choice"] == choice
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


PAY = [ToolSpec("pay", "Pay an amount.", {
    "type": "object", "properties": {"amount": {"type": "number", "maximum": 500}},
    "required": ["amount"]})]
PAY_ANY = [ToolSpec("pay", "Pay an amount.", {
    "type": "object", "properties": {"amount": {"type": "number"}}, "required": ["amount"]})]


def pay_call(arguments: str) -> dict[str, Any]:
    return {"content": None, "tool_calls": [{"id": "c1", "type": "function", "function": {
        "name": "pay", "arguments": arguments}}]}


@pytest.mark.parametrize("tools", [PAY, PAY_ANY], ids=["maximum", "any-number"])
async def test_a_non_finite_number_in_tool_arguments_is_handed_back(
        chat: ChatServer, tools: list[ToolSpec]) -> None:
    """``Infinity``, ``NaN`` and ``1e999`` (which Python's JSON reads as infinity) are
    not JSON numbers: a reply holding one is unusable and handed back to the model,
    named as such, whatever the schema says of the number (with a ``maximum`` it read
    as 'inf is greater than the maximum'; without one it passed, and failed the task
    later, when its context could not be stored)."""
    model = OpenAIModel("gpt-test", base_url=chat.url, max_retries=0, repair_attempts=3)
    chat.script = [pay_call('{"amount": Infinity}'), pay_call('{"amount": NaN}'),
                   pay_call('{"amount": -1e999}'), pay_call('{"amount": 120.5}')]
    response = await model.complete(HI, tools)
    assert [c.arguments for c in response.tool_calls] == [{"amount": 120.5}]
    told = [r["messages"][-1]["content"] for r in chat.requests[1:]]
    for said, token in zip(told, ("Infinity", "NaN", "-1e999"), strict=True):
        assert f"the arguments of 'pay' hold {token}, which is not a finite number" in said
    await model.close()


async def test_a_non_finite_number_in_a_json_mode_reply_is_handed_back(
        chat: ChatServer) -> None:
    model = OpenAIModel("gpt-test", base_url=chat.url, max_retries=0, tool_mode="json")
    chat.script = [{"content": '{"pay": [{"amount": Infinity}], "answer": ""}'},
                   {"content": json.dumps({"pay": [{"amount": 3}], "answer": ""})}]
    response = await model.complete(HI, PAY_ANY)
    assert [c.arguments for c in response.tool_calls] == [{"amount": 3}]
    assert "the reply holds Infinity, which is not a finite number" in \
        chat.requests[1]["messages"][-1]["content"]
    await model.close()


class InfiniteFirst:
    """A model of one's own (not OpenAIModel) that first asks to pay an infinite
    amount, then, told why that could not be used, a finite one; then answers."""

    name = "infinite-first"

    def __init__(self) -> None:
        self.shown: list[list[dict[str, Any]]] = []

    async def complete(self, messages: list[dict[str, Any]],
                       tools: list[ToolSpec]) -> ModelResponse:
        self.shown.append(messages)
        if any(m.get("role") == "tool" for m in messages):
            return ModelResponse(text="paid", usage=Usage(prompt_tokens=5))
        amount = float("inf") if len(self.shown) == 1 else 120.0
        return ModelResponse(text=None, tool_calls=(
            ToolCall(id="c1", name="pay", arguments={"amount": amount}),),
            usage=Usage(prompt_tokens=7, completion_tokens=3))


async def test_a_task_whose_model_writes_a_non_finite_argument_is_not_failed(
        mesh: Mesh, chat: ChatServer) -> None:
    """End to end, on SQLite and PostgreSQL: with OpenAIModel, and with a model of
    one's own whose reply the runtime itself hands back, the task completes and the
    tool runs once, with the corrected amount. (Before, the task ended failed:
    ContextSerializationError ... is inf.)"""
    paid: list[Any] = []
    tool = LocalTool("pay", "Pay an amount.", lambda args: paid.append(args["amount"]) or "ok",
                     parameters=PAY_ANY[0].parameters)
    chat.script = [pay_call('{"amount": Infinity}'), pay_call('{"amount": 99}')]
    openai = OpenAIModel("gpt-test", base_url=chat.url, max_retries=0)
    own = InfiniteFirst()
    for name, model in (("openai", openai), ("own", own)):
        await mesh.run(Agent(name, model, tools=[tool]))
        task = await mesh.client.ask(name, "Pay the bill", 15)
        assert task.status.state is a2a.TaskState.COMPLETED, task.status
    await openai.close()
    assert paid == [99, 120.0]
    retold = own.shown[1][-1]["content"]
    assert "the arguments of 'pay' cannot be used" in retold and "inf" in retold
    usage = (task.metadata or {})["token_usage"]["by_model"]["infinite-first"]
    assert usage["prompt_tokens"] == 7 + 7 + 5  # every attempt is counted
