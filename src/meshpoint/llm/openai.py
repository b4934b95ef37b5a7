"""``OpenAIModel``: the :class:`~meshpoint.llm.base.Model` protocol over any
OpenAI-compatible chat-completions endpoint (OpenAI, vLLM, llama.cpp, Ollama, ...).

Needs the ``openai`` package (``pip install 'meshpoint[openai]'``). Tool calls come
back with JSON-string arguments; they are parsed here, and arguments that are not a
JSON object are reported as a :class:`~meshpoint.errors.ModelError` naming the tool.
"""

from __future__ import annotations

import json
from typing import Any

from meshpoint.errors import ConfigurationError, ModelError
from meshpoint.llm.base import ModelResponse, ToolCall, ToolSpec, Usage


class OpenAIModel:
    """Chat completions with tool calls. ``name`` is the endpoint's model name."""

    def __init__(self, name: str, *, base_url: str | None = None, api_key: str | None = None,
                 timeout_s: float = 60.0, max_retries: int = 2,
                 extra: dict[str, Any] | None = None) -> None:
        try:
            from openai import AsyncOpenAI
        except ImportError:  # pragma: no cover - depends on the install
            raise ConfigurationError(
                "OpenAIModel needs the openai package: pip install 'meshpoint[openai]'"
            ) from None
        self.name = name
        self._extra = dict(extra or {})
        # A local endpoint needs no key, but the client insists on one.
        self._client = AsyncOpenAI(base_url=base_url, api_key=api_key or "unused",
                                   timeout=timeout_s, max_retries=max_retries)

    async def close(self) -> None:
        await self._client.close()

    async def complete(self, messages: list[dict[str, Any]],
                       tools: list[ToolSpec]) -> ModelResponse:
        from openai import OpenAIError

        kwargs: dict[str, Any] = {"model": self.name,
                                  "messages": [_to_wire(m) for m in messages], **self._extra}
        if tools:
            kwargs["tools"] = [{"type": "function", "function": {
                "name": t.name, "description": t.description, "parameters": t.parameters}}
                for t in tools]
        try:
            response = await self._client.chat.completions.create(**kwargs)
        except OpenAIError as error:
            raise ModelError(f"model {self.name!r} failed: {error}") from error
        if not response.choices:
            raise ModelError(f"model {self.name!r} returned no choices")
        message = response.choices[0].message
        calls = []
        for call in message.tool_calls or ():
            function = getattr(call, "function", None)
            if function is None:
                raise ModelError(f"model {self.name!r} returned a non-function tool call")
            try:
                arguments = json.loads(function.arguments or "{}")
            except json.JSONDecodeError as error:
                raise ModelError(f"model {self.name!r} called {function.name!r} with arguments "
                                 f"that are not JSON: {error}") from None
            if not isinstance(arguments, dict):
                raise ModelError(f"model {self.name!r} called {function.name!r} with "
                                 f"arguments that are not a JSON object: {arguments!r:.80}")
            calls.append(ToolCall(id=call.id, name=function.name, arguments=arguments))
        usage = Usage()
        if response.usage is not None:
            details = getattr(response.usage, "prompt_tokens_details", None)
            usage = Usage(prompt_tokens=response.usage.prompt_tokens or 0,
                          completion_tokens=response.usage.completion_tokens or 0,
                          cached_tokens=getattr(details, "cached_tokens", 0) or 0)
        return ModelResponse(text=message.content, tool_calls=tuple(calls), usage=usage,
                             model=response.model or self.name)


def _to_wire(message: dict[str, Any]) -> dict[str, Any]:
    """A session event in the chat-completions wire layout."""
    if message.get("role") == "assistant" and message.get("tool_calls"):
        return {"role": "assistant", "content": message.get("content"),
                "tool_calls": [{"id": c["id"], "type": "function",
                                "function": {"name": c["name"],
                                             "arguments": json.dumps(c["arguments"])}}
                               for c in message["tool_calls"]]}
    if message.get("role") == "tool":
        return {"role": "tool", "tool_call_id": message["tool_call_id"],
                "content": message.get("content") or ""}
    return {"role": message["role"], "content": message.get("content") or ""}
