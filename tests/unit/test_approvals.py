"""Approval answers and tool definitions, without I/O (issue 14 §1)."""

from __future__ import annotations

from typing import Any

import pytest

from meshpoint import a2a
from meshpoint.errors import ArgumentsRejectedError, BadMessageError, InvalidArgumentError
from meshpoint.llm import ScriptedModel
from meshpoint.runtime import Agent, LocalTool, ToolCallInfo
from meshpoint.runtime.approvals import (
    Approve,
    Deny,
    Reply,
    as_decision,
    check_arguments,
    parse_answer,
)


def message(*parts: a2a.TextPart | a2a.DataPart, by: str | None = None) -> a2a.Message:
    return a2a.Message(role="user", parts=list(parts), message_id="m", task_id="t",
                       metadata={"meshpoint_by": by} if by else None)


def data(answer: Any) -> a2a.DataPart:
    return a2a.DataPart(data={"meshpoint_answer": answer})


def test_answers_parse_from_a_data_part_or_from_text() -> None:
    assert parse_answer(message(data({"decision": "approve", "call_id": "c"}), by="ann")) \
        == Approve(call_id="c", by="ann")
    assert parse_answer(message(data({"decision": "approve", "call_id": "c",
                                      "arguments": {"q": 1}}))).arguments == {"q": 1}
    assert parse_answer(message(data({"decision": "deny", "call_id": "c", "reason": "no"}))) \
        == Deny(call_id="c", reason="no")
    assert parse_answer(message(a2a.TextPart(text="later"), by="bo")) == Reply(text="later",
                                                                               by="bo")


@pytest.mark.parametrize(("answer", "reason"), [
    ({"decision": "maybe", "call_id": "c"}, "decision must be one of"),
    ({"call_id": "c"}, "decision must be one of"),
    ("approve", "decision must be one of"),
    ({"decision": "approve"}, "call_id: Field required"),
    ({"decision": "approve", "call_id": ""}, "call_id: String should have at least 1"),
    ({"decision": "approve", "call_id": "c", "arguments": [1]}, "arguments: Input should be"),
    ({"decision": "deny", "call_id": "c", "later": True}, "later: Extra inputs"),
])
def test_a_malformed_answer_says_what_is_wrong(answer: Any, reason: str) -> None:
    with pytest.raises(BadMessageError, match=reason):
        parse_answer(message(data(answer)))


def test_a_message_with_neither_answer_nor_text_is_refused() -> None:
    with pytest.raises(BadMessageError, match="must carry an answer"):
        parse_answer(message(a2a.DataPart(data={"other": 1})))


def test_edited_arguments_are_checked_against_the_schema() -> None:
    schema = {"type": "object", "properties": {"n": {"type": "integer", "maximum": 3}},
              "required": ["n"]}
    check_arguments("t", schema, {"n": 2})
    with pytest.raises(ArgumentsRejectedError, match="n: 4 is greater than the maximum of 3"):
        check_arguments("t", schema, {"n": 4})
    with pytest.raises(ArgumentsRejectedError, match="the arguments: 'n' is a required"):
        check_arguments("t", schema, {})


def test_a_deadline_that_passed_is_a_denial_that_says_so() -> None:
    timeout = as_decision({"status": "timeout", "error": "..."})
    assert (timeout["decision"], timeout["reason"]) == ("denied", "timed out")
    kept = {"decision": "approved", "arguments": {}, "by": "x", "at": 1.0}
    assert as_decision(kept) is kept


def test_tool_definitions_are_checked() -> None:
    def fn(args: dict[str, Any]) -> None:
        return None

    with pytest.raises(InvalidArgumentError, match="not a valid JSON schema"):
        LocalTool("t", "", fn, parameters={"type": "no-such-type"})
    with pytest.raises(InvalidArgumentError, match="needs_approval must be a bool"):
        LocalTool("t", "", fn, needs_approval="yes")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="approval_timeout_s must be"):
        LocalTool("t", "", fn, needs_approval=True, approval_timeout_s=0)
    with pytest.raises(InvalidArgumentError, match="needs stateless_checkpointing"):
        Agent("a", ScriptedModel(), tools=[LocalTool("t", "", fn, needs_approval=True)],
              stateless_checkpointing=False)
    assert Agent("a", ScriptedModel(), tools=[LocalTool("t", "", fn, needs_approval=True)]
                 ).pauses
    assert not Agent("a", ScriptedModel(), tools=[LocalTool("t", "", fn)]).pauses


def test_a_failing_predicate_asks_for_approval() -> None:
    tool = LocalTool("t", "", lambda args: None, needs_approval=lambda args: args["x"] > 1)
    assert tool.requires_approval({"x": 2}) and not tool.requires_approval({"x": 1})
    assert tool.requires_approval({}), "a predicate that raised must not skip the approval"


async def test_a_tool_of_two_parameters_gets_its_call() -> None:
    seen: list[ToolCallInfo | None] = []
    tool = LocalTool("t", "", lambda args, call: seen.append(call))
    await tool.call({}, ToolCallInfo(task_id="task", call_id="c1"))
    assert seen[0] is not None and seen[0].idempotency_key == "task/c1"
    one = LocalTool("u", "", lambda args: "ok")
    assert await one.call({}, ToolCallInfo(task_id="task", call_id="c1")) == "ok"


def test_an_operator_is_shown_the_arguments_an_edit_makes_the_tool_run_with(
        capsys: pytest.CaptureFixture[str]) -> None:
    """``meshpoint tasks approve --arguments`` prints the merged arguments (what the
    tool runs with), not only that they were edited."""
    from meshpoint.cli.tasks import _print_decisions

    _print_decisions([{"decision": "approved", "call_id": "c1", "edited": True,
                       "patch": {"to": "bob@example.com"},
                       "arguments": {"query": "q", "to": "bob@example.com"},
                       "claimed_by": "ops", "verified": False}], "task-1", False)
    out = " ".join(capsys.readouterr().out.split())
    assert 'approved with edited arguments {"query": "q", "to": "bob@example.com"}' in out
