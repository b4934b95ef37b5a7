"""A client's waits and a client of a deployment, on a SQLite file and PostgreSQL, on
the in-process broker and NATS: ``wait_next`` ends at the answer or the next pause,
whichever comes first; ``wait_input`` ends when the task ends without one; a wait
that runs out names the task, its agent and namespace; ``open_client`` reads a
mesh config, and never creates a stream in a namespace nobody serves."""

from __future__ import annotations

import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from meshpoint import a2a
from meshpoint.config import load_config, open_client
from meshpoint.errors import (
    BrokerError,
    ConfigurationError,
    MeshpointError,
    NamespaceNotServedError,
    WaitTimeoutError,
)
from meshpoint.llm import ScriptedModel
from meshpoint.runtime import Agent, AgentInstance, Client, NextStep
from meshpoint.store import SqlStore
from tests.integration.mesh import FAST, Mesh
from tests.integration.test_approvals import SideEffects, approving


async def test_wait_next_returns_each_pause_then_the_answer(broker_mesh: Mesh) -> None:
    """A task whose tool needs approval: wait_next returns its pause (the pending
    call), then, once approved, its answer; a later wait_next returns the answer
    again at once."""
    effects = SideEffects()
    await broker_mesh.run(approving(effects))
    client = broker_mesh.client
    request_id = await client.submit("coordinator", "Send the report")
    step = await client.wait_next(request_id, timeout_s=20)
    assert isinstance(step, NextStep) and not step.ended and step.answer is None
    assert step.task_id == client.task_id("coordinator", request_id)
    assert [(p["tool"], p["arguments"]) for p in step.pending] == [
        ("send", {"query": "Send the report"})]
    await client.approve(step.task_id, step.pending[0]["call_id"])
    done = await client.wait_next(request_id, timeout_s=20)
    assert done.ended and done.pending == []
    assert done.answer is not None and done.answer.status.state is a2a.TaskState.COMPLETED
    assert "sent 'Send the report'" in done.answer.status.message.text  # type: ignore[union-attr]
    assert (await client.wait_next(request_id, timeout_s=0.1)).answer == done.answer
    assert list(effects.runs.values()) == [1]


async def test_wait_input_ends_when_the_task_ends_without_needing_input(
        broker_mesh: Mesh) -> None:
    """No call of this task needs approval: wait_input returns [] once it is
    answered (it used to wait forever), and wait returns the answer at once."""
    effects = SideEffects()
    await broker_mesh.run(approving(effects, needs=False))
    client = broker_mesh.client
    request_id = await client.submit("coordinator", "Send the report")
    assert await client.wait_input(request_id, timeout_s=20) == []
    answer = await client.wait(request_id, timeout_s=0.1)
    assert answer.status.state is a2a.TaskState.COMPLETED
    assert client.answers[request_id] == [answer]
    assert await client.wait_input(request_id, timeout_s=0.1) == []


async def test_wait_input_then_wait_next_after_the_answer(mesh: Mesh) -> None:
    """A pause waited for by wait_input is not returned again by wait_next: once the
    call is denied, wait_next waits for the answer."""
    await mesh.run(approving(SideEffects()))
    request_id = await mesh.client.submit("coordinator", "Send the report")
    [call] = await mesh.client.wait_input(request_id, timeout_s=20)
    await mesh.client.deny(mesh.client.task_id("coordinator", request_id), call["call_id"],
                           "not today")
    step = await mesh.client.wait_next(request_id, timeout_s=20)
    assert step.ended and "not approved: not today" in str(step.answer)


async def test_a_wait_that_runs_out_names_the_task_its_agent_namespace_and_what(
        broker_mesh: Mesh) -> None:
    """Nobody serves ``archivist``: every wait runs out with meshpoint's own error,
    a TimeoutError too, saying which task, sent where, waited for what."""
    client = broker_mesh.client
    namespace = broker_mesh.options.namespace
    request_id = await client.submit("archivist", "File the report")
    task_id = client.task_id("archivist", request_id)
    for wait, what in ((client.wait, "answer"), (client.wait_input, "input"),
                       (client.wait_next, "answer or input")):
        with pytest.raises(WaitTimeoutError) as caught:
            await wait(request_id, 0.2)
        error = caught.value
        assert isinstance(error, TimeoutError) and isinstance(error, MeshpointError)
        assert (error.task_id, error.agent, error.namespace, error.waited_for) == (
            task_id, "archivist", namespace, what)
        assert str(error).startswith(
            f"task {task_id} (request {request_id}, sent to agent 'archivist' in "
            f"namespace '{namespace}'): no {what} within 0.2s")
        assert "meshpoint serve --agent archivist" in str(error)


def write_config(path: Path, namespace: str, broker_url: str, tenant: str) -> Path:
    path.write_text(yaml.safe_dump({
        "namespace": namespace, "store": {"url": f"sqlite:///{path.parent / 'unused.db'}",
                                          "tenant": tenant},
        "broker": {"url": broker_url},
        "agents": {"helper": {"model": {"kind": "scripted", "persona": "helper"}}}}))
    return path


@pytest.mark.nats
async def test_open_client_reaches_the_deployment_its_config_names(
        live_store: SqlStore, nats_url: str, tmp_path: Path) -> None:
    """The agent runs on its own broker (as ``serve`` does); a client opened from the
    config file asks it, and its broker is closed on exit."""
    namespace = f"oc{uuid.uuid4().hex[:10]}"
    from meshpoint.broker.nats import NatsBroker

    options = replace(FAST, namespace=namespace)
    served = await NatsBroker.connect(nats_url, pull_expires_s=0.3)
    instance = AgentInstance(Agent("helper", ScriptedModel(persona="helper")), live_store,
                             served, options=options)
    await instance.start()
    try:
        path = write_config(tmp_path / "mesh.yaml", namespace, nats_url, live_store.tenant_id)
        async with open_client(path) as client:
            assert isinstance(client, Client) and client.namespace == namespace
            answer = await client.ask("helper", "What time is it?", timeout_s=20)
            assert answer.status.state is a2a.TaskState.COMPLETED
            broker = client.broker
        assert broker.closed  # type: ignore[attr-defined]
        async with open_client(load_config(path)) as client:  # a loaded config too
            with pytest.raises(WaitTimeoutError, match=f"agent 'nobody' in namespace "
                                                       f"'{namespace}'"):
                await client.ask("nobody", "hello?", timeout_s=0.2)
    finally:
        await instance.stop()
        await served.delete_namespace(namespace)
        await served.close()


@pytest.mark.nats
async def test_a_client_never_creates_a_stream_in_a_namespace_nobody_serves(
        nats_url: str, tmp_path: Path) -> None:
    import nats.js.errors

    from meshpoint.broker.nats import NatsBroker

    namespace = f"nobody{uuid.uuid4().hex[:10]}"
    path = write_config(tmp_path / "mesh.yaml", namespace, nats_url, "default")
    with pytest.raises(NamespaceNotServedError) as caught:
        async with open_client(path):
            pass
    assert isinstance(caught.value, BrokerError) and caught.value.namespace == namespace
    assert f"namespace '{namespace}' has no stream" in str(caught.value)
    assert "no `meshpoint serve` has run in it" in str(caught.value)
    client_broker = await NatsBroker.connect(nats_url, create_streams=False)
    serving = await NatsBroker.connect(nats_url)
    try:
        with pytest.raises(NamespaceNotServedError):  # a publish does not create it
            await client_broker.publish(f"{namespace}.agent.helper.requests", b"{}")
        with pytest.raises(nats.js.errors.NotFoundError):
            await serving.js.stream_info(serving.stream_name(namespace))
        # once an instance's broker made it, the client's publishes go through
        await serving.subscribe(f"{namespace}.agent.helper.requests", "helpers",
                                _drop)
        await client_broker.publish(f"{namespace}.agent.helper.requests", b"{}")
    finally:
        await client_broker.close()
        await serving.delete_namespace(namespace)
        await serving.close()


async def test_open_client_refuses_an_in_process_broker(tmp_path: Path) -> None:
    """A memory:// broker reaches only its own process's agents: a client opened from
    the config alone could never be answered, so it is refused, saying so."""
    path = write_config(tmp_path / "mesh.yaml", "local", "memory://", "default")
    with pytest.raises(ConfigurationError, match="reaches only agents of its own process"):
        async with open_client(path):
            pass


async def _drop(delivery: Any) -> None:
    await delivery.ack()
