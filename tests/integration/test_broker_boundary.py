"""The broker as a trust boundary: what a publisher can make an instance do.

Every test runs on the in-process broker and on NATS JetStream (a namespace of its
own on the shared server), over a SQLite file and PostgreSQL.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace

import pytest

from meshpoint import a2a
from meshpoint.broker.base import DEAD_LETTER_DELIVERIES, DEAD_LETTER_REASON, DEAD_LETTER_SUBJECT
from meshpoint.llm import ScriptedModel
from meshpoint.runtime import Agent, AgentInstance, Client, Peer, wire
from meshpoint.store import SqlStore, open_store
from tests.conftest import mesh_on
from tests.integration.mesh import FAST, Mesh, eventually

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


# -- tenants ------------------------------------------------------------------------------


@pytest.fixture
async def tenant_stores(live_store: SqlStore, store_url: str,
                        store_options: dict[str, object]) -> AsyncIterator[dict[str, SqlStore]]:
    """Stores of tenants ``acme`` and ``globex`` on the one (emptied) database of
    ``live_store``."""
    stores = {name: await open_store(store_url, tenant_id=name, **store_options)  # type: ignore[arg-type]
              for name in ("acme", "globex")}
    try:
        yield stores
    finally:
        for opened in stores.values():
            await opened.close()


async def test_two_tenants_on_one_namespace_never_take_each_other_s_work(
        broker_mesh: Mesh, tenant_stores: dict[str, SqlStore]) -> None:
    """The attack: ``acme`` and ``globex`` each run a coordinator (two instances) and a
    peer on the same namespace of one broker and one database. Every request runs
    under its own tenant's instances and is stored in its own tenant, and every
    answer of a peer reaches its own tenant's task: none is taken by the other
    tenant, acknowledged as unknown and lost."""
    mesh = broker_mesh
    ns = mesh.options.namespace
    instances: list[AgentInstance] = []
    clients: dict[str, Client] = {}
    try:
        for tenant, store in tenant_stores.items():
            for agent, count in ((Agent("coordinator", ScriptedModel(),
                                        peers=[Peer("flights", timeout_s=30)]), 2),
                                 (Agent("flights", ScriptedModel(persona="flights")), 1)):
                for n in range(count):
                    instance = AgentInstance(agent, store, mesh.broker, options=mesh.options,
                                             instance_id=f"{tenant}-{agent.name}-{n}")
                    await instance.start()
                    instances.append(instance)
            clients[tenant] = await Client(mesh.broker, namespace=ns, tenant=tenant,
                                           client_id=f"{tenant}-client").start()
        requests = {tenant: [await client.submit("coordinator", f"Go: {tenant} trip {n}")
                             for n in range(6)] for tenant, client in clients.items()}
        for tenant, client in clients.items():
            for request_id in requests[tenant]:
                answer = await client.wait(request_id, timeout_s=20)
                assert answer.status.state is a2a.TaskState.COMPLETED
                assert answer.metadata is not None
                assert answer.metadata["instance"].startswith(f"{tenant}-coordinator-")
                assert answer.status.message is not None
                assert "[flights]" in answer.status.message.text
        for instance in instances:
            tenant = instance.instance_id.split("-")[0]
            started = instance.stats.tasks("started")
            mine = {clients[tenant].task_id(instance.agent.name, r) for r in requests[tenant]}
            assert instance.agent.name != "coordinator" or set(started) <= mine, (
                f"{instance.instance_id} ran another tenant's task")
            assert not instance.stats.tasks("ignored_answer"), instance.instance_id
        assert mesh.dead_letters == []
    finally:
        for client in clients.values():
            await client.close()
        for instance in instances:
            await instance.stop()


async def test_an_answer_no_task_waits_for_is_never_acknowledged_and_dropped(
        broker_kind: str, live_store: SqlStore, request: pytest.FixtureRequest) -> None:
    """An answer this tenant's instances cannot place (no task of theirs has its
    sub-task, and it names no task they know) is left for its owner: handed back and
    redelivered, then dead-lettered past ``max_deliver`` with a reason. A late answer
    to a task that ended (its context names the task) is acknowledged and ignored."""
    options = replace(FAST, max_deliver=3)
    async with mesh_on(broker_kind, live_store, request, options) as mesh:
        ns = mesh.options.namespace
        (coordinator,) = await mesh.run(Agent("coordinator", ScriptedModel(),
                                              peers=[Peer("flights", timeout_s=30)]))
        await mesh.run(Agent("flights", ScriptedModel(persona="flights")))
        ended = await mesh.client.ask("coordinator", "Go: once", 20)
        stray = wire.response_subject(ns, "coordinator", "no-such-sub")
        await mesh.broker.publish(stray, wire.final_task(
            "no-such-sub", "flights-x", "someone-else", a2a.TaskState.COMPLETED, "x", [], {}))
        await eventually(lambda: len(mesh.dead_letters) == 1, what="the dead letter")
        ((_, headers),) = mesh.dead_letters
        assert headers[DEAD_LETTER_SUBJECT] == stray
        assert headers[DEAD_LETTER_DELIVERIES] == "3"
        assert "no task of tenant 'default' waits for sub-task 'no-such-sub'" in \
            headers[DEAD_LETTER_REASON]

        late = wire.response_subject(ns, "coordinator", "late-sub")
        await mesh.broker.publish(late, wire.final_task(
            "late-sub", "flights-y", ended.id, a2a.TaskState.COMPLETED, "late", [], {}))
        await eventually(lambda: bool(coordinator.stats.tasks("ignored_answer")),
                         what="the late answer ignored")
        assert len(mesh.dead_letters) == 1


# -- reply subjects -----------------------------------------------------------------------


@pytest.mark.parametrize(("header", "target", "why"), [
    (wire.REPLY_TO, "elsewhere.a2a.v1.client.c.s.response.r", "outside namespace"),
    (wire.REPLY_TO, "{ns}.a2a.v1.tenant.acme.client.c.s.response.r", "outside namespace"),
    (wire.REPLY_TO, "{ns}.a2a.v1.agent.request.admin", "is not a response subject"),
    (wire.REPLY_TO, "{ns}.a2a.v1.agent.control.admin", "is not a response subject"),
    (wire.STATUS_TO, "{ns}.a2a.v1.agent.response.admin.s1", "is not a status subject"),
    (wire.REPLY_TO, "{ns}.deadletter.x", "outside namespace"),
], ids=["other-namespace", "other-tenant", "a-request-subject", "a-control-subject",
        "status-to-an-answer-subject", "a-dead-letter-subject"])
async def test_reply_subjects_outside_the_namespace_or_of_the_wrong_kind_are_refused(
        broker_mesh: Mesh, header: str, target: str, why: str) -> None:
    """A request whose reply subject points outside its namespace and tenant, or at
    a subject that is not a reply subject (which would make the instance publish its
    answer as a request to another agent, say) is dead-lettered with the reason and
    starts no task."""
    mesh = broker_mesh
    ns = mesh.options.namespace
    (instance,) = await mesh.run(Agent("coordinator", ScriptedModel()))
    good = wire.Subjects(ns).client("c", "s")
    headers = wire.reply_headers(f"{good}.response.r", f"{good}.status.r")
    headers[header] = target.format(ns=ns)
    await mesh.broker.publish(wire.request_subject(ns, "coordinator"),
                              wire.send_request("r", "hello"), headers)
    await eventually(lambda: len(mesh.dead_letters) == 1, what="the dead letter")
    ((_, dead),) = mesh.dead_letters
    assert f"header {header}" in dead[DEAD_LETTER_REASON] and why in dead[DEAD_LETTER_REASON]
    assert not instance.stats.tasks("started")
