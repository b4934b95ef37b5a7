"""The gateway's HTTP application and ``meshpoint gateway``.

Every agent of the config is an A2A server at ``/agents/<name>/``: its card at
``/agents/<name>/.well-known/agent-card.json`` and its JSON-RPC endpoint (A2A 1.0
method names, ``SendMessage``...; and with the SDK's 0.3 compatibility,
``message/send``...) at ``/agents/<name>/``, both the a2a-sdk's own routes. In front
of them, before any JSON is parsed: a body over ``max_body_bytes`` or not
``application/json`` is refused with a JSON-RPC error (HTTP 413, 415), and with
tokens, a request without a valid ``Authorization: Bearer`` is refused (HTTP 401).

With a ``memory://`` broker the gateway serves the agents itself, in its process
(:func:`meshpoint.embedded.embedded`); with NATS, it is a client of the mesh's
``meshpoint serve`` processes, and any number of gateways may run side by side.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from a2a.server.routes import create_agent_card_routes, create_jsonrpc_routes
from a2a.utils.constants import AGENT_CARD_WELL_KNOWN_PATH
from starlette.applications import Starlette
from starlette.routing import Mount

from meshpoint._listen import listen
from meshpoint.config import MeshConfig
from meshpoint.errors import ConfigurationError
from meshpoint.events import EventStore
from meshpoint.integrations.a2a.cards import agent_card
from meshpoint.integrations.a2a.handler import Mesh, MeshRequestHandler
from meshpoint.integrations.a2a.views import GatewayLog

#: Printed (and flushed) on stdout once the gateway takes requests; scripts wait for it.
READY = "meshpoint: gateway ready"
#: The largest request body taken, in bytes (an A2A message is words, not files).
MAX_BODY_BYTES = 1_000_000
#: The deepest nesting of arrays and objects taken in a request body (deeper JSON
#: would exhaust the parser's recursion, a 500).
MAX_DEPTH = 32
#: How long a request's body may take to arrive, in seconds (a client that sends a
#: byte at a time holds a connection, and memory, for as long as it likes).
BODY_TIMEOUT_S = 30.0

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


@dataclass(frozen=True)
class Credential:
    """Who a bearer token stands for, and whose tasks it reaches: ``tenant`` (None:
    the config's store tenant)."""

    name: str
    token: str
    tenant: str | None = None


def load_tokens(source: str) -> list[Credential]:
    """The credentials of ``source``: ``file:PATH`` or ``env:VAR`` (never the tokens
    themselves: a command line is seen by every user of the host), one per line,
    ``NAME:TOKEN``, or ``NAME@TENANT:TOKEN`` for a client of that tenant's tasks only;
    blank lines and ``#`` comments are skipped."""
    kind, _, where = source.partition(":")
    if kind == "file":
        try:
            text = Path(where).read_text()
        except OSError as error:
            raise ConfigurationError(f"cannot read the tokens file {where}: "
                                     f"{error.strerror}") from None
    elif kind == "env":
        if where not in os.environ:
            raise ConfigurationError(f"the environment has no {where} (the gateway's "
                                     "tokens)")
        text = os.environ[where]
    else:
        raise ConfigurationError("tokens come from file:PATH or env:VAR, never the command "
                                 "line")
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        name, sep, token = line.partition(":")
        if not sep or not name.strip() or len(token.strip()) < 16:
            raise ConfigurationError(f"{source} line {number}: expected NAME:TOKEN, the "
                                     "token at least 16 characters")
        name, _, tenant = name.strip().partition("@")
        found.append(Credential(name, token.strip(), tenant or None))
    if not found:
        raise ConfigurationError(f"{source} holds no NAME:TOKEN line")
    return found


def _names_a_v1_method(request: Any) -> bool:
    """Whether ``request`` (the parsed body) is a JSON-RPC request naming an A2A 1.0
    method (``SendMessage``; 0.3's names have a slash: ``message/send``)."""
    method = request.get("method") if isinstance(request, dict) else None
    return isinstance(method, str) and method.isalpha()


def _parse(body: bytes, limit: int) -> tuple[Any, bool]:
    """``body`` parsed (None if it is not JSON: the SDK answers it with -32700), and
    whether it nests arrays and objects deeper than ``limit``."""
    try:
        value = json.loads(body)
    except RecursionError:
        return None, True
    except ValueError:
        return None, False
    return value, _depth_over(value, limit)


def _depth_over(value: Any, limit: int) -> bool:
    level = [(value, 1)]
    while level:
        item, depth = level.pop()
        if depth > limit:
            return True
        children = item.values() if isinstance(item, dict) else \
            item if isinstance(item, list) else ()
        level.extend((child, depth + 1) for child in children
                     if isinstance(child, dict | list))
    return False


def _dropped_by_the_sdk(request: Any) -> str | None:
    """Why ``request`` is refused, for params the SDK would silently drop (it parses
    with ``ignore_unknown_fields``, so an unknown enum value reads as unset: a
    ``ListTasks`` with ``status: "NOT_A_STATE"`` would list every task); else None."""
    from a2a.types.a2a_pb2 import TaskState

    if not isinstance(request, dict) or request.get("method") not in ("ListTasks",
                                                                      "tasks/list"):
        return None
    params = request.get("params")
    status = params.get("status") if isinstance(params, dict) else None
    if isinstance(status, str) and status not in TaskState.keys():
        return f"invalid params: status {status!r:.60} is not one of {', '.join(TaskState.keys())}"
    return None


def _error(send: Send, status: int, code: int, message: str,
           headers: list[tuple[bytes, bytes]] | None = None, *,
           request_id: Any = None) -> Awaitable[None]:
    if not isinstance(request_id, str | int) or isinstance(request_id, bool):
        request_id = None
    body = json.dumps({"jsonrpc": "2.0", "id": request_id,
                       "error": {"code": code, "message": message}}).encode()

    async def respond() -> None:
        await send({"type": "http.response.start", "status": status, "headers": [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()), *(headers or [])]})
        await send({"type": "http.response.body", "body": body})
    return respond()


class Guard:
    """ASGI middleware in front of the SDK's routes: the checks a request passes before
    any of its JSON is read (see the module docstring)."""

    def __init__(self, app: ASGIApp, *, tokens: list[Credential],
                 max_body_bytes: int = MAX_BODY_BYTES,
                 body_timeout_s: float = BODY_TIMEOUT_S) -> None:
        self.app = app
        self.tokens = tokens
        self.max_body_bytes = max_body_bytes
        self.body_timeout_s = body_timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1")
                   for k, v in scope["headers"]}
        if self.tokens:
            user = self._user(headers.get("authorization", ""))
            if user is None:
                await _error(send, 401, -32600, "unauthenticated: send Authorization: "
                             "Bearer TOKEN (the agent card's securitySchemes)",
                             [(b"www-authenticate", b'Bearer realm="meshpoint"')])
                return
            scope["user"], scope["auth"] = user
        kind = headers.get("content-type", "").split(";")[0].strip().lower()
        if kind not in ("application/json", "application/a2a+json"):
            await _error(send, 415, -32600, f"content type {kind or 'none'!r:.80} is not "
                         "JSON: send Content-Type: application/json")
            return
        declared = headers.get("content-length", "")
        if declared.isdigit() and int(declared) > self.max_body_bytes:
            await _error(send, 413, -32600, f"payload too large: over "
                         f"{self.max_body_bytes} bytes")
            return
        try:
            async with asyncio.timeout(self.body_timeout_s):
                body = await self._body(receive)
        except TimeoutError:
            await _error(send, 408, -32600, f"the request body did not arrive within "
                         f"{self.body_timeout_s:g} s", [(b"connection", b"close")])
            return
        if body is None:  # the client left
            return
        if len(body) > self.max_body_bytes:
            await _error(send, 413, -32600, f"payload too large: over "
                         f"{self.max_body_bytes} bytes")
            return
        request, too_deep = _parse(body, MAX_DEPTH)
        if too_deep:
            await _error(send, 400, -32600, f"invalid request: JSON nested deeper than "
                         f"{MAX_DEPTH} levels")
            return
        refused = _dropped_by_the_sdk(request)
        if refused is not None:
            await _error(send, 200, -32602, refused, request_id=request.get("id"))
            return
        if "a2a-version" not in headers and _names_a_v1_method(request):
            # The SDK takes a request without A2A-Version as 0.3 and refuses 1.0's
            # method names then; a client that names one means 1.0.
            scope = {**scope, "headers": [*scope["headers"], (b"a2a-version", b"1.0")]}
        replayed = False

        async def replay() -> dict[str, Any]:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": bytes(body), "more_body": False}
            return await receive()
        await self.app(scope, replay, send)

    async def _body(self, receive: Receive) -> bytes | None:
        """The whole body, read before the SDK parses it: stops once it is over the
        limit; None if the client disconnected."""
        body = bytearray()
        while True:
            event = await receive()
            if event["type"] == "http.disconnect":
                return None
            body += event.get("body", b"")
            if len(body) > self.max_body_bytes or not event.get("more_body"):
                return bytes(body)

    def _user(self, authorization: str) -> Any:
        from starlette.authentication import SimpleUser

        scheme, _, token = authorization.partition(" ")
        if scheme.lower() != "bearer" or not token:
            return None
        for credential in self.tokens:
            if hmac.compare_digest(credential.token.encode(), token.strip().encode()):
                return SimpleUser(credential.name), credential
        return None


def build_app(config: MeshConfig, mesh: Mesh | dict[str, Mesh], *, base_url: str,
              tokens: list[Credential] | None = None, root_agent: str | None = None,
              max_body_bytes: int = MAX_BODY_BYTES) -> ASGIApp:
    """The gateway's ASGI application over ``mesh`` (or the mesh of each tenant,
    :func:`open_meshes`) for every agent of ``config``; ``base_url`` is where clients
    reach it (the cards name it). ``root_agent`` is served at ``/`` too (its card at
    ``/.well-known/agent-card.json``), for a client that knows only a host."""
    if root_agent is not None:
        config.agent_config(root_agent)  # a clear error for a typo
    from importlib.metadata import version

    routes = []
    meshes = mesh if isinstance(mesh, dict) else {config.store.tenant: mesh}
    served = [(name, f"/agents/{name}") for name in config.agents]
    if root_agent is not None:  # last: /agents/... is matched first
        served.append((root_agent, ""))
    for name, prefix in served:
        card = agent_card(name, config.agents[name], f"{base_url.rstrip('/')}{prefix}/",
                          version=version("meshpoint"), bearer=bool(tokens))
        handler = MeshRequestHandler(name, meshes, config.store.tenant)
        routes.append(Mount(prefix, routes=[
            *create_agent_card_routes(card, card_url=AGENT_CARD_WELL_KNOWN_PATH),
            *create_jsonrpc_routes(handler, rpc_url="/", enable_v0_3_compat=True)]))
    starlette: Any = Starlette(routes=routes)
    return Guard(starlette, tokens=tokens or [],
                 max_body_bytes=max_body_bytes)


@contextlib.asynccontextmanager
async def open_mesh(config: MeshConfig, *, wait_s: float = 60.0) -> AsyncIterator[Mesh]:
    """The store, a client of the mesh and the event log, for a gateway; with a
    ``memory://`` broker, the agents served in this process too."""
    from meshpoint.embedded import embedded

    store = await config.open_store()
    try:
        async with contextlib.AsyncExitStack() as stack:
            if config.networked_broker:
                client = await stack.enter_async_context(config.open_client())
            else:
                client = await stack.enter_async_context(embedded(config))
            events = await stack.enter_async_context(EventStore(store))
            mesh = Mesh(store=store, client=client, log=GatewayLog(events), wait_s=wait_s)
            try:
                yield mesh
            finally:
                await mesh.close()
    finally:
        await store.close()


@contextlib.asynccontextmanager
async def open_meshes(config: MeshConfig, tenants: set[str], *,
                      wait_s: float = 60.0) -> AsyncIterator[dict[str, Mesh]]:
    """:func:`open_mesh` for the config's tenant and each of ``tenants``: on
    PostgreSQL each store is confined to its tenant by row-level security, and each
    client calls its tenant's agents."""
    async with contextlib.AsyncExitStack() as stack:
        meshes: dict[str, Mesh] = {}
        for tenant in sorted({config.store.tenant, *tenants}):
            tenant_config = config.model_copy(update={
                "store": config.store.model_copy(update={"tenant": tenant})})
            meshes[tenant] = await stack.enter_async_context(
                open_mesh(tenant_config, wait_s=wait_s))
        yield meshes


def public_base_url(host: str, port: int, public_url: str | None = None) -> str:
    """Where clients reach the gateway, as its cards name it: ``public_url`` (the
    gateway behind a proxy, or on a host's public name), else ``http://HOST:PORT``.
    ConfigurationError for a wildcard ``host`` without ``public_url``: a card naming
    ``0.0.0.0`` sends every stock client, which calls the URL its card names, nowhere."""
    if public_url is not None:
        parsed = urlsplit(public_url)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise ConfigurationError(f"--public-url {public_url!r:.100} is not an http(s) "
                                     "URL")
        return public_url.rstrip("/")
    if host in ("0.0.0.0", "::", ""):
        raise ConfigurationError(f"listening on every address ({host or 'all'}), the "
                                 "gateway cannot tell which URL its cards should name: give "
                                 "--public-url, the URL clients reach it at")
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


async def serve_gateway(config: MeshConfig, *, host: str, port: int,
                        tokens: list[Credential] | None = None,
                        root_agent: str | None = None, wait_s: float = 60.0,
                        public_url: str | None = None) -> None:
    """Serve every agent of ``config`` over A2A until SIGTERM or SIGINT; the cards name
    :func:`public_base_url`."""
    import uvicorn

    base_url = public_base_url(host, port, public_url)
    tenants = {c.tenant for c in tokens or [] if c.tenant is not None}
    with contextlib.closing(listen(host, port)) as sock:
        async with open_meshes(config, tenants, wait_s=wait_s) as meshes:
            app = build_app(config, meshes, base_url=base_url, tokens=tokens,
                            root_agent=root_agent)
            server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
            serving = asyncio.create_task(server.serve(sockets=[sock]))
            while not server.started and not serving.done():
                await asyncio.sleep(0.05)
            if server.started:
                print(f"{READY} http://{host}:{port}", flush=True)
            await serving
