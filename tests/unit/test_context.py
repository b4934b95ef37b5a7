"""TaskExecutionContext: the sub-task registry, token usage and (de)serialisation."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from meshpoint import TaskExecutionContext
from meshpoint.errors import ContextSerializationError, InvalidArgumentError

PERSISTED_KEYS = {
    "format", "task_id", "a2a_context", "current_invocation_id", "response_buffer",
    "produced_artifacts", "artifact_signals_to_return", "flags", "security_context",
    "token_usage", "history", "active_peer_sub_tasks", "parallel_tool_calls", "session_events",
    "session_events_persisted",
}


def paused_context() -> TaskExecutionContext:
    ctx = TaskExecutionContext("task-1", {"session_id": "s-1", "user_id": "u-1"})
    ctx.current_invocation_id = "inv-1"
    ctx.begin_parallel_calls("inv-1", ["call-local", "call-a", "call-b"])
    ctx.record_parallel_result("inv-1", "call-local", {"temperature": 21})
    ctx.register_peer_sub_task("sub-a", {"function_call_id": "call-a", "peer_agent_name": "a"})
    ctx.register_peer_sub_task("sub-b", {"function_call_id": "call-b", "peer_agent_name": "b"})
    ctx.response_buffer = "Looking that up. "
    ctx.produced_artifacts.append({"name": "plan.md", "version": 1})
    ctx.flags["deep_research_sent"] = True
    ctx.security_context["auth_token"] = "jwt"
    ctx.record_token_usage(model="m-1", source="agent", prompt_tokens=10, completion_tokens=5)
    ctx.append_session_event({"role": "user", "text": "weather?"})
    return ctx


def test_first_claim_gets_the_data_and_every_later_claim_gets_none() -> None:
    ctx = paused_context()
    data = ctx.claim_sub_task_completion("sub-a")
    assert data == {"function_call_id": "call-a", "peer_agent_name": "a",
                    "invocation_id": "inv-1"}
    assert ctx.claim_sub_task_completion("sub-a") is None
    assert ctx.claim_sub_task_completion("never-registered") is None
    assert list(ctx.active_peer_sub_tasks) == ["sub-b"]


def test_concurrent_claims_from_threads_succeed_exactly_once_per_sub_task() -> None:
    ctx = TaskExecutionContext("t")
    ctx.current_invocation_id = "inv"
    ids = [f"sub-{n}" for n in range(500)]
    for sub_task_id in ids:
        ctx.register_peer_sub_task(sub_task_id, {"peer_agent_name": "p"})
    start = threading.Barrier(8)

    def claim_all(_: int) -> list[str]:
        start.wait()
        return [s for s in ids if ctx.claim_sub_task_completion(s) is not None]

    with ThreadPoolExecutor(8) as pool:
        won = [s for batch in pool.map(claim_all, range(8)) for s in batch]
    assert sorted(won) == sorted(ids)  # every sub-task claimed once, none twice


def test_register_defaults_and_builds_the_call_order() -> None:
    ctx = TaskExecutionContext("t")
    ctx.current_invocation_id = "inv"
    ctx.register_peer_sub_task("s1", {"peer_agent_name": "p"})
    ctx.register_peer_sub_task("s2", {"peer_agent_name": "q", "function_call_id": "f2"})
    assert ctx.parallel_tool_calls["inv"].call_order == ["s1", "f2"]
    assert ctx.active_peer_sub_tasks["s1"]["function_call_id"] == "s1"


def test_register_rejects_bad_input() -> None:
    ctx = TaskExecutionContext("t")
    with pytest.raises(InvalidArgumentError, match="invocation_id"):
        ctx.register_peer_sub_task("s", {"peer_agent_name": "p"})
    ctx.current_invocation_id = "inv"
    ctx.register_peer_sub_task("s", {})
    with pytest.raises(InvalidArgumentError, match="already registered"):
        ctx.register_peer_sub_task("s", {})
    with pytest.raises(InvalidArgumentError, match="sub_task_id"):
        ctx.register_peer_sub_task("", {})
    with pytest.raises(ContextSerializationError, match="socket"):
        ctx.register_peer_sub_task("s2", {"socket": object()})
    assert list(ctx.active_peer_sub_tasks) == ["s"]


def test_parallel_results_come_back_in_call_order() -> None:
    ctx = TaskExecutionContext("t")
    ctx.begin_parallel_calls("inv", ["c1", "c2", "c3"])
    assert ctx.record_parallel_result("inv", "c3", "three") == (1, 3)
    assert ctx.record_parallel_result("inv", "c1", "one") == (2, 3)
    assert ctx.parallel_tool_calls["inv"].ordered_results() == [("c1", "one"), ("c3", "three")]
    with pytest.raises(InvalidArgumentError, match="not part of invocation"):
        ctx.record_parallel_result("inv", "c9", "x")


def test_token_usage_totals_and_breakdowns() -> None:
    ctx = TaskExecutionContext("t")
    ctx.record_token_usage(model="m1", source="agent", prompt_tokens=10, completion_tokens=2)
    ctx.record_token_usage(model="m2", source="agent", prompt_tokens=5, cached_tokens=4)
    ctx.record_token_usage(model="m1", source="search", completion_tokens=3)
    usage = ctx.token_usage
    assert usage.totals == {"prompt_tokens": 15, "completion_tokens": 5, "cached_tokens": 4}
    assert usage.by_model["m1"] == {"prompt_tokens": 10, "completion_tokens": 5,
                                    "cached_tokens": 0}
    assert usage.by_source["agent"]["prompt_tokens"] == 15
    with pytest.raises(InvalidArgumentError, match="prompt_tokens"):
        ctx.record_token_usage(model="m", source="s", prompt_tokens=-1)
    # cached tokens are part of the prompt (more would price the call below zero)
    with pytest.raises(InvalidArgumentError, match=r"cached_tokens \(9\).*prompt_tokens \(2\)"):
        ctx.record_token_usage(model="m", source="s", prompt_tokens=2, cached_tokens=9)
    assert usage.totals["cached_tokens"] == 4  # nothing of the refused call was added


def test_an_endpoint_that_counts_cached_tokens_apart_has_them_in_the_prompt() -> None:
    from types import SimpleNamespace

    from meshpoint.llm.openai import _usage

    for prompt in (None, 10):
        reply = SimpleNamespace(usage=SimpleNamespace(
            prompt_tokens=prompt, completion_tokens=3,
            prompt_tokens_details=SimpleNamespace(cached_tokens=40)))
        usage = _usage(reply)
        assert (usage.prompt_tokens, usage.cached_tokens, usage.completion_tokens) == (
            40, 40, 3)
        TaskExecutionContext("t").record_token_usage(  # counted, not refused
            model="m", source="s", prompt_tokens=usage.prompt_tokens,
            cached_tokens=usage.cached_tokens)


def test_checkpoint_dict_has_persisted_fields_only() -> None:
    ctx = paused_context()
    ctx.streaming_buffer = "partial"
    ctx.original_message = object()
    ctx.event_loop = asyncio.new_event_loop()
    try:
        data = ctx.to_checkpoint_dict()
    finally:
        ctx.event_loop.close()
    assert set(data) == PERSISTED_KEYS
    assert data["active_peer_sub_tasks"]["sub-b"]["peer_agent_name"] == "b"
    assert data["parallel_tool_calls"]["inv-1"] == {
        "call_order": ["call-local", "call-a", "call-b"],
        "results": {"call-local": {"temperature": 21}}}


def test_mutating_the_context_after_checkpointing_does_not_change_the_dict() -> None:
    ctx = paused_context()
    data = ctx.to_checkpoint_dict()
    ctx.flags["deep_research_sent"] = False
    ctx.produced_artifacts[0]["version"] = 2
    ctx.active_peer_sub_tasks["sub-a"]["peer_agent_name"] = "changed"
    ctx.parallel_tool_calls["inv-1"].results["call-a"] = "late"
    ctx.token_usage.totals["prompt_tokens"] = 999
    ctx.session_events[0]["text"] = "changed"
    assert data == paused_context().to_checkpoint_dict()


def test_mutating_the_dict_after_restoring_does_not_change_the_context() -> None:
    data = paused_context().to_checkpoint_dict()
    ctx = TaskExecutionContext.from_checkpoint_dict(data)
    data["flags"]["deep_research_sent"] = False
    data["produced_artifacts"][0]["version"] = 7
    data["active_peer_sub_tasks"]["sub-a"]["peer_agent_name"] = "changed"
    data["parallel_tool_calls"]["inv-1"]["results"]["call-x"] = 1
    data["token_usage"]["by_model"]["m-1"]["prompt_tokens"] = 0
    assert ctx.to_checkpoint_dict() == paused_context().to_checkpoint_dict()


def test_restored_context_has_fresh_transient_state() -> None:
    original = paused_context()
    original.streaming_buffer = "partial"
    original.first_text_seen_in_turn = True
    original.cancellation_event.set()
    restored = TaskExecutionContext.from_checkpoint_dict(original.to_checkpoint_dict())
    assert restored.lock is not original.lock
    assert not restored.lock.locked()
    assert not restored.cancellation_event.is_set()
    assert restored.event_loop is None and restored.original_message is None
    assert restored.streaming_buffer == "" and not restored.first_text_seen_in_turn
    assert restored.to_checkpoint_dict() == original.to_checkpoint_dict()
    # The restored registry works like the original's.
    assert restored.claim_sub_task_completion("sub-a") is not None
    assert restored.claim_sub_task_completion("sub-a") is None


@pytest.mark.parametrize(("value", "path"), [
    (object(), "context['flags']['bad']"),
    ({1: "int key"}, "context['flags']['bad']"),
    (float("nan"), "context['flags']['bad']"),
    ([1, {2, 3}], "context['flags']['bad'][1]"),
    ({"n": 2**64}, "context['flags']['bad']['n']"),
    ([-(2**63) - 1], "context['flags']['bad'][0]"),
])
def test_a_context_that_cannot_be_serialised_names_the_value(value: object, path: str) -> None:
    ctx = paused_context()
    ctx.flags["bad"] = value
    with pytest.raises(ContextSerializationError) as caught:
        ctx.to_checkpoint_dict()
    assert caught.value.path == path
    assert path in str(caught.value)


def test_integers_of_64_bits_are_stored_as_they_are() -> None:
    ctx = TaskExecutionContext("t")
    ctx.flags["edges"] = [-(2**63), 2**63 - 1, 2**64 - 1]
    assert ctx.to_checkpoint_dict()["flags"]["edges"] == [-(2**63), 2**63 - 1, 2**64 - 1]


def test_a_too_big_integer_is_refused_with_what_to_do() -> None:
    ctx = TaskExecutionContext("t")
    with pytest.raises(ContextSerializationError, match=r"event\['digits'\] is 1000.*past "
                       "64 bits.*string"):
        ctx.append_session_event({"role": "tool", "digits": 10**30})
    assert ctx.session_events == []


def test_checkpoint_delta_holds_only_the_events_not_yet_stored() -> None:
    ctx = paused_context()
    for n in range(3):
        ctx.append_session_event({"role": "model", "n": n})
    ctx.session_events_persisted = len(ctx.session_events) - 2
    delta = ctx.checkpoint_delta()
    full = ctx.to_checkpoint_dict()
    assert delta["session_events"] == full["session_events"][-2:]
    assert {k: v for k, v in delta.items() if k != "session_events"} == \
        {k: v for k, v in full.items() if k != "session_events"}
    ctx.session_events_persisted = len(ctx.session_events) + 1  # claims more than it holds
    with pytest.raises(InvalidArgumentError, match="may only grow"):
        ctx.checkpoint_delta()


def test_json_subclasses_are_stored_as_their_base_types() -> None:
    import enum

    class Level(enum.IntEnum):
        HIGH = 3

    ctx = TaskExecutionContext("t")
    ctx.flags["level"] = Level.HIGH
    ctx.flags["pair"] = (1, 2)
    data = ctx.to_checkpoint_dict()
    assert type(data["flags"]["level"]) is int and data["flags"]["pair"] == [1, 2]


@pytest.mark.parametrize(("mutate", "message"), [
    (lambda d: d.pop("task_id"), "task_id must be a str"),
    (lambda d: d.update(flags=[]), "flags must be a dict"),
    (lambda d: d.update(format=99), "format 99 is not supported"),
    (lambda d: d.update(session_events_persisted=5), "session_events_persisted"),
    (lambda d: d["parallel_tool_calls"]["inv-1"].update(call_order="abc"), "call_order"),
    (lambda d: d.update(active_peer_sub_tasks={"s": "x"}), r"active_peer_sub_tasks\['s'\]"),
])
def test_a_malformed_checkpoint_dict_is_rejected_by_name(mutate, message: str) -> None:  # type: ignore[no-untyped-def]
    data = paused_context().to_checkpoint_dict()
    mutate(data)
    with pytest.raises(InvalidArgumentError, match=message):
        TaskExecutionContext.from_checkpoint_dict(data)
