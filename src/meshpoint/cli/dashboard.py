"""``meshpoint dashboard``: serve the web dashboard (:mod:`meshpoint.ops.dashboard`) on a
store, bound to 127.0.0.1 by default.

The store is named as for every store command (``--url``, ``--config``,
``--tenant``; :mod:`meshpoint.cli.common`); one tenant is shown, the flag's or the
config's. With ``--config``, the history's keys read encrypted fields and check
signatures, and the config's approvers check each answer before it is written.
Read-only unless a token is given: ``--token-file`` or ``MESHPOINT_DASHBOARD_TOKEN``,
never the token itself on the command line (every user of the host sees it in
``ps``). Served on the loopback, a request must name the loopback as its ``Host``
(``127.0.0.1`` or ``localhost``, and each ``--allowed-host``): a web page whose name is
rebound to 127.0.0.1 cannot read the dashboard through the browser; served on another
address, any name unless ``--allowed-host`` lists them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from meshpoint._listen import listen
from meshpoint.cli.common import Config, Schema, Tenant, Url, console, err, fail, store_opener
from meshpoint.errors import MeshpointError

#: The addresses that serve this host only, and the names a request to them gives.
LOOPBACK = ("127.0.0.1", "localhost", "::1")
LOOPBACK_NAMES = ["127.0.0.1", "localhost"]


def dashboard(url: Url = None, config: Config = None, schema: Schema = None,
              tenant: Tenant = None,
              port: Annotated[int, typer.Option("--port", min=0, max=65535,
                                                help="TCP port to listen on.")] = 8080,
              host: Annotated[str, typer.Option(
                  "--host", help="Address to bind (127.0.0.1: this host only; behind a "
                  "TLS proxy for anything else).")] = "127.0.0.1",
              token_file: Annotated[Path | None, typer.Option(
                  "--token-file", help="A file whose first line is the token that signs in "
                  "to answer approvals (else MESHPOINT_DASHBOARD_TOKEN; without either the "
                  "dashboard is read-only).")] = None,
              allowed_host: Annotated[list[str] | None, typer.Option(
                  "--allowed-host", help="A name requests may give as their Host (the "
                  "proxy's public name, say); repeat for several. On the loopback, "
                  "127.0.0.1 and localhost are allowed too; elsewhere, without one, any "
                  "name is.")] = None) -> None:
    """Serve the web dashboard: tasks, a task's history and events, the approvals
    inbox, the overview and the live event log of one tenant's store."""
    try:
        import uvicorn

        from meshpoint.ops.dashboard import create_app
        from meshpoint.ops.dashboard.security import load_token
    except ImportError as error:
        err.print(f"[red]error:[/red] the dashboard needs meshpoint[dashboard] "
                  f"(pip install 'meshpoint[dashboard]'): {error}")
        raise typer.Exit(code=1) from None
    try:
        token = load_token(token_file)
        approvers = None
        if config is not None:
            from meshpoint.config import load_config

            approvers = load_config(config).build_approvers()
        opener = store_opener(url, config, schema=schema, tenant=tenant)
        sock = listen(host, port)
    except MeshpointError as error:
        fail(error)
    names = list(allowed_host or [])
    if host in LOOPBACK:
        names += LOOPBACK_NAMES
    app = create_app(opener=opener, token=token, approvers=approvers,
                     allowed_hosts=names or None)
    console.print(f"meshpoint dashboard on http://{host}:{port}/ "
                  f"({'read-only' if token is None else 'answers need the token'})",
                  highlight=False)
    uvicorn.Server(uvicorn.Config(app, log_level="warning")).run(sockets=[sock])


def dashboard_commands(app: typer.Typer) -> None:
    """Register this module's command on the ``meshpoint`` app."""
    app.command()(dashboard)
