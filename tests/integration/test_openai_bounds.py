"""A model call is bounded, however its server misbehaves: ``timeout_s`` is a limit on
the whole call (connect, request and the whole reply, even one trickled a byte at a
time) and ``max_reply_bytes`` on the reply's size (an endless body), each a
meshpoint error naming the model and the bound, which fails the turn as any model
error does. The servers here are real HTTP servers on loopback that misbehave."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from meshpoint import a2a
from meshpoint.errors import ModelError, ModelReplyTooLargeError, ModelTimeoutError
from meshpoint.llm.openai import DEFAULT_MAX_REPLY_BYTES, OpenAIModel
from meshpoint.runtime import Agent
from tests.integration.mesh import Mesh

HI = [{"role": "user", "content": "hi"}]
#: How long the trickling server takes to send its whole reply.
TRICKLE_S = 30.0
REPLY = json.dumps({
    "id": "cmpl-1", "object": "chat.completion", "created": 0, "model": "gpt-test",
    "choices": [{"index": 0, "finish_reason": "stop",
                 "message": {"role": "assistant", "content": "hello " * 40}}],
    "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}).encode()


class BadServer:
    """A chat-completions endpoint that answers ``mode``: ``trickle`` sends a valid
    reply one byte at a time over TRICKLE_S seconds; ``endless`` sends a body that
    never ends, as fast as it is read (chunked); ``declared`` announces a body of a
    gigabyte; ``gzip`` compresses its reply although the client asked it not to;
    ``ok`` answers at once. Each request's Accept-Encoding is kept."""

    def __init__(self) -> None:
        self.mode = "ok"
        self.requests = 0
        self.encodings: list[str | None] = []
        self.stopped = threading.Event()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers["Content-Length"]))
                server.requests += 1
                server.encodings.append(self.headers.get("Accept-Encoding"))
                try:
                    getattr(self, f"answer_{server.mode}")()
                except OSError:
                    pass  # the client went away, as it should

            def head(self, **headers: str) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                for name, value in headers.items():
                    self.send_header(name.replace("_", "-"), value)
                self.end_headers()

            def answer_ok(self) -> None:
                self.head(Content_Length=str(len(REPLY)))
                self.wfile.write(REPLY)

            def answer_trickle(self) -> None:
                self.head(Content_Length=str(len(REPLY)))
                gap = TRICKLE_S / len(REPLY)
                for byte in REPLY:
                    if server.stopped.wait(gap):
                        return
                    self.wfile.write(bytes([byte]))
                    self.wfile.flush()

            def answer_endless(self) -> None:
                self.head(Transfer_Encoding="chunked")
                chunk = b'{"id": "' + b"a" * 65_536
                while not server.stopped.is_set():
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                    chunk = b"a" * 65_536

            def answer_declared(self) -> None:
                self.head(Content_Length=str(2**30))
                self.wfile.write(REPLY)
                server.stopped.wait(TRICKLE_S)

            def answer_gzip(self) -> None:
                import gzip

                body = gzip.compress(REPLY)
                self.head(Content_Length=str(len(body)), Content_Encoding="gzip")
                self.wfile.write(body)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_port}/v1"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.stopped.set()
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def bad() -> Iterator[BadServer]:
    server = BadServer()
    yield server
    server.close()


async def test_a_reply_trickled_byte_by_byte_ends_at_timeout_s(bad: BadServer) -> None:
    model = OpenAIModel("gpt-test", base_url=bad.url, timeout_s=2, max_retries=2)
    assert (await model.complete(HI, [])).text == "hello " * 40  # the server works
    bad.mode, bad.requests = "trickle", 0
    started = time.monotonic()
    with pytest.raises(ModelTimeoutError) as timed_out:
        await model.complete(HI, [])
    # Well before the trickle would have ended (each byte came within the
    # per-read timeout, so the client alone waited for all of them).
    assert time.monotonic() - started < TRICKLE_S
    assert "model 'gpt-test'" in str(timed_out.value) and "timeout_s=2" in str(timed_out.value)
    assert bad.requests == 1  # a timed-out generation is not asked for again
    await model.close()


async def test_an_endless_reply_ends_at_max_reply_bytes(bad: BadServer) -> None:
    assert DEFAULT_MAX_REPLY_BYTES >= 1 << 20  # a sane default: a long reply fits
    model = OpenAIModel("gpt-test", base_url=bad.url, timeout_s=60, max_retries=2,
                        max_reply_bytes=1 << 20)
    for mode in ("endless", "declared"):
        bad.mode, bad.requests = mode, 0
        with pytest.raises(ModelReplyTooLargeError) as too_large:
            await model.complete(HI, [])
        said = str(too_large.value)
        assert "model 'gpt-test'" in said and "max_reply_bytes=1048576" in said, said
        assert bad.requests == 1  # not asked again: the same reply would come back
    # A compressed reply could be a small body that decompresses into a huge one: the
    # client asks for none, and refuses one it is sent anyway.
    assert set(bad.encodings) == {"identity"}
    bad.mode = "gzip"
    with pytest.raises(ModelError, match="compressed"):
        await model.complete(HI, [])
    await model.close()


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
async def test_a_model_call_past_its_bound_fails_the_task_as_any_model_error(
        mesh: Mesh, bad: BadServer) -> None:
    bad.mode = "trickle"
    model = OpenAIModel("gpt-test", base_url=bad.url, timeout_s=1, max_retries=0)
    await mesh.run(Agent("coordinator", model))
    task = await mesh.client.ask("coordinator", "hello", 20)
    await model.close()
    assert task.status.state is a2a.TaskState.FAILED
    assert task.status.message is not None
    assert "ModelTimeoutError: model 'gpt-test'" in task.status.message.text


def test_the_bad_server_really_trickles(bad: BadServer) -> None:
    """The trickle is what the adapter's own timeout would not catch: every byte
    comes well within a read timeout of one second."""
    bad.mode = "trickle"
    with socket.create_connection(("127.0.0.1", bad.httpd.server_port), timeout=1) as conn:
        conn.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                     b"Content-Length: 2\r\n\r\n{}")
        received = b""
        while b"\r\n\r\n" not in received:
            received += conn.recv(1)
        for _ in range(5):  # a byte a time, each within the second
            assert len(conn.recv(1)) == 1
