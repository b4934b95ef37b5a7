"""The event log (issue 16 §1, seed 003), on a SQLite file and on PostgreSQL: events
written off the caller's path and read back by filter, ``@with_logging``, and the
runtime's own steps and protocol messages when an agent keeps a log."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import signal
import subprocess
import sys
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from meshpoint import a2a, open_store
from meshpoint.errors import InvalidArgumentError
from meshpoint.events.log import EventStore, to_json, with_logging
from meshpoint.llm import ScriptedModel
from meshpoint.runtime import Agent, LocalTool, Peer
from meshpoint.store import SqlStore
from tests.integration.mesh import ManualPeer, Mesh, eventually

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
async def events(live_store: SqlStore) -> Any:
    async with EventStore(live_store, flush_interval_s=0.05) as log:
        yield log


async def test_events_are_written_off_the_callers_path_and_read_back_by_filter(
        events: EventStore) -> None:
    before = datetime.now(UTC) - timedelta(seconds=1)
    message = a2a.Message(role="user", parts=[a2a.TextPart(text="hi")], message_id="m1")
    events.log_event("planner", "thread-1", "step_start", step_name="plan",
                     input_data={"goal": "trip"})
    events.log_event("planner", "thread-1", "protocol_handoff", step_name="ask",
                     input_data={"to": "flights"}, protocol_message=message)
    events.log_event("planner", "thread-2", "error", output_data=ValueError("bad input"))
    events.log_event("writer", "thread-1", "step_complete", step_name="draft",
                     output_data={"words": 120}, state_snapshot={"duration_ms": 3.5})
    assert events.written == 0  # log_event only buffered them
    await events.flush()
    assert events.written == 4
    thread = await events.get_events(thread_id="thread-1")
    assert [(e.agent_id, e.event_type) for e in thread] == [
        ("planner", "step_start"), ("planner", "protocol_handoff"), ("writer", "step_complete")]
    handoff = thread[1]
    assert handoff.input_data["to"] == "flights"
    assert handoff.input_data["_protocol_message"]["parts"][0]["text"] == "hi"
    assert [e.thread_id for e in await events.get_events(agent_id="planner")] == [
        "thread-1", "thread-1", "thread-2"]
    error = (await events.get_events(event_type="error"))[0]
    assert error.output_data == {"$error": "ValueError", "message": "bad input"}
    assert len(await events.get_events(since=before, limit=2)) == 2
    assert await events.get_events(until=before) == []
    latest = await events.get_latest_event(agent_id="planner")
    assert latest is not None and latest.event_type == "error"
    assert latest.timestamp >= thread[0].timestamp
    assert await events.get_latest_event(thread_id="nope") is None
    other = EventStore(events.store.for_tenant("other"))
    assert await other.get_events() == []  # another tenant's log


async def test_bad_arguments_are_named_and_nothing_is_buffered(events: EventStore) -> None:
    for call, match in ((lambda: events.log_event("", "t", "x"), "agent_id"),
                        (lambda: events.log_event("a", "t", ""), "event_type"),
                        (lambda: events.log_event("a", "t", "x" * 65), "event_type")):
        with pytest.raises(InvalidArgumentError, match=match):
            call()
    with pytest.raises(InvalidArgumentError, match="since"):
        await events.get_events(since="yesterday")  # type: ignore[arg-type]
    # ids are text every database stores: no NUL, no lone surrogate (on SQLite one
    # stalled the writer; on PostgreSQL it was refused at the write, far from the call)
    for call, match in ((lambda: events.log_event("a", "user-\ud800", "x"), "thread_id"),
                        (lambda: events.log_event("a", "t", "x", step_name="s\x00"),
                         "step_name"),
                        (lambda: events.log_event("a\x00", "t", "x"), "agent_id")):
        with pytest.raises(InvalidArgumentError, match=f"{match}.*lone surrogate"):
            call()
    with pytest.raises(InvalidArgumentError, match="agent_id"):
        await events.get_events(agent_id="a\ud800")
    assert await events.flush() == 0


async def test_the_buffer_is_bounded_and_the_background_writer_flushes_it(
        live_store: SqlStore) -> None:
    log = EventStore(live_store, flush_interval_s=60, batch=2, max_buffered=3)
    for n in range(5):
        log.log_event("a", "t", "step_start", step_name=f"s{n}")
    assert log.dropped == 2  # the oldest two went
    await eventually(lambda: log.written == 3, what="the batch the writer was woken for")
    assert [e.step_name for e in await log.get_events()] == ["s2", "s3", "s4"]
    log.log_event("a", "t", "step_start", step_name="lost")
    log.abandon()  # a crash: what was buffered is gone, and counted
    assert log.dropped == 3 and await log.flush() == 0


async def test_close_writes_everything_buffered(live_store: SqlStore) -> None:
    log = EventStore(live_store, flush_interval_s=60, batch=1000)
    for n in range(450):
        log.log_event("a", "t", "step_start", step_name=f"s{n}")
    await log.close()  # what an instance's stop() and a SIGTERM drain do
    assert log.written == 450 and log.dropped == 0
    assert len(await EventStore(live_store).get_events(limit=1000)) == 450


class Flaky:
    """The real store, whose next ``failures`` transactions fail as if the database
    were away (``after_commit``: as if the connection broke once the commit was sent,
    so the writer cannot know it landed)."""

    def __init__(self, store: SqlStore, failures: int, *, after_commit: bool = False) -> None:
        self.store, self.failures, self.tenant_id = store, failures, store.tenant_id
        self.after_commit = after_commit

    async def transaction(self, *args: Any, **kwargs: Any) -> Any:
        if not self.failures:
            return await self.store.transaction(*args, **kwargs)
        self.failures -= 1
        if self.after_commit:
            await self.store.transaction(*args, **kwargs)
        raise ConnectionError("the database is away")


async def test_flush_returns_once_every_event_logged_before_it_is_committed(
        live_store: SqlStore) -> None:
    """1,005 events make five batches for the background writer, which takes the first
    as soon as 200 wait; ``flush()`` writes the rest and returns only once that batch
    too is committed, so a read after it finds every event, every time."""
    async with EventStore(live_store) as log:
        for run in range(20):
            thread = f"flushed-{run}"
            for n in range(1005):
                log.log_event("writer", thread, "step_complete", step_name=f"s{n}")
            await log.flush()
            found = await log.get_events(thread_id=thread, limit=2000)
            assert len(found) == 1005, f"run {run}: {len(found)} of 1005 events read"


async def test_a_database_away_loses_nothing_and_keeps_the_order(
        live_store: SqlStore) -> None:
    flaky = Flaky(live_store, failures=3)
    log = EventStore(flaky, flush_interval_s=0.02, batch=2)
    for n in range(5):
        log.log_event("a", "t", "step_start", step_name=f"s{n}")
    await eventually(lambda: log.written == 5, what="the writes after the outage")
    assert flaky.failures == 0 and log.dropped == 0
    assert [e.step_name for e in await log.get_events()] == [f"s{n}" for n in range(5)]
    await log.close()


async def test_a_write_retried_after_its_commit_landed_writes_each_event_once(
        live_store: SqlStore) -> None:
    flaky = Flaky(live_store, failures=1, after_commit=True)
    log = EventStore(flaky, flush_interval_s=60)
    for n in range(3):
        log.log_event("a", "t", "step_start", step_name=f"s{n}")
    with pytest.raises(ConnectionError):
        await log.flush()  # it committed, but the writer was not told
    await log.close()  # the retry: the same event ids, each kept once
    assert [e.step_name for e in await log.get_events()] == ["s0", "s1", "s2"]


@dataclasses.dataclass
class Point:
    x: int
    y: int


class Opaque:
    def __repr__(self) -> str:
        return "<opaque>"


class LangChainLike:
    """The shape of a LangChain message (``type``, ``content``, ``additional_kwargs``)."""

    def __init__(self) -> None:
        self.type = "ai"
        self.content = "hello"
        self.additional_kwargs = {"k": 1}
        self.tool_calls: list[Any] = []


def test_values_become_plain_json_and_nothing_is_pickled() -> None:
    assert to_json({"p": Point(1, 2), "when": datetime(2026, 1, 2, tzinfo=UTC),
                    "raw": b"\x00\x01", "tags": {"b", "a"}, "nan": float("nan")}) == {
        "p": {"x": 1, "y": 2}, "when": "2026-01-02T00:00:00+00:00",
        "raw": {"$bytes": "AAE="}, "tags": ["a", "b"], "nan": "nan"}
    assert to_json(LangChainLike()) == {"type": "ai", "content": "hello",
                                        "additional_kwargs": {"k": 1}}
    assert to_json(Opaque()) == {"$type": f"{__name__}.Opaque", "$repr": "<opaque>"}
    message = a2a.Message(role="agent", parts=[a2a.TextPart(text="x")], message_id="m")
    assert to_json(message)["messageId"] == "m"
    deep: Any = []
    for _ in range(100):
        deep = [deep]
    assert "nested too deeply" in str(to_json(deep))


class Unprintable:
    def __repr__(self) -> str:
        raise RuntimeError("no repr")


def test_values_no_database_json_can_hold_are_made_storable() -> None:
    assert to_json({"a\x00b": ["x\x00y", "lone \ud800 half"], "big": 2**70,
                    "small": -(2**63), "fine": "naïve ✓"}) == {
        "a\ufffdb": ["x\ufffdy", "lone \ufffd half"], "big": {"$int": str(2**70)},
        "small": -(2**63), "fine": "naïve ✓"}
    assert to_json({1: "a", "1": "b"}) == {"$items": [[1, "a"], ["1", "b"]]}  # none lost
    assert to_json({1: "a"}) == {"1": "a"}
    assert to_json(Unprintable()) == {"$type": f"{__name__}.Unprintable",
                                      "$repr": "(repr failed: RuntimeError)"}


async def test_the_values_a_user_may_log_are_all_stored_and_read_back(
        events: EventStore) -> None:
    """NUL (which PostgreSQL's JSON refuses), a lone surrogate (not UTF-8), an integer
    past 64 bits and colliding keys, through the real database."""
    events.log_event("a", "t", "step_start", input_data={"q": "a\x00b", "s": "x\ud800y",
                                                          "n": 2**70, "k": {1: 1, "1": 2}})
    await events.flush()
    assert events.written == 1 and events.refused == 0
    (event,) = await events.get_events(thread_id="t")
    assert event.input_data == {"q": "a\ufffdb", "s": "x\ufffdy", "n": {"$int": str(2**70)},
                                "k": {"$items": [[1, 1], ["1", 2]]}}


async def test_an_event_the_database_refuses_is_dropped_alone(
        backend: str, live_store: SqlStore, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """Values that reach the database unconverted (as if to_json missed a case): the
    one it refuses is dropped, logged and counted; the others, before and after it in
    the same batch, are written, and close() does not fail."""
    monkeypatch.setattr("meshpoint.events.log.converted", lambda value: value)
    # A lone surrogate is not UTF-8: the store's JSON encoder refuses it on both
    # databases. NUL is refused by PostgreSQL itself (a data exception); SQLite keeps it.
    values = {3: "x\ud800y", 5: "a\x00b"}
    refused = {3, 5} if backend == "postgres" else {3}
    log = EventStore(live_store, flush_interval_s=60, batch=1000)
    for n in range(8):
        log.log_event("a", "t", "step_start", step_name=f"s{n}",
                      input_data=values.get(n, {"n": n}))
    await log.close()
    assert log.refused == len(refused) and log.written == 8 - len(refused)
    assert log.dropped == 0
    assert [e.step_name for e in await log.get_events()] == [
        f"s{n}" for n in range(8) if n not in refused]
    assert "refused by the database and is dropped" in caplog.text


async def test_events_logged_only_from_worker_threads_are_written_in_the_background(
        live_store: SqlStore) -> None:
    """A sync step run by ``asyncio.to_thread`` (a LangGraph sync node under
    ``ainvoke``): nothing is logged on the loop, and the writer still writes."""
    log = EventStore(live_store, flush_interval_s=0.05)

    @with_logging(log, agent_id="wl")
    def step(state: dict[str, Any], config: dict[str, Any]) -> dict[str, Any]:
        return {"seen": state["n"]}

    await asyncio.to_thread(step, {"n": 1}, {"configurable": {"thread_id": "x"}})
    await eventually(lambda: log.written == 2, what="the worker thread's two events")
    assert [e.event_type for e in await log.get_events(thread_id="x")] == [
        "step_start", "step_complete"]
    await log.close()


async def test_close_leaves_no_writer_behind_that_a_thread_asked_for(
        live_store: SqlStore) -> None:
    """A worker thread's event asks the loop to start the writer; close() runs before
    the loop gets to it. The event is written by close(), and no writer starts after."""
    log = EventStore(live_store, flush_interval_s=0.05)
    thread = threading.Thread(target=log.log_event, args=("a", "t", "step_start"))
    thread.start()
    thread.join()  # its request to start the writer waits on the loop
    await log.close()
    assert log.written == 1
    # The loop runs its callbacks in order: once one queued now has run, so has the
    # thread's request (queued before close()).
    after: list[bool] = []
    asyncio.get_running_loop().call_soon(after.append, True)
    await eventually(lambda: after == [True], what="the loop to run the thread's request")
    assert not writers()


async def test_a_writer_stops_when_its_store_is_closed(
        store_url: str, caplog: pytest.LogCaptureFixture) -> None:
    """An event logged after the log was closed starts a writer again; once the store
    itself is closed, that writer stops and says what it could not write."""
    async with open_store(store_url) as store:
        log = EventStore(store, flush_interval_s=0.05)
        await log.close()
        await asyncio.to_thread(log.log_event, "w", "t", "late")
    await eventually(lambda: "1 event(s) are not written" in caplog.text,
                     what="the writer to find the store closed")
    await eventually(lambda: not writers(), what="the writer to stop")


def writers() -> list[asyncio.Task[Any]]:
    """The event logs' background writers still running on this loop."""
    return [task for task in asyncio.all_tasks()
            if "_flush_forever" in repr(task.get_coro())]


async def test_with_logging_runs_the_step_whatever_its_logging_makes_of_it(
        events: EventStore, caplog: pytest.LogCaptureFixture) -> None:
    @with_logging(events, agent_id="x", thread_id=lambda *a, **k: "t" * 1000)  # too long
    def bad_thread(value: Any) -> str:
        return "ran"

    @with_logging(events, agent_id="x")
    def odd_argument(value: Any) -> str:
        return "ran too"

    assert bad_thread(1) == "ran"
    assert "could not log step_start of step 'bad_thread'" in caplog.text
    assert odd_argument(Unprintable()) == "ran too"
    await events.flush()
    (start, _done) = await events.get_events(agent_id="x")
    assert start.input_data["args"] == [{"$type": f"{__name__}.Unprintable",
                                         "$repr": "(repr failed: RuntimeError)"}]


async def test_an_until_of_epoch_zero_is_a_bound(events: EventStore) -> None:
    events.log_event("a", "t", "step_start")
    await events.flush()
    assert await events.get_events(until=0) == []
    assert await events.get_events(until=datetime(1970, 1, 1, tzinfo=UTC)) == []
    assert len(await events.get_events(since=0)) == 1
    for bad in (float("nan"), float("inf"), 1e300, 10**20, True):
        with pytest.raises(InvalidArgumentError, match="until"):
            await events.get_events(until=bad)  # type: ignore[arg-type]


async def test_with_logging_records_start_completion_and_errors(events: EventStore) -> None:
    @with_logging(events, agent_id="worker")
    def add(a: int, b: int, *, config: dict[str, Any]) -> int:
        return a + b

    @with_logging(events, agent_id="worker", step_name="fetch", thread_id="t-async")
    async def fetch(url: str) -> str:
        await asyncio.sleep(0)
        if url == "bad":
            raise ConnectionError("refused")
        return "page"

    assert add(1, 2, config={"configurable": {"thread_id": "t-sync"}}) == 3
    assert await fetch("ok") == "page"
    with pytest.raises(ConnectionError):
        await fetch("bad")
    await events.flush()
    sync = await events.get_events(thread_id="t-sync")
    assert [(e.event_type, e.step_name) for e in sync] == [("step_start", "add"),
                                                          ("step_complete", "add")]
    assert sync[0].input_data["args"] == [1, 2] and sync[1].output_data == 3
    assert sync[1].state_snapshot["duration_ms"] >= 0
    kinds = [(e.event_type, e.step_name) for e in await events.get_events(thread_id="t-async")]
    assert kinds == [("step_start", "fetch"), ("step_complete", "fetch"),
                     ("step_start", "fetch"), ("error", "fetch")]
    failed = await events.get_latest_event(event_type="error")
    assert failed is not None and failed.output_data["$error"] == "ConnectionError"


async def test_the_runtime_logs_its_steps_when_the_agent_keeps_a_log(
        mesh: Mesh, live_store: SqlStore) -> None:
    peer = await ManualPeer(mesh, "researcher").start()
    agent = Agent("coordinator", ScriptedModel(), peers=[Peer("researcher", timeout_s=30)],
                  tools=[LocalTool("clock", "The time.", lambda args: "noon")], events=True)
    await mesh.run(agent, 2)
    request_id = await mesh.client.submit("coordinator", "Look into it: clock")
    await eventually(lambda: len(peer.requests) == 1, what="the peer's request")
    await peer.answer(next(iter(peer.requests)), "found it")
    answer = await mesh.client.wait(request_id, timeout_s=10)
    assert answer.status.state is a2a.TaskState.COMPLETED
    task_id = mesh.client.task_id("coordinator", request_id)
    log = EventStore(live_store)

    async def logged() -> list[tuple[str, str | None]]:
        return [(e.event_type, e.step_name) for e in await log.get_events(thread_id=task_id)]

    await eventually(lambda: _has(logged, ("answer", "completed")), what="the answer's event")
    kinds = await logged()
    for expected in (("protocol_receive", "request"), ("step_start", "model"),
                     ("step_complete", "model"), ("step_complete", "tool:clock"),
                     ("pause", "paused"), ("protocol_handoff", "researcher"),
                     ("protocol_receive", "answer"), ("resume", "resumed"),
                     ("answer", "completed")):
        assert expected in kinds, (expected, kinds)
    assert kinds.index(("pause", "paused")) < kinds.index(("resume", "resumed"))
    request = (await log.get_events(thread_id=task_id, event_type="protocol_receive"))[0]
    assert request.input_data["_protocol_message"]["method"] == "message/send"


async def _has(logged: Any, item: tuple[str, str | None]) -> bool:
    return item in await logged()


async def test_an_agent_without_a_log_writes_no_event(mesh: Mesh, live_store: SqlStore) -> None:
    await mesh.run(Agent("solo", ScriptedModel()))
    answer = await mesh.client.ask("solo", "Say hi", timeout_s=10)
    assert answer.status.state is a2a.TaskState.COMPLETED
    assert await EventStore(live_store).get_events() == []


async def test_sigkill_loses_only_what_was_not_yet_written(
        live_store: SqlStore, store_url: str, store_options: dict[str, object]) -> None:
    """A process logging as fast as it can is killed with SIGKILL after a few of its
    writes. What its log reported written is all there, as one gap-free run from the
    first event; what is lost is the tail it had not written yet (at most what it
    logged in its last flush interval, as the docs say) and nothing in between."""
    worker = subprocess.Popen(
        [sys.executable, "-m", "tests.integration.events_kill_worker", store_url,
         json.dumps(store_options), "0.05"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    reported = 0
    try:
        assert worker.stdout is not None
        writes = 0
        for line in worker.stdout:  # blocks on the worker: no clock in this test
            reported = int(line.split()[1])
            writes += 1
            if writes == 5:
                break
    finally:
        worker.send_signal(signal.SIGKILL)
        _, errors = worker.communicate(timeout=30)
    assert writes == 5, errors
    numbers = [e.output_data["n"] for e in await EventStore(live_store).get_events(
        thread_id="killed", limit=100_000)]
    assert len(numbers) >= reported > 0
    assert numbers == list(range(len(numbers)))  # a prefix: nothing lost before the tail
