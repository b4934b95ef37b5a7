"""Reading the mesh config file: YAML, ``${VAR}`` expanded, validated into a
:class:`~meshpoint.config.MeshConfig`; every mistake told with the key's path."""

from __future__ import annotations

import os
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml
from pydantic import ValidationError

from meshpoint.config.errors import invalid_file
from meshpoint.config.mesh import MeshConfig
from meshpoint.errors import ConfigurationError, MeshpointError
from meshpoint.runtime.approvers import ApproverKey

if TYPE_CHECKING:
    from meshpoint.runtime import Client

_ENV = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


def load_config(path: str | Path) -> MeshConfig:
    """Read and validate the YAML config at ``path``; the user's code it names is
    imported from its ``python_path:`` or, by default, its directory."""
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
        return MeshConfig.model_validate(_expand_env(raw, ())).with_directory(path.parent)
    except ValidationError as error:
        raise invalid_file(path, error, MeshConfig) from None
    except MeshpointError as error:
        raise ConfigurationError(f"{path}: {error}") from None


@asynccontextmanager
async def open_client(config: str | Path | MeshConfig, *,
                      key: ApproverKey | None = None) -> AsyncIterator[Client]:
    """A client of the deployment ``config`` (a path to its YAML, or the loaded
    config) describes: its broker, namespace and tenant, as ``meshpoint submit``
    uses them. Use as ``async with open_client("mesh.yaml") as client:``; the broker
    it opened is closed on exit. It never creates a namespace's stream: on NATS, a
    namespace no ``meshpoint serve`` has run in raises
    :class:`~meshpoint.errors.NamespaceNotServedError` at once. ``key`` signs the
    client's approvals."""
    mesh = config if isinstance(config, MeshConfig) else load_config(config)
    async with mesh.open_client(key=key) as client:
        yield client


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
