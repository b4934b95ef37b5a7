"""Tool calls for models without reliable native ones: the ``json`` tool mode.

Many small or local models never emit native tool calls, yet fill in a JSON object
well when the server constrains their output to a schema (``response_format``, which
llama.cpp, vLLM, Ollama and OpenAI turn into a grammar). In this mode the adapter
sends no ``tools``; it asks for one JSON object with a field per tool, each a list of
the calls to make now (each item is that tool's arguments, under the tool's own
parameter schema), and an ``answer`` field for the reply when no tool is called::

    {"ask_flights": [{"query": "Lisbon, 3 May"}], "ask_hotels": [], "answer": ""}

Each list holds at most ``per_tool`` calls (``json_calls_per_tool``, 1 by default): a
grammar admits a list of any length, and a small model repeats an item until its
token limit cuts it off.

and turns that object into :class:`~meshpoint.llm.base.ToolCall` s, in the order of
the tools and then of the items: several items make a fan-out. Once no tool may be
called (``max_tool_rounds`` reached, ``tool_choice: none``) the schema has ``answer``
alone, at least one character long: still JSON, because a model that has seen its
own JSON replies in the conversation tends to imitate them in a plain reply, and the
grammar is what ends it.
Because no tool is declared to the server, the conversation is rendered as plain
messages too: a turn that made calls is shown as the JSON object it answered, and the
results as one user message, so that any chat template accepts it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from meshpoint.llm.base import ToolCall, ToolSpec

#: The field of the reply's text; no tool may be called this (an agent's tool names
#: are its peers' ``ask_<name>`` and its local tools', checked by the adapter).
ANSWER = "answer"


@dataclass(frozen=True, slots=True)
class JsonPlan:
    """What a model is asked for in JSON mode this call."""

    #: The tools it may call now (none: only ``answer``).
    tools: tuple[ToolSpec, ...]
    #: At least one call is expected (``tool_choice: required``): no ``answer`` field.
    required: bool = False
    #: At most one call per reply (``parallel_tool_calls: false``).
    single: bool = False
    #: At most this many calls of one tool per reply (the list's ``maxItems``): a
    #: grammar admits a list of any length, and a small model may repeat an item
    #: until its token limit cuts it off.
    per_tool: int = 1
    #: Characters all the reply's strings may have together (None: unbounded), shared
    #: evenly as the ``maxLength`` of each string the schemas leave unbounded. The
    #: adapter sets it from ``max_tokens`` so that the grammar closes the JSON before
    #: the token limit: a small model otherwise repeats words inside a string (a
    #: query, the answer) until it is cut off.
    max_chars: int | None = None

    def _string_bound(self) -> int | None:
        if self.max_chars is None:
            return None
        per_call = 1 if self.single else self.per_tool
        fields = sum(per_call * _strings(tool.parameters) for tool in self.tools)
        fields += 0 if self.required and self.tools else 1  # the answer
        return max(16, self.max_chars // max(1, fields))

    def schema(self) -> dict[str, Any]:
        """The JSON schema of the reply."""
        bound = self._string_bound()
        properties: dict[str, Any] = {}
        for tool in self.tools:
            properties[tool.name] = {"type": "array", "items": _bounded(tool.parameters, bound),
                                     "maxItems": 1 if self.single else self.per_tool}
        if not self.tools:
            # The answer is the whole reply: the grammar leaves no room for an empty
            # one (a small model at temperature 0 otherwise closed the string at once,
            # and again on each repair attempt).
            properties[ANSWER] = _bounded({"type": "string", "minLength": 1}, bound)
        elif not self.required:
            properties[ANSWER] = _bounded({"type": "string"}, bound)
        return {"type": "object", "properties": properties,
                "required": list(properties), "additionalProperties": False}

    def response_format(self, kind: str = "json_schema") -> dict[str, Any]:
        """The chat-completions ``response_format`` that constrains the reply:
        OpenAI's layout (``json_schema``, which llama.cpp, vLLM and Ollama read too), or
        ``json_object`` with a ``schema`` (the only one llama-cpp-python's server
        constrains; llama.cpp reads it too)."""
        if kind == "json_object":
            return {"type": "json_object", "schema": self.schema()}
        # Not "strict": OpenAI's strict mode refuses tool schemas that leave a property
        # optional; grammar-based servers (llama.cpp, vLLM) enforce the schema anyway.
        return {"type": "json_schema", "json_schema": {"name": "reply",
                                                       "schema": self.schema()}}

    def instructions(self) -> str:
        """What the system prompt adds, so that the model knows what the fields mean
        (the schema constrains the form; this says what to put in it)."""
        if not self.tools:
            return (f'Reply with a JSON object whose "{ANSWER}" field is your answer to '
                    "the user, written from the tool results above.")
        lines = ["You can call these tools. Reply with one JSON object that has one field "
                 "per tool: the list of calls to make now, each an object of the tool's "
                 f"arguments (at most {1 if self.single else self.per_tool}), or [] to not "
                 "call it. Call several tools to do things at once."]
        for tool in self.tools:
            lines.append(f"- {tool.name}: {tool.description} Arguments: "
                         f"{json.dumps(tool.parameters, separators=(',', ':'))}")
        if self.required:
            lines.append("Call at least one tool.")
        else:
            lines.append(f'Put your answer to the user in "{ANSWER}" when you call no tool '
                         f'(then every tool\'s list is empty); leave it "" otherwise.')
        return "\n".join(lines)

    def calls(self, reply: dict[str, Any], call_prefix: str) -> tuple[
            tuple[ToolCall, ...], str | None, list[str]]:
        """The calls and the answer in a parsed reply, and what is wrong with it (a list
        of problems the model is told about; empty when the reply is usable). Call ids
        are ``<call_prefix>_<n>``."""
        problems: list[str] = []
        calls: list[ToolCall] = []
        for tool in self.tools:
            items = reply.get(tool.name, [])
            if not isinstance(items, list):
                problems.append(f'"{tool.name}" must be a list of argument objects')
                continue
            if len(items) > self.per_tool:
                problems.append(f'"{tool.name}" has {len(items)} calls; at most '
                                f"{self.per_tool} per reply")
            for index, arguments in enumerate(items):
                if not isinstance(arguments, dict):
                    problems.append(f'"{tool.name}"[{index}] must be an object of arguments')
                    continue
                calls.append(ToolCall(id=f"{call_prefix}_{len(calls)}", name=tool.name,
                                      arguments=arguments))
        unknown = sorted(set(reply) - {t.name for t in self.tools} - {ANSWER})
        if unknown:
            problems.append(f"unknown fields {unknown}; the tools are "
                            f"{[t.name for t in self.tools]}")
        answer = reply.get(ANSWER)
        if answer is not None and not isinstance(answer, str):
            problems.append(f'"{ANSWER}" must be a string')
            answer = None
        if self.single:
            calls = calls[:1]
        if self.required and self.tools and not calls:
            problems.append("call at least one tool")
        if not calls and not (answer or "").strip() and not problems:
            problems.append(f'the reply calls no tool and its "{ANSWER}" is empty')
        return tuple(calls), answer, problems


_NESTED = ("items", "additionalProperties", "not")
_NESTED_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")


def _strings(schema: Any) -> int:
    """How many string values a schema's instance has at most once (arrays count once)."""
    if not isinstance(schema, dict):
        return 0
    count = int(schema.get("type") == "string")
    count += sum(_strings(v) for v in (schema.get("properties") or {}).values())
    count += sum(_strings(schema.get(key)) for key in _NESTED)
    count += sum(_strings(v) for key in _NESTED_LISTS for v in schema.get(key) or ())
    return count


def _bounded(schema: Any, bound: int | None) -> Any:
    """``schema`` with ``maxLength: bound`` on each string that has none (a copy)."""
    if bound is None or not isinstance(schema, dict):
        return schema
    out = dict(schema)
    if out.get("type") == "string" and "maxLength" not in out:
        out["maxLength"] = bound
    if isinstance(out.get("properties"), dict):
        out["properties"] = {k: _bounded(v, bound) for k, v in out["properties"].items()}
    for key in _NESTED:
        if isinstance(out.get(key), dict):
            out[key] = _bounded(out[key], bound)
    for key in _NESTED_LISTS:
        if isinstance(out.get(key), list):
            out[key] = [_bounded(v, bound) for v in out[key]]
    return out


def render(messages: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The conversation as plain chat messages (no tool roles, no ``tool_calls``): a
    turn that made calls becomes the JSON object it answered; consecutive results
    become one user message, each line naming its call."""
    out: list[dict[str, Any]] = []
    calls: dict[str, tuple[str, dict[str, Any]]] = {}
    results: list[str] = []

    def flush() -> None:
        if results:
            out.append({"role": "user", "content": "Tool results:\n" + "\n".join(results)})
            results.clear()

    for message in messages:
        role = message.get("role")
        if role == "tool":
            name, arguments = calls.get(str(message.get("tool_call_id")),
                                        (str(message.get("name") or "?"), {}))
            shown = json.dumps(arguments, ensure_ascii=False, separators=(",", ":"))
            results.append(f"- {name}({shown}) -> {message.get('content') or ''}")
            continue
        flush()
        if role == "assistant" and message.get("tool_calls"):
            reply: dict[str, Any] = {}
            for call in message["tool_calls"]:
                calls[call["id"]] = (call["name"], call.get("arguments") or {})
                reply.setdefault(call["name"], []).append(call.get("arguments") or {})
            reply[ANSWER] = message.get("content") or ""
            out.append({"role": "assistant", "content": json.dumps(reply, ensure_ascii=False)})
        else:
            out.append({"role": str(role), "content": message.get("content") or ""})
    flush()
    return out
