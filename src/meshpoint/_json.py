"""Strict JSON helpers shared by the context and the store.

meshpoint stores task state as JSON on SQLite and PostgreSQL alike, so only the
JSON data model is admitted: ``dict`` with ``str`` keys, ``list`` (tuples become
lists), ``str``, ``int`` of at most 64 bits, finite ``float``, ``bool`` and
``None``. NaN and the infinities are refused because PostgreSQL's ``jsonb`` and
RFC 8785 refuse them; integers past 64 bits because most JSON readers (orjson,
which the store reads with, among them) turn them into floats without a word.

Encoding and decoding go through orjson: the same JSON as the standard library's
compact form, several times faster, and this runs at every pause and resume.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

import orjson

from meshpoint.errors import ContextSerializationError


def json_copy(value: Any, path: str = "$") -> Any:
    """Return a deep copy of ``value`` that shares no mutable object with it.

    Raises :class:`ContextSerializationError` naming the path of the first value
    that is not JSON, so a caller can tell *which* field broke the checkpoint.
    """
    try:
        return _plain_copy(value)
    except (_NotPlain, RecursionError):
        pass  # copied again below, the slow way, which names what is wrong
    try:
        return _copy(value, path)
    except RecursionError:
        raise ContextSerializationError(
            f"{path} is nested too deeply, or contains itself; JSON cannot hold cycles",
            path=path) from None


#: The integers JSON values may hold: signed 64 bits, and unsigned 64 bits.
INT_MIN, INT_MAX = -(2**63), 2**64 - 1


class _NotPlain(Exception):
    """A value that is not of an exact JSON type, or a float that JSON cannot hold."""


def _plain_copy(value: Any) -> Any:
    """The copy of a value made of exact JSON types only, or _NotPlain.

    The common case, about twice as fast as :func:`_copy`: it builds no path strings
    and makes no call for scalars."""
    kind = type(value)
    if kind is dict:
        out: dict[str, Any] = {}
        for key, item in value.items():
            if type(key) is not str:
                raise _NotPlain
            kind = type(item)
            out[key] = item if kind is str or kind is bool or item is None \
                else _plain_copy(item)
        return out
    if kind is list:
        return [item if (kind := type(item)) is str or kind is bool or item is None
                else _plain_copy(item) for item in value]
    if kind is str or kind is bool or value is None:
        return value
    if kind is int and INT_MIN <= value <= INT_MAX:
        return value
    if kind is float and math.isfinite(value):
        return value
    raise _NotPlain  # a tuple, a subclass, NaN, too big, or not JSON: see _copy


def _copy(value: Any, path: str) -> Any:
    kind = type(value)
    if kind is str or kind is bool or value is None:
        return value
    if kind is int:
        if not INT_MIN <= value <= INT_MAX:
            raise ContextSerializationError(
                f"{path} is {value}, an integer past 64 bits, which JSON readers turn into "
                "a float; store it as a string", path=path)
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
        return _copy(int(value), path)
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


def dump_bytes(value: Any) -> bytes:
    """Serialise already-validated JSON compactly as UTF-8 (no NaN).

    orjson writes the same JSON as the standard library's compact form, about ten
    times faster, and this runs at every pause (docs/store.md). What it refuses of
    validated JSON is handled by :func:`_refused`."""
    try:
        return orjson.dumps(value)
    except orjson.JSONEncodeError:
        return _refused(value).encode()


def dumps(value: Any) -> str:
    """:func:`dump_bytes` as text (what SQLAlchemy's JSON types bind)."""
    try:
        return orjson.dumps(value).decode()
    except orjson.JSONEncodeError:
        return _refused(value)


def _refused(value: Any) -> str:
    """What orjson refuses of values :func:`json_copy` admits: nesting deeper than
    its 255 levels, which the standard library writes instead, and a string with a
    lone surrogate (half of a UTF-16 pair), which is not UTF-8, so that no database
    stores it as text: refused with :class:`ContextSerializationError` naming where
    it is, before any write."""
    # An explicit stack: this value may be nested past the recursion limit's reach.
    stack: list[tuple[Any, str]] = [(value, "$")]
    while stack:
        item, path = stack.pop()
        if type(item) is dict:
            for key, child in item.items():
                _check_utf8(key, f"a key of {path}")
                stack.append((child, f"{path}[{key!r}]"))
        elif type(item) is list:
            stack.extend((child, f"{path}[{n}]") for n, child in enumerate(item))
        elif type(item) is str:
            _check_utf8(item, path)
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def _check_utf8(text: str, path: str) -> None:
    if text.isascii():
        return
    try:
        text.encode()
    except UnicodeEncodeError as error:
        raise ContextSerializationError(
            f"{path} is a string with a lone surrogate ({text[error.start]!r} at index "
            f"{error.start}), which is not valid Unicode text and cannot be stored; "
            "decode the text it came from with errors='replace'", path=path) from None


def loads(text: str | bytes) -> Any:
    """Parse JSON text; the caller translates ``ValueError`` into its own error
    (orjson's ``JSONDecodeError`` is the standard library's)."""
    return orjson.loads(text)


@dataclass(frozen=True, slots=True)
class Undecodable:
    """A stored JSON document whose text does not parse: what a column of documents
    that are verified before use (the checkpoint history's records) reads back as,
    instead of failing the whole read, so that the verifier names that one record."""

    text: str
    error: str


def loads_or_undecodable(text: str | bytes) -> Any:
    """:func:`loads`, or an :class:`Undecodable` holding the text and why it failed."""
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError as error:
        shown = text.decode("utf-8", "replace") if isinstance(text, bytes) else text
        return Undecodable(shown, str(error))
