"""``meshpoint nats-config``: a NATS user per agent, client and approver of a mesh,
each allowed only its own subjects.

A signed decision proves who approved; the broker's permissions keep everyone else
in their lane: with these users, the server itself refuses an agent that publishes
to an agent it does not call, a client that publishes an answer, a status update or
a cancel broadcast, and anyone who reads another's queue. For a mesh config (its
namespace, its store's tenant, its agents with their peers, its ``clients:`` and
``approvers:``), :func:`broker_users` lists the users and :func:`server_config`
writes them as a nats-server ``authorization`` block. With ``R`` the tenant's root
(:mod:`meshpoint.runtime.subjects`), each user may publish:

* agent ``A``: requests (and cancels) to its peers, ``R.agent.request.<peer>``;
  answers and progress to its callers (the agents that list it as a peer:
  ``R.agent.{response,status}.<caller>.*`` and their instances' inboxes), and to
  clients (``R.client.*.*.{response,status}.*``); its own cancel broadcast,
  ``R.agent.control.A``; its own alerts, ``R.alerts.A``; its own handoffs,
  ``R.agent.handoff.A``, and those of the agents its phases hand its tasks to (which
  then answer its callers too);
* client ``C``: requests (tasks, cancels, answers) to the agents it may call;
* approver ``P``: requests (its decisions) to the agents it may decide for;
* client, approver and ``admin``: may also read alerts (``R.alerts.*``: a client's of
  the agents it may call, an approver's of the agents it decides for) with a core NATS
  subscription (``nats sub``);
* every one of them: dead letters (``<ns>.deadletter.>``) and what JetStream's API
  needs for its own queues, and nothing of anyone else's: consumers it creates must
  filter its own subjects (the server checks the filter in the API subject), the
  durable consumers of other users are denied by name, and an ephemeral consumer
  has an unguessable name (:meth:`~meshpoint.broker.nats.NatsBroker.consumer_of`)
  that no user may list. Each subscribes to its own reply inbox only
  (``_INBOX_<user>.>``; NatsBroker uses that prefix for a user).

Instances may create the namespace's stream (exactly its name, and nothing else of
streams: no update, purge or delete), so that ``serve`` needs no setup; with
``admin_creates_stream`` only the ``admin`` user may, and an operator creates it
first. ``admin`` may do anything in the server's account: keep it for operators.

Passwords are never in the file: each user's is the nats-server environment
variable the block names (``$MESHPOINT_NATS_...``), and each process gives its own
in ``broker.user`` and ``broker.password`` (or in the broker URL).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from meshpoint.broker.nats import inbox_prefix, safe_name
from meshpoint.errors import ConfigurationError
from meshpoint.runtime.approvers import ANY
from meshpoint.runtime.subjects import DEFAULT_TENANT, Subjects, broker_user, tenant_token

if TYPE_CHECKING:  # the config's modules never import this one
    from meshpoint.config import MeshConfig

Role = Literal["agent", "client", "approver", "admin"]


@dataclass(frozen=True)
class BrokerUser:
    """One NATS user of a mesh and what it may do."""

    #: Its NATS user name (what ``broker.user`` says).
    name: str
    role: Role
    #: The agent, client or approver it is (the namespace, for ``admin``).
    of: str
    #: The client id its processes use (a client's or approver's; MeshConfig.client).
    client_id: str | None
    #: The nats-server environment variable that holds its password.
    password_env: str
    publish: list[str] = field(default_factory=list)
    publish_deny: list[str] = field(default_factory=list)
    subscribe: list[str] = field(default_factory=list)

    def permissions(self) -> dict[str, Any]:
        publish: dict[str, Any] = {"allow": self.publish}
        if self.publish_deny:
            publish["deny"] = self.publish_deny
        return {"publish": publish, "subscribe": {"allow": self.subscribe}}


def broker_users(config: MeshConfig, *,
                 admin_creates_stream: bool = False) -> list[BrokerUser]:
    """The users of ``config``'s mesh (see the module docstring): one per agent, per
    client and per approver, and ``admin``."""
    ns, tenant = config.namespace, config.store.tenant
    subjects = Subjects(ns, tenant)
    root = subjects.root
    stream = safe_name(f"{config.broker.stream_prefix}{ns}")
    prefix = ns if tenant == DEFAULT_TENANT else f"{ns}.{tenant_token(tenant)}"
    # At a phase's end an agent hands its task to the next phase's agent, which then
    # answers the task's caller: it publishes that agent's handoff subject, and the
    # next agent answers the first one's callers too.
    hands_to = {name: sorted({phase.agent for phase in (spec.handoff.phases if spec.handoff
                                                        else ()) if phase.agent not in (
                                                            None, name)})
                for name, spec in config.agents.items()}
    callers = {name: sorted({c for c, spec in config.agents.items()
                             for agent in (name, *(a for a in config.agents
                                                   if name in hands_to[a]))
                             if any(p.agent == agent for p in spec.peers)})
               for name in config.agents}
    durables = {name: [safe_name(subjects.queue(f"{name}-{kind}"))
                       for kind in ("requests", "responses", "status", "handoffs")]
                for name in config.agents}

    def make(role: Role, of: str, publish: list[str], filters: list[str],
             client_id: str | None = None, alerts: list[str] | None = None) -> BrokerUser:
        user = broker_user(ns, tenant, role, of)
        mine = durables.get(of, []) if role == "agent" else []
        others = [d for agent, names in durables.items() for d in names if d not in mine]
        return BrokerUser(
            name=user, role=role, of=of, client_id=client_id,
            password_env="MESHPOINT_NATS_" + re.sub(r"[^A-Za-z0-9]", "_", user).upper(),
            publish=[*publish, f"{ns}.deadletter.>", "$JS.API.INFO",
                     f"$JS.API.STREAM.INFO.{stream}",
                     *([] if admin_creates_stream else [f"$JS.API.STREAM.CREATE.{stream}"]),
                     *(f"$JS.API.CONSUMER.CREATE.{stream}.*.{f}" for f in filters),
                     f"$JS.API.CONSUMER.INFO.{stream}.*",
                     f"$JS.API.CONSUMER.MSG.NEXT.{stream}.*",
                     f"$JS.API.CONSUMER.DELETE.{stream}.*", f"$JS.ACK.{stream}.*.>"],
            publish_deny=[subject for d in others for subject in (
                f"$JS.API.CONSUMER.CREATE.{stream}.{d}.>", f"$JS.API.CONSUMER.INFO.{stream}.{d}",
                f"$JS.API.CONSUMER.MSG.NEXT.{stream}.{d}",
                f"$JS.API.CONSUMER.DELETE.{stream}.{d}", f"$JS.ACK.{stream}.{d}.>")],
            subscribe=[f"{inbox_prefix(user)}.>", *(alerts or [])])

    users = []
    for name, spec in config.agents.items():
        answers = [subject for caller in callers[name] for subject in (
            f"{root}.agent.response.{caller}.*", f"{root}.agent.status.{caller}.*",
            f"{root}.instance.{caller}.*.response.*", f"{root}.instance.{caller}.*.status.*")]
        users.append(make("agent", name, [
            *(subjects.request(peer.agent) for peer in spec.peers), *answers,
            f"{root}.client.*.*.response.*", f"{root}.client.*.*.status.*",
            subjects.control(name), subjects.handoff(name), subjects.alerts(name),
            *(subjects.handoff(agent) for agent in hands_to[name])], filters=[
            subjects.request(name), subjects.responses(name), subjects.statuses(name),
            f"{root}.instance.{name}.*.>", subjects.control(name), subjects.handoff(name)]))
    for name, client in config.clients.items():
        agents = client.agents if client.agents is not None else list(config.agents)
        users.append(make("client", name, [subjects.request(a) for a in agents],
                          filters=[f"{root}.client.{name}.*.>"], client_id=name,
                          alerts=[subjects.alerts(a) for a in agents]))
    for approver, scope in config.approvers.items():
        token = tenant_token(approver)
        agents = list(config.agents) if ANY in scope.agents else list(scope.agents)
        users.append(make("approver", approver, [subjects.request(a) for a in agents],
                          filters=[f"{root}.client.{token}.*.>"], client_id=token,
                          alerts=[subjects.alerts(a) for a in agents]))
    admin = f"{prefix}.admin"
    users.append(BrokerUser(
        name=admin, role="admin", of=ns, client_id=None,
        password_env="MESHPOINT_NATS_" + re.sub(r"[^A-Za-z0-9]", "_", admin).upper(),
        publish=[">"], subscribe=[">"]))
    seen: dict[str, str] = {}
    for user in users:
        clash = seen.get(user.password_env)
        if clash is not None:
            raise ConfigurationError(
                f"NATS users {clash!r} and {user.name!r} would share the password variable "
                f"{user.password_env}: rename one of them")
        seen[user.password_env] = user.name
    return users


def server_config(config: MeshConfig, users: list[BrokerUser]) -> str:
    """``users`` as a nats-server configuration: an ``authorization`` block to
    ``include`` in the server's config (which must enable JetStream)."""
    lines = [
        f"# Written by `meshpoint nats-config` for namespace {config.namespace!r}, tenant "
        f"{config.store.tenant!r}.",
        "# Include it in nats-server's config (JetStream on). Each password is an environment",
        "# variable of nats-server, never in this file:",
        *(f"#   {u.password_env} (user {u.name})" for u in users),
        "# and each process connects as its user (broker.user, broker.password in the mesh",
        "# config, or nats://USER:PASSWORD@host:4222).",
        "authorization {", "  users = ["]
    for user in users:
        permissions = user.permissions()
        lines += [
            "    {",
            f"      # {user.role} {user.of}",
            f"      user: {json.dumps(user.name)}",
            f"      password: ${user.password_env}",
            "      permissions: {",
            "        publish: {",
            f"          allow: {_list(permissions['publish']['allow'], 10)}"]
        if "deny" in permissions["publish"]:
            lines.append(f"          deny: {_list(permissions['publish']['deny'], 10)}")
        lines += [
            "        }",
            f"        subscribe: {{ allow: {_list(user.subscribe, 10)} }}",
            "      }",
            "    }"]
    lines += ["  ]", "}"]
    return "\n".join(lines) + "\n"


def as_json(config: MeshConfig, users: list[BrokerUser], *,
            admin_creates_stream: bool) -> dict[str, Any]:
    """``users`` as one JSON document (for tools; the server reads :func:`server_config`)."""
    return {"namespace": config.namespace, "tenant": config.store.tenant,
            "stream": safe_name(f"{config.broker.stream_prefix}{config.namespace}"),
            "admin_creates_stream": admin_creates_stream,
            "users": [{"user": u.name, "role": u.role, "of": u.of, "client_id": u.client_id,
                       "password_env": u.password_env, "permissions": u.permissions()}
                      for u in users]}


def _list(items: list[str], indent: int) -> str:
    pad = " " * (indent + 2)
    return "[\n" + "".join(f"{pad}{json.dumps(item)}\n" for item in items) + " " * indent + "]"
