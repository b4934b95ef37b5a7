"""Argument checks written once, as types: what the option groups (RuntimeOptions,
the checkpoint and recovery policies, a peer, a queue's options) and the mesh
config's YAML share.

An option group is a frozen pydantic dataclass decorated with :func:`checked`.
Built from Python it validates strictly (``"30"`` or ``True`` is no number of
seconds) and a mistake is an :class:`~meshpoint.errors.InvalidArgumentError`
naming the class, the argument and what was expected, e.g. ``RuntimeOptions.
lease_ttl_s must be greater than 0, got 0``. Read from the config
file, the same type validates as the file's other sections do and a mistake is
told by :func:`explain` with the key's path in the file.

This module imports nothing of meshpoint but its errors, so that every layer may
use it.
"""

from __future__ import annotations

import math
import re
from types import UnionType
from typing import Annotated, Any, TypeVar, Union, get_args, get_origin

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    Tag,
    TypeAdapter,
    ValidationError,
)
from pydantic.dataclasses import is_pydantic_dataclass
from pydantic_core import ArgsKwargs

from meshpoint.errors import InvalidArgumentError

#: The configuration of every option group: unknown arguments or keys are refused.
OPTIONS = ConfigDict(extra="forbid")

_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_NAME_RULE = "must be 1-64 letters, digits, '_' or '-'"
#: How pydantic begins a message ("Input should be", "String should have").
_SHOULD = re.compile(r"^(Input|String|List|Dictionary|Value) should ")


def check_name(what: str, value: Any) -> str:
    """Agent, tool and namespace names become subject tokens: letters, digits, _ and -."""
    if type(value) is not str or not _NAME.match(value):
        raise InvalidArgumentError(f"{what} {_NAME_RULE}, got {value!r}")
    return value


def check_text(what: str, value: Any) -> str:
    """An id or a text that must be a non-empty str (a plain check: it runs on each
    call of the hot path)."""
    if type(value) is not str or not value:
        raise InvalidArgumentError(f"{what} must be a non-empty str, got {value!r:.80}")
    return value


def _name(value: str) -> str:
    if not _NAME.match(value):
        raise ValueError(_NAME_RULE)
    return value


def _finite(value: float) -> float:
    if not math.isfinite(value):
        raise ValueError("Input should be a finite number")
    return value


#: A name that becomes a subject token (an agent's, a tool's, a namespace).
Name = Annotated[str, AfterValidator(_name)]
_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")
_KEY_RULE = "must be 1-64 letters, digits or '_', not starting with a digit"


def _output_key(value: str) -> str:
    if not _KEY.match(value):
        raise ValueError(_KEY_RULE)
    return value


#: Where a stage's answer is stored in the workflow's state (and the ``{key}`` that
#: names it in a later stage's system prompt).
OutputKey = Annotated[str, AfterValidator(_output_key)]


def check_output_key(what: str, value: str) -> str:
    if not isinstance(value, str) or not _KEY.match(value):
        raise InvalidArgumentError(f"{what} {_KEY_RULE}, got {value!r}")
    return value


#: Seconds of a timeout or an interval: a number > 0 (infinity allowed).
Seconds = Annotated[float, Field(gt=0)]
#: Seconds of a deadline that must come: a finite number > 0.
FiniteSeconds = Annotated[float, Field(gt=0), AfterValidator(_finite)]
#: A count of at least one (deliveries, messages in flight).
AtLeastOne = Annotated[int, Field(ge=1)]

T = TypeVar("T")


def checked(cls: type[T]) -> type[T]:
    """Make a pydantic dataclass validate strictly when built from Python, and raise
    :class:`InvalidArgumentError` (naming the argument) instead of pydantic's error.
    Validation by an enclosing model (the config file) is left as it is."""
    target: Any = cls  # (cls stays the caller's type for mypy)
    if not is_pydantic_dataclass(cls):
        raise TypeError(f"{cls.__name__} is not a pydantic dataclass")

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        try:  # (the validator is looked up now: pydantic may have rebuilt it)
            target.__pydantic_validator__.validate_python(
                ArgsKwargs(args, kwargs), self_instance=self, strict=True)
        except ValidationError as error:
            raise InvalidArgumentError(describe(error, cls)) from None

    __init__.__qualname__ = f"{cls.__qualname__}.__init__"
    target.__init__ = __init__
    return target  # type: ignore[no-any-return]


#: id(type) -> the type and its adapter (the type kept, so that its id stays its own).
_ADAPTERS: dict[int, tuple[Any, TypeAdapter[Any]]] = {}


def check(kind: Any, what: str, value: Any) -> Any:
    """``value`` validated strictly as ``kind`` (one of this module's types), or an
    :class:`InvalidArgumentError` saying ``what: what was expected (got value)``: the
    check of an argument that is no option group's field (an agent's max_turns)."""
    entry = _ADAPTERS.get(id(kind))
    if entry is None:
        entry = _ADAPTERS[id(kind)] = (kind, TypeAdapter(kind))
    adapter = entry[1]
    try:
        return adapter.validate_python(value, strict=True)
    except ValidationError as error:
        raise InvalidArgumentError("; ".join(
            explain(e, object, name=what) for e in error.errors(include_url=False))) from None


def describe(error: ValidationError, root: type[Any]) -> str:
    """Every problem of ``error`` (from building ``root``), ``; `` between them."""
    return "; ".join(explain(e, root, name=root.__name__)
                     for e in error.errors(include_url=False))


def explain(error: Any, root: type[Any], name: str | None = None) -> str:
    """One pydantic error as ``key.path: what was expected (got ...)``, the path spelled
    as the config file spells it (after ``name``, if given)."""
    path, _ = _walk(error["loc"], root)
    where = ".".join(([name] if name else []) + path) or "(top level)"
    if error["type"] in ("extra_forbidden", "unexpected_keyword_argument"):
        _, model = _walk(error["loc"][:-1], root)
        hidden = getattr(model, "__hidden_keys__", ())
        allowed = sorted(f.alias or key for key, f in _fields(model).items()
                         if key not in hidden)
        hint = f"; expected one of: {', '.join(allowed)}" if allowed else ""
        return f"{where}: unknown {'key' if name is None else 'argument'}{hint}"
    if error["type"] in ("missing", "missing_argument"):
        return f"{where}: required {'key' if name is None else 'argument'} is missing"
    message = str(error["msg"])
    if error["type"] == "value_error":
        message = message.removeprefix("Value error, ")
        if message.startswith(f"{where}."):  # it names a deeper key itself
            return message
    got = error.get("input")
    shown = not isinstance(got, dict | list | ArgsKwargs) and got is not None
    if name is not None:  # as the Python API's checks say it: "x must be ..., got ..."
        message = _SHOULD.sub("must ", message, count=1)
        if message.startswith("must "):
            return f"{where} {message}" + (f", got {got!r}" if shown else "")
    return f"{where}: {message}" + (f" (got {got!r})" if shown else "")


def _fields(node: Any) -> dict[str, Any]:
    """The fields of a model or a pydantic dataclass (none of anything else)."""
    if isinstance(node, type) and issubclass(node, BaseModel):
        return dict(node.model_fields)
    if isinstance(node, type) and is_pydantic_dataclass(node):
        return dict(node.__pydantic_fields__)
    return {}


def _walk(loc: tuple[Any, ...], root: type[Any]) -> tuple[list[str], type[Any] | None]:
    """Follow a pydantic error location through the config's types: the key path as
    the file spells it (without the tag pydantic inserts for a ``kind:`` union), and
    the model found at its end, if any."""
    node: Any = root
    path: list[str] = []
    for part in loc:
        node = _unwrap(node)
        fields = _fields(node)
        if fields and isinstance(part, int) and part < len(fields):
            part = list(fields)[part]  # a dataclass's positional argument
        if fields:
            field = next((f for key, f in fields.items() if part in (key, f.alias)), None)
            node = field.annotation if field is not None else None
        elif get_origin(node) in (dict, list):
            node = get_args(node)[-1]
        elif get_origin(node) in (Union, UnionType):  # tagged: this part is the tag
            node = next((m for m in get_args(node) if _tag(m) == part), None)
            continue
        else:
            node = None
        path.append(str(part))
    node = _unwrap(node)
    return path, node if _fields(node) else None


def _unwrap(node: Any) -> Any:
    """``Annotated[X, ...]`` and ``X | None`` as ``X``."""
    while get_origin(node) is Annotated:
        node = get_args(node)[0]
    if get_origin(node) in (Union, UnionType):
        members = [m for m in get_args(node) if m is not type(None)]
        if len(members) == 1:
            return members[0]
    return node


def _tag(member: Any) -> Any:
    """The tag of a union's member in an error location: its ``Tag`` (a union told
    apart by a function), or its ``kind``."""
    if get_origin(member) is Annotated:
        found = next((m.tag for m in get_args(member)[1:] if isinstance(m, Tag)), None)
        if found is not None:
            return found
    fields = _fields(_unwrap(member))
    return fields["kind"].default if "kind" in fields else None


__all__ = ["OPTIONS", "AtLeastOne", "FiniteSeconds", "Name", "Seconds", "check",
           "check_name", "check_text", "checked", "describe", "explain"]
