"""The ``Model`` protocol: what an agent needs from a language model.

A model sees the conversation so far and the tools it may call, and answers with
text, tool calls, or both. The conversation is a list of plain dicts in the
chat-completions layout, because that is what the store persists as session
events and what most endpoints speak:

* ``{"role": "system" | "user", "content": str}``
* ``{"role": "assistant", "content": str | None, "tool_calls": [{"id", "name", "arguments"}]}``
* ``{"role": "tool", "tool_call_id": str, "name": str, "content": str}``

``arguments`` is a JSON object (a dict), never a JSON string: adapters convert.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from meshpoint._json import dump_bytes, json_copy
from meshpoint.errors import ContextSerializationError


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """A tool as the model sees it: a name, what it does, and a JSON schema."""

    name: str
    description: str
    parameters: dict[str, Any] = field(default_factory=lambda: {
        "type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]})
    #: ``"peer"`` for a call to another agent (it pauses the task), ``"local"`` for a
    #: function that returns at once. Models may ignore it; the scripted one reads it.
    kind: str = "local"


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One call the model asks for. ``id`` is the function-call id: results are
    given back in the order of the calls, keyed by it."""

    id: str
    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Usage:
    """Tokens one model call spent."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    #: The tokens of the conversation's own prompt, what the context window holds: a
    #: call that asked again (a repair) counts every attempt's prompt in
    #: ``prompt_tokens``, but only the first attempt's here. 0: ``prompt_tokens``.
    context_tokens: int = 0

    @property
    def context(self) -> int:
        """The tokens the context window held for this call's prompt."""
        return self.context_tokens or self.prompt_tokens


@dataclass(frozen=True, slots=True)
class ModelResponse:
    """A model's answer: text, tool calls (possibly several: a fan-out), or both."""

    text: str | None
    tool_calls: tuple[ToolCall, ...] = ()
    usage: Usage = Usage()
    #: The model that answered (an endpoint may name a more specific version).
    model: str = ""


@runtime_checkable
class Model(Protocol):
    """A language model. ``name`` is recorded in token usage by model."""

    name: str

    async def complete(self, messages: list[dict[str, Any]],
                       tools: list[ToolSpec]) -> ModelResponse:
        """Answer the conversation ``messages``, possibly calling some of ``tools``."""
        ...


#: The first words of a continuation prompt, the first message of a task's iteration
#: after a handoff (:mod:`meshpoint.runtime.handoff`), and the titles of its sections.
CONTINUATION_HEADER = "You are continuing a task in a fresh context"
REQUEST_SECTION = "## The request"
ACCOMPLISHED_SECTION = "## What was accomplished"


def ask_again(problems: Sequence[str]) -> str:
    """What a model is told after a reply that could not be used (the user message
    that follows it when it is handed back for repair)."""
    return ("Your reply above could not be used:\n" + "\n".join(f"- {p}" for p in problems)
            + "\nReply again, correcting this.")


def unusable(response: ModelResponse) -> list[str]:
    """What keeps a model's reply out of the task, or nothing: its text and each tool
    call's arguments must be JSON a checkpoint can store (no NaN or infinity, no
    integer past 64 bits, no lone surrogate, only JSON types)."""
    problems = []
    for what, value in ((f"the arguments of {call.name!r}", call.arguments)
                        for call in response.tool_calls):
        try:
            dump_bytes(json_copy(value, "arguments"))
        except ContextSerializationError as error:
            problems.append(f"{what} cannot be used: {error}")
    try:
        dump_bytes(json_copy(response.text, "the reply's text"))
    except ContextSerializationError as error:
        problems.append(str(error))
    return problems


def shown(response: ModelResponse) -> str:
    """An unusable reply as text to show the model, its calls' arguments as written."""
    parts = [response.text] if response.text else []
    parts += [f"(call {call.name} with arguments {json.dumps(call.arguments, default=repr)})"
              for call in response.tool_calls]
    return "\n".join(parts) or "(nothing)"
