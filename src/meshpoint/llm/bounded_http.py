"""An HTTP client whose replies have a size bound, for :class:`~meshpoint.llm.openai.
OpenAIModel`.

A chat-completions reply is read whole into memory before it is parsed, so a server
that sends an endless body (a bug, or a hostile endpoint) would grow the process
until it dies. The transport here counts a reply's bytes as they arrive and stops at
``max_bytes``; a reply whose declared length is already past it is refused before
its body is read. It asks for an uncompressed reply (``Accept-Encoding: identity``)
and refuses a compressed one, which could be small on the wire and unbounded once
decompressed. Both refusals are :class:`~meshpoint.errors.ModelReplyTooLargeError`
or :class:`~meshpoint.errors.ModelError`, raised through the openai client.

It is an ``httpx`` transport (the openai client accepts an ``httpx.AsyncClient`` in
every version meshpoint supports).
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx

from meshpoint.errors import ModelError, ModelReplyTooLargeError


def bounded_client(model: str, max_bytes: int, timeout_s: float) -> httpx.AsyncClient:
    """An ``httpx.AsyncClient`` for the openai client of ``model`` whose replies stop
    at ``max_bytes`` (with openai's own defaults: redirects followed)."""
    return httpx.AsyncClient(transport=_BoundedTransport(httpx.AsyncHTTPTransport(), model,
                                                         max_bytes),
                             timeout=timeout_s, follow_redirects=True)


class _BoundedTransport(httpx.AsyncBaseTransport):
    def __init__(self, inner: httpx.AsyncBaseTransport, model: str, max_bytes: int) -> None:
        self._inner = inner
        self._model = model
        self._max_bytes = max_bytes

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        request.headers["Accept-Encoding"] = "identity"
        response = await self._inner.handle_async_request(request)
        encoding = response.headers.get("Content-Encoding", "identity").strip().lower()
        declared = response.headers.get("Content-Length", "")
        problem: ModelError | None = None
        if encoding not in ("", "identity"):
            problem = ModelError(
                f"model {self._model!r}: its server sent a compressed reply "
                f"(Content-Encoding: {encoding}) though asked for none; it was not read "
                "(once decompressed, its size has no bound)")
        elif declared.isdigit() and int(declared) > self._max_bytes:
            problem = self.too_large(f"it declared {int(declared):,} bytes")
        if problem is not None:
            await response.aclose()
            raise problem
        assert isinstance(response.stream, httpx.AsyncByteStream)
        response.stream = _BoundedStream(response.stream, self)
        return response

    def too_large(self, how: str) -> ModelReplyTooLargeError:
        return ModelReplyTooLargeError(
            f"model {self._model!r} sent a reply larger than max_reply_bytes="
            f"{self._max_bytes} ({how}); it was not used. Raise max_reply_bytes if "
            "replies this long are expected, or lower max_tokens")

    async def aclose(self) -> None:
        await self._inner.aclose()


class _BoundedStream(httpx.AsyncByteStream):
    """A reply's body that raises once more than the bound has arrived."""

    def __init__(self, inner: httpx.AsyncByteStream, transport: _BoundedTransport) -> None:
        self._inner = inner
        self._transport = transport

    async def __aiter__(self) -> AsyncIterator[bytes]:
        received = 0
        async for chunk in self._inner:
            received += len(chunk)
            if received > self._transport._max_bytes:
                raise self._transport.too_large(f"more than {received:,} bytes arrived")
            yield chunk

    async def aclose(self) -> None:
        await self._inner.aclose()
