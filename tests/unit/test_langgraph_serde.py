"""The LangGraph saver's values: tagged JSON that round-trips what LangGraph stores,
refuses what it cannot store when it is written, and reads a row without importing a
module or unpickling anything (no I/O here)."""

from __future__ import annotations

import builtins
import dataclasses
import datetime as dt
import enum
import importlib
import pickle
import uuid
from decimal import Decimal
from typing import Any, NamedTuple

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("langgraph")

from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
from langgraph.checkpoint.serde.types import _DeltaSnapshot
from langgraph.types import Command, Interrupt, Overwrite, Send
from pydantic import BaseModel

from meshpoint.errors import CorruptCheckpointError, UnserializableValueError
from meshpoint.integrations.langgraph.rows import Cached, plan
from meshpoint.integrations.langgraph.serde import SafeSerializer


class Color(enum.Enum):
    RED = "red"


@dataclasses.dataclass
class Point:
    x: int
    y: int


class Pair(NamedTuple):
    a: int
    b: str


class Profile(BaseModel):
    name: str
    tags: list[str]


SERDE = SafeSerializer([Color, Point, Pair, Profile])

leaves = (st.none() | st.booleans() | st.integers() | st.floats() | st.text()
          | st.binary() | st.uuids() | st.datetimes() | st.dates()
          | st.decimals(allow_nan=False) | st.sampled_from(list(Color)))
values = st.recursive(leaves, lambda inner: (
    st.lists(inner, max_size=4) | st.tuples(inner, inner)
    | st.dictionaries(st.text(max_size=5) | st.integers(), inner, max_size=4)
    | st.frozensets(st.integers() | st.text(), max_size=4)
    | st.builds(Point, st.integers(), st.integers())
    | st.builds(Pair, st.integers(), st.text())), max_leaves=20)


def same(a: Any, b: Any) -> bool:
    """Equal, and of the same types all the way down (NaN equal to itself)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return a == b or (a != a and b != b)
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    return bool(a == b)


@settings(max_examples=300, deadline=None)
@given(values)
def test_values_round_trip_with_their_types_and_their_bytes(value: Any) -> None:
    data = SERDE.dumps(value)
    back = SERDE.loads(data)
    assert same(back, value)
    assert SERDE.dumps(back) == data  # deterministic: what the delta storage relies on


def test_langgraph_and_langchain_types_round_trip() -> None:
    messages = [HumanMessage(content="hi", id="1"),
                AIMessage(content="", tool_calls=[{"name": "f", "args": {"x": 1}, "id": "c1"}]),
                ToolMessage(content="ok", tool_call_id="c1")]
    value = {"messages": messages, "send": Send("node", {"n": 1}),
             "interrupt": Interrupt(value={"ask": "?"}, id="i1"),
             "command": Command(resume="yes", goto="next"), "overwrite": Overwrite([1]),
             "snapshot": _DeltaSnapshot([1, 2]), "profile": Profile(name="a", tags=["b"]),
             "when": dt.datetime(2026, 1, 1, tzinfo=dt.UTC), "big": 2**80,
             "set": {1, 2}, "dec": Decimal("1.10"), "id": uuid.UUID(int=7)}
    back = SERDE.loads(SERDE.dumps(value))
    assert back["messages"] == messages and [type(m) for m in back["messages"]] == \
        [HumanMessage, AIMessage, ToolMessage]
    for key in value:
        if key not in ("messages", "send", "interrupt", "command"):
            assert back[key] == value[key] and type(back[key]) is type(value[key]), key
    assert (back["send"].node, back["send"].arg) == ("node", {"n": 1})
    assert (back["interrupt"].value, back["interrupt"].id) == ({"ask": "?"}, "i1")
    assert (back["command"].resume, back["command"].goto) == ("yes", "next")


def test_a_value_it_cannot_store_is_refused_when_written_with_the_fix() -> None:
    class Unregistered(BaseModel):
        x: int

    for bad in (Unregistered(x=1), object(), Point(1, 2)):
        with pytest.raises(UnserializableValueError, match="types=") as caught:
            SafeSerializer().dumps({"state": [bad]})
        assert "pickle" in str(caught.value)


def test_reading_never_imports_nor_unpickles(monkeypatch: pytest.MonkeyPatch) -> None:
    """A row naming a module and a class, written by someone who can write rows, is
    refused: the reader looks tags up in its fixed table and registered classes only."""
    real_import = builtins.__import__
    calls: list[str] = []
    reading = [False]  # only the reads are watched (pytest imports as it reports)

    def spy_import(name: str, *args: Any, **kwargs: Any) -> Any:
        if reading[0]:
            calls.append(name)
        return real_import(name, *args, **kwargs)

    def read(data: Any) -> Any:
        reading[0] = True
        try:
            return SERDE.loads_typed(data) if isinstance(data, tuple) else SERDE.loads(data)
        finally:
            reading[0] = False

    def no_pickle(*_args: Any, **_kwargs: Any) -> Any:
        raise AssertionError("unpickled")

    forged = [
        {"__mp__": "model", "t": "os:system", "v": {"command": "touch /tmp/pwned"}},
        {"__mp__": "dataclass", "t": "subprocess:Popen", "v": {"args": ["true"]}},
        {"__mp__": "message", "t": "Popen", "v": {}},
        {"__mp__": "pickle", "v": "gASVAAAAAAAAAAA="},
    ]
    langgraph_format = JsonPlusSerializer().dumps_typed(Point(1, 2))
    monkeypatch.setattr(builtins, "__import__", spy_import)
    monkeypatch.setattr(importlib, "import_module", spy_import)
    monkeypatch.setattr(pickle, "loads", no_pickle)
    for row in forged:
        with pytest.raises(CorruptCheckpointError):
            read(orjson.dumps(row))
    # LangGraph's own format (msgpack naming a module) is not read either.
    with pytest.raises(CorruptCheckpointError):
        read(langgraph_format)
    assert calls == []


def test_the_allowlist_langgraph_builds_registers_only_loaded_classes() -> None:
    loaded = SafeSerializer().with_loaded({(Point.__module__, "Point"),
                                           ("a_module_never_imported", "Thing")})
    assert loaded.types == (Point,)
    assert loaded.loads(loaded.dumps(Point(1, 2))) == Point(1, 2)


def test_a_growing_list_is_planned_as_the_items_it_gained() -> None:
    old = [HumanMessage(content="a", id="1"), AIMessage(content="b", id="2")]
    new = [*old, HumanMessage(content="c, with a comma]", id="3")]
    old_bytes = SERDE.dumps(old)
    cached = Cached("v1", old_bytes, 2, "v1", 0, 2)
    row = plan(cached, "messages", "v2", new, SERDE.dumps(new))
    assert row.base == "v1" and row.row_items == 1
    assert SERDE.loads(row.data) == new[2:]
    # Not a growth of the cached list: stored whole.
    for other in ([new[2], *old], old[:1], "text"):
        assert plan(cached, "messages", "v2", other, SERDE.dumps(other)).base is None
    # A chain that reached its length is cut by a whole value.
    long = Cached("v1", old_bytes, 2, "v0", 64, 2)
    assert plan(long, "messages", "v2", new, SERDE.dumps(new)).base is None


def test_messages_read_back_as_model_construct_builds_them() -> None:
    """The read's shortcut for messages (serde._message) builds what pydantic's
    model_construct builds, for every message class LangChain has."""
    from meshpoint.integrations.langgraph.serde import _CONSTRUCT, _MESSAGES

    assert _CONSTRUCT, "the shortcut applies to LangChain's messages"
    for name, cls in _MESSAGES.items():
        kwargs: dict[str, Any] = {"content": f"a {name}", "id": "m1"}
        if "tool_call_id" in cls.model_fields:
            kwargs["tool_call_id"] = "c1"
        if "role" in cls.model_fields:
            kwargs["role"] = "critic"
        if "name" in cls.model_fields and cls.model_fields["name"].is_required():
            kwargs["name"] = "f"
        try:
            message = cls(**kwargs)
        except Exception:  # RemoveMessage and the like take other fields
            continue
        back = SERDE.loads(SERDE.dumps(message))
        direct = cls.model_construct(**orjson.loads(
            cls.__pydantic_serializer__.to_json(message, warnings=False)))
        assert type(back) is cls and back == message == direct, name
        assert back.model_dump() == direct.model_dump()
        assert back.model_fields_set == direct.model_fields_set
        assert back.__pydantic_extra__ == direct.__pydantic_extra__
