"""The continuation prompt of a handoff (docs/handoff.md, seed 001 §4.2): what a task's
next iteration starts from, built from its checkpoint, deterministically; and the
``ctx.flags`` keys the handoff keeps in a task's context across its iterations."""

from __future__ import annotations

import json
from typing import Any

from meshpoint.context import TaskExecutionContext
from meshpoint.llm.base import ACCOMPLISHED_SECTION, CONTINUATION_HEADER, REQUEST_SECTION
from meshpoint.runtime.turns import HANDOFF_PENDING, LAST_PROMPT_TOKENS, HandOff

#: ``ctx.flags`` keys: the handoff this iteration wrote (pending until the next one
#: starts), a request for one (the model's tool, an operator), consecutive errors,
#: the original request's text, and what earlier iterations accomplished.
PENDING = HANDOFF_PENDING
REQUESTED = "handoff_requested"
ERRORS = "consecutive_errors"
REQUEST = "request"
ACCOMPLISHED = "accomplished"
#: The index of the phase of the work the task is in (its agent's ``handoff.phases``).
PHASE = "phase"
#: The last model call's reported prompt tokens, and the conversation's length then.
LAST_PROMPT = LAST_PROMPT_TOKENS
#: The lines of what was accomplished a continuation prompt carries, at most, and the
#: characters of a call's result each line keeps (the prompt must stay small: it is
#: the next iteration's whole context).
MAX_ACCOMPLISHED = 60
RESULT_CHARS = 160


def iteration_of(ctx: TaskExecutionContext) -> int:
    value = ctx.history.get("iteration", 1)
    return value if type(value) is int and value >= 1 else 1


def phase_of(ctx: TaskExecutionContext) -> int:
    value = ctx.flags.get(PHASE, 0)
    return value if type(value) is int and value >= 0 else 0


def request_of(ctx: TaskExecutionContext) -> str:
    """The task's original request: kept in the flags from the first iteration on."""
    kept = ctx.flags.get(REQUEST)
    if isinstance(kept, str):
        return kept
    first = next((e for e in ctx.session_events if e.get("role") == "user"), None)
    return str(first.get("content") or "") if first else ""


def tokens_used(ctx: TaskExecutionContext) -> int:
    totals = ctx.token_usage.to_dict()["totals"]
    return int(totals.get("prompt_tokens", 0)) + int(totals.get("completion_tokens", 0))


def accomplished_lines(ctx: TaskExecutionContext) -> list[str]:
    """What this iteration's conversation did, a line per call and its result, after
    what earlier iterations did (at most :data:`MAX_ACCOMPLISHED` lines, the newest)."""
    lines = [str(line) for line in ctx.flags.get(ACCOMPLISHED) or ()]
    calls: dict[str, str] = {}
    for event in ctx.session_events:
        if event.get("role") == "assistant":
            for call in event.get("tool_calls") or ():
                calls[call.get("id", "")] = (
                    f"{call.get('name')}({json.dumps(call.get('arguments'), default=str)})")
        elif event.get("role") == "tool":
            what = calls.get(event.get("tool_call_id", ""), str(event.get("name") or "a call"))
            lines.append(f"{what} = {short(event.get('content'), RESULT_CHARS)}")
    return lines[-MAX_ACCOMPLISHED:]


def is_error(content: Any) -> bool:
    """Whether a tool message's content is an error result (``{"error": ...}``)."""
    try:
        value = json.loads(content) if isinstance(content, str) else content
    except ValueError:
        return False
    return isinstance(value, dict) and set(value) == {"error"}


def _said(reason: str) -> str:
    return reason.split(": ", 1)[1] if ": " in reason else reason


def short(value: Any, limit: int = 300) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit - 1] + "…"


def continuation_prompt(ctx: TaskExecutionContext, verdict: HandOff, *,
                        accomplished: list[str], summary: str | None = None,
                        budget_left: int | None = None, instruction: str = "") -> str:
    """The prompt the next iteration starts from (seed 001 §4.2): what was asked, what
    was accomplished, what remains, current blockers, recommended next steps; the
    agent's key decisions, assumptions and constraints (its history record's
    ``context_summary``); a budget warning. Deterministic: the same checkpoint gives
    the same prompt (``summary``, a model's, is added in a section of its own; the
    calls and their results stay listed)."""
    record = ctx.history.get("record")
    agent_summary = (record.get("context_summary") if isinstance(record, dict) else None) or {}
    last_text = next((str(e.get("content")) for e in reversed(ctx.session_events)
                      if e.get("role") == "assistant" and e.get("content")), None)
    iteration = iteration_of(ctx)
    parts = [f"{CONTINUATION_HEADER} (iteration {iteration + 1}; iteration {iteration} handed off: "
             f"{verdict.reason}). The earlier conversation is not shown; this is what it "
             "left.", "", REQUEST_SECTION, request_of(ctx), "", ACCOMPLISHED_SECTION]
    parts += [f"- {line}" for line in accomplished] or ["- nothing yet"]
    if summary:
        parts += ["", "## The previous iteration's own summary", summary]
    parts += ["", "## What remains",
              "- the rest of the request: whatever the accomplished work does not yet "
              "answer", "", "## Current blockers"]
    if verdict.trigger == "consecutive_errors":
        parts.append(f"- the last iteration's errors: {verdict.detail.get('last_error')}")
    else:
        parts.append("- none known")
    if last_text:
        parts += ["", "## Last note of the previous iteration", short(last_text, 1000)]
    for title, key in (("Key decisions", "key_decisions"), ("Assumptions", "assumptions"),
                       ("Constraints", "constraints")):
        values = agent_summary.get(key) if isinstance(agent_summary, dict) else None
        if values:
            parts += ["", f"## {title}", *(f"- {short(v)}" for v in values)]
    if verdict.trigger == "phase_complete":
        parts += ["", "## The next phase", f"- {verdict.detail.get('next_phase')}: the "
                  f"phase before it ({verdict.detail.get('phase')}) is complete: "
                  f"{_said(verdict.reason)}"]
        if instruction:
            parts.append(f"- {instruction}")
    if budget_left is not None:
        parts += ["", "## Budget warning",
                  f"- {budget_left} tokens of the task's budget are left: finish the "
                  "request within them, or the task stops."]
    parts += ["", "## Recommended next steps",
              "- carry on from what was accomplished; do not repeat calls whose results "
              "are above; answer the request when nothing remains."]
    return "\n".join(parts)

