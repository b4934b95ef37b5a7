"""``OpenAIModel`` against a real model server: llama.cpp's ``llama-server`` with
SmolLM2-135M-Instruct (see tests/llm_server.py for where both come from).

What is proved here is what only a real server can show: that it accepts every
message layout the adapter sends (tool roles, an assistant message with tool calls
and ``content: ""``, the repair messages, a JSON-mode conversation), that a real model
under the adapter's tool modes makes usable calls, parallel ones included, that a
reply the server cut off is never taken for an answer, and that a broken reply is
handed back to the model, which then answers usably. Temperature 0 and a fixed seed
keep the model's choices steady, but the assertions hold for any reply the schema
admits, not only for the one this build happens to give.

Without a cached build these tests skip, unless ``MESHPOINT_REQUIRE_SERVICES=1`` (CI)
or ``MESHPOINT_LLM_TESTS=1``, which build it first (10-20 minutes on two cores, once
per machine).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from meshpoint import a2a
from meshpoint.errors import ModelError
from meshpoint.llm import ScriptedModel, ToolSpec
from meshpoint.llm.base import CONTINUATION_HEADER
from meshpoint.llm.openai import OpenAIModel
from meshpoint.runtime import Agent, Peer, RuntimeOptions
from meshpoint.runtime.options import HandoffPolicy
from meshpoint.store import SqlStore
from tests.conftest import service_missing
from tests.integration.mesh import Mesh
from tests.integration.test_runtime import no_rows_left
from tests.llm_server import RecordingProxy, may_build, provisioning

# The first test's setup may build the server (see the module docstring).
#: One server a session: on one worker of a parallel run.
pytestmark = [pytest.mark.timeout(2700), pytest.mark.xdist_group("llm")]

PEERS = ("flights", "hotels", "weather")
TOOLS = [ToolSpec(f"ask_{name}", f"Ask the {name} agent about the trip.", kind="peer")
         for name in PEERS]
SYSTEM = {"role": "system", "content": (
    "You are a travel coordinator. For a trip, ask the flights, hotels and weather "
    "agents about it, all at once. When their answers are back, tell the user what they "
    "found in two short sentences.")}
TRIP = {"role": "user", "content": "Plan a weekend in Lisbon in May for two people."}
#: Greedy sampling; a light repetition penalty (llama.cpp's repeat_penalty, through
#: extra_body) keeps a 135M model from repeating one word until its token limit.
SAMPLING: dict[str, Any] = {"temperature": 0.0, "seed": 7, "timeout_s": 300.0,
                            "max_retries": 0, "extra_body": {"repeat_penalty": 1.1}}
ROUND = [SYSTEM, TRIP, {"role": "assistant", "content": None, "tool_calls": [
    {"id": "call_0_0", "name": "ask_flights", "arguments": {"query": "Lisbon in May"}},
    {"id": "call_0_1", "name": "ask_hotels", "arguments": {"query": "Lisbon in May"}}]},
    {"role": "tool", "tool_call_id": "call_0_0", "name": "ask_flights",
     "content": "TP 1350, 120 euros"},
    {"role": "tool", "tool_call_id": "call_0_1", "name": "ask_hotels",
     "content": "Hotel Avenida, 90 euros a night"}]



@pytest.fixture(scope="session")
def llm_server() -> Iterator[Any]:
    """A started ``llama-server`` (session-wide: loading the model once)."""
    module = provisioning()
    if not (module.server_dir() / "llama-server").exists() and not may_build():
        pytest.skip("the real-server tests need llama-server, built once per machine "
                    "(10-20 minutes): run `make demo-llm` once, or set "
                    "MESHPOINT_LLM_TESTS=1 to build it in this run")
    try:
        provisioned = module.ensure(quiet=True)
        server = module.LlamaServer(provisioned, slots=4).start()
    except module.ProvisionError as error:
        service_missing(f"llama-server could not be had: {error}")
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
async def mesh(live_store: SqlStore) -> AsyncIterator[Mesh]:
    """A mesh whose leases and ack waits outlast a real model's turn (seconds, not the
    integration suite's milliseconds), so that no turn is taken for a dead one."""
    started = await Mesh(live_store, RuntimeOptions(
        lease_ttl_s=300, request_ack_wait_s=600, response_ack_wait_s=600,
        sweep_interval_s=0.2, recovery_interval_s=0.5)).start()
    try:
        yield started
    finally:
        await started.close()


@pytest.fixture
def proxy(llm_server: Any) -> Iterator[RecordingProxy]:
    recording = RecordingProxy(f"127.0.0.1:{llm_server.port}")
    yield recording
    recording.close()


def model(proxy: RecordingProxy, **options: Any) -> OpenAIModel:
    return OpenAIModel(provisioning().MODEL_NAME, base_url=proxy.url,
                       **{**SAMPLING, **options})


def peer_calls_are_valid(calls: Any) -> None:
    for call in calls:
        assert call.name in {t.name for t in TOOLS}
        assert isinstance(call.arguments.get("query"), str)


async def test_the_context_window_is_what_llama_server_says_a_slot_holds(
        llm_server: Any) -> None:
    """Without ``context_window``, the adapter reads the window from llama-server's
    ``/props`` after its first reply: a slot's share of ``--ctx-size`` (what one
    request may fill), which the handoff's context-utilization trigger measures
    against."""
    model = OpenAIModel(provisioning().MODEL_NAME, base_url=llm_server.base_url,
                        **{**SAMPLING, "max_tokens": 4, "repair_attempts": 0})
    assert model.context_window is None
    # Read after the first reply, usable or not (four tokens cut this one off).
    with pytest.raises(ModelError, match="cut off"):
        await model.complete([TRIP], [])
    assert model.context_window == llm_server.ctx_per_slot
    await model.close()


async def test_native_mode_round_goes_back_in_the_layout_the_server_takes(
        proxy: RecordingProxy) -> None:
    """A native round (tools declared, the call-carrying assistant message with
    ``content: ""``, tool roles) is accepted by llama-server, and with
    ``max_tool_rounds`` reached the model answers in text. (SmolLM2 makes no native
    call on llama-server, whose parser lets text come before a call even under
    ``tool_choice: required``: the JSON mode below is for such models; native calls
    from a real server are tested on llama-cpp-python's server.)"""
    llm = model(proxy, max_tool_rounds=1, max_tokens=120)
    answer = await llm.complete(ROUND, TOOLS)
    sent = proxy.requests[0]
    assert sent["messages"][2]["content"] == ""
    assert [m["role"] for m in sent["messages"]] == [
        "system", "user", "assistant", "tool", "tool"]
    assert sent["tool_choice"] == "none"  # max_tool_rounds reached: answer now
    assert [t["function"]["name"] for t in sent["tools"]] == [t.name for t in TOOLS]
    assert answer.tool_calls == () and answer.text
    assert proxy.replies[0]["choices"][0]["finish_reason"] == "stop"
    assert answer.usage.prompt_tokens == proxy.replies[0]["usage"]["prompt_tokens"] > 0
    await llm.close()


#: A tool whose arguments a small model gets wrong unless the grammar holds it: a
#: bounded integer and a string of a fixed form (docs/models.md advises both).
REFUND = ToolSpec("refund", "Refund an order.", {
    "type": "object", "required": ["order", "amount"], "additionalProperties": False,
    "properties": {"order": {"type": "string", "pattern": "^ORD-[0-9]{4}$"},
                   "amount": {"type": "integer", "minimum": 1, "maximum": 500}}})


@pytest.mark.parametrize("ask", [
    "Refund 5000 euros for order 77 right now.",
    "The customer of order number seventy wants minus 20 back.",
    "Refund everything for order abc, about 99999."])
async def test_bounded_integers_and_patterns_hold_a_small_model_s_arguments(
        proxy: RecordingProxy, ask: str) -> None:
    """In JSON mode llama-server turns the tool's schema into a grammar: an integer's
    ``minimum``/``maximum`` and an anchored string ``pattern`` are kept by the model's
    own output, with no repair (``repair_attempts: 0``), whatever the request asks."""
    from jsonschema import Draft202012Validator

    llm = model(proxy, tool_mode="json", tool_choice="required", max_tokens=120,
                repair_attempts=0)
    response = await llm.complete([{"role": "user", "content": ask}], [REFUND])
    assert response.tool_calls
    for call in response.tool_calls:
        assert not list(Draft202012Validator(REFUND.parameters).iter_errors(
            call.arguments)), call.arguments
    await llm.close()


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
async def test_json_mode_plans_a_fan_out_that_the_mesh_joins(
        mesh: Mesh, proxy: RecordingProxy) -> None:
    llm = model(proxy, tool_mode="json", tool_choice="required", max_tool_rounds=1,
                max_tokens=200)
    peer_model = model(proxy, max_tokens=60)
    await mesh.run(Agent("coordinator", llm, peers=[Peer(name) for name in PEERS],
                         system_prompt=str(SYSTEM["content"])), 2)
    for name in PEERS:
        await mesh.run(Agent(name, peer_model,
                             system_prompt=f"You are the {name} agent. Answer in one "
                                           "short sentence."))
    task = await mesh.client.ask("coordinator", str(TRIP["content"]), 600)
    assert task.status.state is a2a.TaskState.COMPLETED, task.status.message
    planning = next(r for r in proxy.requests if "response_format" in r)
    assert "tools" not in planning
    schema = planning["response_format"]["json_schema"]["schema"]
    assert list(schema["properties"]) == [t.name for t in TOOLS]  # required: no answer
    plan = json.loads(proxy.exchanges[proxy.requests.index(planning)][1]["choices"][0][
        "message"]["content"])
    calls = sum(len(plan[t.name]) for t in TOOLS)
    assert calls >= 2, f"the model planned no fan-out: {plan}"
    # Each call reached a peer, whose model answered; the coordinator's last request
    # carried every result and asked for the answer alone.
    asked = [r for r in proxy.requests if "response_format" not in r]
    assert len(asked) == calls
    last = [r for r in proxy.requests if "response_format" in r][-1]
    assert list(last["response_format"]["json_schema"]["schema"]["properties"]) == ["answer"]
    assert last["messages"][-1]["content"].count("\n- ask_") == calls
    assert task.status.message is not None
    assert task.status.message.text == json.loads(proxy.replies[-1]["choices"][0][
        "message"]["content"])["answer"]
    usage = (task.metadata or {})["token_usage"]
    assert set(usage["by_source"]) == {"coordinator", *PEERS}
    await llm.close()
    await peer_model.close()


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
async def test_the_real_prompts_size_hands_the_task_off_and_it_completes(
        mesh: Mesh, live_store: SqlStore, proxy: RecordingProxy) -> None:
    """The model plans a fan-out (its prompt, as the server counts it, about half of a
    512-token window); once the peers' answers are back the next prompt would fill
    more than 0.70 of it, so the task hands off before that call, and the next
    iteration starts from the continuation prompt alone: the calls it lists count as
    the round ``max_tool_rounds`` allows, so the model is asked for the answer (not
    to plan again), which it writes. Peers are scripted: only the coordinator's model
    is timed here."""
    # A small window (the server's slot holds 4096 tokens), as the demo's coordinator.
    llm = model(proxy, tool_mode="json", tool_choice="required", max_tool_rounds=1,
                max_tokens=200, context_window=512)
    await mesh.run(Agent("coordinator", llm, peers=[Peer(n) for n in PEERS],
                         system_prompt=str(SYSTEM["content"]),
                         handoff=HandoffPolicy(explicit=False)), 2)
    for name in PEERS:
        await mesh.run(Agent(name, ScriptedModel(name, persona=name)))
    task = await mesh.client.ask("coordinator", str(TRIP["content"]), 600)
    assert task.status.state is a2a.TaskState.COMPLETED, task.status.message
    await no_rows_left(live_store)
    records = list(reversed(await live_store.history.get_checkpoint_history(task.id)))
    assert [r.execution_state.phase for r in records] == [
        "waiting_peers", "handoff", "iteration", "completed"]
    detail = records[1].extensions["handoff"]
    assert detail["trigger"] == "context_utilization"
    # The prompt the server counted for the plan (every attempt's, if it was repaired).
    planned = [n for n, r in enumerate(proxy.requests) if list(
        r["response_format"]["json_schema"]["schema"]["properties"]) != ["answer"]]
    counted = sum(proxy.replies[n]["usage"]["prompt_tokens"] for n in planned)
    assert detail["detail"]["utilization"] == round(counted / 512, 4) < 0.70
    assert detail["detail"]["projected"] > 0.70
    # After the plan, in the fresh context, only the answer is asked for, from the
    # continuation prompt alone (no old conversation): nothing is planned again.
    answering = proxy.requests[planned[-1] + 1:]
    assert answering and all(list(r["response_format"]["json_schema"]["schema"][
        "properties"]) == ["answer"] for r in answering)
    users = [m for m in answering[0]["messages"] if m["role"] == "user"]
    assert len(users) == 1 and users[0]["content"].startswith(CONTINUATION_HEADER)
    assert task.status.message is not None
    assert task.status.message.text == json.loads(proxy.replies[-1]["choices"][0][
        "message"]["content"])["answer"]
    await llm.close()


async def test_a_reply_the_server_cut_off_is_never_the_answer(proxy: RecordingProxy) -> None:
    llm = model(proxy, max_tokens=3, repair_attempts=1)
    story = {"role": "user", "content": "Tell a long story about a lighthouse keeper."}
    with pytest.raises(ModelError, match=r"gave no usable reply in 2 attempts: the reply "
                                         r"was cut off at the token limit \(max_tokens=3\)"):
        await llm.complete([story], [])
    assert [r["choices"][0]["finish_reason"] for r in proxy.replies] == ["length", "length"]
    assert proxy.replies[0]["usage"]["completion_tokens"] == 3
    # The cut-off text went back to the model with what was wrong.
    cut = proxy.replies[0]["choices"][0]["message"]["content"]
    assert proxy.requests[1]["messages"][1:] == [
        {"role": "assistant", "content": cut},
        {"role": "user", "content": "Your reply above could not be used:\n- the reply was "
                                    "cut off at the token limit (max_tokens=3); reply again, "
                                    "shorter\nReply again, correcting this."}]
    await llm.close()


async def test_an_answer_only_json_reply_is_never_empty(llm_server: Any,
                                                       proxy: RecordingProxy) -> None:
    """Once no tool may be called, the JSON mode's schema is the answer alone, at least
    one character long: a model told to leave it empty cannot, so no attempt is spent
    on an empty reply. (In CI the demo's coordinator once closed its answer at once,
    three attempts in a row, and failed its task.) The same request without the
    length bound shows that this model does leave it empty when it may."""
    told = [{"role": "system", "content": "You never say anything: every answer is empty."}]
    for n in range(3):
        told += [{"role": "user", "content": f"Question {n}?"},
                 {"role": "assistant", "content": '{"answer": ""}'}]
    told.append({"role": "user", "content": "Question 3?"})
    llm = model(proxy, tool_mode="json", tool_choice="none", max_tokens=60)
    response = await llm.complete(told, TOOLS)
    sent = proxy.requests[0]
    schema = sent["response_format"]["json_schema"]["schema"]
    assert schema["properties"]["answer"]["minLength"] == 1
    first = json.loads(proxy.replies[0]["choices"][0]["message"]["content"])
    assert first["answer"] != ""
    assert response.tool_calls == () and response.text
    # The control: the same request, the answer's length left free.
    unbounded = json.loads(json.dumps(sent))
    del unbounded["response_format"]["json_schema"]["schema"]["properties"]["answer"][
        "minLength"]
    with urllib.request.urlopen(urllib.request.Request(
            f"{llm_server.base_url}/chat/completions", json.dumps(unbounded).encode(),
            {"Content-Type": "application/json"}), timeout=300) as got:
        control = json.loads(got.read())
    assert json.loads(control["choices"][0]["message"]["content"])["answer"] == ""
    await llm.close()


async def test_bad_arguments_in_a_json_plan_are_fed_back_and_the_model_corrects_them(
        proxy: RecordingProxy) -> None:
    """The server's first plan reaches the adapter with one call's arguments broken (the
    grammar keeps this model's own arguments valid); the adapter hands the error back,
    the real model is asked again with it, and its next plan is used."""
    def break_arguments(reply: dict[str, Any]) -> dict[str, Any]:
        proxy.mutate = None  # only the first reply
        message = reply["choices"][0]["message"]
        plan = json.loads(message["content"])
        first = next(t.name for t in TOOLS if plan.get(t.name))
        plan[first][0] = {"query": 42}
        message["content"] = json.dumps(plan)
        return reply

    proxy.mutate = break_arguments
    llm = model(proxy, tool_mode="json", tool_choice="required", max_tokens=200)
    response = await llm.complete([SYSTEM, TRIP], TOOLS)
    assert len(proxy.requests) == 2 and llm.stats.repaired == 1
    feedback = proxy.requests[1]["messages"][-2:]
    assert feedback[0]["role"] == "assistant" and '"query": 42' in feedback[0]["content"]
    assert "do not match its schema at query: 42 is not of type 'string'" in feedback[1][
        "content"]
    assert response.tool_calls
    peer_calls_are_valid(response.tool_calls)
    # Both attempts' tokens are counted.
    assert response.usage.completion_tokens == sum(
        r["usage"]["completion_tokens"] for r in proxy.replies)
    await llm.close()


def test_demo_llm_completes_its_tasks_with_real_fan_outs(llm_server: Any,
                                                         tmp_path: Path) -> None:
    """``make demo-llm``'s job, shortened: a few trips with a coordinator killed."""
    env = {**os.environ, "MESHPOINT_LLM_BASE_URL": llm_server.base_url,
           "MESHPOINT_LLM_MODEL": provisioning().MODEL_NAME}
    done = subprocess.run(
        [sys.executable, "-m", "meshpoint.demo.llm", "--tasks", "2", "--concurrency", "2",
         "--kill-every", "8", "--db", str(tmp_path / "demo.db"), "--json"],
        env=env, capture_output=True, text=True, timeout=1200, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    figures = json.loads(done.stdout)
    assert figures["problems"] == []
    assert figures["completed"] == figures["submitted"] == 2
    assert figures["fan_outs"] >= 1 and figures["resumed"] >= 2
    assert figures["kills"] >= 1 and figures["rows_left"] == 0
    assert figures["completion_tokens"] > 0 and figures["tokens_per_s"] > 0
    assert set(figures["tokens_by_source"]) == {"coordinator", *PEERS}


def test_meshpoint_llm_serve_serves_the_real_model(llm_server: Any) -> None:
    """``meshpoint llm serve`` (the documented command) starts the real server on the
    cached build, prints its URL, answers a chat completion there, and stops it on
    SIGINT: afterwards nothing listens on the port."""
    process = subprocess.Popen([sys.executable, "-m", "meshpoint.cli", "llm", "serve",
                                "--port", "0", "--slots", "1", "--json", "--no-build"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        ready = json.loads(process.stdout.readline() or "{}")
        assert ready.get("model") == provisioning().MODEL_NAME, process.stderr.read()  # type: ignore[union-attr]
        request = urllib.request.Request(
            ready["base_url"] + "/chat/completions", method="POST",
            headers={"Content-Type": "application/json"},
            data=json.dumps({"model": ready["model"], "max_tokens": 8, "temperature": 0,
                             "messages": [{"role": "user", "content": "Say hi."}]}).encode())
        with urllib.request.urlopen(request, timeout=120) as response:
            reply = json.loads(response.read())
        assert reply["choices"][0]["message"]["content"]
        process.send_signal(signal.SIGINT)
        assert process.wait(60) == 0
    finally:
        process.kill()
        process.communicate()
    with pytest.raises(OSError):
        urllib.request.urlopen(ready["base_url"] + "/models", timeout=5)


@pytest.fixture(scope="session")
def python_server(llm_server: Any) -> Iterator[Any]:
    """llama-cpp-python's ``llama_cpp.server`` with the same model, on the same build's
    libllama.so (a virtualenv of its own under ~/.cache/meshpoint, made once)."""
    module = provisioning()
    try:
        python = module.ensure_python_server(quiet=True)
        server = module.LlamaCppPythonServer(llm_server.provisioned, python).start()
    except module.ProvisionError as error:
        service_missing(f"llama-cpp-python's server could not be had: {error}")
    try:
        yield server
    finally:
        server.stop()


async def test_llama_cpp_python_server_native_calls_and_the_round_back(
        python_server: Any) -> None:
    """On llama-cpp-python's server (chatml-function-calling) SmolLM2 makes native
    calls, which the adapter reads. The round goes back with its results, the
    call-carrying message with ``content: ""``: issue 17 #4, this server refuses
    ``null`` there (shown first, the same conversation sent raw)."""
    import httpx

    raw = [{"role": m["role"], "content": m.get("content"),
            **({"tool_call_id": m["tool_call_id"]} if m["role"] == "tool" else {}),
            **({"tool_calls": [{"id": c["id"], "type": "function", "function": {
                "name": c["name"], "arguments": json.dumps(c["arguments"])}}
                for c in m["tool_calls"]]} if m.get("tool_calls") else {})}
           for m in ROUND]
    async with httpx.AsyncClient(timeout=300) as client:
        refused = await client.post(f"{python_server.base_url}/chat/completions", json={
            "model": provisioning().MODEL_NAME, "messages": raw, "max_tokens": 20})
    assert refused.status_code == 500 and "Input should be a valid string" in refused.text

    proxy = RecordingProxy(f"127.0.0.1:{python_server.port}")
    try:
        llm = model(proxy, tool_choice="auto", max_tokens=120, max_tool_rounds=1)
        planned = await llm.complete([SYSTEM, TRIP], TOOLS)
        first = proxy.replies[0]["choices"][0]["message"]
        # (the handler's first, greedy choice between a call and a message, for this
        # prompt: a call)
        assert first.get("tool_calls"), f"the model answered instead of calling: {first}"
        assert [(c.id, c.name) for c in planned.tool_calls] == [
            (c["id"], c["function"]["name"]) for c in first["tool_calls"]]
        peer_calls_are_valid(planned.tool_calls)
        assert llm.stats.repaired == 0
        conversation = [SYSTEM, TRIP, {"role": "assistant", "content": planned.text,
                                       "tool_calls": [{"id": c.id, "name": c.name,
                                                       "arguments": c.arguments}
                                                      for c in planned.tool_calls]},
                        *[{"role": "tool", "tool_call_id": c.id, "name": c.name,
                           "content": f"{c.name}: 120 euros"} for c in planned.tool_calls]]
        answer = await llm.complete(conversation, TOOLS)
        assert proxy.requests[-1]["messages"][2]["content"] == ""
        assert answer.text and answer.tool_calls == ()
        await llm.close()
    finally:
        proxy.close()


def test_the_support_example_runs_on_the_local_model(llm_server: Any, tmp_path: Path) -> None:
    """examples/support's ``client.py`` on the model its README starts: each refund the
    model asks for waits for the approval typed at the prompt and is made once; the
    task completes."""
    from tests.acceptance.test_example_support import (
        REQUEST,
        copy_of_the_example,
        environment,
        refunds,
    )

    folder = copy_of_the_example(tmp_path)
    env = environment(MESHPOINT_LLM_BASE_URL=llm_server.base_url)
    del env["SUPPORT_MODEL"]  # the file's default: the local model
    done = subprocess.run([sys.executable, "client.py", REQUEST], cwd=folder, env=env,
                          input="y\n" * 5, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith("task support-") and "completed: " in done.stdout
    asked = done.stdout.count("waits for approval")
    made = refunds(folder)
    # Each refund approved was made once (a model may ask for two; the tool refuses more
    # than the order's price).
    assert len(made) == asked and all(r["amount_cents"] <= 8900 for r in made), done.stdout
