"""Any JSON value comes back exactly as written, on every backend and every path.

A value a caller stores (a sub-task's result, its correlation data, a result known
at checkpoint time, a conversation event) is compared after the round trip by its
JSON encoding, so a type (``1.0`` is not ``1``), a digit or a key's place that
changed fails. Paths: resolved by an answer (the returned record and every read),
claimed and then recorded (seed 000's two steps), and restored (one statement on
PostgreSQL, four with its fast paths off, four on SQLite).

SQLite once stored the text of a bare number as a number (a column declared JSON
has NUMERIC affinity) and refused to read it back; PostgreSQL's JSONB turned
``1e300`` into 301 digits that no 64-bit JSON reader takes back. Both are fixed by
migration 0005; this test fails without it. PostgreSQL's fast paths once parsed the
caller's JSON with json_to_recordset, which refuses a ``\u0000`` its json type stores.
"""

from __future__ import annotations

import itertools
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from meshpoint import TaskExecutionContext
from meshpoint.store import SqlStore, open_store
from tests.conftest import FakeClock

#: The store's own suite: also run with PostgreSQL's fast paths off.
pytestmark = pytest.mark.portable_too

_examples = itertools.count()

#: Every value json_copy admits: integers of 64 bits (signed and unsigned), every
#: finite float, any text (NUL included), nested.
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1)
    | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner,
                                                                max_size=3),
    max_leaves=8)


def same(got: Any, want: Any) -> bool:
    """Equal as JSON text: types, digits and key order included."""
    return orjson.dumps(got) == orjson.dumps(want)


@pytest.fixture
async def shared_store(store_url: str, store_options: dict[str, Any],
                       clock: FakeClock) -> Any:
    async with open_store(store_url, clock=clock, **store_options) as store:
        yield store


@settings(max_examples=30, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(answered=json_values, recorded=json_values, local=json_values, carried=json_values,
       said=json_values)
@example(answered=1, recorded=2.5, local=0, carried=-3, said=1.0)
@example(answered=1e300, recorded=1e16, local=2**64 - 1, carried=-(2**63),
         said={"b": 1, "a": [1e-300, -0.0]})
@example(answered="\x00", recorded={"\x00": "\x00"}, local="a\x00b", carried={"\x00": None},
         said=["\x00"])  # PostgreSQL's JSON functions refuse \u0000; its json type keeps it
async def test_any_json_value_comes_back_as_written(
        shared_store: SqlStore, answered: Any, recorded: Any, local: Any, carried: Any,
        said: Any) -> None:
    store = shared_store.for_tenant(f"example-{next(_examples)}")  # isolates examples
    ctx = TaskExecutionContext("t")
    ctx.current_invocation_id = "inv"
    ctx.begin_parallel_calls("inv", ["local", "answered", "recorded", "pending"])
    ctx.record_parallel_result("inv", "local", local)
    for call in ("answered", "recorded", "pending"):
        ctx.register_peer_sub_task(f"t/{call}", {"function_call_id": call,
                                                 "peer_agent_name": "peer",
                                                 "carried": carried})
    ctx.append_session_event({"role": "tool", "said": said})
    await store.checkpoint_task(ctx, "agent")

    resolution = await store.resolve_peer_sub_task("t/answered", answered)
    assert resolution is not None and same(resolution.sub_task.result, answered)
    claimed = await store.claim_peer_sub_task("t/recorded")
    assert claimed is not None
    resolution = await store.record_parallel_result("t", "inv", "recorded", recorded)
    assert resolution is not None and same(resolution.sub_task.result, recorded)

    assert same((await store.get_peer_sub_task("t/answered")).result, answered)
    assert same((await store.get_peer_sub_task("t/pending")).correlation_data["carried"],
                carried)
    want = [("local", local), ("answered", answered), ("recorded", recorded)]
    assert same(await store.get_parallel_results("t", "inv"), want)
    restored = (await store.restore_task("t")).context
    assert same(restored.parallel_tool_calls["inv"].ordered_results(), want)
    assert same(restored.active_peer_sub_tasks["t/pending"]["carried"], carried)
    assert same(restored.session_events, [{"role": "tool", "said": said}])
