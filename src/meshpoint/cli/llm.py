"""``meshpoint llm``: the bundled local model server, for your own app.

``meshpoint llm serve`` starts ``llama-server`` with SmolLM2-135M-Instruct (or a GGUF
file of yours, ``--model``), prints its OpenAI-compatible base URL and a model entry
for the mesh config, and keeps it running in the foreground until SIGINT (Ctrl-C) or
SIGTERM, then stops it. ``meshpoint llm build`` fetches the model and builds the
server without starting it (once per machine: 10-20 minutes on two cores). Both use
:mod:`meshpoint.llm.local_server`, as ``make demo-llm`` does.
"""

from __future__ import annotations

import json
import signal
import sys
import threading
from dataclasses import asdict, replace
from pathlib import Path
from types import FrameType
from typing import Annotated, Any

import typer

from meshpoint.cli.common import AsJson, err, shown

llm_app = typer.Typer(help="The bundled local model server (llama.cpp's llama-server).",
                      no_args_is_help=True)


def _provision(build: bool, as_json: bool, own_model: Path | None = None,
               name: str | None = None) -> Any:
    """The server and the model (``own_model``, else the bundled one): built and
    fetched if missing (with a progress bar on stderr, unless ``as_json``), or with
    ``build`` off only what is cached."""
    from meshpoint.llm.local_server import cached, ensure, ensure_server

    if own_model is None:
        provisioned = ensure(quiet=as_json) if build else cached()
        return replace(provisioned, model_name=name) if name else provisioned
    if build:
        ensure_server(quiet=as_json)
    return replace(cached(model=False), model=str(own_model.resolve()),
                   model_name=name or own_model.name.removesuffix(".gguf"))


def _problem(error: Exception, as_json: bool) -> typer.Exit:
    if as_json:
        print(json.dumps({"error": str(error), "kind": type(error).__name__}))
    else:
        err.print(f"[red]error:[/red] {shown(error)}")
    return typer.Exit(code=1)


@llm_app.command()
def build(as_json: AsJson = False) -> None:
    """Fetch the model (pip) and build llama-server for this machine, if not done
    yet (10-20 minutes on two cores, once; cached under ~/.cache/meshpoint, or
    $MESHPOINT_CACHE). Prints where they are."""
    from meshpoint.llm.local_server import ProvisionError

    try:
        provisioned = _provision(True, as_json)
    except ProvisionError as error:
        raise _problem(error, as_json) from None
    if as_json:
        print(json.dumps(asdict(provisioned)))
    else:
        print(f"server: {provisioned.server}\nmodel:  {provisioned.model}")


@llm_app.command()
def serve(
    port: Annotated[int, typer.Option(min=0, max=65535,
                                      help="The port (0: a free one).")] = 8080,
    host: Annotated[str, typer.Option(
        help="The address to listen on: 127.0.0.1 (this machine only), or 0.0.0.0 "
             "(every interface: anyone who can reach it may use the model).")
    ] = "127.0.0.1",
    model: Annotated[Path | None, typer.Option(
        "--model", exists=True, dir_okay=False,
        help="A GGUF model file of yours instead of the bundled SmolLM2-135M-Instruct.")
    ] = None,
    name: Annotated[str | None, typer.Option(
        help="The model's name in the API (default: the file's, without .gguf).")] = None,
    slots: Annotated[int, typer.Option(min=1, max=64,
                                       help="Requests decoded at once.")] = 4,
    ctx: Annotated[int, typer.Option(min=256,
                                     help="Tokens of context per request.")] = 4096,
    build_missing: Annotated[bool, typer.Option(
        "--build/--no-build", help="Build llama-server (and fetch the model) if this "
        "machine has none yet: 10-20 minutes on two cores, once.")] = True,
    as_json: AsJson = False,
) -> None:
    """Start the local model server, print its base URL, and keep it running until
    Ctrl-C (SIGINT) or SIGTERM, which stop it.

    Its API is OpenAI's (chat completions, tools, JSON mode). Point an agent at it
    in the mesh config: model: {kind: openai, name: NAME, base_url: URL, tool_mode: json}.

    Prints the base URL on stdout once ready (with --json, one JSON object: base_url,
    model, port, pid, log), what it does on stderr."""
    from meshpoint.llm.local_server import LlamaServer, ProvisionError

    try:  # Ctrl-C during a build interrupts it (the next run resumes it)
        provisioned = _provision(build_missing, as_json, model, name)
    except ProvisionError as error:
        raise _problem(error, as_json) from None
    stop = threading.Event()

    def stopping(signum: int, frame: FrameType | None) -> None:
        stop.set()

    # Taken before the server starts, so that a signal while the model loads cannot
    # leave the server running: it is stopped once ready.
    previous = {s: signal.signal(s, stopping) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        server = LlamaServer(provisioned, port=port, host=host, slots=slots,
                             ctx_per_slot=ctx)
        if not as_json:
            err.print(f"starting llama-server ({shown(provisioned.model_name)}) on "
                      f"{shown(server.base_url)} ...")
        try:
            server.start()
        except ProvisionError as error:
            raise _problem(error, as_json) from None
        try:
            _announce(server, as_json)
            while not stop.wait(0.5):
                code = server.exit_code()
                # A terminal's Ctrl-C reaches the server too: then it ended as asked.
                if code is not None and not stop.wait(0.5):
                    raise _problem(ProvisionError(
                        f"llama-server exited with {code}; its log ({server.log_path}):\n"
                        f"{server.log_tail()}"), as_json)
        finally:
            server.stop()
        if not as_json:
            err.print("llama-server stopped")
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _announce(server: Any, as_json: bool) -> None:
    provisioned = server.provisioned
    if as_json:
        print(json.dumps({"base_url": server.base_url, "model": provisioned.model_name,
                          "model_path": provisioned.model, "server": provisioned.server,
                          "host": server.host, "port": server.port, "pid": server.pid,
                          "log": str(server.log_path)}), flush=True)
        return
    print(server.base_url, flush=True)
    err.print(f"ready: {shown(provisioned.model_name)} at {shown(server.base_url)} (log: "
              f"{shown(server.log_path)}); Ctrl-C stops it. In the mesh config:\n"
              f"  model: {{kind: openai, name: {shown(provisioned.model_name)}, "
              f"base_url: {shown(server.base_url)}, tool_mode: json}}\n"
              "(a small model writes its tool calls best as JSON under a schema: "
              "docs/models.md)")
    sys.stderr.flush()
