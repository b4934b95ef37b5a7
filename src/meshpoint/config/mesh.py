"""The whole mesh config (:class:`MeshConfig`) and what it builds: agents with their
models and tools, the store, the broker, a client, the approvers."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import Field, PrivateAttr, field_validator, model_validator

from meshpoint._validation import Name, check_name
from meshpoint.config.imports import import_object
from meshpoint.config.sections import (
    AgentConfig,
    BrokerConfig,
    ClientConfig,
    HistoryConfig,
    MetricsConfig,
    ModelConfig,
    OpenAIModelConfig,
    PythonModelConfig,
    RuntimeConfig,
    ScriptedModelConfig,
    StoreConfig,
    SyncConfig,
    ToolConfig,
    _Strict,
)
from meshpoint.errors import ConfigurationError, InvalidArgumentError, MeshpointError
from meshpoint.llm.base import Model
from meshpoint.runtime.agent import Agent, LocalTool
from meshpoint.runtime.approvers import ANY, ApproverConfig, ApproverKey, Approvers
from meshpoint.runtime.options import AlertOptions, RuntimeOptions
from meshpoint.runtime.stages import SubAgent, default_output_key
from meshpoint.runtime.workflows import WORKFLOW_AGENTS

if TYPE_CHECKING:
    from meshpoint.broker import Broker
    from meshpoint.history.planning import HistoryOptions
    from meshpoint.runtime import AgentInstance, Client
    from meshpoint.store import SqlStore

class MeshConfig(_Strict):
    """A whole deployment; see the module docstring and ``examples/mesh.yaml``.

    Only ``store`` is required: a verifier's config (the store and
    ``history.signing`` with public keys) serves no agent, and is enough for
    ``meshpoint verify``, ``purge`` and the other commands that read the store."""

    namespace: Name = "meshpoint"
    store: StoreConfig
    broker: BrokerConfig = Field(default_factory=BrokerConfig)
    runtime: RuntimeConfig = Field(default_factory=RuntimeConfig)
    agents: dict[str, AgentConfig] = Field(default_factory=dict)
    #: Models by name, for agents that give a name as their ``model:`` (one endpoint
    #: several agents use; ``model: ${MY_MODEL:-local}`` picks one per run).
    models: dict[str, ModelConfig] = Field(default_factory=dict)
    history: HistoryConfig = Field(default_factory=HistoryConfig)
    #: Who may decide the calls that wait for a human (id -> public key and scope;
    #: :mod:`meshpoint.runtime.approvers`). None configured: anyone may, and the
    #: name a decision gives is recorded as claimed only.
    approvers: dict[str, ApproverConfig] = Field(default_factory=dict)
    #: The mesh's clients by name (their NATS users: ``meshpoint nats-config``).
    clients: dict[str, ClientConfig] = Field(default_factory=dict)
    #: Where every agent's alerts go besides its alert subject and the event log (a
    #: webhook; docs/runtime.md, "Recovery limits, the circuit breaker and alerts").
    alerts: AlertOptions = Field(default_factory=AlertOptions)
    #: Where ``meshpoint serve`` serves Prometheus metrics; unset: it serves none.
    metrics: MetricsConfig | None = None
    #: The cloud store ``meshpoint serve`` pushes this (SQLite) store to in the
    #: background (docs/sync.md); unset: none.
    sync: SyncConfig | None = None
    #: Where the user's code the file names (``module:function`` tools, predicates,
    #: model factories) is imported from: directories, relative to the config file,
    #: put at the front of the import path. Not given: the config file's directory.
    python_path: list[str] = Field(default_factory=list)
    #: The directory of the file this config was read from (load_config), if any.
    _directory: Path | None = PrivateAttr(default=None)

    @field_validator("store", "broker", mode="before")
    @classmethod
    def _url_shorthand(cls, value: Any) -> Any:
        return {"url": value} if isinstance(value, str) else value

    @model_validator(mode="after")
    def _clients_of_known_agents(self) -> MeshConfig:
        for name, client in self.clients.items():
            check_name("a client name", name)
            for agent in client.agents or ():
                if agent not in self.agents:
                    raise ValueError(
                        f"clients.{name}.agents: {agent!r} is not an agent of this file "
                        f"(expected one of {sorted(self.agents)})")
        return self

    @model_validator(mode="after")
    def _sync_of_a_local_store(self) -> MeshConfig:
        if self.sync is not None and not self.store.url.startswith("sqlite"):
            raise ValueError("sync: pushes a local SQLite store to the cloud; this "
                             "store is not SQLite (remove the sync: section)")
        if self.sync is not None and not self.sync.unsigned and not self.history.signing.keys:
            raise ValueError("sync: checks the history chains' signatures on arrival with "
                             "the keys of history.signing, and this file has none: add "
                             "them, or sync: {unsigned: true} to push chains whose "
                             "signatures nobody checks")
        return self

    @model_validator(mode="after")
    def _known_models(self) -> MeshConfig:
        for name, agent in self.agents.items():
            if isinstance(agent.model, str) and agent.model not in self.models:
                defined = ", ".join(sorted(self.models))
                raise ValueError(
                    f"agents.{name}.model: {agent.model!r} is not a model of this file ("
                    + (f"models: defines {defined}" if defined else
                       "it has no models: section") + "; or give the model itself, "
                    "e.g. {kind: scripted})")
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
            check_name("an agent name", name)
            for index, peer in enumerate(agent.peers):
                if peer.agent not in agents:
                    raise ValueError(
                        f"agents.{name}.peers.{index}.agent: {peer.agent!r} is not an agent "
                        f"of this file (expected one of {sorted(agents)})")
            for index, phase in enumerate(agent.handoff.phases if agent.handoff else ()):
                # The next phase's agent takes the handoff: its instances must listen.
                where = f"agents.{name}.handoff.phases.{index}.agent"
                if phase.agent is not None and phase.agent not in agents:
                    raise ValueError(f"{where}: {phase.agent!r} is not an agent of this "
                                     f"file (expected one of {sorted(agents)})")
                if phase.agent is not None and agents[phase.agent].handoff is None:
                    raise ValueError(f"{where}: agent {phase.agent!r} has no handoff: "
                                     "section, so its instances never take a handoff "
                                     "(give it one: handoff: {} for the defaults)")
        return agents

    @field_validator("agents")
    @classmethod
    def _known_sub_agents(cls, agents: dict[str, AgentConfig]) -> dict[str, AgentConfig]:
        def stages(name: str) -> list[str]:
            return [item.agent for item in agents[name].sub_agents]

        for name, spec in agents.items():
            keys: dict[str, int] = {}
            for index, item in enumerate(spec.sub_agents):
                if item.agent not in agents:
                    raise ValueError(
                        f"agents.{name}.sub_agents.{index}: {item.agent!r} is not an agent "
                        f"of this file (expected one of {sorted(agents)})")
                key = default_output_key(item.agent, item.output_key,
                                         agents[item.agent].output_key)
                if key in keys:
                    raise ValueError(
                        f"agents.{name}.sub_agents.{index}: output_key {key!r} is also "
                        f"sub_agents.{keys[key]}'s (give each stage its own output_key)")
                keys[key] = index
        for name in agents:  # a workflow that reaches itself through its stages
            path = [name]
            todo = [(sub, [name]) for sub in stages(name)]
            while todo:
                sub, path = todo.pop()
                if sub == name:
                    raise ValueError(f"agents.{name}.sub_agents: a cycle: "
                                     + " -> ".join([*path, name]))
                if sub not in path:
                    todo += [(s, [*path, sub]) for s in stages(sub)]
        return agents

    def runtime_options(self) -> RuntimeOptions:
        """The :class:`~meshpoint.runtime.RuntimeOptions` of ``runtime:``, in the
        file's namespace."""
        return self.runtime.options(self.namespace)

    def agent_config(self, name: str) -> AgentConfig:
        try:
            return self.agents[name]
        except KeyError:
            defined = ", ".join(sorted(self.agents))
            raise ConfigurationError(
                f"no agent {name!r} in the config (it defines"
                + (f": {defined})" if defined else " none: add it under agents:)")) from None

    def import_path(self) -> list[Path]:
        """The directories the user's code is imported from (``python_path:``,
        relative to the config file; or the file's own directory; or, for a config
        not read from a file, the relative ``python_path:`` entries from the working
        directory), absolute; ConfigurationError for an entry that is no directory."""
        base = self._directory or Path.cwd()
        if not self.python_path:
            return [] if self._directory is None else [self._directory]
        found = [(base / entry).resolve() for entry in self.python_path]
        relative_to = "the config file" if self._directory else "the working directory"
        for entry, directory in zip(self.python_path, found, strict=True):
            if not directory.is_dir():
                raise ConfigurationError(
                    f"python_path: {entry!r} ({directory}) is not a directory (its "
                    f"entries are relative to {relative_to})")
        return found

    def with_directory(self, directory: Path) -> MeshConfig:
        """This config as read from a file in ``directory`` (:meth:`import_path`)."""
        self._directory = directory.resolve()
        return self

    def build_agent(self, name: str) -> Agent:
        """The :class:`Agent` called ``name``, with its model and tools built (their
        code imported from :meth:`import_path` first, then the Python path)."""
        spec = self.agent_config(name)
        try:
            return self._build_agent(name, spec, self.import_path())
        except InvalidArgumentError as error:
            raise ConfigurationError(f"agents.{name}: {error}") from None

    def _build_agent(self, name: str, spec: AgentConfig, path: Sequence[Path]) -> Agent:
        if spec.kind != "llm":
            loop: dict[str, Any] = ({"max_iterations": spec.max_iterations}
                                    if spec.kind == "loop" else {})
            return WORKFLOW_AGENTS[spec.kind](
                name=name, description=spec.description, sub_agents=[
                    self._sub_agent(item) for item in spec.sub_agents],
                output_key=spec.output_key, stateless_checkpointing=True,
                checkpoint=spec.checkpoint.policy(), recovery=spec.checkpoint.recovery,
                agent_type=spec.agent_type, retention=spec.retention, events=spec.events,
                **loop)
        return Agent(
            name=name, model=_build_model(name, self.models[spec.model]
                                          if isinstance(spec.model, str) else spec.model,
                                          path),
            description=spec.description,
            tools=[_build_tool(name, tool, path) for tool in spec.tools],
            peers=spec.peers,
            stateless_checkpointing=spec.stateless_checkpointing,
            system_prompt=spec.system_prompt, max_turns=spec.max_turns,
            checkpoint=spec.checkpoint.policy(), recovery=spec.checkpoint.recovery,
            agent_type=spec.agent_type, retention=spec.retention, events=spec.events,
            handoff=spec.handoff, output_key=spec.output_key)

    def _sub_agent(self, stage: SubAgent) -> SubAgent:
        """A stage as the file gives it, its output key defaulting to its agent's."""
        if stage.output_key is None and self.agents[stage.agent].output_key is not None:
            stage = SubAgent(agent=stage.agent, output_key=self.agents[stage.agent].output_key,
                             timeout_s=stage.timeout_s)
        return stage

    async def open_store(self) -> SqlStore:
        from meshpoint.store import open_store

        s = self.store
        return await open_store(s.url, tenant_id=s.tenant, **s.options(),
                                history=self.history_options())

    def history_options(self) -> HistoryOptions:
        """The store's :class:`~meshpoint.history.planning.HistoryOptions` from ``history:``
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

    def instance(self, agent: Agent, store: SqlStore, broker: Broker, *,
                 approvers: Approvers, instance_id: str | None = None) -> AgentInstance:
        """An (unstarted) instance of ``agent`` (:meth:`build_agent`) on ``store`` and
        ``broker`` with this file's runtime options and alerts, as ``serve`` and
        :func:`meshpoint.embedded.embedded` run it; ``approvers`` (read once,
        :meth:`build_approvers`) decide its tools' approvals."""
        from meshpoint.runtime import AgentInstance

        return AgentInstance(agent, store, broker, instance_id=instance_id,
                             options=self.runtime_options(), approvers=approvers,
                             alerts=self.alerts)

    @property
    def networked_broker(self) -> bool:
        """Whether ``broker.url`` is NATS (``nats://``, ``tls://``), which processes
        share; else ``memory://``, which reaches this process's agents only."""
        return self.broker.url.startswith(("nats://", "tls://"))

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

    @asynccontextmanager
    async def open_client(self, *, key: ApproverKey | None = None) -> AsyncIterator[Client]:
        """A started :meth:`client` of this mesh on a broker of its own, opened as a
        client's (``create_streams=False``: a namespace no ``serve`` has run in is
        refused with NamespaceNotServedError, not created); both closed on exit.
        ``key`` signs its approvals (see :class:`~meshpoint.runtime.Client`). A
        ``memory://`` broker is refused: it would reach no agent but this process's."""
        if not self.networked_broker:
            raise ConfigurationError(
                f"broker.url is {self.broker.url}, which reaches only agents of its own "
                "process: a client of another process needs the deployment's NATS "
                "(nats://host:4222); in one process, meshpoint.embedded(config) serves "
                "the agents and gives a client")
        broker = await self.open_broker(create_streams=False)
        try:
            async with self.client(broker) as client:
                client.key = key
                yield client
        finally:
            await broker.close()

    async def open_broker(self, *, create_streams: bool = True) -> Broker:
        """The config's broker. ``create_streams=False`` is a client's: on NATS, the
        namespace's stream must exist (a ``serve`` created it), else
        :class:`~meshpoint.errors.NamespaceNotServedError`."""
        from meshpoint.broker import open_broker

        if self.networked_broker:
            password = self.broker.password
            return await open_broker(self.broker.url, tls=self.broker.tls,
                                     **self.broker.model_dump(exclude={"url", "tls",
                                                                       "password"}),
                                     password=None if password is None else
                                     password.get_secret_value(),
                                     create_streams=create_streams)
        return await open_broker(self.broker.url, tls=self.broker.tls,
                                 dedupe_window_s=self.broker.dedupe_window_s)


def _build_model(agent: str,
                 spec: ScriptedModelConfig | OpenAIModelConfig | PythonModelConfig,
                 path: Sequence[Path]) -> Model:
    where = f"agents.{agent}.model"
    if isinstance(spec, ScriptedModelConfig):
        from meshpoint.llm.scripted import ScriptedModel

        return ScriptedModel(spec.name or agent, persona=spec.persona or agent,
                             rounds=spec.rounds, delay_s=spec.delay_s,
                             context_window=spec.context_window,
                             handoff_after=spec.handoff_after, phase_after=spec.phase_after)
    if isinstance(spec, PythonModelConfig):
        factory = import_object(where, spec.factory, path)
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


def _build_tool(agent: str, spec: ToolConfig, path: Sequence[Path]) -> LocalTool:
    where = f"agents.{agent}.tools ({spec.name})"
    fn = import_object(where, spec.function, path)
    needs = spec.needs_approval
    extra: dict[str, Any] = {} if spec.parameters is None else {"parameters": spec.parameters}
    try:
        return LocalTool(spec.name, spec.description or (fn.__doc__ or "").strip(), fn,
                         needs_approval=import_object(where, needs, path)
                         if isinstance(needs, str)
                         else needs, approval_timeout_s=spec.approval_timeout_s, **extra)
    except InvalidArgumentError as error:
        raise ConfigurationError(f"{where}: {error}") from None

