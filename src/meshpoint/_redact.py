"""Credentials out of what meshpoint prints: a store or broker URL as logs, errors
and reprs show it.

A URL's password becomes ``***`` (``postgresql://app:***@db/mesh``), as
SQLAlchemy's ``URL.render_as_string(hide_password=True)`` shows it; so does a NATS
token, which is the whole user part of a ``nats://`` URL (``nats://***@host:4222``),
and a credential given as a query parameter (``?password=``, libpq's
``sslpassword``, a ``token``). The host, port, user and database stay: they are what
an operator needs to tell which server a message is about.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

#: Query parameters that carry a credential.
SECRET_PARAMETERS = frozenset({"password", "sslpassword", "token", "auth_token", "pass",
                               "passfile", "nkey", "jwt", "creds"})
#: Schemes whose URL's user part, without a password, is a token (NATS's).
_TOKEN_SCHEMES = ("nats", "tls", "ws", "wss")
_HIDDEN = "***"
#: The user part of anything that looks like a URL, for text urlsplit cannot parse.
_USERINFO = re.compile(r"(//)[^/@\s]*@")
_LIST = re.compile(r",\s*[A-Za-z][A-Za-z0-9+.-]*://")


def redact_url(url: Any) -> str:
    """``url`` (a string or a SQLAlchemy URL) with its credentials replaced by ``***``
    (see the module docstring). Never raises: what does not parse as a URL loses
    everything between ``//`` and ``@``."""
    text = str(url)  # a SQLAlchemy URL's str() already hides its password
    if _LIST.search(text):  # a list of servers
        return ",".join(redact_url(one) for one in text.split(","))
    try:
        parts = urlsplit(text)
        netloc = parts.netloc
        if "@" not in netloc and not parts.query:
            return text  # nothing to hide: as written (urlunsplit may respell it)
        if "@" in netloc:
            userinfo, _, host = netloc.rpartition("@")
            user, colon, _password = userinfo.partition(":")
            if colon:
                userinfo = f"{user}:{_HIDDEN}"
            elif parts.scheme.split("+")[0] in _TOKEN_SCHEMES:
                userinfo = _HIDDEN
            netloc = f"{userinfo}@{host}"
        query = parts.query
        if query:
            pairs = parse_qsl(query, keep_blank_values=True)
            if any(key.lower() in SECRET_PARAMETERS for key, _ in pairs):
                query = urlencode([(key, _HIDDEN if key.lower() in SECRET_PARAMETERS
                                    else value) for key, value in pairs], safe="*/:")
        return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))
    except ValueError:
        return _USERINFO.sub(rf"\1{_HIDDEN}@", text)
