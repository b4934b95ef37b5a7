"""Values of LangGraph threads as JSON, without pickle and without imports.

LangGraph's own serializer (``JsonPlusSerializer``) writes msgpack whose extension
records name a module and a class, and reading them back imports that module and
calls that class: whoever can write a row of the checkpoint tables can make a
reader import and run code of their choosing (LangGraph added an allow-list for
this, off by default), and a ``pickle_fallback`` makes it worse. This serializer
writes JSON (orjson) in which a value that JSON cannot say is an object tagged
``"__mp__"``, and reads a tag through a fixed table of constructors built when
this module is imported, plus the classes the application registered by passing
them (``types=``): nothing read from a row ever names a module to import or a
function to call. A value it cannot write is refused when it is written, with
the fix (:class:`~meshpoint.errors.UnserializableValueError`), never when it is
read.

What round-trips: ``None``, booleans, integers of any size, floats (non-finite
too), strings, lists, tuples, sets, frozensets, dicts (keys of any type written
here), bytes, ``datetime``/``date``/``time``/``timedelta``, ``UUID``, ``Decimal``;
LangChain's messages (every class of ``langchain_core.messages``); LangGraph's
``Send``, ``Interrupt``, ``Command``, ``Overwrite`` and ``_DeltaSnapshot``; and
registered pydantic models, dataclasses, enums and named tuples.

A LangChain message is written as pydantic writes it to JSON (in Rust, by its
declared field types), so a value inside its fields that JSON cannot say comes back
as its JSON form (a tuple in ``additional_kwargs`` as a list); one pydantic cannot
write at all falls back to the tagged form of each field.

The output is deterministic (a value written, read and written again gives the
same bytes), which the saver's delta storage of growing lists relies on: a list
is written as a JSON array, so the bytes of a list that grew by one item start
with the bytes of the list before it.
"""

from __future__ import annotations

import base64
import dataclasses
import datetime as dt
import enum
import sys
import uuid
from collections.abc import Callable, Collection, Iterable
from decimal import Decimal
from typing import Any

import orjson
from langchain_core import messages as lc_messages
from langchain_core.messages import BaseMessage
from langgraph.checkpoint.serde.types import _DeltaSnapshot
from langgraph.types import Command, Interrupt, Overwrite, Send
from pydantic import BaseModel, TypeAdapter

from meshpoint._json import INT_MAX, INT_MIN, dump_bytes
from meshpoint.errors import CorruptCheckpointError, UnserializableValueError

TAG = "__mp__"


def _message_classes() -> dict[str, type[BaseMessage]]:
    """Every concrete message class of ``langchain_core.messages``, by class name."""
    found: dict[str, type[BaseMessage]] = {}
    for name in dir(lc_messages):
        cls = getattr(lc_messages, name)
        if isinstance(cls, type) and issubclass(cls, BaseMessage) and cls is not BaseMessage \
                and name != "BaseMessageChunk":
            found[cls.__name__] = cls
    return found


_MESSAGES = _message_classes()


def type_name(cls: type) -> str:
    """The name a registered class is written under: ``module:QualifiedName``."""
    return f"{cls.__module__}:{cls.__qualname__}"


class SafeSerializer:
    """Writes and reads values as tagged JSON (see the module docstring).

    ``types`` are the application's own pydantic models, dataclasses, enums and
    named tuples that its graph state holds; each is read back by the class
    registered under its name, and only those. It also serves as LangGraph's
    ``SerializerProtocol`` (``dumps_typed``/``loads_typed``, type ``"json"``).
    """

    def __init__(self, types: Iterable[type] = ()) -> None:
        self._types: dict[str, type] = {}
        for cls in types:
            self._register(cls)

    def _register(self, cls: type) -> None:
        if not isinstance(cls, type) or not (
                issubclass(cls, BaseModel | enum.Enum) or dataclasses.is_dataclass(cls)
                or (issubclass(cls, tuple) and hasattr(cls, "_fields"))):
            raise UnserializableValueError(
                f"{cls!r} cannot be registered: register pydantic models, dataclasses, "
                "enums and named tuples")
        self._types[type_name(cls)] = cls

    @property
    def types(self) -> tuple[type, ...]:
        """The registered classes."""
        return tuple(self._types.values())

    def with_types(self, types: Iterable[type]) -> SafeSerializer:
        """A serializer that also reads and writes ``types``."""
        return SafeSerializer([*self._types.values(), *types])

    def with_loaded(self, names: Collection[tuple[str, ...]]) -> SafeSerializer:
        """A serializer that also knows the classes named ``(module, name)`` whose
        module is already imported (LangGraph's msgpack allow-list, which it builds
        from the graph's state schema). Nothing is imported: a class of a module not
        loaded yet is left out."""
        found: list[type] = []
        for entry in names:
            if len(entry) != 2:
                continue
            module = sys.modules.get(entry[0])
            cls = getattr(module, entry[1], None) if module is not None else None
            if isinstance(cls, type) and type_name(cls) not in self._types \
                    and cls.__name__ not in _MESSAGES:
                try:
                    SafeSerializer([cls])
                except UnserializableValueError:
                    continue
                found.append(cls)
        return self.with_types(found) if found else self

    # -- LangGraph's SerializerProtocol ------------------------------------------------

    def dumps_typed(self, obj: Any) -> tuple[str, bytes]:
        return "json", self.dumps(obj)

    def loads_typed(self, data: tuple[str, bytes]) -> Any:
        kind, payload = data
        if kind != "json":
            raise CorruptCheckpointError(f"a value of type {kind!r} was not written by "
                                         "meshpoint's serializer and is not read")
        return self.loads(payload)

    # -- bytes -------------------------------------------------------------------------

    def dumps(self, value: Any) -> bytes:
        """``value`` as tagged JSON bytes (ContextSerializationError naming where, for
        a string that is not valid Unicode text: a lone surrogate)."""
        return dump_bytes(self.to_json(value))

    def loads(self, data: bytes) -> Any:
        """The value of tagged JSON bytes (a tag it does not know is refused)."""
        try:
            tree = orjson.loads(data)
        except orjson.JSONDecodeError as error:
            raise CorruptCheckpointError(f"a stored value is not JSON: {error}") from None
        if b'"__mp__"' not in data:
            return tree  # nothing tagged: the JSON is the value
        return self.from_json(tree)

    # -- writing -------------------------------------------------------------------------

    def to_json(self, value: Any) -> Any:
        """``value`` as JSON types, tagged where JSON cannot say it."""
        kind = type(value)
        if kind is str or kind is bool or value is None:
            return value
        if kind is int:
            return value if INT_MIN <= value <= INT_MAX else {TAG: "int", "v": str(value)}
        if kind is float:
            return value if value - value == 0 else {TAG: "float", "v": repr(value)}
        if kind is list:
            return [self.to_json(item) for item in value]
        if kind is dict:
            if TAG not in value and all(type(key) is str for key in value):
                return {key: self.to_json(item) for key, item in value.items()}
            return {TAG: "dict", "v": [[self.to_json(k), self.to_json(v)]
                                      for k, v in value.items()]}
        writer = _WRITERS.get(kind)
        if writer is not None:
            return writer(self, value)
        return self._object(value)

    def _object(self, value: Any) -> Any:
        kind = type(value)
        if isinstance(value, BaseMessage) and _MESSAGES.get(kind.__name__) is kind:
            try:
                # pydantic's own JSON of the message, in Rust: its fields are JSON by
                # their declared types (a conversation's bulk, written at every step).
                body = kind.__pydantic_serializer__.to_json(value, warnings=False)
            except ValueError:  # a field holds what pydantic cannot write as JSON
                return {TAG: "message", "t": kind.__name__, "v": self._fields(value)}
            return orjson.Fragment(b'{"__mp__":"message","t":"%s","plain":true,"v":%s}'
                                   % (kind.__name__.encode(), body))
        name = type_name(kind)
        registered = self._types.get(name) is kind
        if registered and isinstance(value, BaseModel):
            return {TAG: "model", "t": name, "v": self._fields(value)}
        if registered and isinstance(value, enum.Enum):
            return {TAG: "enum", "t": name, "v": self.to_json(value.value)}
        if registered and dataclasses.is_dataclass(value):
            return {TAG: "dataclass", "t": name, "v": {
                f.name: self.to_json(getattr(value, f.name))
                for f in dataclasses.fields(value) if f.init}}
        if registered and isinstance(value, tuple):
            return {TAG: "namedtuple", "t": name, "v": [self.to_json(v) for v in value]}
        for base, writer in _SUBCLASS_WRITERS:
            if isinstance(value, base) and not registered and not isinstance(
                    value, BaseModel | enum.Enum):
                return writer(self, value)
        raise UnserializableValueError(
            f"a value of type {type_name(kind)} cannot be stored: meshpoint's LangGraph "
            "saver stores JSON, LangChain messages, LangGraph's own types and the "
            "pydantic models, dataclasses, enums and named tuples registered with it "
            "(MeshpointSaver(..., types=[...]) or get_checkpointer(types=[...])); it "
            "never pickles")

    def _fields(self, model: BaseModel) -> dict[str, Any]:
        return {name: self.to_json(getattr(model, name))
                for name in type(model).model_fields}

    # -- reading -------------------------------------------------------------------------

    def from_json(self, tree: Any) -> Any:
        """The value of a JSON tree written by :meth:`to_json`."""
        kind = type(tree)
        if kind is list:
            return [self.from_json(item) for item in tree]
        if kind is not dict:
            return tree
        tag = tree.get(TAG)
        if tag is None:
            return {key: self.from_json(item) for key, item in tree.items()}
        reader = _READERS.get(tag)
        if reader is None:
            raise CorruptCheckpointError(f"a stored value has an unknown tag {tag!r}")
        try:
            return reader(self, tree)
        except CorruptCheckpointError:
            raise
        except Exception as error:
            raise CorruptCheckpointError(
                f"a stored value tagged {tag!r} does not read back: {error}") from error

    def _registered(self, tree: dict[str, Any]) -> type:
        cls = self._types.get(tree["t"])
        if cls is None:
            raise CorruptCheckpointError(
                f"a stored value is a {tree['t']}, which is not registered with this "
                "saver: pass it in types=[...] to read it")
        return cls


def _interrupt_schema(schema: Any) -> Any:
    """An interrupt's response schema as JSON Schema (a type is not stored)."""
    if schema is None or isinstance(schema, dict):
        return schema
    return TypeAdapter(schema).json_schema()


_Writer = Callable[[SafeSerializer, Any], Any]


def _sorted(s: SafeSerializer, items: Any) -> list[Any]:
    """A set's items in the order of their JSON (sets have none of their own: a set
    read back and written again must give the same bytes)."""
    return sorted((s.to_json(x) for x in items), key=orjson.dumps)

_WRITERS: dict[type, _Writer] = {
    tuple: lambda s, v: {TAG: "tuple", "v": [s.to_json(x) for x in v]},
    set: lambda s, v: {TAG: "set", "v": _sorted(s, v)},
    frozenset: lambda s, v: {TAG: "frozenset", "v": _sorted(s, v)},
    bytes: lambda s, v: {TAG: "bytes", "v": base64.b64encode(v).decode()},
    bytearray: lambda s, v: {TAG: "bytearray", "v": base64.b64encode(v).decode()},
    dt.datetime: lambda s, v: {TAG: "datetime", "v": v.isoformat()},
    dt.date: lambda s, v: {TAG: "date", "v": v.isoformat()},
    dt.time: lambda s, v: {TAG: "time", "v": v.isoformat()},
    dt.timedelta: lambda s, v: {TAG: "timedelta",
                                "v": [v.days, v.seconds, v.microseconds]},
    uuid.UUID: lambda s, v: {TAG: "uuid", "v": str(v)},
    Decimal: lambda s, v: {TAG: "decimal", "v": str(v)},
    Send: lambda s, v: {TAG: "send", "v": [v.node, s.to_json(v.arg)]},
    Interrupt: lambda s, v: {TAG: "interrupt", "v": [
        s.to_json(v.value), v.id, s.to_json(_interrupt_schema(v.response_schema))]},
    Overwrite: lambda s, v: {TAG: "overwrite", "v": s.to_json(v.value)},
    _DeltaSnapshot: lambda s, v: {TAG: "delta_snapshot", "v": s.to_json(v.value)},
    Command: lambda s, v: {TAG: "command", "v": {
        "graph": v.graph, "update": s.to_json(v.update), "resume": s.to_json(v.resume),
        "goto": s.to_json(v.goto)}},
}
#: Subclasses of the built-in types (a str enum aside): written as their base type.
_SUBCLASS_WRITERS: tuple[tuple[type, _Writer], ...] = (
    (str, lambda s, v: str(v)),
    (int, lambda s, v: s.to_json(int(v))),
    (float, lambda s, v: s.to_json(float(v))),
    (dict, lambda s, v: s.to_json(dict(v))),
    (list, lambda s, v: s.to_json(list(v))),
)

_Reader = Callable[[SafeSerializer, dict[str, Any]], Any]


def _message(s: SafeSerializer, tree: dict[str, Any]) -> Any:
    cls = _MESSAGES.get(tree["t"])
    if cls is None:
        raise CorruptCheckpointError(f"a stored message is of an unknown kind {tree['t']!r}")
    fields = tree["v"]
    if tree.get("plain") is not True:
        return cls.model_construct(**{k: s.from_json(v) for k, v in fields.items()})
    # (A tag inside a plain message stays a dict: nothing runs.)
    names = _CONSTRUCT.get(cls)
    if names is None or fields.keys() != names:
        return cls.model_construct(**fields)
    # What model_construct does for a message with every field given, without its
    # search for aliases and defaults: a third of its time, and most of a read's.
    message = cls.__new__(cls)
    _set(message, "__dict__", fields)
    _set(message, "__pydantic_fields_set__", set(names))
    _set(message, "__pydantic_extra__", {} if cls.model_config.get("extra") == "allow"
         else None)
    _set(message, "__pydantic_private__", None)
    return message


_set = object.__setattr__
#: The fields of each message class that model_construct would simply copy (no alias,
#: no post-init hook), for _message's shortcut.
_CONSTRUCT = {
    cls: frozenset(cls.__pydantic_fields__) for cls in _MESSAGES.values()
    if cls.__pydantic_post_init__ is None and not cls.__pydantic_root_model__ and all(
        f.alias is None and f.validation_alias is None
        for f in cls.__pydantic_fields__.values())}



def _command(s: SafeSerializer, tree: dict[str, Any]) -> Any:
    v = tree["v"]
    return Command(graph=v["graph"], update=s.from_json(v["update"]),
                   resume=s.from_json(v["resume"]), goto=s.from_json(v["goto"]))


_READERS: dict[str, _Reader] = {
    "int": lambda s, t: int(t["v"]),
    "float": lambda s, t: float(t["v"]),
    "dict": lambda s, t: {s.from_json(k): s.from_json(v) for k, v in t["v"]},
    "tuple": lambda s, t: tuple(s.from_json(x) for x in t["v"]),
    "set": lambda s, t: {s.from_json(x) for x in t["v"]},
    "frozenset": lambda s, t: frozenset(s.from_json(x) for x in t["v"]),
    "bytes": lambda s, t: base64.b64decode(t["v"], validate=True),
    "bytearray": lambda s, t: bytearray(base64.b64decode(t["v"], validate=True)),
    "datetime": lambda s, t: dt.datetime.fromisoformat(t["v"]),
    "date": lambda s, t: dt.date.fromisoformat(t["v"]),
    "time": lambda s, t: dt.time.fromisoformat(t["v"]),
    "timedelta": lambda s, t: dt.timedelta(days=t["v"][0], seconds=t["v"][1],
                                           microseconds=t["v"][2]),
    "uuid": lambda s, t: uuid.UUID(t["v"]),
    "decimal": lambda s, t: Decimal(t["v"]),
    "send": lambda s, t: Send(t["v"][0], s.from_json(t["v"][1])),
    "interrupt": lambda s, t: Interrupt(value=s.from_json(t["v"][0]), id=t["v"][1],
                                        response_schema=s.from_json(t["v"][2])),
    "overwrite": lambda s, t: Overwrite(s.from_json(t["v"])),
    "delta_snapshot": lambda s, t: _DeltaSnapshot(s.from_json(t["v"])),
    "command": _command,
    "message": _message,
    "model": lambda s, t: s._registered(t)(**{k: s.from_json(v) for k, v in t["v"].items()}),
    "enum": lambda s, t: s._registered(t)(s.from_json(t["v"])),
    "dataclass": lambda s, t: s._registered(t)(
        **{k: s.from_json(v) for k, v in t["v"].items()}),
    "namedtuple": lambda s, t: s._registered(t)(*(s.from_json(x) for x in t["v"])),
}
