"""Property tests: any context survives the checkpoint round trip, and neither side
of it can change the other afterwards."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from meshpoint import TaskExecutionContext

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
