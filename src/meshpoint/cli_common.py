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
import logging
import os
import re
import sys
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn, TypeVar

import typer
from rich.console import Console
from rich.markup import escape

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


# No emoji codes: ``:warning:`` in a stored text is printed as written.
console = Console(width=_width(sys.stdout), emoji=False)
err = Console(stderr=True, width=_width(sys.stderr), emoji=False)

#: What must not reach an operator's terminal as it is: the C0 controls but tab and
#: newline (ESC starts every escape sequence, BEL ends an OSC one, CR and backspace
#: rewrite what is shown), DEL, the C1 controls (CSI and OSC in one code point), and
#: the bidirectional controls that make a line read other than it is.
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f"
                      "\u202a-\u202e\u2066-\u2069]")


def _escaped(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def plain(value: object) -> str:
    """``str(value)`` with every control character shown as its escape (``\\x1b``,
    ``\\u202e``): what a requester wrote (a request, a tool's arguments, an
    approver's name, an error quoting them) is shown to the operator, never run by
    their terminal. For text printed as it is (``print``, a log line)."""
    return _CONTROL.sub(_escaped, str(value))


def shown(value: object) -> str:
    """:func:`plain`, with rich markup escaped too: for every stored or user-given
    text in a table cell or a line printed through :data:`console` or :data:`err`
    (``[/]`` in a request would otherwise stop the command with a MarkupError)."""
    return escape(plain(value))


class PlainFormatter(logging.Formatter):
    """A log formatter whose lines pass through :func:`plain` (a log quotes task ids,
    requests and errors a requester caused; ``serve`` logs to a terminal too)."""

    def format(self, record: logging.LogRecord) -> str:
        return plain(super().format(record))

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
        problem = {"error": str(error), "kind": type(error).__name__}
        if getattr(error, "decision", None) is not None:  # a refused answer's
            problem["decision"] = error.decision  # type: ignore[attr-defined]
        print(json.dumps(problem))
    else:
        err.print(f"[red]error:[/red] {shown(error)}")
    raise typer.Exit(code=1) from None
