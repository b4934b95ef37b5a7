"""What every ``meshpoint`` command that works on a store shares: its options
(``--url``, ``--config``, ``--schema``, ``--tenant``, ``--json``), how the store is
opened from them, and how a meshpoint error becomes a message and exit code 1.

A command reaches the store from any host in one of two ways: a URL (``--url``,
with ``--schema`` for a PostgreSQL schema other than the search path's), or the mesh
config (``--config`` or ``MESHPOINT_CONFIG``), whose ``store`` section gives the URL,
schema and tenant, and whose ``history`` section the keys that sign and encrypt the
checkpoint history (a URL alone verifies hashes, not signatures, and reads no
encrypted field). ``--tenant`` overrides the config's tenant; without either it is
``default``.

Which wins (:func:`store_opener`): an explicit flag, then the config, then the
environment's ``MESHPOINT_STORE_URL``, which is used only when neither ``--url`` nor
a config names a store (a config may read it itself, as ``${MESHPOINT_STORE_URL}``).
A conflict that would change the schema or tenant is named, never settled silently:

* ``--url`` naming another database than the config's ``store.url``, while the
  config's schema or tenant is not overridden by ``--schema``/``--tenant``, is a usage
  error (exit 2): those belong to the config's database, and guessing either way
  reads or writes (``purge``, ``approve``, ``migrate``) another schema's or tenant's
  tasks. An operator who typed both says which they meant in one more flag.
* ``MESHPOINT_STORE_URL`` naming another database than the config is a warning on
  stderr: the rule is clear (the config was given on purpose; the variable is often
  set for other processes), but an operator who expected it to redirect the command
  is told it did not.
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


def _piped(stream: Any) -> bool:
    try:
        return not stream.isatty()
    except (AttributeError, ValueError):  # replaced by a test harness, or closed
        return True


def _width(stream: Any) -> int | None:
    """Rich lays out for 80 columns when its output is not a terminal, so a table
    piped to a file, ``grep`` or ``less`` folded its ids over lines: piped, it lays
    out for up to 200 (``COLUMNS`` still wins; a terminal keeps its own width)."""
    return 200 if _piped(stream) and not os.environ.get("COLUMNS") else None


# No emoji codes: ``:warning:`` in a stored text is printed as written.
console = Console(width=_width(sys.stdout), emoji=False)
#: Piped, a message is one line however long (a path in it is never cut in two).
err = Console(stderr=True, width=_width(sys.stderr), emoji=False,
              soft_wrap=_piped(sys.stderr))

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

#: The environment variable naming a store when no flag or config does.
STORE_URL_ENV = "MESHPOINT_STORE_URL"
Url = Annotated[str | None, typer.Option(
    "--url", help="Store URL (sqlite:///file.db or postgresql+asyncpg://user@host/db); "
                  "wins over --config's. Without either: MESHPOINT_STORE_URL.")]
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
    """The store the options name, by the precedence of the module docstring:
    ``url`` (the ``--url`` flag) over the ``config``'s store over
    ``MESHPOINT_STORE_URL``; ``schema`` and ``tenant`` (flags) over the config's.
    InvalidArgumentError if they name none, ConfigurationError if the config is
    wrong, a usage error for a conflict that would change the schema or tenant."""
    from meshpoint.store import open_store

    from_env = os.environ.get(STORE_URL_ENV) or None
    if config is None:
        chosen = url or from_env
        if chosen is None:
            raise InvalidArgumentError(f"give --url (or {STORE_URL_ENV}) or --config (or "
                                       "MESHPOINT_CONFIG)")
        _check_schema(chosen, schema)
        return open_store(chosen, tenant_id="default" if tenant is None else tenant,
                          schema=schema, migrate=migrate)
    from meshpoint.config import load_config

    mesh = load_config(config)
    s = mesh.store
    if url is not None and url != s.url:
        # Another database than the config's: its schema and tenant are not this
        # one's, and dropping them changes what is read and written.
        dropped = [f"{name} {value!r}" for name, value, given in (
            ("schema", s.schema_name, schema is not None or url.startswith("sqlite")),
            ("tenant", s.tenant, tenant is not None)) if value not in (None, "default")
            and not given]
        if dropped:
            raise typer.BadParameter(
                f"names another database than {config}'s store.url, whose "
                f"{' and '.join(dropped)} would not apply to it: give --schema/--tenant "
                "for this URL, or drop --url to use the config's store", param_hint="--url")
        _check_schema(url, schema)
        return open_store(url, tenant_id="default" if tenant is None else tenant,
                          schema=schema, migrate=migrate, history=mesh.history_options())
    if url is None and from_env is not None and from_env != s.url:
        err.print(f"[yellow]warning:[/yellow] {STORE_URL_ENV} ({_shown(from_env)}) is not "
                  f"used: {config} names the store ({_shown(s.url)}, schema "
                  f"{s.schema_name or '(search path)'}, tenant {tenant or s.tenant!r}); "
                  "--url wins over both", highlight=False)
    _check_schema(s.url, schema)
    return open_store(s.url, tenant_id=s.tenant if tenant is None else tenant,
                      **{**s.options(), "schema": schema or s.schema_name,
                         "migrate": migrate}, history=mesh.history_options())


def _shown(url: str) -> str:
    """A store URL as it may be printed: its password hidden."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        return make_url(url).render_as_string(hide_password=True)
    except ArgumentError:
        return "(not a URL)"


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
