"""Where one tenant's messages travel in a namespace: every subject and queue name.

The layout (docs/runtime.md, "Subjects") sits under a root per tenant, so that two tenants
sharing a namespace (one broker, one NATS stream) never share a subject or a queue:
an instance of tenant ``acme`` never receives ``globex``'s requests or answers.
With ``R`` the tenant's root::

    R = {ns}.a2a.v1                      the default tenant (the layout as is)
    R = {ns}.a2a.v1.tenant.{t}           any other tenant (t: its token, see below)

    R.agent.request.{agent}                       new tasks, humans' answers, cancels
    R.agent.response.{agent}.{sub_task}           a peer's answer to one of agent's calls
    R.agent.status.{agent}.{sub_task}             its progress
    R.agent.control.{agent}                       broadcast to every instance of agent
    R.agent.handoff.{agent}                       handed-off tasks, for one instance to take
    R.instance.{agent}.{instance}.{kind}.{id}     answers for a task waiting in one
                                                  instance's memory (kind: response, status)
    R.client.{client}.{session}.{kind}.{id}       a client's answers and progress
    R.alerts.{agent}                              the agent's alerts (runtime/alerts.py)

Queue names (durable consumers on NATS) are ``{ns}-{name}`` for the default tenant
and ``{ns}-{name}~{t}`` for another: ``~`` is in no agent or namespace name, so two
tenants' queues never collide.

A tenant's token is its id when that is a plain name (letters, digits, ``_`` and
``-``, starting with a letter or digit, at most 64), else ``_`` and 32 hex digits of
its SHA-256: any tenant id meshpoint stores becomes one subject token, and two ids
never share one.

Reply subjects (``Meshpoint-Reply-To``, ``Meshpoint-Status-To``) come from the wire:
:meth:`Subjects.reply_subject` accepts only a subject of the right kind under the
tenant's own root, so a publisher cannot make an instance publish its answer
anywhere else (another namespace, another tenant, an agent's request subject).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from meshpoint.broker.base import check_subject
from meshpoint.errors import BadMessageError, InvalidArgumentError
from meshpoint.runtime.agent import check_name

#: The tenant of a store opened without one.
DEFAULT_TENANT = "default"
_PLAIN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")

#: What a reply subject is for: a final answer, or progress.
ReplyKind = Literal["response", "status"]


def tenant_token(tenant: str) -> str:
    """The subject token of ``tenant`` (see the module docstring); any other name
    becomes a token the same way (an approver's id, say)."""
    if type(tenant) is not str or not tenant:
        raise InvalidArgumentError(f"a name is a non-empty str, got {tenant!r}")
    if _PLAIN.match(tenant):
        return tenant
    return "_" + hashlib.sha256(tenant.encode("utf-8", "surrogatepass")).hexdigest()[:32]


def broker_user(namespace: str, tenant: str, role: str, name: str) -> str:
    """The NATS user ``meshpoint nats-config`` gives ``role`` (agent, client,
    approver) ``name`` of a tenant's mesh: ``<ns>.<role>.<name>`` (the name as a
    token), with the tenant's token after the namespace for any tenant but the
    default. A client's or approver's client id is its name's token."""
    prefix = namespace if tenant == DEFAULT_TENANT else f"{namespace}.{tenant_token(tenant)}"
    return f"{prefix}.{role}.{tenant_token(name)}"


@dataclass(frozen=True)
class Subjects:
    """The subjects and queue names of one tenant in one namespace."""

    namespace: str
    tenant: str = DEFAULT_TENANT
    #: Every subject of the tenant starts with it (see the module docstring).
    root: str = field(init=False)

    def __post_init__(self) -> None:
        check_name("namespace", self.namespace)
        base = f"{self.namespace}.a2a.v1"
        root = base if self.tenant == DEFAULT_TENANT else \
            f"{base}.tenant.{tenant_token(self.tenant)}"
        object.__setattr__(self, "root", root)

    def request(self, agent: str) -> str:
        return f"{self.root}.agent.request.{agent}"

    def response(self, agent: str, sub_task_id: str) -> str:
        return f"{self.root}.agent.response.{agent}.{sub_task_id}"

    def status(self, agent: str, sub_task_id: str) -> str:
        return f"{self.root}.agent.status.{agent}.{sub_task_id}"

    def control(self, agent: str) -> str:
        """Broadcast to every live instance of an agent (cancel of a running task)."""
        return f"{self.root}.agent.control.{agent}"

    def handoff(self, agent: str) -> str:
        """The handed-off tasks of an agent, for any one of its instances to take
        (:mod:`meshpoint.runtime.handoff`)."""
        return f"{self.root}.agent.handoff.{agent}"

    def responses(self, agent: str) -> str:
        """The filter of every answer to ``agent``'s calls."""
        return f"{self.root}.agent.response.{agent}.*"

    def statuses(self, agent: str) -> str:
        """The filter of every progress update of ``agent``'s calls."""
        return f"{self.root}.agent.status.{agent}.*"

    def alerts(self, agent: str) -> str:
        """Where agent's instances publish their alerts (a blocked or expired task, its
        breaker opened or closed, a message dead-lettered)."""
        return f"{self.root}.alerts.{agent}"

    def inbox(self, agent: str, instance_id: str) -> str:
        """The prefix of one instance's own subjects (its inbox)."""
        return f"{self.root}.instance.{agent}.{instance_id}"

    def client(self, client_id: str, session: str) -> str:
        """The prefix of one client's subjects (``session``: one Client object's)."""
        return f"{self.root}.client.{client_id}.{session}"

    def queue(self, name: str) -> str:
        """The tenant's queue called ``name`` (see the module docstring)."""
        if self.tenant == DEFAULT_TENANT:
            return f"{self.namespace}-{name}"
        return f"{self.namespace}-{name}~{tenant_token(self.tenant)}"

    def reply_subject(self, headers: Mapping[str, str], name: str,
                      kind: ReplyKind) -> str | None:
        """The reply subject in header ``name``, or None if there is none;
        BadMessageError unless it is a ``kind`` subject (an agent's, an instance's
        or a client's) under this tenant's root."""
        value = headers.get(name)
        if value is None:
            return None
        try:
            tokens = check_subject(value, pattern=False)
        except InvalidArgumentError as error:
            raise BadMessageError(f"header {name}: {error}") from None
        root = self.root.split(".")
        # Under the default tenant's root, "tenant" starts another tenant's subjects.
        if tokens[:len(root)] != root or tokens[len(root):len(root) + 1] == ["tenant"]:
            raise BadMessageError(
                f"header {name}: {value!r} is outside namespace {self.namespace!r} (tenant "
                f"{self.tenant!r}): replies go only to subjects under {self.root}")
        rest = tokens[len(root):]
        if not ((rest[:2] == ["agent", kind] and len(rest) == 4)
                or (rest[:1] in (["instance"], ["client"]) and len(rest) == 5
                and rest[3] == kind)):
            raise BadMessageError(
                f"header {name}: {value!r} is not a {kind} subject (an agent's "
                f"{self.root}.agent.{kind}.<agent>.<id>, an instance's or a client's "
                f"...{kind}.<id>)")
        return value
