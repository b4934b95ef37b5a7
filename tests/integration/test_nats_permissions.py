"""``meshpoint nats-config``'s users on a real nats-server: what a user's permissions
do not allow is refused by the server itself, and a mesh runs with its users.

Each test starts a private nats-server with the configuration the command writes
for a mesh (the shared server has no users), and connects as the mesh's users.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nats
import pytest

from meshpoint import a2a
from meshpoint.broker import ConsumerOptions, Delivery
from meshpoint.broker.nats import NatsBroker
from meshpoint.config import MeshConfig
from meshpoint.errors import BrokerError, BrokerPermissionError
from meshpoint.llm import ScriptedModel
from meshpoint.nats_users import BrokerUser, broker_users, server_config
from meshpoint.runtime import Agent, AgentInstance, Client, LocalTool, Peer, RuntimeOptions, wire
from meshpoint.runtime.approvers import ApproverKey
from meshpoint.runtime.subjects import Subjects
from meshpoint.store import SqlStore
from tests.conftest import service_missing
from tests.integration.mesh import eventually
from tests.nats_server import PrivateNats, nats_server_binary

pytestmark = pytest.mark.nats

NS = "travel"
CFO = "cfo@example.com"
R = Subjects(NS).root


def refund(arguments: dict[str, Any], _call: Any) -> str:
    return f"refunded order {arguments.get('query')}"


def mesh_config(cfo: ApproverKey) -> MeshConfig:
    """support calls flights and has a refund tool a human approves, and hands its
    escalated tasks to admin (a phase); admin is another agent nobody calls; the web
    client may call support only; the CFO decides support's refunds."""
    return MeshConfig.model_validate({
        "namespace": NS, "store": "sqlite:///unused.db",
        "agents": {"support": {"peers": [{"agent": "flights"}], "handoff": {"phases": [
                       {"name": "triage"}, {"name": "escalate", "agent": "admin"}]}},
                   "flights": {}, "admin": {"handoff": {}}},
        "clients": {"web": {"agents": ["support"]}},
        "approvers": {CFO: {"key": cfo.public_pem(), "agents": {"support": ["*"]}}}})


@dataclass
class Server:
    nats: PrivateNats
    users: dict[str, BrokerUser]  # by role and name: "agent support", "client web", ...
    passwords: dict[str, str]

    async def connect(self, who: str, **options: Any) -> NatsBroker:
        user = self.users[who]
        return await NatsBroker.connect(self.nats.url, user=user.name,
                                        password=self.passwords[user.name],
                                        publish_timeout_s=5, pull_expires_s=0.3, **options)


@pytest.fixture
def cfo() -> ApproverKey:
    return ApproverKey.generate(CFO)


@pytest.fixture
def server(tmp_path: Path, cfo: ApproverKey) -> Iterator[Server]:
    binary = nats_server_binary()
    if binary is None:
        service_missing("nats-server is not installed (Debian: apt install nats-server)")
    config = mesh_config(cfo)
    users = broker_users(config)
    passwords = {u.name: f"secret-{n}" for n, u in enumerate(users)}
    private = PrivateNats(binary, tmp_path / "nats", extra_config=server_config(config, users),
                          env={u.password_env: passwords[u.name] for u in users})
    private.start()
    try:
        yield Server(private, {f"{u.role} {u.of}": u for u in users}, passwords)
    finally:
        private.stop()


@pytest.fixture
async def brokers(server: Server) -> AsyncIterator[dict[str, NatsBroker]]:
    opened: dict[str, NatsBroker] = {}
    try:
        for who in ("admin travel", "agent support", "agent flights", "agent admin",
                    "client web", f"approver {CFO}"):
            opened[who] = await server.connect(who)
        await opened["agent support"]._ensure_stream(NS)
        yield opened
    finally:
        for broker in opened.values():
            await broker.close()


async def test_the_server_refuses_what_a_user_may_not_publish(
        brokers: dict[str, NatsBroker]) -> None:
    """An agent publishing to an agent it does not call, a client publishing an
    answer, a status update or a cancel broadcast, an approver deciding for an agent
    outside its scope: each publish is refused by the server, and the stream never
    holds it. What each may publish goes through."""
    support, web, approver = (brokers["agent support"], brokers["client web"],
                              brokers[f"approver {CFO}"])
    refused = [
        (support, f"{R}.agent.request.admin"),          # admin is not a peer of support
        (support, f"{R}.agent.response.flights.s1"),    # flights never calls support
        (web, f"{R}.agent.response.support.s1"),        # a client forging a peer's answer
        (web, f"{R}.agent.status.support.s1"),
        (web, f"{R}.agent.control.support"),            # a cancel broadcast
        (web, f"{R}.agent.request.admin"),              # not one of the web's agents
        (approver, f"{R}.agent.request.flights"),       # outside the CFO's scope
        (brokers["agent flights"], f"{R}.agent.handoff.support"),  # not its phase agent
        (web, f"{R}.agent.handoff.support"),            # a client forging a handoff
    ]
    for broker, subject in refused:
        with pytest.raises(BrokerPermissionError,
                           match=f'permissions violation for publish to "{subject}"'):
            await broker.publish(subject, b"{}")
    # Another namespace: not even its stream may be made.
    with pytest.raises(BrokerPermissionError, match=r"stream\.create\.meshpoint_elsewhere"):
        await web.publish("elsewhere.a2a.v1.agent.request.support", b"{}")
    for broker, subject in ((support, f"{R}.agent.request.flights"),
                            (brokers["agent flights"], f"{R}.agent.response.support.s1"),
                            (web, f"{R}.agent.request.support"),
                            (approver, f"{R}.agent.request.support"),
                            (support, f"{R}.agent.handoff.admin")):  # its next phase
        await broker.publish(subject, b"{}")
    held = await brokers["admin travel"].subject_counts(NS)
    assert set(held) == {f"{R}.agent.request.flights", f"{R}.agent.response.support.s1",
                         f"{R}.agent.request.support", f"{R}.agent.handoff.admin"}


async def test_no_user_reads_or_takes_another_user_s_queue(
        brokers: dict[str, NatsBroker], server: Server) -> None:
    """A user cannot pull from, acknowledge, look up or delete another user's
    queue, nor make a queue of its own over another's subjects, nor listen to the
    wire: each is refused by the server."""
    support, flights = brokers["agent support"], brokers["agent flights"]
    subjects = Subjects(NS)
    taken: list[bytes] = []

    async def take(delivery: Delivery) -> None:
        taken.append(delivery.message.data)
        await delivery.ack()

    # support's own queue, as its instances make it.
    await support.subscribe(subjects.request("support"), subjects.queue("support-requests"),
                            take)
    with pytest.raises(BrokerPermissionError, match="permissions violation"):
        # Joining support's queue: its consumer may not even be looked up by flights.
        await flights.subscribe(subjects.request("support"),
                                subjects.queue("support-requests"), take)
    with pytest.raises(BrokerPermissionError, match="permissions violation"):
        # A queue of flights' own over support's requests: the server checks the filter.
        await flights.subscribe(subjects.request("support"), "flights-snoops", take,
                                ConsumerOptions(ephemeral=True))
    await brokers["client web"].publish(subjects.request("support"), b"for support")
    await eventually(lambda: taken == [b"for support"], what="support's own request")

    refused: list[str] = []

    async def on_error(error: Exception) -> None:
        refused.append(str(error))

    user = server.users["agent flights"]
    raw = await nats.connect(server.nats.url, user=user.name,
                             password=server.passwords[user.name], error_cb=on_error)
    try:
        for subject in (">", f"{R}.>", "_INBOX.>",
                        f"_INBOX_{server.users['agent support'].name}.>"):
            await raw.subscribe(subject)
        await raw.flush()
        await eventually(lambda: len(refused) == 4, what="four refused subscriptions")
    finally:
        await raw.close()
    assert all("permissions violation for subscription" in r for r in refused), refused


async def test_a_wrong_password_is_refused(server: Server) -> None:
    user = server.users["agent support"]
    with pytest.raises(BrokerError, match=r"refused user 'travel\.agent\.support'"):
        await NatsBroker.connect(server.nats.url, user=user.name, password="guess",
                                 connect_timeout_s=5)


async def test_a_mesh_runs_with_its_users(server: Server, live_store: SqlStore,
                                          cfo: ApproverKey) -> None:
    """Each process as its own user: support (which calls flights, and waits for the
    CFO's approval of each refund), flights, the web client, the CFO. A task goes
    from the client to support, to flights and back, waits for the CFO, and is
    answered."""
    options = RuntimeOptions(namespace=NS, sweep_interval_s=0.1, recovery_interval_s=0.2,
                             lease_ttl_s=2.0)
    config = mesh_config(cfo)
    support = Agent("support", ScriptedModel(), peers=[Peer("flights", timeout_s=30)],
                    tools=[LocalTool("refund", "Refund an order.", refund,
                                     needs_approval=True)])
    opened: list[NatsBroker] = []
    instances: list[AgentInstance] = []

    async def connect(who: str) -> NatsBroker:
        opened.append(await server.connect(who))
        return opened[-1]

    try:
        for agent, who in ((support, "agent support"),
                           (Agent("flights", ScriptedModel(persona="flights")),
                            "agent flights")):
            instance = AgentInstance(agent, live_store, await connect(who), options=options,
                                     approvers=config.build_approvers())
            await instance.start()
            instances.append(instance)
        async with Client(await connect("client web"), namespace=NS,
                          client_id=server.users["client web"].client_id) as web, \
                Client(await connect(f"approver {CFO}"), namespace=NS, key=cfo,
                       client_id=server.users[f"approver {CFO}"].client_id) as desk:
            request_id = await web.submit("support", "Go: order 7")
            pending = await web.wait_input(request_id, timeout_s=20)
            task_id = web.task_id("support", request_id)
            decided = await desk.approve(task_id, pending[0]["call_id"], proposed=pending[0])
            assert (decided["by"], decided["verified"]) == (CFO, True)
            answer = await web.wait(request_id, timeout_s=20)
        assert answer.status.state is a2a.TaskState.COMPLETED
        assert answer.status.message is not None
        text = answer.status.message.text
        assert "[flights]" in text and "refunded order" in text
    finally:
        for instance in instances:
            await instance.stop()
        for broker in opened:
            await broker.close()
        await asyncio.sleep(0)


def test_the_config_names_every_user_and_no_password(cfo: ApproverKey) -> None:
    text = server_config(mesh_config(cfo), broker_users(mesh_config(cfo)))
    assert "secret" not in text and "password: $MESHPOINT_NATS_TRAVEL_AGENT_SUPPORT" in text
    assert wire.request_subject(NS, "flights") in text


async def test_an_agent_publishes_its_own_alerts_which_its_clients_read(
        server: Server, brokers: dict[str, NatsBroker]) -> None:
    """An agent may publish alerts on its own alert subject only; a client may read
    those of the agents it may call (a core subscription), and no other's."""
    support, web = brokers["agent support"], brokers["client web"]
    received: asyncio.Queue[bytes] = asyncio.Queue()

    async def on_alert(message: Any) -> None:
        await received.put(message.data)

    await web.nc.subscribe(Subjects(NS).alerts("support"), cb=on_alert)
    # nats-py's flush() writes its PING ahead of a SUB still in its buffer, so the
    # server may take a publish before the subscription (seen on a loaded machine):
    # the agent publishes until the client has one, as a core subscriber would see.

    async def heard() -> bool:
        await support.publish(Subjects(NS).alerts("support"), b'{"kind": "blocked"}')
        with contextlib.suppress(TimeoutError):
            return await asyncio.wait_for(received.get(), 0.5) == b'{"kind": "blocked"}'
        return False

    await eventually(heard, what="the client to read the agent's alert")
    with pytest.raises(BrokerPermissionError, match="permissions violation for publish"):
        await support.publish(Subjects(NS).alerts("flights"), b"{}")
    assert [s for s in server.users["client web"].subscribe if ".alerts." in s] == [
        f"{R}.alerts.support"]
