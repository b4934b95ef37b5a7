"""``meshpoint gateway``: every agent of a mesh config as an A2A server over HTTP
(:mod:`meshpoint.integrations.a2a`), for any A2A client."""

from __future__ import annotations

import asyncio
import logging
import sys
from typing import Annotated

import typer

from meshpoint.cli.common import fail
from meshpoint.errors import MeshpointError


def _kept_off_the_command_line(value: str | None) -> str | None:
    if value is None or value.startswith(("env:", "file:")):
        return value
    raise typer.BadParameter("a token written in the command line is seen by every user of "
                             "this host (ps) and kept in shell history: give file:PATH or "
                             "env:VAR")


def gateway(
    config: Annotated[str, typer.Option("--config", "-c", help="The mesh config (YAML).")],
    port: Annotated[int, typer.Option(min=1, max=65535, help="The port to listen on.")] = 8000,
    host: Annotated[str, typer.Option(help="The address to listen on.")] = "127.0.0.1",
    tokens: Annotated[str | None, typer.Option(
        "--tokens", envvar="MESHPOINT_GATEWAY_TOKENS_FROM",
        callback=_kept_off_the_command_line,
        help="Require a bearer token: file:PATH or env:VAR holding NAME:TOKEN lines, one "
             "per client (never the tokens themselves). Default: no authentication.")
    ] = None,
    root_agent: Annotated[str | None, typer.Option(
        "--root-agent", help="Serve this agent at / too (its card at "
                             "/.well-known/agent-card.json), for clients that know only a "
                             "host.")] = None,
    public_url: Annotated[str | None, typer.Option(
        "--public-url", help="The URL clients reach the gateway at, which the agent cards "
                             "name (behind a proxy, or with --host 0.0.0.0). Default: "
                             "http://HOST:PORT.")] = None,
    wait: Annotated[float, typer.Option(
        min=0.1, help="Seconds a SendMessage waits for the task to end or pause for "
                      "input before it returns the task as it stands.")] = 60.0,
) -> None:
    """Serve every agent of the config over A2A (JSON-RPC over HTTP, SSE streaming): its
    card at /agents/NAME/.well-known/agent-card.json, its endpoint at /agents/NAME/.
    With a memory:// broker the agents run in this process; with NATS, the gateway is a
    client of the `meshpoint serve` processes, and any number of gateways can run."""
    from meshpoint.config import load_config
    from meshpoint.integrations.a2a.app import load_tokens, serve_gateway

    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    try:
        mesh = load_config(config)
        credentials = load_tokens(tokens) if tokens is not None else None
        asyncio.run(serve_gateway(mesh, host=host, port=port, tokens=credentials,
                                  root_agent=root_agent, wait_s=wait,
                                  public_url=public_url))
    except MeshpointError as error:
        fail(error)


def gateway_commands(app: typer.Typer) -> None:
    """Register ``gateway`` on the ``meshpoint`` app."""
    app.command()(gateway)
