"""``ScriptedModel``: a deterministic model, the offline default of the demo and tests.

It is not a canned reply. Given a request such as ``"Plan a trip: flights, hotels,
weather"`` and the tools of its agent, it plans one peer call per topic after the
colon (or one per peer tool when the request lists none), spreads them over the
peer tools round-robin, adds one call to each local tool, and, once every result is
back, writes its answer from the results in the order it made the calls. An agent
without tools answers the request itself. The same input always gives the same
output, so a turn re-run after a crash makes the same calls.

A local tool is called with ``{"query": ...}`` unless its JSON schema asks for other
properties: those are read from the request (:func:`fill`): a string with a
``pattern`` is the first part of the request that matches it, an ``enum`` the first
value the request names, an integer or number the first in the request within its
``minimum``/``maximum``. So ``"Refund order A-1001: 2500 cents"`` calls a
``refund(order_id: pattern ^A-\\d{4}$, amount_cents: integer)`` tool with
``{"order_id": "A-1001", "amount_cents": 2500}``.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
from collections.abc import Sequence
from typing import Any

from meshpoint.llm.base import (
    ACCOMPLISHED_SECTION,
    CONTINUATION_HEADER,
    REQUEST_SECTION,
    ModelResponse,
    ToolCall,
    ToolSpec,
    Usage,
)


class ScriptedModel:
    """A deterministic planner/composer (see the module docstring).

    ``persona`` prefixes answers of a tool-less agent; ``rounds`` is how many
    fan-out turns to make before answering (2 makes a task pause twice);
    ``delay_s`` simulates thinking time per call. ``context_window`` (tokens: its
    prompt counts a token per 4 characters) lets the context-utilization trigger of a
    handoff measure it; ``handoff_after`` calls the ``handoff`` tool, if offered, after
    that many rounds of an iteration. A task continued in a fresh context (its
    conversation starts with a continuation prompt) goes on with the rounds left,
    and its answer lists what earlier iterations accomplished too.
    """

    def __init__(self, name: str = "scripted", *, persona: str | None = None,
                 rounds: int = 1, delay_s: float = 0.0, context_window: int | None = None,
                 handoff_after: int | None = None, phase_after: int | None = None) -> None:
        if rounds < 1:
            raise ValueError(f"rounds must be >= 1, got {rounds!r}")
        if context_window is not None and context_window < 1:
            raise ValueError(f"context_window must be >= 1, got {context_window!r}")
        for what, value in (("handoff_after", handoff_after), ("phase_after", phase_after)):
            if value is not None and value < 1:
                raise ValueError(f"{what} must be >= 1, got {value!r}")
        self.name = name
        self.persona = persona
        self.rounds = rounds
        self.delay_s = delay_s
        self.context_window = context_window
        self.handoff_after = handoff_after
        self.phase_after = phase_after

    async def complete(self, messages: list[dict[str, Any]],
                       tools: list[ToolSpec]) -> ModelResponse:
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        request, since = _last_request(messages)
        earlier: list[str] = []
        if request.startswith(CONTINUATION_HEADER):
            request, earlier = _continued(request)
        turns = [m for m in since if m.get("role") == "assistant" and m.get("tool_calls")]
        done = len(turns) + _rounds_in(earlier)
        for kind, after, argument in (("phase", self.phase_after, "summary"),
                                      ("handoff", self.handoff_after, "reason")):
            builtin = next((t for t in tools if t.kind == kind), None)
            if builtin is not None and after is not None and len(turns) >= after and \
                    done < self.rounds:
                return self._respond(messages, None, (ToolCall(
                    id=f"call_{done}_{kind}", name=builtin.name,
                    arguments={argument: f"{len(turns)} rounds done in this context"}),))
        planning = [t for t in tools if t.kind not in ("handoff", "phase")]
        if planning and done < self.rounds:
            calls = self._plan(request, planning, round_no=done)
            return self._respond(messages, None, calls)
        if not turns and not earlier:
            who = self.persona or "agent"
            digest = hashlib.sha256(request.encode()).hexdigest()[:8]
            return self._respond(messages, f"[{who}] {request} (ref {digest})", ())
        return self._respond(messages, _compose(request, since, earlier), ())

    def _plan(self, request: str, tools: list[ToolSpec], round_no: int) -> tuple[ToolCall, ...]:
        peers = [t for t in tools if t.kind == "peer"]
        local = [t for t in tools if t.kind != "peer"]
        head, sep, tail = request.partition(":")
        topics = [t.strip() for t in tail.split(",") if t.strip()] if sep else []
        planned: list[tuple[ToolSpec, str]] = []
        if peers:
            if topics:
                planned = [(peers[i % len(peers)], topic) for i, topic in enumerate(topics)]
            else:
                planned = [(peer, request) for peer in peers]
        # Local tools run in the same turn as the peer calls (a mixed fan-out).
        for tool in local:
            planned.insert(min(1, len(planned)), (tool, head.strip() or request))
        suffix = f" (round {round_no + 1})" if self.rounds > 1 else ""
        return tuple(ToolCall(id=f"call_{round_no}_{i}", name=tool.name,
                              arguments=fill(tool.parameters, request, query + suffix))
                     for i, (tool, query) in enumerate(planned))

    def _respond(self, messages: list[dict[str, Any]], text: str | None,
                 calls: tuple[ToolCall, ...]) -> ModelResponse:
        prompt = sum(len(str(m.get("content") or "")) for m in messages)
        out = len(text or "") + sum(len(json.dumps(c.arguments)) for c in calls)
        return ModelResponse(text=text, tool_calls=calls, model=self.name,
                             usage=Usage(prompt_tokens=prompt // 4 + 1,
                                         completion_tokens=out // 4 + 1))


def _last_request(messages: list[dict[str, Any]]) -> tuple[str, list[dict[str, Any]]]:
    """The text of the last user message and the messages after it."""
    for index in range(len(messages) - 1, -1, -1):
        if messages[index].get("role") == "user":
            return str(messages[index].get("content") or ""), messages[index + 1:]
    return "", list(messages)


def _continued(prompt: str) -> tuple[str, list[str]]:
    """The request a continuation prompt carries, and its accomplished lines (those
    of calls this model planned: ``name({"query": ...}) = result``)."""
    sections: dict[str, list[str]] = {}
    current = None
    for line in prompt.splitlines():
        if line.startswith("## "):
            current = line
            sections[current] = []
        elif current is not None:
            sections[current].append(line)
    request = "\n".join(sections.get(REQUEST_SECTION, [])).strip()
    earlier = [line[2:] for line in sections.get(ACCOMPLISHED_SECTION, [])
               if line.startswith("- ") and _CALL_LINE.match(line[2:])]
    return request, earlier


#: An accomplished line of a call: ``tool({"query": "..."}) = result``.
_CALL_LINE = re.compile(r'^[A-Za-z0-9_.-]+\(\{"query": "(?P<query>(?:[^"\\]|\\.)*)"\}\) = ')
_ROUND = re.compile(r"\(round (\d+)\)$")


def _rounds_in(earlier: list[str]) -> int:
    """How many rounds the accomplished lines of earlier iterations made."""
    rounds = set()
    for line in earlier:
        match = _CALL_LINE.match(line)
        query = json.loads(f'"{match.group("query")}"') if match else ""
        found = _ROUND.search(query)
        rounds.add(int(found.group(1)) if found else 1)
    return len(rounds)


def _plain(line: str) -> str:
    """An accomplished line as :func:`_compose` writes its own: ``tool(query) = result``."""
    match = _CALL_LINE.match(line)
    if match is None:
        return line
    name = line[:line.index("(")]
    return f"{name}({json.loads(chr(34) + match.group('query') + chr(34))}) = " \
        f"{line[match.end():]}"


def _compose(request: str, since: list[dict[str, Any]],
             earlier: Sequence[str] = ()) -> str:
    """The answer, written from every tool result in the order of the calls (those of
    earlier iterations first)."""
    names = {call["id"]: (call["name"], _shown_arguments(call["arguments"]))
             for m in since if m.get("role") == "assistant"
             for call in m.get("tool_calls") or ()}
    lines = [_plain(line) for line in earlier]
    for m in since:
        if m.get("role") == "tool":
            name, query = names.get(m.get("tool_call_id", ""), (m.get("name", "?"), ""))
            lines.append(f"{name}({query}) = {m.get('content')}")
    return f"Answer to {request!r}:\n" + "\n".join(f"- {line}" for line in lines)


def _shown_arguments(arguments: dict[str, Any]) -> str:
    """A call's arguments in an answer line: the query, or ``name=value, ...``."""
    if set(arguments) <= {"query"}:
        return str(arguments.get("query", ""))
    return ", ".join(f"{name}={value}" for name, value in arguments.items())


_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def fill(schema: dict[str, Any], request: str, query: str) -> dict[str, Any]:
    """The arguments a local tool is called with: ``{"query": query}`` when its schema
    has a ``query`` property or none, else each property read from ``request`` (see
    the module docstring); a required property the request does not give gets its
    type's least value (the schema's minimum, its first enum value, ``query``)."""
    properties = schema.get("properties") if isinstance(schema, dict) else None
    if not isinstance(properties, dict) or not properties or "query" in properties:
        return {"query": query}
    required = set(schema.get("required") or ())
    rest, arguments = request, dict[str, Any]()
    for name, spec in properties.items():  # the patterns first: they take their text
        pattern = spec.get("pattern") if isinstance(spec, dict) else None
        if isinstance(pattern, str):
            found = re.search(pattern.removeprefix("^").removesuffix("$"), rest)
            if found:
                arguments[name] = found.group(0)
                rest = rest[:found.start()] + " " + rest[found.end():]
    numbers = [float(n) for n in _NUMBER.findall(rest)]
    for name, spec in properties.items():
        if name in arguments or not isinstance(spec, dict):
            continue
        kind = spec.get("type")
        if spec.get("enum"):
            named = next((v for v in spec["enum"] if str(v).lower() in request.lower()),
                         None)
            if named is not None or name in required:
                arguments[name] = spec["enum"][0] if named is None else named
        elif kind in ("integer", "number"):
            low, high = spec.get("minimum", float("-inf")), spec.get("maximum", float("inf"))
            value = next((n for n in numbers if low <= n <= high and
                          (kind == "number" or n == int(n))), None)
            if value is not None:
                numbers.remove(value)
            elif name in required:
                value = low if low != float("-inf") else 0
            if value is not None:
                arguments[name] = int(value) if kind == "integer" else value
        elif kind == "boolean" and name in required:
            arguments[name] = False
        elif kind == "string" and "pattern" not in spec and name in required:
            arguments[name] = query
    return arguments
