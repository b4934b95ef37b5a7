"""``OpenAIModel``: the :class:`~meshpoint.llm.base.Model` protocol over any
OpenAI-compatible chat-completions endpoint (OpenAI, vLLM, llama.cpp's
``llama-server``, llama-cpp-python's server, Ollama, ...).

Needs the ``openai`` package (``pip install 'meshpoint[openai]'``). What it adds to a
bare client call, each for a failure seen with real local servers (issue 17):

* **Bounded generations.** ``max_tokens`` is 1024 unless set: a model that never
  stops otherwise runs until its context is full (minutes on a CPU).
* **Bounded calls.** ``timeout_s`` bounds each request whole: connecting, sending and
  reading the whole reply, however slowly a server trickles it (the HTTP client's
  own timeouts bound each read, which a byte a second never trips), and
  ``max_reply_bytes`` the reply's size (:mod:`meshpoint.llm.bounded_http`); past
  either the call fails with :class:`~meshpoint.errors.ModelTimeoutError` or
  :class:`~meshpoint.errors.ModelReplyTooLargeError`, naming the model and the bound.
* **Retries that do not repeat a generation.** Connection failures, 408, 409, 429 and
  5xx answers are retried (``max_retries``); a request that timed out is not, unless
  ``retry_timeouts``: the server may still be generating it, and a slow generation
  would only run again, as long.
* **Replies it cannot use are handed back to the model.** Tool-call arguments that are
  not a JSON object, hold a number JSON has not (``NaN``, ``Infinity``, or ``1e999``,
  which would read as infinity), or do not match the tool's schema, a reply cut off at
  the token
  limit (``finish_reason: "length"``), a JSON-mode reply that is not the asked JSON:
  the model is shown its reply and what is wrong with it, and asked again, up to
  ``repair_attempts`` times, before the call fails with a
  :class:`~meshpoint.errors.ModelError`. Only the usable reply enters the
  conversation; the tokens of every attempt are counted.
* **Two tool modes** (``tool_mode``): ``native`` offers the tools as ``tools`` and reads
  ``tool_calls``; ``json`` asks for a JSON object under a schema made from the tools
  (:mod:`meshpoint.llm.json_mode`), for models without reliable native tool calls.
* **A bound on rounds of calls** (``max_tool_rounds``): after that many rounds since
  the user's message the model is asked to answer, not to call again (a small model
  may otherwise call the same tools until the agent's ``max_turns``). A fresh-context
  iteration's continuation prompt (docs/handoff.md) that lists calls an earlier
  iteration made counts as one round: without it, a small model would plan the same
  calls again in every iteration, and hand off again, until ``max_iterations``.
* **A known context window** (``context_window``, what a handoff's context-utilization
  trigger measures against): configured, or else read once from the server where it
  says (:func:`server_context_window`) after the first reply; a server that does not
  say leaves it unknown, and no call ever fails for it.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Literal

from jsonschema import Draft202012Validator
from tenacity import (
    AsyncRetrying,
    retry_if_exception,
    stop_after_attempt,
    wait_exponential,
)

from meshpoint._retry import retried
from meshpoint.errors import (
    ConfigurationError,
    InvalidArgumentError,
    ModelError,
    ModelTimeoutError,
)
from meshpoint.llm import json_mode
from meshpoint.llm.base import (
    ACCOMPLISHED_SECTION,
    CONTINUATION_HEADER,
    ModelResponse,
    ToolCall,
    ToolSpec,
    Usage,
    ask_again,
)
from meshpoint.llm.context_window import WINDOW_LOOKUP_TIMEOUT_S, server_context_window

if TYPE_CHECKING:
    from openai import AsyncOpenAI

ToolMode = Literal["native", "json"]
TOOL_MODES: tuple[str, ...] = ("native", "json")
TOOL_CHOICES: tuple[str, ...] = ("auto", "required", "none")
JSON_FORMATS: tuple[str, ...] = ("json_schema", "json_object")
#: Sent as ``max_tokens`` unless the caller says otherwise (None: the server's default).
DEFAULT_MAX_TOKENS = 1024
#: The largest reply read, in bytes: a whole context's worth of tokens as JSON fits
#: several times over.
DEFAULT_MAX_REPLY_BYTES = 8 * 1024 * 1024
#: HTTP statuses worth another try: the request may succeed unchanged.
RETRYABLE_STATUS = frozenset({408, 409, 429})


@dataclass
class RequestStats:
    """What this adapter's requests cost, for a demo's tokens/s: every HTTP request
    counts, repair attempts included. Mutable counters, owned by one adapter."""

    requests: int = 0
    #: Requests whose reply was handed back to the model (see the module docstring).
    repaired: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    #: Wall-clock seconds spent waiting for replies.
    seconds: float = 0.0

    @property
    def completion_tokens_per_s(self) -> float:
        return self.completion_tokens / self.seconds if self.seconds else 0.0


@dataclass(frozen=True, slots=True)
class _Attempt:
    """One reply: usable (``response``), or not (``problems``, and what the model said,
    to show it)."""

    response: ModelResponse | None
    problems: tuple[str, ...] = ()
    said: str = ""
    #: The token limit cut it off.
    cut_off: bool = False


class OpenAIModel:
    """Chat completions with tool calls (see the module docstring).

    ``name`` is the endpoint's model name. ``api_key`` may be None for a local server
    that checks none. ``max_tokens``, ``temperature``, ``top_p``, ``seed``, ``stop``,
    ``tool_choice`` (``auto``, ``required``, ``none``), ``parallel_tool_calls`` and
    ``response_format`` are sent as the API defines them when not None; ``json_format``
    is the ``response_format`` layout of the JSON tool mode (see
    :meth:`~meshpoint.llm.json_mode.JsonPlan.response_format`) and
    ``json_calls_per_tool`` how many calls of one tool a JSON reply may make;
    ``extra_body`` adds server-specific fields to the request's JSON (llama.cpp's
    ``cache_prompt``, vLLM's ``top_k``); ``extra`` passes further keyword arguments to
    the openai client's ``create()``. ``timeout_s`` bounds each request whole (its
    reply included) and ``max_reply_bytes`` the size of a reply. ``context_window``
    (tokens) is the model's window; None: read from the server after the first reply
    (:func:`server_context_window`), and None still if the server does not say.
    """

    def __init__(self, name: str, *, base_url: str | None = None, api_key: str | None = None,
                 timeout_s: float = 60.0, max_retries: int = 2, retry_timeouts: bool = False,
                 max_tokens: int | None = DEFAULT_MAX_TOKENS, temperature: float | None = None,
                 top_p: float | None = None, seed: int | None = None,
                 stop: Sequence[str] | None = None, tool_choice: str | None = None,
                 parallel_tool_calls: bool | None = None,
                 response_format: dict[str, Any] | None = None,
                 tool_mode: ToolMode = "native", json_format: str = "json_schema",
                 json_calls_per_tool: int = 1, max_tool_rounds: int | None = None,
                 repair_attempts: int = 2, extra_body: dict[str, Any] | None = None,
                 max_reply_bytes: int = DEFAULT_MAX_REPLY_BYTES,
                 context_window: int | None = None,
                 extra: dict[str, Any] | None = None) -> None:
        if context_window is not None and (type(context_window) is not int or
                                           context_window < 1):
            raise InvalidArgumentError(f"OpenAIModel: context_window must be an int >= 1 "
                                       f"(tokens), got {context_window!r}")
        _check_options(name=name, timeout_s=timeout_s, max_retries=max_retries,
                       max_reply_bytes=max_reply_bytes,
                       max_tokens=max_tokens, tool_choice=tool_choice, tool_mode=tool_mode,
                       json_format=json_format, json_calls_per_tool=json_calls_per_tool,
                       max_tool_rounds=max_tool_rounds,
                       repair_attempts=repair_attempts, response_format=response_format)
        try:
            from openai import AsyncOpenAI
        except ImportError:  # pragma: no cover - depends on the install
            raise ConfigurationError(
                "OpenAIModel needs the openai package: pip install 'meshpoint[openai]'"
            ) from None
        self.name = name
        self.tool_mode: ToolMode = tool_mode
        self.json_format = json_format
        self.json_calls_per_tool = json_calls_per_tool
        self.max_tokens = max_tokens
        self.tool_choice = tool_choice
        self.parallel_tool_calls = parallel_tool_calls
        self.max_tool_rounds = max_tool_rounds
        self.repair_attempts = repair_attempts
        self.max_retries = max_retries
        self.retry_timeouts = retry_timeouts
        self.timeout_s = timeout_s
        self.max_reply_bytes = max_reply_bytes
        self.stats = RequestStats()
        self._context_window = context_window
        #: Whether the server is still to be asked its window (once: the answer is kept).
        self._ask_window = context_window is None and base_url is not None
        self._base_url, self._api_key = base_url, api_key
        sampling = {"max_tokens": max_tokens, "temperature": temperature, "top_p": top_p,
                    "seed": seed, "stop": list(stop) if stop is not None else None,
                    "response_format": response_format}
        self._fixed: dict[str, Any] = {k: v for k, v in sampling.items() if v is not None}
        if extra_body:
            self._fixed["extra_body"] = dict(extra_body)
        self._fixed.update(extra or {})
        # The client's own retries are off: they would retry a timed-out generation.
        # A local endpoint needs no key, but the client insists on one.
        from meshpoint.llm.bounded_http import bounded_client

        # An httpx client: openai 1.x takes only that, and later versions (typed for
        # httpx2's) take it as well.
        http: Any = bounded_client(name, max_reply_bytes, timeout_s)
        self._client: AsyncOpenAI = AsyncOpenAI(base_url=base_url, api_key=api_key or "unused",
                                                timeout=timeout_s, max_retries=0,
                                                http_client=http)

    async def close(self) -> None:
        await self._client.close()

    @property
    def context_window(self) -> int | None:
        """Tokens of the model's context window: configured, or what the server said
        after the first reply (see :func:`server_context_window`); None if unknown."""
        return self._context_window

    async def _learn_context_window(self) -> None:
        """Ask the server its context window, the first time only (never raises)."""
        if not self._ask_window or self._base_url is None:
            return
        self._ask_window = False
        self._context_window = await server_context_window(
            self._base_url, self.name, api_key=self._api_key,
            timeout_s=min(self.timeout_s, WINDOW_LOOKUP_TIMEOUT_S))

    async def complete(self, messages: list[dict[str, Any]],
                       tools: list[ToolSpec]) -> ModelResponse:
        offered = self._tools_now(messages, tools)
        plan = None
        if self.tool_mode == "json" and tools:
            # Whatever the round, the conversation is rendered without tool roles.
            plan = json_mode.JsonPlan(tuple(offered), required=self.tool_choice == "required",
                                      single=self.parallel_tool_calls is False,
                                      per_tool=self.json_calls_per_tool,
                                      max_chars=_chars(self.max_tokens))
        prefix = f"call_{sum(1 for m in messages if m.get('tool_calls'))}"
        feedback: list[dict[str, Any]] = []
        usage = Usage()
        problems: tuple[str, ...] = ()
        for attempt in range(1 + self.repair_attempts):
            if attempt:
                self.stats.repaired += 1
            request = self._request(messages, tools, offered, plan, feedback)
            reply = await self._send(request)
            await self._learn_context_window()  # the server answers: it is up
            usage = _add(usage, _usage(reply))
            result = self._read(reply, offered, plan, prefix)
            if result.response is not None:
                response = result.response
                return ModelResponse(text=response.text, tool_calls=response.tool_calls,
                                     usage=usage, model=response.model)
            problems = result.problems
            feedback += [{"role": "assistant", "content": result.said or "(nothing)"},
                         {"role": "user", "content": ask_again(problems)}]
            if result.cut_off and plan is not None and plan.max_chars:
                # The strings' bound did not end the JSON in time (escapes and spacing
                # take tokens it does not count): the grammar holds the next one shorter.
                plan = replace(plan, max_chars=plan.max_chars // 2)
        raise ModelError(f"model {self.name!r} gave no usable reply in "
                         f"{1 + self.repair_attempts} attempts: {'; '.join(problems)}")

    def _tools_now(self, messages: list[dict[str, Any]],
                   tools: list[ToolSpec]) -> list[ToolSpec]:
        """The tools offered this call: none once ``max_tool_rounds`` rounds of calls
        were made since the last user message (a continuation prompt listing calls
        counts as one), or with ``tool_choice: none``."""
        if self.tool_choice == "none":
            return []
        if self.max_tool_rounds is not None:
            rounds = 0
            for message in reversed(messages):
                if message.get("role") == "user":
                    rounds += _continues_calls(message)
                    break
                rounds += bool(message.get("role") == "assistant" and message.get("tool_calls"))
            if rounds >= self.max_tool_rounds:
                return []
        return list(tools)

    def _request(self, messages: list[dict[str, Any]], tools: list[ToolSpec],
                 offered: list[ToolSpec], plan: json_mode.JsonPlan | None,
                 feedback: list[dict[str, Any]]) -> dict[str, Any]:
        request: dict[str, Any] = {"model": self.name, **self._fixed}
        if plan is not None:
            # No tool is declared to the server: the conversation goes as plain messages.
            wire = json_mode.render(messages)
            _add_system(wire, plan.instructions())
            request["response_format"] = plan.response_format(self.json_format)
        else:
            wire = [_to_wire(m) for m in messages]
            if tools:
                # Every tool stays declared while the conversation holds calls of them;
                # "none" (a rounds bound reached) says not to call one now.
                request["tools"] = [{"type": "function", "function": {
                    "name": t.name, "description": t.description, "parameters": t.parameters}}
                    for t in tools]
                choice = self.tool_choice if offered else "none"
                if choice is not None:
                    request["tool_choice"] = choice
                if self.parallel_tool_calls is not None and offered:
                    request["parallel_tool_calls"] = self.parallel_tool_calls
        request["messages"] = wire + feedback
        return request

    async def _send(self, request: dict[str, Any]) -> Any:
        from openai import APIConnectionError, APIStatusError, APITimeoutError, OpenAIError

        def retryable(error: BaseException) -> bool:
            if isinstance(error, APITimeoutError | TimeoutError):
                return self.retry_timeouts
            if _refusal(error) is not None:
                return False  # the same reply would come back
            if isinstance(error, APIConnectionError):
                return True
            return isinstance(error, APIStatusError) and (
                error.status_code in RETRYABLE_STATUS or error.status_code >= 500)

        def policy() -> AsyncRetrying:
            return AsyncRetrying(stop=stop_after_attempt(self.max_retries + 1),
                                 wait=wait_exponential(multiplier=0.5, max=8.0),
                                 retry=retry_if_exception(retryable), reraise=True)

        async def attempt() -> Any:
            self.stats.requests += 1
            started = time.perf_counter()
            try:
                # The whole request, the reply read to its end included: the client's
                # own timeout bounds each read, which a trickled reply never trips.
                async with asyncio.timeout(self.timeout_s):
                    return await self._client.chat.completions.create(**request)
            finally:
                self.stats.seconds += time.perf_counter() - started

        try:
            reply = await retried(attempt, policy, retryable)
        except (APITimeoutError, TimeoutError) as error:
            raise ModelTimeoutError(
                f"model {self.name!r} did not answer within the timeout (timeout_s="
                f"{self.timeout_s:g}: connecting, sending and the whole reply); a slow "
                "model needs a longer one or a smaller max_tokens") from error
        except (OpenAIError, ModelError) as error:
            refusal = _refusal(error)
            if refusal is not None:
                raise refusal from None
            raise ModelError(f"model {self.name!r} failed: {error}") from error
        usage = _usage(reply)
        self.stats.prompt_tokens += usage.prompt_tokens
        self.stats.completion_tokens += usage.completion_tokens
        return reply

    def _read(self, reply: Any, offered: list[ToolSpec], plan: json_mode.JsonPlan | None,
              prefix: str) -> _Attempt:
        """The usable response in ``reply``, or what is wrong with it."""
        if not reply.choices:
            raise ModelError(f"model {self.name!r} returned no choices")
        choice = reply.choices[0]
        message = choice.message
        model = reply.model or self.name
        text = message.content
        if choice.finish_reason == "length":
            return _Attempt(None, (
                f"the reply was cut off at the token limit (max_tokens={self.max_tokens}); "
                "reply again, shorter",), said=_shown(message), cut_off=True)
        if plan is not None:
            return self._read_json(text, plan, prefix, model)
        calls: list[ToolCall] = []
        problems: list[str] = []
        for index, call in enumerate(message.tool_calls or ()):
            function = getattr(call, "function", None)
            if function is None:
                problems.append(f"call {index + 1} is not a function call")
                continue
            arguments, problem = _arguments(function.name, function.arguments, offered)
            if problem:
                problems.append(problem)
            else:
                calls.append(ToolCall(id=call.id or f"{prefix}_{index}", name=function.name,
                                      arguments=arguments))
        if not calls and not problems and not (text or "").strip():
            problems.append("the reply is empty: call a tool or answer")
        if problems:
            return _Attempt(None, tuple(problems), said=_shown(message))
        return _Attempt(ModelResponse(text=text, tool_calls=tuple(calls), model=model))

    def _read_json(self, text: str | None, plan: json_mode.JsonPlan, prefix: str,
                   model: str) -> _Attempt:
        try:
            parsed = loads_finite(text or "")
        except NotFinite as error:
            return _Attempt(None, (_not_finite_problem("the reply", error),), said=text or "")
        except json.JSONDecodeError as error:
            return _Attempt(None, (f"the reply is not JSON ({error})",), said=text or "")
        if not isinstance(parsed, dict):
            return _Attempt(None, ("the reply must be a JSON object",), said=text or "")
        calls, answer, problems = plan.calls(parsed, prefix)
        by_name = {tool.name: tool for tool in plan.tools}
        for call in calls:
            problem = _schema_problem(call.name, call.arguments, by_name[call.name])
            if problem:
                problems.append(problem)
        if problems:
            return _Attempt(None, tuple(problems), said=text or "")
        # A reply that calls tools keeps its answer as the turn's text only if it has one.
        return _Attempt(ModelResponse(text=answer or None if calls else answer,
                                      tool_calls=calls, model=model))


def _refusal(error: BaseException) -> ModelError | None:
    """The refusal of a reply by :mod:`~meshpoint.llm.bounded_http` that ``error`` is
    or wraps (older openai clients wrap what their transport raises), if any."""
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, ModelError):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


def _continues_calls(message: dict[str, Any]) -> int:
    """1 if ``message`` is a continuation prompt whose accomplished section lists a
    call (an earlier iteration of the same request made a round), else 0."""
    content = message.get("content")
    if not isinstance(content, str) or not content.startswith(CONTINUATION_HEADER):
        return 0
    _, _, after = content.partition(f"\n{ACCOMPLISHED_SECTION}\n")
    section = after.split("\n## ", 1)[0]
    return int(any(line.startswith("- ") and line != "- nothing yet"
                   for line in section.splitlines()))


def _check_options(*, name: str, timeout_s: float, max_retries: int, max_tokens: int | None,
                   tool_choice: str | None, tool_mode: str, json_format: str,
                   json_calls_per_tool: int, max_tool_rounds: int | None,
                   repair_attempts: int, response_format: dict[str, Any] | None,
                   max_reply_bytes: int) -> None:
    """Bad options fail here, with what was expected, not at the first request."""
    def need(ok: bool, message: str) -> None:
        if not ok:
            raise InvalidArgumentError(f"OpenAIModel: {message}")

    need(isinstance(name, str) and bool(name), f"name must be a model name, got {name!r}")
    need(timeout_s > 0, f"timeout_s must be > 0, got {timeout_s!r}")
    need(max_reply_bytes >= 1024, f"max_reply_bytes must be >= 1024, got {max_reply_bytes!r}")
    need(max_retries >= 0, f"max_retries must be >= 0, got {max_retries!r}")
    need(max_tokens is None or max_tokens >= 1, f"max_tokens must be >= 1, got {max_tokens!r}")
    need(tool_choice is None or tool_choice in TOOL_CHOICES,
         f"tool_choice must be one of {TOOL_CHOICES}, got {tool_choice!r}")
    need(tool_mode in TOOL_MODES, f"tool_mode must be one of {TOOL_MODES}, got {tool_mode!r}")
    need(json_calls_per_tool >= 1,
         f"json_calls_per_tool must be >= 1, got {json_calls_per_tool!r}")
    need(json_format in JSON_FORMATS,
         f"json_format must be one of {JSON_FORMATS}, got {json_format!r}")
    need(max_tool_rounds is None or max_tool_rounds >= 0,
         f"max_tool_rounds must be >= 0, got {max_tool_rounds!r}")
    need(repair_attempts >= 0, f"repair_attempts must be >= 0, got {repair_attempts!r}")
    need(response_format is None or tool_mode != "json",
         "response_format cannot be set with tool_mode json, which sets its own")


def _chars(max_tokens: int | None) -> int | None:
    """The characters a JSON-mode reply's strings may have together: one per token of
    ``max_tokens``, so that the JSON ends before the token limit cuts it off. (English
    prose runs at about four characters a token, but a small model's runaway strings of
    digits and codes were seen at under two.)"""
    return None if max_tokens is None else max_tokens


class NotFinite(ValueError):
    """A reply's JSON holds a number JSON has not: NaN, an infinity, or one too large
    for a float (``1e999``, which Python's JSON reads as infinity)."""

    def __init__(self, token: str) -> None:
        super().__init__(token)
        self.token = token


def _not_finite(token: str) -> Any:
    raise NotFinite(token)


def _finite(token: str) -> float:
    value = float(token)
    if not math.isfinite(value):
        raise NotFinite(token)
    return value


def loads_finite(text: str) -> Any:
    """``json.loads``, refusing what JSON has no number for (:class:`NotFinite`): the
    standard library reads ``NaN`` and ``Infinity``, and ``1e999`` as infinity, none of
    which a task can store."""
    return json.loads(text, parse_constant=_not_finite, parse_float=_finite)


def _not_finite_problem(holder: str, error: NotFinite) -> str:
    return (f"{holder} hold{'s' if holder == 'the reply' else ''} {error.token}, which is "
            "not a finite number (JSON has no NaN or infinity): write a finite number")


def _arguments(name: str, raw: str | None, offered: list[ToolSpec]) -> tuple[
        dict[str, Any], str | None]:
    """A native call's arguments parsed, or what is wrong with them."""
    try:
        arguments = loads_finite(raw or "{}")
    except NotFinite as error:
        return {}, _not_finite_problem(f"the arguments of {name!r}", error)
    except json.JSONDecodeError as error:
        return {}, f"the arguments of {name!r} are not valid JSON ({error})"
    if not isinstance(arguments, dict):
        return {}, f"the arguments of {name!r} must be a JSON object, not {arguments!r:.60}"
    tool = next((t for t in offered if t.name == name), None)
    # An unknown tool is the runtime's to answer (the model sees an error result).
    problem = _schema_problem(name, arguments, tool) if tool is not None else None
    return arguments, problem


def _schema_problem(name: str, arguments: dict[str, Any], tool: ToolSpec) -> str | None:
    error = next(iter(Draft202012Validator(tool.parameters).iter_errors(arguments)), None)
    if error is None:
        return None
    where = "/".join(map(str, error.absolute_path)) or "arguments"
    return f"the arguments of {name!r} do not match its schema at {where}: {error.message}"


def _shown(message: Any) -> str:
    """An unusable reply as text to show the model (raw arguments included)."""
    parts = [message.content] if message.content else []
    for call in message.tool_calls or ():
        function = getattr(call, "function", None)
        if function is not None:
            parts.append(f"(call {function.name} with arguments {function.arguments})")
    return "\n".join(parts)


def _add_system(messages: list[dict[str, Any]], text: str) -> None:
    """Append ``text`` to the system message, or start with one (some chat templates
    accept a single system message, first)."""
    if messages and messages[0].get("role") == "system":
        messages[0] = {"role": "system", "content": f"{messages[0]['content']}\n\n{text}"}
    else:
        messages.insert(0, {"role": "system", "content": text})


def _usage(reply: Any) -> Usage:
    if getattr(reply, "usage", None) is None:
        return Usage()
    details = getattr(reply.usage, "prompt_tokens_details", None)
    prompt = reply.usage.prompt_tokens or 0
    # Cached tokens are part of the prompt's; an endpoint that counts them apart (or
    # reports no prompt) has them counted as prompt tokens at the cached price.
    cached = getattr(details, "cached_tokens", 0) or 0
    return Usage(prompt_tokens=max(prompt, cached),
                 completion_tokens=reply.usage.completion_tokens or 0,
                 cached_tokens=cached)


def _add(a: Usage, b: Usage) -> Usage:
    """Two attempts' usage; the context is the first's (a repair's prompt holds the
    conversation and the feedback, which the conversation does not keep)."""
    return Usage(prompt_tokens=a.prompt_tokens + b.prompt_tokens,
                 completion_tokens=a.completion_tokens + b.completion_tokens,
                 cached_tokens=a.cached_tokens + b.cached_tokens,
                 context_tokens=a.context if a.prompt_tokens else b.context)


def _to_wire(message: dict[str, Any]) -> dict[str, Any]:
    """A session event in the chat-completions wire layout (native tool mode).

    The assistant message that carries tool calls has ``content: ""`` when it said
    nothing, not ``null``: OpenAI accepts both, llama-cpp-python's server refuses null
    with HTTP 500 ("Input should be a valid string").
    """
    if message.get("role") == "assistant" and message.get("tool_calls"):
        return {"role": "assistant", "content": message.get("content") or "",
                "tool_calls": [{"id": c["id"], "type": "function",
                                "function": {"name": c["name"],
                                             "arguments": json.dumps(c["arguments"])}}
                               for c in message["tool_calls"]]}
    if message.get("role") == "tool":
        return {"role": "tool", "tool_call_id": message["tool_call_id"],
                "content": message.get("content") or ""}
    return {"role": message["role"], "content": message.get("content") or ""}
