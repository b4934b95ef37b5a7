"""The mesh config file: one YAML document for every process of a deployment.

It names the namespace, where checkpoints live (``store``), how messages travel
(``broker``), the runtime's timings and each agent with its model, peers and
tools. ``meshpoint serve``, ``submit`` and ``migrate`` read it; so can code::

    config = load_config("mesh.yaml")
    agent = config.build_agent("coordinator")

    async with open_client("mesh.yaml") as client:  # a client of the deployment
        answer = await client.ask("coordinator", "Plan a trip")

Strings may use ``${VAR}`` or ``${VAR:-default}`` to read the environment (secrets,
per-host URLs). Every mistake is reported with the file, the key (as a dotted path
such as ``agents.coordinator.peers.0.timeout_s``) and what was expected.

This package owns the file's sections (:mod:`~meshpoint.config.sections`, one model
each; those that are option groups of the Python API are those groups' own types),
the whole file and what it builds (:mod:`~meshpoint.config.mesh`), reading it
(:mod:`~meshpoint.config.loading`) and telling its mistakes
(:mod:`~meshpoint.config.errors`). It may import every other part of meshpoint;
none of them imports it but the command line and ``serve``.
"""

from __future__ import annotations

import warnings
from typing import Any

from meshpoint.config.loading import load_config, open_client
from meshpoint.config.mesh import MeshConfig
from meshpoint.config.sections import (
    AgentConfig,
    BrokerConfig,
    CheckpointConfig,
    ClientConfig,
    EncryptionConfig,
    HistoryConfig,
    ImportPath,
    MetricsConfig,
    ModelConfig,
    OpenAIModelConfig,
    PythonModelConfig,
    RetentionPolicy,
    RuntimeConfig,
    ScriptedModelConfig,
    SigningConfig,
    StoreConfig,
    SyncConfig,
    ToolConfig,
)

#: Names that were sections of their own and are now the Python API's types.
_MOVED = {"PeerConfig": ("meshpoint.runtime", "Peer"),
          "RecoveryConfig": ("meshpoint.runtime.agent", "RecoveryPolicy")}


def __getattr__(name: str) -> Any:
    if name in _MOVED:
        module, new = _MOVED[name]
        warnings.warn(f"meshpoint.config.{name} is {module}.{new}, which the config file "
                      "now reads too; import that", DeprecationWarning, stacklevel=2)
        return getattr(__import__(module, fromlist=[new]), new)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["AgentConfig", "BrokerConfig", "CheckpointConfig", "ClientConfig",
           "EncryptionConfig", "HistoryConfig", "ImportPath", "MeshConfig", "MetricsConfig",
           "ModelConfig",
           "OpenAIModelConfig", "PythonModelConfig", "RetentionPolicy", "RuntimeConfig",
           "ScriptedModelConfig", "SigningConfig", "StoreConfig", "SyncConfig", "ToolConfig",
           "load_config", "open_client"]
