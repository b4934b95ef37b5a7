"""What every ``meshpoint`` command that works on a store shares: its options
(``--url``, ``--config``, ``--schema``, ``--tenant``, ``--json``), how the store is
opened from them, and how a meshpoint error becomes a message and exit code 1.

A command reaches the store from any host in one of two ways: a URL (``--url`` or
``MESHPOINT_STORE_URL``, with ``--schema`` for a PostgreSQL schema other than the
search path's), or the mesh config (``--config`` or ``MESHPOINT_CONFIG``), whose
``store`` section gives the URL, schema and tenant, and whose ``history`` section
the keys that sign and encrypt the checkpoint history (a URL alone verifies hashes,
not signatures, and reads no encrypted field). ``--tenant`` overrides the config's
tenant; without either it is ``default``.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn, TypeVar

import typer
from rich.console import Console

from meshpoint.errors import InvalidArgumentError, MeshpointError

if TYPE_CHECKING:
    from meshpoint.store import StoreOpener

R = TypeVar("R")


def _width(stream: Any) -> int | None:
    """Rich lays out for 80 columns when its output is not a terminal, so a table
    piped to a file, ``grep`` or ``less`` folded its ids over lines: piped, it lays
    out for up to 200 (``COLUMNS`` still wins; a terminal keeps its own width)."""
    try:
        piped = not stream.isatty()
    except (AttributeError, ValueError):  # replaced by a test harness, or closed
        piped = True
    return 200 if piped and not os.environ.get("COLUMNS") else None


console = Console(width=_width(sys.stdout))
err = Console(stderr=True, width=_width(sys.stderr))

Url = Annotated[str | None, typer.Option(
    "--url", envvar="MESHPOINT_STORE_URL",
    help="Store URL (sqlite:///file.db or postgresql+asyncpg://user@host/db), or give "
         "--config.")]
Config = Annotated[Path | None, typer.Option("--config", "-c", envvar="MESHPOINT_CONFIG",
                                             help="The mesh config (YAML).")]
Schema = Annotated[str | None, typer.Option(
    "--schema", help="PostgreSQL schema of meshpoint's tables (default: the config's, "
                     "or the search path).")]
Tenant = Annotated[str | None, typer.Option(
    "--tenant", help="Tenant id (default: the config's, or 'default').")]
AsJson = Annotated[bool, typer.Option("--json", help="Print one JSON object.")]


def store_opener(url: str | None, config: Path | None, *, schema: str | None = None,
                 tenant: str | None = None, migrate: bool = False) -> StoreOpener:
    """The store the options name (see the module docstring); InvalidArgumentError if
    they name none, ConfigurationError if the config is wrong."""
    from meshpoint.store import open_store

    if url is not None:
        _check_schema(url, schema)
        return open_store(url, tenant_id="default" if tenant is None else tenant,
                          schema=schema, migrate=migrate)
    if config is None:
        raise InvalidArgumentError("give --url (or MESHPOINT_STORE_URL) or --config "
                                   "(or MESHPOINT_CONFIG)")
    from meshpoint.config import load_config

    mesh = load_config(config)
    s = mesh.store
    _check_schema(s.url, schema)
    return open_store(s.url, tenant_id=s.tenant if tenant is None else tenant,
                      **{**s.options(), "schema": schema or s.schema_name,
                         "migrate": migrate}, history=mesh.history_options())


def _check_schema(url: str, schema: str | None) -> None:
    if schema is not None and url.startswith("sqlite"):
        raise typer.BadParameter("a PostgreSQL schema; this store is SQLite, which has none",
                                 param_hint="--schema")


def run_on_store(url: str | None, config: Path | None, schema: str | None,
                 tenant: str | None, as_json: bool,
                 body: Callable[[Any], Awaitable[R]], *, migrate: bool = False) -> R:
    """Open the store the options name, run ``body(store)``, close it; a meshpoint
    error is printed (as JSON with ``--json``) and exits 1."""
    async def run() -> R:
        async with store_opener(url, config, schema=schema, tenant=tenant,
                                migrate=migrate) as store:
            return await body(store)

    return run_sync(run, as_json)


def run_sync(run: Callable[[], Coroutine[Any, Any, R]], as_json: bool = False) -> R:
    """``asyncio.run(run())``, a meshpoint error printed and turned into exit code 1."""
    try:
        return asyncio.run(run())
    except MeshpointError as error:
        fail(error, as_json)


def fail(error: MeshpointError, as_json: bool = False) -> NoReturn:
    """Print ``error`` (one JSON object with ``--json``: error, kind and, for a refused
    answer, the decision that stands) and exit 1."""
    if as_json:
        shown = {"error": str(error), "kind": type(error).__name__}
        if getattr(error, "decision", None) is not None:  # a refused answer's
            shown["decision"] = error.decision  # type: ignore[attr-defined]
        print(json.dumps(shown))
    else:
        err.print(f"[red]error:[/red] {error}")
    raise typer.Exit(code=1) from None
