"""The sections of the mesh config file, one model per section (see
:mod:`meshpoint.config`). A section that is also an option group of the Python API
is that group's own type, with what only the file has added: ``runtime:`` is
:class:`~meshpoint.runtime.RuntimeOptions` plus the ``serve`` process's timings,
``checkpoint:`` is :class:`~meshpoint.runtime.agent.CheckpointPolicy` plus its
``recovery:`` (a :class:`~meshpoint.runtime.agent.RecoveryPolicy`), ``handoff:`` is
a :class:`~meshpoint.runtime.options.HandoffPolicy` as it is, and each of ``peers:``
is a :class:`~meshpoint.runtime.Peer`.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    SecretStr,
    Tag,
    field_validator,
    model_validator,
)
from pydantic.dataclasses import dataclass as pydantic_dataclass

from meshpoint._redact import redact_url
from meshpoint._validation import OPTIONS, AtLeastOne, FiniteSeconds, Name, OutputKey, checked
from meshpoint.compression import DEFAULT_MAX_DECOMPRESSED_BYTES
from meshpoint.errors import InvalidArgumentError
from meshpoint.runtime.agent import AgentType, Peer
from meshpoint.runtime.options import (
    CheckpointPolicy,
    HandoffPolicy,
    RecoveryPolicy,
    RuntimeOptions,
)
from meshpoint.runtime.stages import SubAgent
from meshpoint.store.engine import MIGRATION_LOCK_TIMEOUT_S
from meshpoint.tls import TlsConfig

if TYPE_CHECKING:
    from meshpoint.history.planning import HistoryOptions

#: ``package.module:name``: a class or a function the file names.
ImportPath = Annotated[str, Field(pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")]


def _policy(value: str | None) -> str | None:
    """A retention policy, checked when the file is read (ValueError names the forms)."""
    from meshpoint.history.planning import parse_retention

    if value is not None:
        try:
            parse_retention(value)
        except InvalidArgumentError as error:
            raise ValueError(str(error)) from None
    return value


def _families(value: list[str]) -> list[str]:
    """Families of encrypted columns, checked when the file is read."""
    from meshpoint.history.encryption import check_families

    try:
        check_families(value)
    except InvalidArgumentError as error:
        raise ValueError(str(error)) from None
    return value


#: ``days:N``, ``last:N`` or ``hold`` (:func:`meshpoint.history.planning.parse_retention`).
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
    #: A PostgreSQL schema (search_path) to keep meshpoint's tables in; empty (as
    #: ``${MESHPOINT_STORE_SCHEMA:-}`` unset gives): none, as for a SQLite store.
    schema_name: str | None = Field(default=None, alias="schema")
    tenant: str = "default"

    @field_validator("schema_name", mode="before")
    @classmethod
    def _empty_is_unset(cls, value: Any) -> Any:
        return None if value == "" else value
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


@checked
@pydantic_dataclass(frozen=True, config=OPTIONS)
class RuntimeConfig(RuntimeOptions):
    """The ``runtime:`` section: :class:`~meshpoint.runtime.RuntimeOptions` (whose
    ``namespace`` is the file's, at its top level), and two timings of the ``serve``
    process."""

    #: The file names the namespace at its top level: this section does not.
    __hidden_keys__: ClassVar[tuple[str, ...]] = ("namespace",)

    #: On SIGTERM, how long to let the work in hand reach its pause or its end.
    drain_timeout_s: Annotated[float, Field(ge=0)] = 20.0
    #: How long ``serve`` retries an unreachable store or broker before giving up.
    startup_timeout_s: Annotated[float, Field(ge=0)] = 120.0

    @model_validator(mode="before")
    @classmethod
    def _namespace_is_the_files(cls, data: Any) -> Any:
        if isinstance(data, dict) and "namespace" in data:
            raise ValueError("namespace is set at the top level of the file, not under "
                             "runtime:")
        return data

    def options(self, namespace: str) -> RuntimeOptions:
        """The :class:`~meshpoint.runtime.RuntimeOptions` of the mesh ``namespace``."""
        values = {f.name: getattr(self, f.name) for f in dataclasses.fields(RuntimeOptions)}
        return RuntimeOptions(**{**values, "namespace": namespace})


class ScriptedModelConfig(_Strict):
    """The deterministic offline model (plans one peer call per topic of the request)."""

    kind: Literal["scripted"] = "scripted"
    name: str | None = None
    persona: str | None = None
    rounds: int = Field(default=1, ge=1)
    delay_s: float = Field(default=0.0, ge=0)
    #: Tokens its context window holds, as if it had one (what the handoff's
    #: context-utilization trigger measures against); unset: none, and that trigger
    #: never fires.
    context_window: int | None = Field(default=None, ge=1)
    #: Calls the agent's ``handoff`` tool after this many rounds of an iteration (a
    #: model that asks for a fresh context); unset: never.
    handoff_after: int | None = Field(default=None, ge=1)
    #: Calls the tool that ends a phase after this many rounds of an iteration.
    phase_after: int | None = Field(default=None, ge=1)


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
    #: Tokens of the model's context window (what the handoff's context-utilization
    #: trigger measures against). Unset: read from the server where it says
    #: (llama.cpp's ``GET /props``, vLLM's ``GET /v1/models``), once, after the first
    #: call; a server that does not say leaves it unknown, and that trigger off.
    context_window: int | None = Field(default=None, ge=1)
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
    factory: ImportPath
    #: Not in the repr: they may hold the model's credentials.
    options: dict[str, Any] = Field(default_factory=dict, repr=False)


ModelConfig = Annotated[ScriptedModelConfig | OpenAIModelConfig | PythonModelConfig,
                        Field(discriminator="kind")]


def _model_or_name(value: Any) -> str:
    return "name" if isinstance(value, str) else "model"


#: An agent's ``model:``: a model, or a name under ``models:`` (the errors of one only).
ModelOrName = Annotated[Annotated[ModelConfig, Tag("model")] | Annotated[Name, Tag("name")],
                        Discriminator(_model_or_name)]


class ToolConfig(_Strict):
    """A local tool: a Python callable named ``package.module:function``."""

    name: Name
    function: ImportPath
    description: str = ""
    #: true: every call waits for a human's approval; ``package.module:function``: a
    #: predicate on the call's arguments says which calls do.
    needs_approval: bool | ImportPath = False
    #: Seconds a call waits for approval before it is denied ("timed out").
    approval_timeout_s: FiniteSeconds = 3600.0
    #: The JSON schema of the arguments (edited arguments must satisfy it).
    parameters: dict[str, Any] | None = None


@checked
@pydantic_dataclass(frozen=True, config=OPTIONS)
class CheckpointConfig(CheckpointPolicy):
    """An agent's ``checkpoint:`` section: its
    :class:`~meshpoint.runtime.agent.CheckpointPolicy`, and its ``recovery:``."""

    recovery: RecoveryPolicy = dataclasses.field(default_factory=RecoveryPolicy)

    def policy(self) -> CheckpointPolicy:
        """The :class:`~meshpoint.runtime.agent.CheckpointPolicy` alone."""
        return CheckpointPolicy(**{f.name: getattr(self, f.name)
                                   for f in dataclasses.fields(CheckpointPolicy)})


class SigningConfig(_Strict):
    """Ed25519 keys that sign the checkpoint history (see :class:`meshpoint.history.integrity.
    SigningKeys`): ``keys`` maps a key id to ``env:VAR``, ``file:PATH`` or the key (a
    PEM private or public key, or the base64 of a 32-byte seed); ``active`` signs."""

    active: str | None = None
    #: Secret strings: a key given inline (or through ``${VAR}``) is never printed.
    keys: dict[str, SecretStr] = Field(default_factory=dict)
    #: Unsigned records fail verification (default: whenever a key is configured).
    require_signatures: bool | None = None


class EncryptionConfig(_Strict):
    """AES-GCM encryption at rest (:mod:`meshpoint.history.encryption`): every column that
    carries user content (:mod:`meshpoint.store.sealing`), and history fields."""

    #: The key ring file (``meshpoint keys rotate`` writes it).
    keyring: str
    #: Record fields to encrypt besides the security context (dotted paths).
    fields: list[str] = Field(default_factory=list)
    #: Families of columns left in clear (context, conversation, calls, snapshots,
    #: events, langgraph); none by default.
    exclude: Annotated[list[str], AfterValidator(_families)] = Field(default_factory=list)


class HistoryConfig(_Strict):
    """The checkpoint history (:class:`meshpoint.history.planning.HistoryOptions`)."""

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
        from meshpoint.history.costs import Prices
        from meshpoint.history.encryption import load_keyring
        from meshpoint.history.integrity import SigningKeys
        from meshpoint.history.planning import HistoryOptions

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


class MetricsConfig(_Strict):
    """The ``metrics:`` section: where ``meshpoint serve`` serves Prometheus's
    ``/metrics`` (docs/operations.md); ``--metrics-port`` and ``--metrics-host`` win."""

    #: The TCP port; 0 picks a free one (``serve`` logs the URL).
    port: int = Field(ge=0, le=65535)
    #: The address to listen on: loopback unless said otherwise (the figures name
    #: agents and counts, not tasks; a scraper elsewhere needs ``0.0.0.0``).
    host: str = "127.0.0.1"


class SyncConfig(_Strict):
    """The ``sync:`` section: ``meshpoint serve`` on a SQLite store pushes it to this
    cloud PostgreSQL store in the background (docs/sync.md), as ``meshpoint sync
    --follow`` does; the tenant is the store's, and chains are verified on arrival
    with the keys of ``history.signing``."""

    #: The cloud store's URL (``postgresql://user@host/db``, the runtime role's).
    to: str
    #: Its PostgreSQL schema; unset: the search path.
    schema_name: str | None = Field(default=None, alias="schema")
    #: The longest wait between passes (a pass starts as soon as the file has new rows).
    interval_s: float = Field(default=10.0, gt=0)
    #: Source rows per cloud transaction.
    batch: int = Field(default=500, ge=1, le=10_000)
    #: The longest wait between tries while the cloud is unreachable.
    max_backoff_s: float = Field(default=60.0, gt=0)
    #: Push without ``history.signing`` keys, the chains' signatures unchecked on
    #: arrival (``meshpoint sync --unsigned``); without it, such a section is refused.
    unsigned: bool = False

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    def __repr_args__(self) -> Any:
        for name, value in super().__repr_args__():
            yield name, redact_url(value) if name == "to" else value


class ClientConfig(_Strict):
    """A client of the mesh (a web backend, ``meshpoint submit``): it gets a NATS user
    of its own from ``meshpoint nats-config``, which may submit to ``agents`` only."""

    #: The agents it may send tasks (and cancels) to; unset: every agent.
    agents: list[str] | None = None


class AgentConfig(_Strict):
    description: str = ""
    #: The model (a mapping with its ``kind``), or the name of one under the file's
    #: ``models:`` (a model several agents share, switched in one place).
    model: ModelOrName = Field(default_factory=ScriptedModelConfig)
    peers: list[Peer] = Field(default_factory=list)
    tools: list[ToolConfig] = Field(default_factory=list)
    stateless_checkpointing: bool = True
    system_prompt: str | None = None
    max_turns: AtLeastOne = 25
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig)
    #: What its records in the checkpoint history say it is, and how long they stay.
    agent_type: AgentType = "general"
    retention: RetentionPolicy = None
    #: Keep an event log of every step and protocol message (meshpoint.events.log).
    events: bool = False
    #: When its tasks hand off to a fresh-context iteration (docs/handoff.md):
    #: ``handoff: {}`` for the defaults; absent (or null), never.
    handoff: HandoffPolicy | None = None
    #: ``llm`` (an agent with a model; the default) or a workflow agent's kind, whose
    #: stages are ``sub_agents`` (docs/workflows.md).
    kind: Literal["llm", "sequential", "parallel", "loop"] = "llm"
    #: Its stages: agents of the file, each a name or ``{agent, output_key, timeout_s}``.
    sub_agents: list[SubAgent] = Field(default_factory=list)
    #: A loop's rounds at most (absent: until a sub-agent escalates).
    max_iterations: AtLeastOne | None = None
    #: Where a workflow that calls this agent stores its answer (default: its name).
    output_key: OutputKey | None = None

    #: What a workflow agent may not be given (it has no model of its own).
    _NOT_FOR_WORKFLOWS: ClassVar[tuple[str, ...]] = (
        "model", "tools", "peers", "system_prompt", "handoff", "max_turns")

    @field_validator("sub_agents", mode="before")
    @classmethod
    def _names_as_stages(cls, value: Any) -> Any:
        if isinstance(value, list):
            return [{"agent": item} if isinstance(item, str) else item for item in value]
        return value

    @model_validator(mode="after")
    def _workflow_fields(self) -> AgentConfig:
        if self.kind == "llm":
            for what in ("sub_agents", "max_iterations"):
                if what in self.model_fields_set:
                    raise ValueError(f"{what} is for workflow agents (kind: sequential, "
                                     "parallel or loop)")
            return self
        if not self.sub_agents:
            raise ValueError(f"a {self.kind} agent needs sub_agents: (the agents its "
                             "stages call)")
        given = [f for f in self._NOT_FOR_WORKFLOWS if f in self.model_fields_set]
        if given:
            raise ValueError(f"a {self.kind} agent has no model of its own, so no "
                             f"{given[0]}: (give it to its sub_agents)")
        if not self.stateless_checkpointing:
            raise ValueError(f"a {self.kind} agent checkpoints at every stage boundary: "
                             "stateless_checkpointing must be true")
        if self.max_iterations is not None and self.kind != "loop":
            raise ValueError(f"max_iterations is for loop agents, not {self.kind}")
        return self
