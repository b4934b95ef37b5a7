"""The JSON tool mode's pieces: the schema made from the tools, the calls read back
from a reply, and the conversation rendered without tool roles."""

from __future__ import annotations

import json

from jsonschema import Draft202012Validator

from meshpoint.llm import ToolSpec
from meshpoint.llm.json_mode import JsonPlan, render

BOOK = ToolSpec("book", "Book it.", {"type": "object", "properties": {
    "query": {"type": "string"}, "nights": {"type": "integer"}}, "required": ["query"]})
FLIGHTS = ToolSpec("ask_flights", "Ask the flights agent.", kind="peer")


def test_the_schema_has_a_list_of_calls_per_tool_and_an_answer() -> None:
    schema = JsonPlan((BOOK, FLIGHTS)).schema()
    Draft202012Validator.check_schema(schema)
    assert list(schema["properties"]) == ["book", "ask_flights", "answer"]
    assert schema["required"] == ["book", "ask_flights", "answer"]
    # Each list is bounded: a grammar admits any length and a small model repeats items.
    assert schema["properties"]["book"] == {"type": "array", "items": BOOK.parameters,
                                            "maxItems": 1}
    assert JsonPlan((BOOK,), per_tool=3).schema()["properties"]["book"]["maxItems"] == 3
    valid = Draft202012Validator(schema)
    assert valid.is_valid({"book": [{"query": "x", "nights": 2}], "ask_flights": [],
                           "answer": ""})
    assert not valid.is_valid({"book": [{"nights": 2}], "ask_flights": [], "answer": ""})
    assert not valid.is_valid({"book": [], "ask_flights": [], "answer": "", "other": 1})
    # required: no answer field, so the grammar leaves only calls; single: one per tool
    required = JsonPlan((BOOK,), required=True, single=True).schema()
    assert list(required["properties"]) == ["book"]
    assert required["properties"]["book"]["maxItems"] == 1
    # nothing to call: only the answer, never empty (bounded, so that the JSON ends
    # before the limit)
    alone = JsonPlan(()).schema()
    assert alone["properties"] == {"answer": {"type": "string", "minLength": 1}}
    assert not Draft202012Validator(alone).is_valid({"answer": ""})
    assert JsonPlan((), max_chars=400).schema()["properties"] == {
        "answer": {"type": "string", "minLength": 1, "maxLength": 400}}


def test_a_character_budget_bounds_every_unbounded_string() -> None:
    """So that the grammar ends the JSON before the token limit: two strings in BOOK
    (query; nights is an integer), one in FLIGHTS, and the answer share 300 chars."""
    bounded = ToolSpec("b", "b", {"type": "object", "properties": {
        "code": {"type": "string", "maxLength": 3},
        "legs": {"type": "array", "items": {"type": "string"}},
        "pick": {"anyOf": [{"type": "string"}, {"type": "integer"}]}}})
    schema = JsonPlan((BOOK, FLIGHTS, bounded), max_chars=500).schema()
    # strings: query (BOOK), query (FLIGHTS), code, legs item, pick, answer: 6
    props = schema["properties"]
    assert props["book"]["items"]["properties"]["query"]["maxLength"] == 83
    assert props["ask_flights"]["items"]["properties"]["query"]["maxLength"] == 83
    inner = props["b"]["items"]["properties"]
    assert inner["code"]["maxLength"] == 3  # a bound of the tool's own is kept
    assert inner["legs"]["items"]["maxLength"] == 83
    assert inner["pick"]["anyOf"][0]["maxLength"] == 83
    assert props["answer"]["maxLength"] == 83
    assert BOOK.parameters["properties"]["query"] == {"type": "string"}  # not changed
    assert "maxLength" not in str(JsonPlan((BOOK,)).schema())  # no budget, no bound
    assert JsonPlan((BOOK,)).response_format()["json_schema"]["schema"] == JsonPlan(
        (BOOK,)).schema()
    assert JsonPlan((BOOK,)).response_format("json_object") == {
        "type": "json_object", "schema": JsonPlan((BOOK,)).schema()}


def test_a_reply_becomes_calls_in_tool_then_item_order() -> None:
    plan = JsonPlan((BOOK, FLIGHTS), per_tool=2)
    calls, answer, problems = plan.calls({
        "book": [{"query": "hotel"}],
        "ask_flights": [{"query": "out"}, {"query": "back"}], "answer": ""}, "call_2")
    assert problems == []
    assert [(c.id, c.name, c.arguments["query"]) for c in calls] == [
        ("call_2_0", "book", "hotel"), ("call_2_1", "ask_flights", "out"),
        ("call_2_2", "ask_flights", "back")]
    assert answer == ""
    calls, answer, problems = plan.calls({"book": [], "ask_flights": [],
                                          "answer": "Done."}, "c")
    assert (calls, answer, problems) == ((), "Done.", [])
    single = JsonPlan((FLIGHTS,), single=True, per_tool=2)
    calls, _, _ = single.calls({"ask_flights": [{"query": "a"}, {"query": "b"}]}, "c")
    assert [c.arguments["query"] for c in calls] == ["a"]


def test_what_is_wrong_with_a_reply_is_said() -> None:
    plan = JsonPlan((BOOK, FLIGHTS), required=True)
    _, _, problems = plan.calls({"book": {"query": "x"}, "ask_flights": ["x"],
                                 "hotels": []}, "c")
    assert problems == ['"book" must be a list of argument objects',
                        '"ask_flights"[0] must be an object of arguments',
                        "unknown fields ['hotels']; the tools are ['book', 'ask_flights']",
                        "call at least one tool"]
    _, _, problems = JsonPlan((BOOK,)).calls({"book": [], "answer": "  "}, "c")
    assert problems == ['the reply calls no tool and its "answer" is empty']
    # Nothing left to call (a rounds bound reached): "required" asks for no call.
    assert JsonPlan((), required=True).calls({"answer": "Done."}, "c") == ((), "Done.", [])
    _, _, problems = JsonPlan((BOOK,)).calls({"book": [], "answer": 3}, "c")
    assert problems[0] == '"answer" must be a string'
    _, _, problems = JsonPlan((BOOK,)).calls({"book": [{"query": "a"}, {"query": "b"}],
                                              "answer": ""}, "c")
    assert problems == ['"book" has 2 calls; at most 1 per reply']


def test_the_instructions_name_every_tool_and_its_arguments() -> None:
    text = JsonPlan((BOOK, FLIGHTS)).instructions()
    assert "- book: Book it. Arguments: " in text and '"nights"' in text
    assert "- ask_flights: Ask the flights agent." in text
    assert '"answer"' in text
    assert "Call at least one tool." in JsonPlan((BOOK,), required=True).instructions()
    assert "results above" in JsonPlan(()).instructions()


def test_the_conversation_is_rendered_without_tool_roles() -> None:
    messages = [
        {"role": "system", "content": "You plan."},
        {"role": "user", "content": "Lisbon"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "a", "name": "ask_flights", "arguments": {"query": "out"}},
            {"id": "b", "name": "ask_flights", "arguments": {"query": "back"}},
            {"id": "c", "name": "book", "arguments": {"query": "hotel"}}]},
        {"role": "tool", "tool_call_id": "a", "name": "ask_flights", "content": "TP 123"},
        {"role": "tool", "tool_call_id": "b", "name": "ask_flights", "content": "TP 124"},
        {"role": "tool", "tool_call_id": "c", "name": "book", "content": '{"ok": true}'},
    ]
    wire = render(messages)
    assert [m["role"] for m in wire] == ["system", "user", "assistant", "user"]
    assert json.loads(wire[2]["content"]) == {
        "ask_flights": [{"query": "out"}, {"query": "back"}], "book": [{"query": "hotel"}],
        "answer": ""}
    assert wire[3]["content"] == (
        'Tool results:\n- ask_flights({"query":"out"}) -> TP 123\n'
        '- ask_flights({"query":"back"}) -> TP 124\n- book({"query":"hotel"}) -> {"ok": true}')
    assert all(set(m) == {"role", "content"} for m in wire)
