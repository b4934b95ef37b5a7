"""Property tests: any context survives the checkpoint round trip, and neither side
of it can change the other afterwards."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from meshpoint import TaskExecutionContext, _json
from meshpoint._json import json_copy

json_scalars = (st.none() | st.booleans() | st.integers(-(2**53), 2**53)
                | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=20))
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                max_size=4),
    max_leaves=12,
)
json_objects = st.dictionaries(st.text(max_size=8), json_values, max_size=4)
ids = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-", min_size=1, max_size=12)


@st.composite
def contexts(draw: st.DrawFn) -> TaskExecutionContext:
    ctx = TaskExecutionContext(draw(ids), draw(json_objects))
    ctx.current_invocation_id = draw(st.none() | ids)
    ctx.response_buffer = draw(st.text(max_size=50))
    ctx.produced_artifacts = draw(st.lists(json_objects, max_size=3))
    ctx.artifact_signals_to_return = draw(st.lists(json_objects, max_size=3))
    ctx.flags = draw(json_objects)
    ctx.security_context = draw(json_objects)
    for _ in range(draw(st.integers(0, 3))):
        ctx.record_token_usage(model=draw(ids), source=draw(ids),
                               prompt_tokens=draw(st.integers(0, 10**6)),
                               completion_tokens=draw(st.integers(0, 10**6)))
    invocation = draw(ids)
    calls = draw(st.lists(ids, unique=True, max_size=5))
    ctx.begin_parallel_calls(invocation, calls)
    for call in calls:
        choice = draw(st.sampled_from(["result", "peer", "none"]))
        if choice == "result":
            ctx.record_parallel_result(invocation, call, draw(json_values))
        elif choice == "peer":
            ctx.register_peer_sub_task(f"sub-{call}", {
                **draw(json_objects), "invocation_id": invocation, "function_call_id": call})
    for event in draw(st.lists(json_objects, max_size=4)):
        ctx.append_session_event(event)
    ctx.session_events_persisted = draw(st.integers(0, len(ctx.session_events)))
    return ctx


def _mutate_everything(value: Any) -> None:
    """Change every container reachable from ``value`` in place."""
    if isinstance(value, dict):
        for item in list(value.values()):
            _mutate_everything(item)
        value["__mutated__"] = True
    elif isinstance(value, list):
        for item in value:
            _mutate_everything(item)
        value.append("__mutated__")


@settings(max_examples=200, deadline=None)
@given(contexts())
def test_round_trip_is_lossless(ctx: TaskExecutionContext) -> None:
    data = ctx.to_checkpoint_dict()
    assert TaskExecutionContext.from_checkpoint_dict(data).to_checkpoint_dict() == data
    # What the store writes is JSON text: the dict survives that too.
    assert json.loads(json.dumps(data)) == data


# Scalars of every kind json_copy admits, including the forms it converts (tuples,
# subclasses), which its fast path hands to the slow one.
class _Text(str):
    pass


admitted_scalars = (json_scalars | st.integers(-(2**63), 2**64 - 1)
                    | st.text(max_size=5).map(_Text))
admitted_values = st.recursive(
    admitted_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.lists(inner, max_size=3).map(tuple)
    | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20)


def _plain(value: Any) -> Any:
    """What json_copy must return: tuples as lists, subclasses as their base type."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return str(value) if isinstance(value, str) else value


@settings(max_examples=300, deadline=None)
@given(admitted_values)
def test_json_copy_and_the_store_encoding_agree_with_the_standard_library(value: Any) -> None:
    copied = json_copy(value)
    # Compared with the types: == alone takes True for 1 and 1 for 1.0.
    assert _typed(copied) == _typed(_plain(value))
    assert all(type(v) in (str, int, float, bool, type(None), list, dict)
               for v in _walk(copied))
    # orjson writes what the standard library reads, and reads what it writes.
    assert _typed(json.loads(_json.dumps(copied))) == _typed(copied)
    assert _typed(_json.loads(json.dumps(copied))) == _typed(copied)


def _typed(value: Any) -> Any:
    """``value`` with the exact type of every scalar beside it."""
    if type(value) is dict:
        return {key: _typed(item) for key, item in value.items()}
    if type(value) is list:
        return [_typed(item) for item in value]
    return (type(value).__name__, value)


def _walk(value: Any) -> Any:
    yield value
    if isinstance(value, dict):
        for item in value.values():
            yield from _walk(item)
    elif isinstance(value, list):
        for item in value:
            yield from _walk(item)


@settings(max_examples=100, deadline=None)
@given(contexts())
def test_checkpoint_dict_shares_nothing_with_the_context(ctx: TaskExecutionContext) -> None:
    data = ctx.to_checkpoint_dict()
    expected = json.loads(json.dumps(data))
    _mutate_everything(data)
    assert ctx.to_checkpoint_dict() == expected


@settings(max_examples=100, deadline=None)
@given(contexts())
def test_restored_context_shares_nothing_with_the_dict(ctx: TaskExecutionContext) -> None:
    data = ctx.to_checkpoint_dict()
    restored = TaskExecutionContext.from_checkpoint_dict(data)
    before = restored.to_checkpoint_dict()
    _mutate_everything(data)
    assert restored.to_checkpoint_dict() == before
