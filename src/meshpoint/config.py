"""The mesh config file: one YAML document for every process of a deployment.

It names the namespace, where checkpoints live (``store``), how messages travel
(``broker``), the runtime's timings and each agent with its model, peers and
tools. ``meshpoint serve``, ``submit`` and ``migrate`` read it; so can code::

    config = load_config("mesh.yaml")
    agent = config.build_agent("coordinator")

Strings may use ``${VAR}`` or ``${VAR:-default}`` to read the environment (secrets,
per-host URLs). Every mistake is reported with the file, the key (as a dotted path
such as ``agents.coordinator.peers.0.timeout_s``) and what was expected.
"""

from __future__ import annotations

import importlib
import os
import re
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)

from meshpoint._redact import redact_url
from meshpoint.compression import DEFAULT_MAX_DECOMPRESSED_BYTES
from meshpoint.config_errors import explain
from meshpoint.errors import ConfigurationError, InvalidArgumentError, MeshpointError
from meshpoint.llm.base import Model
from meshpoint.runtime.agent import (
    Agent,
    CheckpointPolicy,
    LocalTool,
    Peer,
    RecoveryPolicy,
    RuntimeOptions,
)
from meshpoint.runtime.approvers import ANY, ApproverConfig, Approvers
from meshpoint.store.engine import MIGRATION_LOCK_TIMEOUT_S
from meshpoint.tls import TlsConfig

if TYPE_CHECKING:
    from meshpoint.broker import Broker
    from meshpoint.history import HistoryOptions
    from meshpoint.runtime import Client
    from meshpoint.store import SqlStore

_NAME = r"^[A-Za-z0-9_-]{1,64}$"
_ENV = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


def _policy(value: str | None) -> str | None:
    """A retention policy, checked when the file is read (ValueError names the forms)."""
    from meshpoint.history import parse_retention

    if value is not None:
        try:
            parse_retention(value)
        except InvalidArgumentError as error:
            raise ValueError(str(error)) from None
    return value


def _families(value: list[str]) -> list[str]:
    """Families of encrypted columns, checked when the file is read."""
    from meshpoint.encryption import check_families

    try:
        check_families(value)
    except InvalidArgumentError as error:
        raise ValueError(str(error)) from None
    return value


#: ``days:N``, ``last:N`` or ``hold`` (:func:`meshpoint.history.parse_retention`).
RetentionPolicy = Annotated[str | None, AfterValidator(_policy)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class _HasUrl(_Strict):
    """A section whose ``url`` may hold credentials (``${VAR}``-expanded, often): its
    repr shows the URL with them replaced by ``***``; the field keeps them."""

    url: str

    def __repr_args__(self) -> Any:
        for name, value in super().__repr_args__():
            yield name, redact_url(value) if name == "url" else value


class StoreConfig(_HasUrl):
    """Where tasks are checkpointed."""

    #: ``sqlite:///path.db`` or ``postgresql+asyncpg://user@host:5432/db``.
    url: str
    #: A PostgreSQL schema (search_path) to keep meshpoint's tables in.
    schema_name: str | None = Field(default=None, alias="schema")
    tenant: str = "default"
    #: Bring the schema up to date when a process starts (safe from many at once).
    migrate: bool = True
    pool_size: int = Field(default=5, ge=1)
    #: TLS to PostgreSQL (:class:`meshpoint.tls.TlsConfig`); the URL's libpq
    #: ``sslmode`` may say it instead.
    tls: TlsConfig | None = None
    #: No stored blob (a context, a history snapshot) is inflated past this: one that
    #: would be is refused as corrupt, and one that would be is never written.
    max_decompressed_bytes: int = Field(default=DEFAULT_MAX_DECOMPRESSED_BYTES, ge=1)
    #: How long a migration waits for another session's migration lock (PostgreSQL).
    migration_lock_timeout_s: float = Field(default=MIGRATION_LOCK_TIMEOUT_S, gt=0)

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    def options(self) -> dict[str, Any]:
        """The ``open_store`` options this section names, beside the URL and tenant."""
        return {"migrate": self.migrate, "schema": self.schema_name,
                "pool_size": self.pool_size, "tls": self.tls,
                "max_decompressed_bytes": self.max_decompressed_bytes,
                "migration_lock_timeout_s": self.migration_lock_timeout_s}


class BrokerConfig(_HasUrl):
    """How messages travel. ``memory://`` only reaches agents in the same process."""

    #: ``nats://host:4222`` (NATS with JetStream) or ``memory://``.
    url: str = "nats://127.0.0.1:4222"
    #: The NATS user this process connects as: one of those ``meshpoint nats-config``
    #: writes for this mesh (an agent's for ``serve``, a client's or approver's for
    #: ``submit``), usually ``${MESHPOINT_BROKER_USER}`` set per process. Unset (or
    #: empty): no user, or the URL's.
    user: str | None = None
    #: That user's password (``${VAR}``); never shown in a repr or a log.
    password: SecretStr | None = None
    stream_prefix: str = "MESHPOINT_"
    #: How long a NATS stream keeps messages (acknowledged or not).
    max_age_s: float = Field(default=7 * 86400.0, gt=0)
    #: Window in which a repeated final answer is dropped (exactly-once answers).
    dedupe_window_s: float = Field(default=120.0, gt=0)
    #: How long a publish keeps retrying while NATS is unreachable.
    publish_timeout_s: float = Field(default=30.0, gt=0)
    connect_timeout_s: float = Field(default=10.0, gt=0)
    #: TLS to NATS (:class:`meshpoint.tls.TlsConfig`); a ``tls://`` URL requires it too.
    tls: TlsConfig | None = None

    @field_validator("user", "password", mode="before")
    @classmethod
    def _empty_is_unset(cls, value: Any) -> Any:
        return None if value == "" else value

    @model_validator(mode="after")
    def _window_within_age(self) -> BrokerConfig:
        if self.dedupe_window_s > self.max_age_s:
            raise ValueError(f"dedupe_window_s ({self.dedupe_window_s:g}) must not exceed "
                             f"max_age_s ({self.max_age_s:g}): NATS refuses such a stream")
        return self


_RUNTIME = RuntimeOptions()  # the defaults the config falls back to


class RuntimeConfig(_Strict):
    """Timings of every instance (see :class:`meshpoint.runtime.RuntimeOptions`, whose
    defaults these are), and two of the ``serve`` process."""

    lease_ttl_s: float = Field(default=_RUNTIME.lease_ttl_s, gt=0)
    sweep_interval_s: float = Field(default=_RUNTIME.sweep_interval_s, gt=0)
    recovery_interval_s: float = Field(default=_RUNTIME.recovery_interval_s, gt=0)
    request_ack_wait_s: float = Field(default=_RUNTIME.request_ack_wait_s, gt=0)
    response_ack_wait_s: float = Field(default=_RUNTIME.response_ack_wait_s, gt=0)
    max_deliver: int = Field(default=_RUNTIME.max_deliver, ge=1)
    max_in_flight: int = Field(default=_RUNTIME.max_in_flight, ge=1)
    max_message_bytes: int = Field(default=_RUNTIME.max_message_bytes, ge=1024)
    #: On SIGTERM, how long to let the work in hand reach its pause or its end.
    drain_timeout_s: float = Field(default=20.0, ge=0)
    #: How long ``serve`` retries an unreachable store or broker before giving up.
    startup_timeout_s: float = Field(default=120.0, ge=0)


class ScriptedModelConfig(_Strict):
    """The deterministic offline model (plans one peer call per topic of the request)."""

    kind: Literal["scripted"] = "scripted"
    name: str | None = None
    persona: str | None = None
    rounds: int = Field(default=1, ge=1)
    delay_s: float = Field(default=0.0, ge=0)


class OpenAIModelConfig(_Strict):
    """An OpenAI-compatible chat-completions endpoint (:class:`meshpoint.llm.openai.
    OpenAIModel`; every key is described in docs/models.md)."""

    kind: Literal["openai"] = "openai"
    #: The model name the endpoint knows (e.g. ``gpt-4o-mini``).
    name: str = Field(min_length=1)
    #: The endpoint, e.g. ``http://127.0.0.1:8080/v1``; unset: OpenAI's.
    base_url: str | None = None
    #: The environment variable holding the API key (never the key itself). Unset: OpenAI
    #: needs ``OPENAI_API_KEY``; an endpoint of ``base_url`` is sent no key, so that a
    #: local server never receives the key meant for OpenAI.
    api_key_env: str | None = None
    #: Seconds one request may take whole: connecting, sending and the whole reply.
    timeout_s: float = Field(default=60.0, gt=0)
    #: Bytes a reply may have; a longer one fails the call (ModelReplyTooLargeError).
    max_reply_bytes: int = Field(default=8 * 1024 * 1024, ge=1024)
    #: Retries of a failed connection or a 408/409/429/5xx answer.
    max_retries: int = Field(default=2, ge=0)
    #: Also retry a request that timed out (its generation would run again).
    retry_timeouts: bool = False
    #: Tokens one reply may have; null: the server's default (often the whole context).
    max_tokens: int | None = Field(default=1024, ge=1)
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    seed: int | None = None
    stop: list[str] | None = None
    tool_choice: Literal["auto", "required", "none"] | None = None
    parallel_tool_calls: bool | None = None
    #: For an agent without tools (tool_mode json sets its own).
    response_format: dict[str, Any] | None = None
    #: ``native``: tools and tool_calls; ``json``: a JSON reply under a schema made from
    #: the tools, for models without reliable native tool calls.
    tool_mode: Literal["native", "json"] = "native"
    #: How tool_mode json asks for its schema: OpenAI's ``json_schema`` layout, or
    #: ``json_object`` with a ``schema`` (llama-cpp-python's server reads only that).
    json_format: Literal["json_schema", "json_object"] = "json_schema"
    #: Calls of one tool a tool_mode json reply may make (the schema bounds each list).
    json_calls_per_tool: int = Field(default=1, ge=1)
    #: Rounds of tool calls after the user's message before the model must answer.
    max_tool_rounds: int | None = Field(default=None, ge=0)
    #: Times an unusable reply is handed back to the model before the call fails.
    repair_attempts: int = Field(default=2, ge=0)
    #: Server-specific fields added to each request's JSON (not in the repr: a server
    #: may take a credential here).
    extra_body: dict[str, Any] = Field(default_factory=dict, repr=False)

    @model_validator(mode="after")
    def _one_response_format(self) -> OpenAIModelConfig:
        if self.response_format is not None and self.tool_mode == "json":
            raise ValueError("response_format cannot be set with tool_mode json, which "
                             "sets its own")
        return self


class PythonModelConfig(_Strict):
    """A model of your own: ``factory`` (``package.module:name``, a class or a function)
    called with ``options`` as keyword arguments returns it."""

    kind: Literal["python"] = "python"
    factory: str = Field(pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
    #: Not in the repr: they may hold the model's credentials.
    options: dict[str, Any] = Field(default_factory=dict, repr=False)


ModelConfig = Annotated[ScriptedModelConfig | OpenAIModelConfig | PythonModelConfig,
                        Field(discriminator="kind")]


class PeerConfig(_Strict):
    """An agent this agent may call."""

    agent: str = Field(pattern=_NAME)
    #: Seconds to wait for the answer, counted from the checkpoint (status updates
    #: restart it).
    timeout_s: float = Field(default=600.0, gt=0)
    description: str = ""
    tool_name: str | None = Field(default=None, pattern=_NAME)


_IMPORT_PATH = r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$"


class ToolConfig(_Strict):
    """A local tool: a Python callable named ``package.module:function``."""

    name: str = Field(pattern=_NAME)
    function: str = Field(pattern=_IMPORT_PATH)
    description: str = ""
    #: true: every call waits for a human's approval; ``package.module:function``: a
    #: predicate on the call's arguments says which calls do.
    needs_approval: bool | Annotated[str, Field(pattern=_IMPORT_PATH)] = False
    #: Seconds a call waits for approval before it is denied ("timed out").
    approval_timeout_s: float = Field(default=3600.0, gt=0)
    #: The JSON schema of the arguments (edited arguments must satisfy it).
    parameters: dict[str, Any] | None = None


class RecoveryConfig(_Strict):
    """What recovery does with an agent's stored tasks (seed 004's ``recovery:``; see
    :class:`meshpoint.runtime.agent.RecoveryPolicy`)."""

    auto_resume: bool = True
    auto_resume_hitl: bool = False
    #: Seconds without a checkpoint after which a task fails (0: never).
    timeout_s: float = Field(default=86_400.0, ge=0)
    #: Restart a task blocked by its history from its reconstruction (seed 003).
    reconstruct: bool = False


class CheckpointConfig(_Strict):
    """When a running turn is checkpointed besides its pauses (seed 004's ``checkpoint:``;
    see :class:`meshpoint.runtime.agent.CheckpointPolicy`)."""

    strategy: Literal["event", "interval", "hybrid"] = "event"
    #: Model calls between checkpoints, with strategy interval or hybrid.
    interval: int = Field(default=0, ge=0)
    after_tools: bool = False
    before_llm: bool = False
    recovery: RecoveryConfig = Field(default_factory=RecoveryConfig)


class SigningConfig(_Strict):
    """Ed25519 keys that sign the checkpoint history (see :class:`meshpoint.integrity.
    SigningKeys`): ``keys`` maps a key id to ``env:VAR``, ``file:PATH`` or the key (a
    PEM private or public key, or the base64 of a 32-byte seed); ``active`` signs."""

    active: str | None = None
    #: Secret strings: a key given inline (or through ``${VAR}``) is never printed.
    keys: dict[str, SecretStr] = Field(default_factory=dict)
    #: Unsigned records fail verification (default: whenever a key is configured).
    require_signatures: bool | None = None


class EncryptionConfig(_Strict):
    """AES-GCM encryption at rest (:mod:`meshpoint.encryption`): every column that
    carries user content (:mod:`meshpoint.store.sealing`), and history fields."""

    #: The key ring file (``meshpoint keys rotate`` writes it).
    keyring: str
    #: Record fields to encrypt besides the security context (dotted paths).
    fields: list[str] = Field(default_factory=list)
    #: Families of columns left in clear (context, conversation, calls, snapshots,
    #: events, langgraph); none by default.
    exclude: Annotated[list[str], AfterValidator(_families)] = Field(default_factory=list)


class HistoryConfig(_Strict):
    """The checkpoint history (seed 001; :class:`meshpoint.history.HistoryOptions`)."""

    enabled: bool = True
    signing: SigningConfig = Field(default_factory=SigningConfig)
    encryption: EncryptionConfig | None = None
    #: Price per million tokens by model: ``{model: {prompt_tokens, completion_tokens,
    #: cached_tokens}}``; the cost attribution of each record.
    prices: dict[str, dict[str, float]] = Field(default_factory=dict)
    currency: str = "USD"
    #: The retention of records whose agent sets none (days:N, last:N, hold).
    retention: RetentionPolicy = None
    #: How often ``serve`` purges what retention lets go (0: never; ``meshpoint purge``
    #: does it on demand).
    purge_interval_s: float = Field(default=3600.0, ge=0)

    def options(self) -> HistoryOptions:
        from meshpoint.costs import Prices
        from meshpoint.encryption import load_keyring
        from meshpoint.history import HistoryOptions
        from meshpoint.integrity import SigningKeys

        return HistoryOptions(
            enabled=self.enabled,
            signing=SigningKeys.from_config(
                {key_id: key.get_secret_value() for key_id, key in self.signing.keys.items()},
                self.signing.active),
            require_signatures=self.signing.require_signatures,
            encryption=None if self.encryption is None else load_keyring(
                self.encryption.keyring),
            encrypt_fields=tuple(self.encryption.fields) if self.encryption else (),
            encrypt_exclude=frozenset(self.encryption.exclude if self.encryption else ()),
            prices=Prices(self.prices, self.currency), retention=self.retention)


class ClientConfig(_Strict):
    """A client of the mesh (a web backend, ``meshpoint submit``): it gets a NATS user
    of its own from ``meshpoint nats-config``, which may submit to ``agents`` only."""

    #: The agents it may send tasks (and cancels) to; unset: every agent.
    agents: list[str] | None = None


class AgentConfig(_Strict):
    description: str = ""
    model: ModelConfig = Field(default_factory=ScriptedModelConfig)
    peers: list[PeerConfig] = Field(default_factory=list)
    tools: list[ToolConfig] = Field(default_factory=list)
    stateless_checkpointing: bool = True
    system_prompt: str | None = None
    max_turns: int = Field(default=25, ge=1)
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig)
    #: What its records in the checkpoint history say it is, and how long they stay.
    agent_type: str = Field(default="general", min_length=1, max_length=64)
    retention: RetentionPolicy = None
    #: Keep an event log of every step and protocol message (meshpoint.events).
    events: bool = False


class MeshConfig(_Strict):
    """A whole deployment; see the module docstring and ``examples/mesh.yaml``.

    Only ``store`` is required: a verifier's config (the store and
    ``history.signing`` with public keys) serves no agent, and is enough for
    ``meshpoint verify``, ``purge`` and the other commands that read the store."""

    namespace: str = Field(default="meshpoint", pattern=_NAME)
    store: StoreConfig
    broker: BrokerConfig = Field(default_factory=BrokerConfig)
    runtime: RuntimeConfig = Field(default_factory=RuntimeConfig)
    agents: dict[str, AgentConfig] = Field(default_factory=dict)
    history: HistoryConfig = Field(default_factory=HistoryConfig)
    #: Who may decide the calls that wait for a human (id -> public key and scope;
    #: :mod:`meshpoint.runtime.approvers`). None configured: anyone may, and the
    #: name a decision gives is recorded as claimed only.
    approvers: dict[str, ApproverConfig] = Field(default_factory=dict)
    #: The mesh's clients by name (their NATS users: ``meshpoint nats-config``).
    clients: dict[str, ClientConfig] = Field(default_factory=dict)

    @field_validator("store", "broker", mode="before")
    @classmethod
    def _url_shorthand(cls, value: Any) -> Any:
        return {"url": value} if isinstance(value, str) else value

    @model_validator(mode="after")
    def _clients_of_known_agents(self) -> MeshConfig:
        for name, client in self.clients.items():
            if not re.match(_NAME, name):
                raise ValueError(f"client name {name!r} must be 1-64 letters, digits, _ or -")
            for agent in client.agents or ():
                if agent not in self.agents:
                    raise ValueError(
                        f"clients.{name}.agents: {agent!r} is not an agent of this file "
                        f"(expected one of {sorted(self.agents)})")
        return self

    @model_validator(mode="after")
    def _approvers_of_known_agents(self) -> MeshConfig:
        for approver, spec in self.approvers.items():
            for agent, tools in spec.agents.items():
                if agent != ANY and agent not in self.agents:
                    raise ValueError(
                        f"approvers.{approver}.agents: {agent!r} is not an agent of this "
                        f"file (expected one of {sorted(self.agents)}, or {ANY!r})")
                known = {t.name for t in self.agents[agent].tools} if agent != ANY else set()
                unknown = sorted(set(tools) - known - {ANY}) if agent != ANY else []
                if unknown:
                    raise ValueError(
                        f"approvers.{approver}.agents.{agent}: {unknown[0]!r} is not a tool "
                        f"of agent {agent!r} (its tools: {sorted(known) or 'none'}, or "
                        f"{ANY!r})")
        return self

    @field_validator("agents")
    @classmethod
    def _known_peers(cls, agents: dict[str, AgentConfig]) -> dict[str, AgentConfig]:
        for name, agent in agents.items():
            if not re.match(_NAME, name):
                raise ValueError(f"agent name {name!r} must be 1-64 letters, digits, _ or -")
            for index, peer in enumerate(agent.peers):
                if peer.agent not in agents:
                    raise ValueError(
                        f"agents.{name}.peers.{index}.agent: {peer.agent!r} is not an agent "
                        f"of this file (expected one of {sorted(agents)})")
        return agents

    def runtime_options(self) -> RuntimeOptions:
        return RuntimeOptions(namespace=self.namespace, **self.runtime.model_dump(
            exclude={"drain_timeout_s", "startup_timeout_s"}))

    def agent_config(self, name: str) -> AgentConfig:
        try:
            return self.agents[name]
        except KeyError:
            defined = ", ".join(sorted(self.agents))
            raise ConfigurationError(
                f"no agent {name!r} in the config (it defines"
                + (f": {defined})" if defined else " none: add it under agents:)")) from None

    def build_agent(self, name: str) -> Agent:
        """The :class:`Agent` called ``name``, with its model and tools built."""
        spec = self.agent_config(name)
        try:
            return self._build_agent(name, spec)
        except InvalidArgumentError as error:
            raise ConfigurationError(f"agents.{name}: {error}") from None

    def _build_agent(self, name: str, spec: AgentConfig) -> Agent:
        return Agent(
            name=name, model=_build_model(name, spec.model), description=spec.description,
            tools=[_build_tool(name, tool) for tool in spec.tools],
            peers=[Peer(agent=p.agent, timeout_s=p.timeout_s, description=p.description,
                        tool_name=p.tool_name) for p in spec.peers],
            stateless_checkpointing=spec.stateless_checkpointing,
            system_prompt=spec.system_prompt, max_turns=spec.max_turns,
            checkpoint=CheckpointPolicy(**spec.checkpoint.model_dump(exclude={"recovery"})),
            recovery=RecoveryPolicy(**spec.checkpoint.recovery.model_dump()),
            agent_type=spec.agent_type, retention=spec.retention, events=spec.events)

    async def open_store(self) -> SqlStore:
        from meshpoint.store import open_store

        s = self.store
        return await open_store(s.url, tenant_id=s.tenant, **s.options(),
                                history=self.history_options())

    def history_options(self) -> HistoryOptions:
        """The store's :class:`~meshpoint.history.HistoryOptions` from ``history:``
        (keys read now: a missing one is a ConfigurationError naming it)."""
        try:
            options = self.history.options()
        except InvalidArgumentError as error:
            raise ConfigurationError(f"history: {error}") from None
        return replace(options, agent_retention={
            name: agent.retention for name, agent in self.agents.items() if agent.retention})

    def build_approvers(self) -> Approvers:
        """The :class:`~meshpoint.runtime.approvers.Approvers` of ``approvers:`` (their
        keys read now: a missing or wrong one is a ConfigurationError naming it)."""
        try:
            return Approvers.from_config(self.approvers)
        except InvalidArgumentError as error:
            raise ConfigurationError(f"approvers: {error}") from None

    def client(self, broker: Broker) -> Client:
        """A :class:`~meshpoint.runtime.Client` of this mesh on ``broker``: its
        namespace and the store's tenant (whose subjects its agents listen on), and,
        when ``broker.user`` is one of the mesh's clients or approvers, that one's
        client id (the only one its NATS permissions allow)."""
        from meshpoint.runtime import Client
        from meshpoint.runtime.subjects import broker_user, tenant_token

        user, client_id = self.broker.user, None
        for role, names in (("client", self.clients), ("approver", self.approvers)):
            for name in names:
                if user == broker_user(self.namespace, self.store.tenant, role, name):
                    client_id = tenant_token(name)
        return Client(broker, namespace=self.namespace, tenant=self.store.tenant,
                      client_id=client_id)

    async def open_broker(self) -> Broker:
        from meshpoint.broker import open_broker

        if self.broker.url.startswith(("nats://", "tls://")):
            password = self.broker.password
            return await open_broker(self.broker.url, tls=self.broker.tls,
                                     **self.broker.model_dump(exclude={"url", "tls",
                                                                       "password"}),
                                     password=None if password is None else
                                     password.get_secret_value())
        return await open_broker(self.broker.url, tls=self.broker.tls,
                                 dedupe_window_s=self.broker.dedupe_window_s)


def _build_model(agent: str,
                 spec: ScriptedModelConfig | OpenAIModelConfig | PythonModelConfig) -> Model:
    where = f"agents.{agent}.model"
    if isinstance(spec, ScriptedModelConfig):
        from meshpoint.llm.scripted import ScriptedModel

        return ScriptedModel(spec.name or agent, persona=spec.persona or agent,
                             rounds=spec.rounds, delay_s=spec.delay_s)
    if isinstance(spec, PythonModelConfig):
        factory = _import(where, spec.factory)
        try:
            model = factory(**spec.options)
        except (TypeError, ValueError, MeshpointError) as error:
            raise ConfigurationError(f"{where}: {spec.factory}(**options) failed: "
                                     f"{error}") from None
        if not isinstance(model, Model):
            raise ConfigurationError(
                f"{where}: {spec.factory} returned {type(model).__name__}, which is not a "
                "meshpoint.llm.Model (it needs a name and an async complete())")
        return model
    from meshpoint.llm.openai import OpenAIModel

    key_env = spec.api_key_env or (None if spec.base_url else "OPENAI_API_KEY")
    key = os.environ.get(key_env) if key_env else None
    if key_env and not key:
        raise ConfigurationError(f"{where}: the API key variable {key_env} is not set"
                                 + ("" if spec.api_key_env else
                                    " (OpenAI's endpoint; set base_url for another)"))
    options = spec.model_dump(exclude={"kind", "name", "base_url", "api_key_env"})
    return OpenAIModel(spec.name, base_url=spec.base_url, api_key=key, **options)


def _build_tool(agent: str, spec: ToolConfig) -> LocalTool:
    where = f"agents.{agent}.tools ({spec.name})"
    fn = _import(where, spec.function)
    needs = spec.needs_approval
    extra: dict[str, Any] = {} if spec.parameters is None else {"parameters": spec.parameters}
    try:
        return LocalTool(spec.name, spec.description or (fn.__doc__ or "").strip(), fn,
                         needs_approval=_import(where, needs) if isinstance(needs, str)
                         else needs, approval_timeout_s=spec.approval_timeout_s, **extra)
    except InvalidArgumentError as error:
        raise ConfigurationError(f"{where}: {error}") from None


def _import(where: str, path: str) -> Any:
    module_name, _, attribute = path.partition(":")
    try:
        return getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as error:
        raise ConfigurationError(f"{where}: cannot import {path!r} ({error})") from None


def load_config(path: str | Path) -> MeshConfig:
    """Read and validate the YAML config at ``path``."""
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text())
    except OSError as error:
        raise ConfigurationError(f"cannot read the config {path}: {error.strerror}") from None
    except yaml.YAMLError as error:
        raise ConfigurationError(f"{path}: not valid YAML: {error}") from None
    if not isinstance(raw, dict):
        raise ConfigurationError(f"{path}: expected a mapping of keys "
                                 f"({', '.join(MeshConfig.model_fields)}), got "
                                 f"{type(raw).__name__}")
    try:
        return MeshConfig.model_validate(_expand_env(raw, ()))
    except ValidationError as error:
        problems = [explain(e, MeshConfig) for e in error.errors(include_url=False)]
        raise ConfigurationError(f"{path}: " + (problems[0] if len(problems) == 1 else (
            f"{len(problems)} problems:\n  - " + "\n  - ".join(problems)))) from None
    except MeshpointError as error:
        raise ConfigurationError(f"{path}: {error}") from None


def _expand_env(value: Any, where: tuple[Any, ...]) -> Any:
    if isinstance(value, dict):
        return {k: _expand_env(v, (*where, k)) for k, v in value.items()}
    if isinstance(value, list):
        return [_expand_env(v, (*where, i)) for i, v in enumerate(value)]
    if isinstance(value, str):
        def substitute(match: re.Match[str]) -> str:
            name, default = match.group(1), match.group(2)
            found = os.environ.get(name, default)
            if found is None:
                raise ConfigurationError(
                    f"{'.'.join(map(str, where))}: environment variable {name} is not set "
                    f"(write ${{{name}:-default}} for a default)")
            return found

        return _ENV.sub(substitute, value)
    return value
