"""What the event log stores of a value: plain JSON, never pickled (see
:func:`to_json`). Used by :mod:`meshpoint.events.log`, which re-exports ``to_json``.

LangChain messages become dicts with ``type``, ``content`` and the rest, pydantic
models (A2A messages among them) their JSON, dataclasses, datetimes, enums, sets and
bytes follow documented rules, and anything else becomes ``{"$type": ..., "$repr":
...}``: reading an event imports nothing and runs nothing.
"""

from __future__ import annotations

import base64
import dataclasses
import enum
from collections.abc import Mapping
from datetime import date, datetime
from typing import Any

from meshpoint._json import INT_MAX, INT_MIN
from meshpoint.store.checks import is_text

#: How deep :func:`to_json` follows nested values before it stops.
_MAX_DEPTH = 64


def to_json(value: Any, _depth: int = 0) -> Any:
    """``value`` as plain JSON (see the module docstring): never pickled, never
    refused. Strings longer than 100,000 characters are cut, marked with ``…``."""
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int):  # past 64 bits JSON readers make it a float
        return value if INT_MIN <= value <= INT_MAX else {"$int": str(value)}
    if isinstance(value, float):
        return value if value == value and abs(value) != float("inf") else repr(value)
    if isinstance(value, str):
        return _text(value)
    if _depth > _MAX_DEPTH:
        return {"$type": type(value).__name__, "$repr": "(nested too deeply)"}
    if isinstance(value, Mapping):
        out = {_text(str(k)): to_json(v, _depth + 1) for k, v in value.items()}
        if len(out) == len(value):
            return out
        # keys that are one string apart ({1: ..., "1": ...}): every pair is kept
        return {"$items": [[to_json(k, _depth + 1), to_json(v, _depth + 1)]
                           for k, v in value.items()]}
    if isinstance(value, list | tuple):
        return [to_json(v, _depth + 1) for v in value]
    if isinstance(value, set | frozenset):
        return sorted((to_json(v, _depth + 1) for v in value), key=repr)
    if isinstance(value, bytes | bytearray | memoryview):
        return {"$bytes": base64.b64encode(bytes(value)).decode()}
    if isinstance(value, datetime | date):
        return value.isoformat()
    if isinstance(value, enum.Enum):
        return to_json(value.value, _depth + 1)
    if isinstance(value, BaseException):
        return {"$error": type(value).__name__, "message": str(value)}
    dump = getattr(value, "model_dump", None)
    if callable(dump):  # pydantic: A2A messages, LangChain messages (v2)
        try:
            return to_json(dump(mode="json", by_alias=True, exclude_none=True), _depth + 1)
        except Exception:
            pass
    if hasattr(value, "type") and hasattr(value, "content"):  # a LangChain message
        return {"type": to_json(value.type, _depth + 1),
                "content": to_json(value.content, _depth + 1),
                **{k: to_json(getattr(value, k), _depth + 1)
                   for k in ("additional_kwargs", "name", "id", "tool_calls",
                             "tool_call_id") if getattr(value, k, None)}}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return to_json({f.name: getattr(value, f.name) for f in dataclasses.fields(value)},
                       _depth + 1)
    try:
        shown = _text(repr(value)[:1000])
    except Exception as error:  # a __repr__ that raises: the event is still logged
        shown = f"(repr failed: {type(error).__name__})"
    return _opaque(value, shown)


def _opaque(value: Any, shown: str) -> dict[str, str]:
    return {"$type": f"{type(value).__module__}.{type(value).__qualname__}", "$repr": shown}


def _text(value: str) -> str:
    """A string every database's JSON can hold: cut past 100,000 characters (marked
    with ``…``); NUL, which PostgreSQL's JSON cannot hold, and lone surrogates (half
    of a UTF-16 pair), which are not UTF-8, as U+FFFD."""
    if len(value) > 100_000:
        value = value[:100_000] + "…"
    if is_text(value):
        return value
    return "".join("\ufffd" if c == "\x00" or "\ud800" <= c <= "\udfff" else c
                   for c in value)


def converted(value: Any) -> Any:
    """:func:`to_json`, or, for a value whose own methods raise while it is converted,
    what it was and why not: logging never fails for what it is given."""
    try:
        return to_json(value)
    except Exception as error:
        return _opaque(value, f"(could not be converted: {type(error).__name__})")
