"""Strict JSON helpers shared by the context and the store.

meshpoint stores task state as JSON on SQLite and PostgreSQL alike, so only the
JSON data model is admitted: ``dict`` with ``str`` keys, ``list`` (tuples become
lists), ``str``, ``int``, finite ``float``, ``bool`` and ``None``. NaN and the
infinities are refused because PostgreSQL's ``jsonb`` and RFC 8785 refuse them.
"""

from __future__ import annotations

import json
import math
from typing import Any

from meshpoint.errors import ContextSerializationError


def json_copy(value: Any, path: str = "$") -> Any:
    """Return a deep copy of ``value`` that shares no mutable object with it.

    Raises :class:`ContextSerializationError` naming the path of the first value
    that is not JSON, so a caller can tell *which* field broke the checkpoint.
    """
    try:
        return _copy(value, path)
    except RecursionError:
        raise ContextSerializationError(
            f"{path} is nested too deeply, or contains itself; JSON cannot hold cycles",
            path=path) from None


def _copy(value: Any, path: str) -> Any:
    # Exact type checks first: they cover nearly every node and are the fast path.
    kind = type(value)
    if kind is str or kind is int or kind is bool or value is None:
        return value
    if kind is dict:
        out: dict[str, Any] = {}
        for key, item in value.items():
            if type(key) is not str:
                raise ContextSerializationError(
                    f"{path} has a key {key!r} of type {type(key).__name__}; JSON object keys "
                    "must be str",
                    path=path,
                )
            out[key] = _copy(item, f"{path}[{key!r}]")
        return out
    if kind is list or kind is tuple:
        return [_copy(item, f"{path}[{index}]") for index, item in enumerate(value)]
    if kind is float:
        if not math.isfinite(value):
            raise ContextSerializationError(
                f"{path} is {value!r}; JSON has no NaN or infinity", path=path
            )
        return value
    # Subclasses (an IntEnum, a str subclass, an OrderedDict) are admitted as their base type.
    if isinstance(value, bool):
        return bool(value)
    if isinstance(value, int):
        return int(value)
    if isinstance(value, str):
        return str(value)
    if isinstance(value, dict):
        return _copy(dict(value), path)
    if isinstance(value, list | tuple):
        return _copy(list(value), path)
    if isinstance(value, float):
        return _copy(float(value), path)
    raise ContextSerializationError(
        f"{path} holds a {type(value).__name__}, which cannot be stored as JSON; "
        "store plain dicts, lists, strings, numbers, booleans or None",
        path=path,
    )


def dumps(value: Any) -> str:
    """Serialise already-validated JSON compactly (no NaN, UTF-8 kept as is)."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def loads(text: str | bytes) -> Any:
    """Parse JSON text; the caller translates ``ValueError`` into its own error."""
    return json.loads(text)
