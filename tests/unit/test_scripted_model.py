"""The scripted model plans from the request and composes from the results."""

from __future__ import annotations

from meshpoint.llm import ScriptedModel, ToolSpec

PEERS = [ToolSpec("ask_a", "a", kind="peer"), ToolSpec("ask_b", "b", kind="peer")]


async def test_plans_one_call_per_topic_round_robin_with_local_tools_mixed_in() -> None:
    model = ScriptedModel()
    tools = [*PEERS, ToolSpec("clock", "time")]
    first = await model.complete([{"role": "user", "content": "Trip: x, y, z"}], tools)
    assert first.text is None
    assert [(c.name, c.arguments["query"]) for c in first.tool_calls] == [
        ("ask_a", "x"), ("clock", "Trip"), ("ask_b", "y"), ("ask_a", "z")]
    again = await model.complete([{"role": "user", "content": "Trip: x, y, z"}], tools)
    assert again == first  # deterministic: a re-run turn makes the same calls
    assert first.usage.prompt_tokens > 0 and first.model == "scripted"


async def test_composes_the_answer_from_results_in_call_order() -> None:
    model = ScriptedModel()
    plan = await model.complete([{"role": "user", "content": "Go"}], PEERS)
    assert [c.arguments["query"] for c in plan.tool_calls] == ["Go", "Go"]
    messages = [
        {"role": "user", "content": "Go"},
        {"role": "assistant", "content": None,
         "tool_calls": [{"id": c.id, "name": c.name, "arguments": c.arguments}
                        for c in plan.tool_calls]},
        {"role": "tool", "tool_call_id": plan.tool_calls[0].id, "content": "A"},
        {"role": "tool", "tool_call_id": plan.tool_calls[1].id, "content": "B"},
    ]
    answer = await model.complete(messages, PEERS)
    assert answer.tool_calls == ()
    assert answer.text == "Answer to 'Go':\n- ask_a(Go) = A\n- ask_b(Go) = B"


async def test_without_tools_it_answers_the_request_itself() -> None:
    answer = await ScriptedModel(persona="hotels").complete(
        [{"role": "user", "content": "Lisbon"}], [])
    assert answer.text is not None and answer.text.startswith("[hotels] Lisbon (ref ")


REFUND = ToolSpec("refund", "Refund an order", parameters={
    "type": "object", "required": ["order_id", "amount_cents"],
    "properties": {"order_id": {"type": "string", "pattern": "^A-\\d{4}$"},
                   "amount_cents": {"type": "integer", "minimum": 1, "maximum": 100000},
                   "reason": {"type": "string", "enum": ["damaged", "late", "other"]}}})


async def test_a_tool_with_its_own_schema_is_called_with_arguments_read_from_the_request(
        ) -> None:
    model = ScriptedModel()
    plan = await model.complete(
        [{"role": "user", "content": "Refund order A-1001: 2500 cents, it came late"}],
        [REFUND])
    assert [c.arguments for c in plan.tool_calls] == [
        {"order_id": "A-1001", "amount_cents": 2500, "reason": "late"}]
    # A number out of bounds is not taken; a required one the request lacks is the
    # least, an optional one is left out.
    plan = await model.complete(
        [{"role": "user", "content": "Refund order A-1001: 999999 cents"}], [REFUND])
    assert plan.tool_calls[0].arguments == {"order_id": "A-1001", "amount_cents": 1}
    messages = [{"role": "user", "content": "Refund order A-1001: 2500 cents"},
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": "c", "name": "refund",
                     "arguments": {"order_id": "A-1001", "amount_cents": 2500}}]},
                {"role": "tool", "tool_call_id": "c", "content": "done"}]
    answer = await model.complete(messages, [REFUND])
    assert answer.text == ("Answer to 'Refund order A-1001: 2500 cents':\n"
                           "- refund(order_id=A-1001, amount_cents=2500) = done")
