"""``ScriptedModel``: a deterministic model, the offline default of the demo and tests.

It is not a canned reply. Given a request such as ``"Plan a trip: flights, hotels,
weather"`` and the tools of its agent, it plans one peer call per topic after the
colon (or one per peer tool when the request lists none), spreads them over the
peer tools round-robin, adds one call to each local tool, and, once every result is
back, writes its answer from the results in the order it made the calls. An agent
without tools answers the request itself. The same input always gives the same
output, so a turn re-run after a crash makes the same calls.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from typing import Any

from meshpoint.llm.base import ModelResponse, ToolCall, ToolSpec, Usage


class ScriptedModel:
    """A deterministic planner/composer (see the module docstring).

    ``persona`` prefixes answers of a tool-less agent; ``rounds`` is how many
    fan-out turns to make before answering (2 makes a task pause twice);
    ``delay_s`` simulates thinking time per call.
    """

    def __init__(self, name: str = "scripted", *, persona: str | None = None,
                 rounds: int = 1, delay_s: float = 0.0) -> None:
        if rounds < 1:
            raise ValueError(f"rounds must be >= 1, got {rounds!r}")
        self.name = name
        self.persona = persona
        self.rounds = rounds
        self.delay_s = delay_s

    async def complete(self, messages: list[dict[str, Any]],
                       tools: list[ToolSpec]) -> ModelResponse:
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        request, since = _last_request(messages)
        turns = [m for m in since if m.get("role") == "assistant" and m.get("tool_calls")]
        if tools and len(turns) < self.rounds:
            calls = self._plan(request, tools, round_no=len(turns))
            return self._respond(messages, None, calls)
        if not turns:
            who = self.persona or "agent"
            digest = hashlib.sha256(request.encode()).hexdigest()[:8]
            return self._respond(messages, f"[{who}] {request} (ref {digest})", ())
        return self._respond(messages, _compose(request, since), ())

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
                              arguments={"query": query + suffix})
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


def _compose(request: str, since: list[dict[str, Any]]) -> str:
    """The answer, written from every tool result in the order of the calls."""
    names = {call["id"]: (call["name"], call["arguments"].get("query", ""))
             for m in since if m.get("role") == "assistant"
             for call in m.get("tool_calls") or ()}
    lines = []
    for m in since:
        if m.get("role") == "tool":
            name, query = names.get(m.get("tool_call_id", ""), (m.get("name", "?"), ""))
            lines.append(f"{name}({query}) = {m.get('content')}")
    return f"Answer to {request!r}:\n" + "\n".join(f"- {line}" for line in lines)
