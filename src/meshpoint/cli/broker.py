"""The broker as a trust boundary, from the command line: ``meshpoint nats-config``
(a NATS user per agent, client and approver; :mod:`meshpoint.nats_users`) and
``meshpoint keys approver new`` (an approver's key pair;
:mod:`meshpoint.runtime.approvers`)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated

import typer

from meshpoint.cli.common import AsJson, console, fail
from meshpoint.errors import ConfigurationError, InvalidArgumentError, MeshpointError

approver_app = typer.Typer(help="Approvers' key pairs: they sign their decisions.",
                           no_args_is_help=True)


def nats_config(config: Annotated[Path, typer.Option(
                    "--config", "-c", envvar="MESHPOINT_CONFIG", help="The mesh config.")],
                admin_creates_stream: Annotated[bool, typer.Option(
                    "--admin-creates-stream",
                    help="Only the admin user may create the namespace's stream (create it "
                         "before the first serve); by default instances may.")] = False,
                as_json: AsJson = False) -> None:
    """Print a nats-server configuration with a user per agent, client and approver of
    the mesh, each allowed to publish and read only its own subjects (include it in
    the server's config; passwords are environment variables it names)."""
    from meshpoint.config import load_config
    from meshpoint.nats_users import as_json as users_json
    from meshpoint.nats_users import broker_users, server_config

    try:
        mesh = load_config(config)
        users = broker_users(mesh, admin_creates_stream=admin_creates_stream)
    except MeshpointError as error:
        fail(error, as_json)
    if as_json:
        print(json.dumps(users_json(mesh, users, admin_creates_stream=admin_creates_stream)))
    else:
        print(server_config(mesh, users), end="")


@approver_app.command("new")
def new_approver_key(
        approver: Annotated[str, typer.Option("--id", help="The approver's id, as the "
                                              "config's approvers: name it.")],
        out: Annotated[Path, typer.Option(
            "--out", help="Where to write the private key (PEM, readable by its owner "
                          "only); the public key goes beside it, with .pub.pem.")],
        as_json: AsJson = False) -> None:
    """Make an approver's Ed25519 key pair: the private key stays with the approver
    (``tasks approve --key file:PATH``, ``Client(key=...)``); the public key goes in
    the mesh config's ``approvers:``. Refuses to overwrite a file."""
    from meshpoint.runtime.approvers import ApproverKey

    public = out.with_name(out.name + ".pub.pem")
    try:
        key = ApproverKey.generate(approver)
        for path in (out, public):
            if path.exists():
                raise InvalidArgumentError(f"{path} exists: name another file with --out")
        out.parent.mkdir(parents=True, exist_ok=True)
        descriptor = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(descriptor, "w") as private_file:
            private_file.write(key.private_pem())
        public.write_text(key.public_pem())
    except OSError as error:
        fail(ConfigurationError(f"cannot write the key: {error}"), as_json)
    except MeshpointError as error:
        fail(error, as_json)
    if as_json:
        print(json.dumps({"approver": approver, "private_key": str(out),
                          "public_key": str(public), "public_pem": key.public_pem()}))
        return
    console.print(f"private key of {approver}: {out} (keep it secret; sign with "
                  f"--key file:{out} --by {approver})")
    console.print(f"public key: {public}; in the mesh config:\n"
                  f"approvers:\n  {json.dumps(approver)}:\n    key: file:{public}\n"
                  f"    agents: {{AGENT: [TOOL]}}", markup=False)


def broker_commands(app: typer.Typer, keys_app: typer.Typer) -> None:
    """Register this module's commands on the ``meshpoint`` app."""
    app.command("nats-config")(nats_config)
    keys_app.add_typer(approver_app, name="approver")
