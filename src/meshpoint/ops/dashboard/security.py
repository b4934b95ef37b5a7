"""Who may change anything through the dashboard, and how a change is checked.

The dashboard is read-only unless a token is configured (``--token-file`` or
``MESHPOINT_DASHBOARD_TOKEN``; never on the command line, where every user of the
host sees it). With one, an operator signs in with it on the login form and gets a
session cookie signed with a key derived from the token (Starlette's
``SessionMiddleware``, itsdangerous underneath; ``HttpOnly``, ``SameSite=Strict``):
restarting with another token signs every session out. Every form carries the
session's CSRF token, and a write (POST only) is refused, 403, changing nothing, unless
the session is signed in and the form's token is the session's. A wrong token at the
login form is answered only after a pause, one failure at a time
(:data:`LOGIN_FAILURE_DELAY_S`), so guessing is slow as well as hopeless. Every
response carries :data:`HEADERS` (:class:`SecurityHeaders`): a Content-Security-Policy
that allows the dashboard's own script and stylesheet and nothing inline, no framing,
no MIME sniffing, no referrer.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import os
import secrets
from pathlib import Path

from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from meshpoint.errors import ConfigurationError

#: The environment variable that may hold the dashboard's token.
TOKEN_ENV = "MESHPOINT_DASHBOARD_TOKEN"
#: A token shorter than this is refused: it would be guessed.
MIN_TOKEN_CHARS = 16
#: How long a wrong token at the login form waits before its answer; failures wait
#: one after another, so at most one guess is judged per this many seconds.
LOGIN_FAILURE_DELAY_S = 1.0
#: The headers of every response.
HEADERS = {
    "content-security-policy": "default-src 'none'; script-src 'self'; style-src 'self'; "
                               "img-src 'self'; connect-src 'self'; form-action 'self'; "
                               "frame-ancestors 'none'; base-uri 'none'",
    "x-content-type-options": "nosniff",
    "x-frame-options": "DENY",
    "referrer-policy": "no-referrer",
}

_pause = asyncio.sleep  # the tests' to replace


async def login_failed(failures: asyncio.Lock) -> None:
    """Wait :data:`LOGIN_FAILURE_DELAY_S` after a wrong token, behind every other
    failure being waited for (``failures``: the application's lock)."""
    async with failures:
        await _pause(LOGIN_FAILURE_DELAY_S)


class SecurityHeaders:
    """ASGI middleware: :data:`HEADERS` on every response (those it already has
    are left as they are)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                present = {name.lower() for name, _ in message.get("headers", [])}
                message["headers"] = list(message.get("headers", [])) + [
                    (name.encode(), value.encode()) for name, value in HEADERS.items()
                    if name.encode() not in present]
            await send(message)

        await self.app(scope, receive, with_headers)


def load_token(token_file: Path | None) -> str | None:
    """The configured token: the file's first line, else ``MESHPOINT_DASHBOARD_TOKEN``,
    else None (read-only). ConfigurationError for an unreadable file or a short token."""
    if token_file is not None:
        try:
            token = token_file.read_text(encoding="utf-8").strip()
        except OSError as error:
            raise ConfigurationError(f"cannot read the dashboard token file {token_file}: "
                                     f"{error.strerror}") from None
        source = str(token_file)
    else:
        token = (os.environ.get(TOKEN_ENV) or "").strip()
        source = TOKEN_ENV
        if not token:
            return None
    if len(token) < MIN_TOKEN_CHARS:
        raise ConfigurationError(f"the dashboard token in {source} is {len(token)} characters; "
                                 f"give at least {MIN_TOKEN_CHARS} (say, `openssl rand -hex 32`)")
    return token


def session_key(token: str | None) -> str:
    """The key sessions are signed with: derived from the token (a random one when
    there is none: nothing is signed in then)."""
    if token is None:
        return secrets.token_hex(32)
    return hmac.new(token.encode(), b"meshpoint-dashboard-session", hashlib.sha256).hexdigest()


def csrf_token(request: Request) -> str:
    """The session's CSRF token, made on first use."""
    token = request.session.get("csrf")
    if not isinstance(token, str):
        token = request.session["csrf"] = secrets.token_urlsafe(32)
    return token


def signed_in(request: Request) -> bool:
    return request.session.get("signed_in") is True


def token_matches(given: object, token: str | None) -> bool:
    """Whether ``given`` is the configured token (never, read-only), in constant time."""
    return token is not None and isinstance(given, str) and \
        hmac.compare_digest(given.encode(), token.encode())


def csrf_matches(request: Request, given: object) -> bool:
    """Whether a form's CSRF token is its session's, in constant time."""
    expected = request.session.get("csrf")
    return isinstance(expected, str) and isinstance(given, str) and \
        hmac.compare_digest(given.encode(), expected.encode())


def refusal(request: Request, form_csrf: object, token: str | None) -> str | None:
    """Why a write is refused (None: allowed): the dashboard is read-only, the
    session is not signed in, or the form's CSRF token is not the session's."""
    if token is None:
        return ("this dashboard is read-only: it was started without a token "
                f"(--token-file or {TOKEN_ENV})")
    if not signed_in(request):
        return "sign in with the dashboard's token first"
    if not csrf_matches(request, form_csrf):
        return "the form's CSRF token is not this session's: reload the page and try again"
    return None
