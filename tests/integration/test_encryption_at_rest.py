"""Encryption at rest of every column that carries user content (docs/security.md §4),
on a SQLite file and on PostgreSQL (fast paths and portable bodies): a marker written
through each path rests nowhere in clear, a ciphertext moved to another row or column
does not decrypt, rotation keeps everything readable and shredding makes all of it
unreadable without stopping an instance."""

from __future__ import annotations

import json
import sqlite3
import uuid
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Connection, LargeBinary, Table, select, update

from meshpoint import a2a
from meshpoint.context import TaskExecutionContext
from meshpoint.errors import (
    CorruptCheckpointError,
    HistoryIntegrityError,
    TaskBlockedError,
    UnreadableValueError,
)
from meshpoint.events.log import EventStore
from meshpoint.history.encryption import EncryptionKeys
from meshpoint.history.planning import HistoryOptions
from meshpoint.integrations.langgraph.tables import graph_blobs, graph_checkpoints, graph_writes
from meshpoint.llm import ScriptedModel
from meshpoint.llm.base import ModelResponse, ToolCall, ToolSpec
from meshpoint.runtime import Agent, LocalTool, Peer
from meshpoint.runtime.approvals import Approve, Reply, decide
from meshpoint.store import SqlStore
from meshpoint.store.schema import events as events_table
from meshpoint.store.schema import (
    metadata,
    parallel_invocations,
    paused_tasks,
    peer_sub_tasks,
    session_events,
)
from meshpoint.store.sealing import UNREADABLE
from tests.conftest import snapshot
from tests.integration.mesh import ManualPeer, Mesh, eventually

pytestmark = pytest.mark.portable_too


class MarkerModel:
    """A model whose every output carries the test's marker: turn 1 says something and
    calls a peer, a plain tool and the approval tool twice; turn 2 calls the approval
    tool once more (so the results of turn 1 rest in a checkpoint); turn 3 answers."""

    name = "marker"

    def __init__(self, mark: str) -> None:
        self.mark = mark

    async def complete(self, messages: list[dict[str, Any]],
                       tools: list[ToolSpec]) -> ModelResponse:
        m = self.mark
        turns = sum(1 for message in messages if message.get("role") == "assistant")
        if turns == 0:
            return ModelResponse(text=f"{m}-reply", tool_calls=(
                ToolCall("c1", "ask_researcher", {"query": f"{m}-peer-request"}),
                ToolCall("c2", "lookup", {"query": f"{m}-lookup"}),
                ToolCall("c3", "send", {"query": f"{m}-tool-arg"}),
                ToolCall("c4", "send", {"query": f"{m}-tool-arg-2"})))
        if turns == 1:
            return ModelResponse(text=None, tool_calls=(
                ToolCall("c5", "send", {"query": f"{m}-second-round"}),))
        return ModelResponse(text=f"{m}-final-answer")


def marker_agent(mark: str) -> Agent:
    lookup = LocalTool("lookup", "Look it up.", lambda args: f"{mark}-local-result")
    send = LocalTool("send", "Send it (needs a human).", lambda args: f"sent {args['query']}",
                     needs_approval=True)
    return Agent("coordinator", MarkerModel(mark), tools=[lookup, send],
                 peers=[Peer("researcher")], events=True)


class AtRest:
    """Everything the database holds, as bytes and text: the SQLite file and its WAL
    (before and after a checkpoint of the WAL), or every row of every table of the
    PostgreSQL schema as text."""

    def __init__(self, store: SqlStore, backend: str, path: Path | None,
                 schema: str | None) -> None:
        self.store, self.backend, self.path, self.schema = store, backend, path, schema

    async def texts(self) -> list[tuple[str, bytes]]:
        if self.path is not None:
            wal = Path(f"{self.path}-wal")
            found = [("db file", self.path.read_bytes()),
                     ("-wal", wal.read_bytes() if wal.exists() else b"")]
            conn = sqlite3.connect(self.path)  # copies the WAL into the file
            try:
                conn.execute("PRAGMA wal_checkpoint(FULL)").fetchone()
            finally:
                conn.close()
            found.append(("db file after a WAL checkpoint", self.path.read_bytes()))
            return found

        def dump(conn: Connection) -> list[tuple[str, bytes]]:
            out = []
            for table in metadata.sorted_tables:
                # The row as text, and its bytea columns with their printable bytes
                # as they are (a row's text shows bytea as hex).
                binary = [f"encode(t.{c.name}, 'escape')" for c in table.c
                          if isinstance(c.type, LargeBinary)]
                rows = conn.exec_driver_sql(
                    f"SELECT concat_ws(' ', t::text, {', '.join(binary) or 'NULL'}) "
                    f"FROM {self.schema}.{table.name} t").all()
                out.append((table.name, "\n".join(r[0] for r in rows).encode()))
            return out

        return await self.store.run(dump)

    async def where(self, marker: str) -> list[str]:
        """Where ``marker`` rests in clear."""
        return [name for name, data in await self.texts() if marker.encode() in data]


@pytest.fixture
async def at_rest(live_store: SqlStore, backend: str, store_url: str,
                  store_options: dict[str, object]) -> AsyncIterator[AtRest]:
    path = Path(store_url.removeprefix("sqlite:///")) if backend == "sqlite" else None
    schema = None if backend == "sqlite" else str(store_options["schema"])
    yield AtRest(live_store, backend, path, schema)


@pytest.mark.parametrize("encrypted", [True, False], ids=["encrypted", "clear"])
async def test_a_marker_written_through_every_path_rests_nowhere_in_clear(
        live_store: SqlStore, at_rest: AtRest, encrypted: bool) -> None:
    """A request, a model reply, a tool argument, a local tool's result, a peer's
    request and answer, an approval's edited arguments and a human's reply, event
    payloads, a LangGraph state value, write and metadata, and the history's
    snapshots: with the tenant's encryption on, none of them is in the SQLite file
    or its WAL (before or after a WAL checkpoint) or in any PostgreSQL row's text.
    ``clear`` runs the same with encryption off, to prove the test sees each one."""
    mark = f"mk{uuid.uuid4().hex[:12]}"
    keys = EncryptionKeys.generate("default")
    store = live_store.with_history(HistoryOptions(encryption=keys if encrypted else None))
    seen: dict[str, list[str]] = {}

    async def look(*paths: str) -> None:
        for path in paths:
            seen[path] = seen.get(path, []) + await at_rest.where(f"{mark}-{path}")

    mesh = await Mesh(store).start()
    try:
        peer = await ManualPeer(mesh, "researcher").start()
        await mesh.run(marker_agent(mark))
        request_id = await mesh.client.submit("coordinator", f"{mark}-request")
        pending = await mesh.client.wait_input(request_id, timeout_s=10)
        task_id = mesh.client.task_id("coordinator", request_id)
        await eventually(lambda: len(peer.requests) == 1, what="the peer's request")
        await look("request", "reply", "peer-request", "lookup", "local-result",
                   "tool-arg", "tool-arg-2")

        await peer.answer(next(iter(peer.requests)), f"{mark}-peer-answer")
        first, _second = sorted(pending, key=lambda p: p["function_call_id"])
        await mesh.client.approve(task_id, first["call_id"], {"query": f"{mark}-edited"})

        async def answered() -> bool:
            subs = await store.get_peer_sub_tasks_for_task(task_id)
            return sum(s.status == "resolved" for s in subs) == 2

        await eventually(answered, what="the peer's answer and the approval recorded")
        await look("peer-answer", "edited")

        # The human replies to the other call: the join completes, the task resumes,
        # and its second round pauses again with the first round's results stored.
        await mesh.client.reply(task_id, f"{mark}-human-reply")
        pending = await mesh.client.wait_input(request_id, timeout_s=10)
        assert [p["arguments"] for p in pending] == [{"query": f"{mark}-second-round"}]
        await look("human-reply", "second-round")
        await mesh.client.approve(task_id, pending[0]["call_id"])
        answer = await mesh.client.wait(request_id, timeout_s=10)
        assert answer.status.state is a2a.TaskState.COMPLETED
        assert f"{mark}-final-answer" in str(answer.status.message.text)  # type: ignore
    finally:
        await mesh.close()

    async with EventStore(store) as log:
        log.log_event("coordinator", task_id, "step_complete", step_name="note",
                      input_data={"in": f"{mark}-event-input"},
                      output_data=f"{mark}-event-output",
                      state_snapshot={"s": f"{mark}-event-state"})
    # The runtime's own events hold the final answer (its model step's output).
    await look("event-input", "event-output", "event-state", "final-answer")
    await _langgraph_paths(store, mark)
    await look("lg-value", "lg-write", "lg-meta")

    if encrypted:
        assert {path: where for path, where in seen.items() if where} == {}
    else:
        assert [path for path, where in seen.items() if not where] == []


async def _langgraph_paths(store: SqlStore, mark: str) -> None:
    """A LangGraph state value, a pending write and a metadata value, through the saver."""
    pytest.importorskip("langgraph")
    from langgraph.checkpoint.base import empty_checkpoint

    from meshpoint.integrations.langgraph import MeshpointSaver

    saver = MeshpointSaver(store)
    checkpoint = empty_checkpoint()
    checkpoint["channel_values"] = {"notes": [f"{mark}-lg-value"]}
    checkpoint["channel_versions"] = {"notes": saver.get_next_version(None)}
    config = await saver.aput({"configurable": {"thread_id": "lg-1", "checkpoint_ns": ""}},
                              checkpoint, {"source": "input", "step": -1,
                                           "note": f"{mark}-lg-meta"},
                              dict(checkpoint["channel_versions"]))
    await saver.aput_writes(config, [("notes", f"{mark}-lg-write")], "task-1")
    got = await saver.aget_tuple(config)
    assert got is not None and got.checkpoint["channel_values"]["notes"] == [
        f"{mark}-lg-value"]
    assert got.metadata["note"] == f"{mark}-lg-meta"  # type: ignore[typeddict-item]
    assert [w[2] for w in got.pending_writes or ()] == [f"{mark}-lg-write"]
    found = [t async for t in saver.alist(None, filter={"note": f"{mark}-lg-meta"})]
    assert [t.config for t in found] == [got.config]
    assert [t async for t in saver.alist(None, filter={"note": "other"})] == []



# -- a ciphertext moved to another row or column -----------------------------------------


def paused_task(task_id: str, secret: str) -> TaskExecutionContext:
    """A task waiting on two peers, with a result known at its checkpoint: a value of
    each sealed column, each holding ``secret``."""
    ctx = TaskExecutionContext(task_id, {"session_id": secret})
    ctx.current_invocation_id = "turn-1"
    ctx.append_session_event({"role": "user", "content": f"{secret} request"})
    ctx.begin_parallel_calls("turn-1", ["a", "b", "local"])
    ctx.record_parallel_result("turn-1", "local", f"{secret} local result")
    for call in ("a", "b"):
        ctx.register_peer_sub_task(f"{task_id}/{call}", {
            "invocation_id": "turn-1", "function_call_id": call,
            "peer_agent_name": "researcher", "query": f"{secret} {call}"})
    return ctx


async def swap(store: SqlStore, table: Table, columns: tuple[str, ...],
               first: dict[str, Any], second: dict[str, Any]) -> None:
    """Swap ``columns`` between two rows of ``table`` (each named by column values),
    as anyone who can write the database can."""
    def body(conn: Connection) -> None:
        def where(key: dict[str, Any]) -> list[Any]:
            return [table.c[name] == value for name, value in key.items()]

        picked = [table.c[name] for name in columns]
        a = conn.execute(select(*picked).where(*where(first))).one()
        b = conn.execute(select(*picked).where(*where(second))).one()
        conn.execute(update(table).where(*where(first)).values(dict(zip(columns, b,
                                                                        strict=True))))
        conn.execute(update(table).where(*where(second)).values(dict(zip(columns, a,
                                                                         strict=True))))

    await store.run(body, write=True)


@pytest.fixture
async def sealing(store: SqlStore) -> SqlStore:
    """The test's store with encryption on (two tenants' keys) and no history, so
    that only the encryption stands between a moved ciphertext and its reader."""
    keys = EncryptionKeys.generate("default", "globex")
    return store.with_history(HistoryOptions(enabled=False, encryption=keys))


async def test_a_live_rows_ciphertext_moved_to_another_row_or_column_does_not_decrypt(
        sealing: SqlStore) -> None:
    await sealing.checkpoint_task(paused_task("t1", "acme-one"), "coordinator")
    await sealing.checkpoint_task(paused_task("t2", "acme-two"), "coordinator")
    await sealing.resolve_peer_sub_task("t1/a", "answer for one")
    await sealing.resolve_peer_sub_task("t2/a", "answer for two")
    T, E, I, S = paused_tasks, session_events, parallel_invocations, peer_sub_tasks  # noqa: E741
    one, two = {"logical_task_id": "t1"}, {"logical_task_id": "t2"}
    attacks = [
        # the whole stored context, its checksum and encoding with it
        (T, ("context", "context_encoding", "context_sha256"), one, two),
        (E, ("data",), one, two),  # the conversations
        (I, ("results",), one, two),  # the results known at the checkpoint
        (S, ("correlation_data",), {"sub_task_id": "t1/b"}, {"sub_task_id": "t2/b"}),
        (S, ("result",), {"sub_task_id": "t1/a"}, {"sub_task_id": "t2/a"}),
    ]
    for table, columns, first, second in attacks:
        await swap(sealing, table, columns, first, second)
        with pytest.raises(CorruptCheckpointError, match="does not decrypt"):
            await sealing.restore_task("t1")
        await swap(sealing, table, columns, first, second)  # put back
        assert (await sealing.restore_task("t1")).context.task_id == "t1"
    # A listing shows a moved value as unreadable, never the other row's.
    await swap(sealing, S, ("result",), {"sub_task_id": "t1/a"}, {"sub_task_id": "t2/a"})
    moved = await sealing.get_peer_sub_task("t1/a")
    assert set(moved.result) == {UNREADABLE} and "does not decrypt" in moved.result[UNREADABLE]
    # Another column of the same row: the request copied over the answer.
    await sealing.run(lambda conn: conn.execute(update(S).where(S.c.sub_task_id == "t2/a")
                                                .values(result=S.c.correlation_data)),
                      write=True)
    assert set((await sealing.get_peer_sub_task("t2/a")).result) == {UNREADABLE}
    # Another tenant: the task's rows moved to globex, whose key differs.
    await sealing.run(lambda conn: [conn.execute(update(t).where(
        t.c.logical_task_id == "t2").values(tenant_id="globex")) for t in (T, E, I, S)],
        write=True)
    with pytest.raises(CorruptCheckpointError, match="does not decrypt"):
        await sealing.for_tenant("globex").restore_task("t2")


async def test_an_event_payload_moved_to_another_event_or_column_does_not_decrypt(
        sealing: SqlStore) -> None:
    async with EventStore(sealing) as log:
        first = log.log_event("coordinator", "t1", "step_start", input_data="one's input",
                              output_data="one's output")
        second = log.log_event("coordinator", "t2", "step_start", input_data="two's input")
    V = events_table
    await swap(sealing, V, ("input_data",), {"event_id": first}, {"event_id": second})
    await sealing.run(lambda conn: conn.execute(update(V).where(V.c.event_id == first)
                                                .values(state_snapshot=V.c.output_data)),
                      write=True)
    read = {e.event_id: e for e in await EventStore(sealing).get_events()}
    for event_id in (first, second):
        assert set(read[event_id].input_data) == {UNREADABLE}
    assert set(read[first].state_snapshot) == {UNREADABLE}
    assert read[first].output_data == "one's output"  # where it was sealed, it opens


async def test_a_langgraph_rows_ciphertext_moved_to_another_thread_does_not_decrypt(
        sealing: SqlStore) -> None:
    """Two threads holding the same checkpoint id (as copy_thread makes them): a row's
    digest leaves the thread out, so only the encryption binds a row to its thread."""
    pytest.importorskip("langgraph")
    from langgraph.checkpoint.base import empty_checkpoint

    from meshpoint.integrations.langgraph import MeshpointSaver

    saver = MeshpointSaver(sealing)
    checkpoint = empty_checkpoint()
    checkpoint["channel_versions"] = {"notes": saver.get_next_version(None)}
    for thread in ("one", "two"):
        checkpoint["channel_values"] = {"notes": [f"{thread}'s note"]}
        config = await saver.aput({"configurable": {"thread_id": thread, "checkpoint_ns": ""}},
                                  checkpoint, {"source": "input", "step": -1, "who": thread},
                                  dict(checkpoint["channel_versions"]))
        await saver.aput_writes(config, [("notes", f"{thread}'s write")], "task-1")
    one = {"thread_id": "one"}
    two = {"thread_id": "two"}
    for table, columns in ((graph_checkpoints, ("data", "digest")),
                           (graph_blobs, ("data", "digest")),
                           (graph_writes, ("data", "digest"))):
        await swap(sealing, table, columns, one, two)
        with pytest.raises(CorruptCheckpointError, match="does not decrypt"):
            await MeshpointSaver(sealing).aget_tuple({"configurable": {"thread_id": "one"}})
        await swap(sealing, table, columns, one, two)
    # The metadata (what a filter and prune read), moved: prune refuses, lists skip it.
    await swap(sealing, graph_checkpoints, ("metadata",), one, two)
    with pytest.raises(CorruptCheckpointError, match="does not decrypt"):
        await saver.aprune(["one"])
    got = await saver.aget_tuple({"configurable": {"thread_id": "one"}})
    assert got is not None and got.metadata["who"] == "one"  # type: ignore[typeddict-item]


# -- rotation and shredding ------------------------------------------------------------------


async def write_everything(store: SqlStore, task_id: str, thread: str, secret: str) -> None:
    """A value of every sealed column: a paused task (context, conversation, calls,
    invocation results, its record's snapshot), an answer, an event, a LangGraph
    checkpoint with a value, a write and metadata."""
    await store.checkpoint_task(paused_task(task_id, secret), "coordinator")
    await store.resolve_peer_sub_task(f"{task_id}/a", f"{secret} answer")
    async with EventStore(store) as log:
        log.log_event("coordinator", task_id, "step_start", input_data=f"{secret} event")
    pytest.importorskip("langgraph")
    from langgraph.checkpoint.base import empty_checkpoint

    from meshpoint.integrations.langgraph import MeshpointSaver

    saver = MeshpointSaver(store)
    checkpoint = empty_checkpoint()
    checkpoint["channel_values"] = {"notes": [f"{secret} note"]}
    checkpoint["channel_versions"] = {"notes": saver.get_next_version(None)}
    config = await saver.aput({"configurable": {"thread_id": thread, "checkpoint_ns": ""}},
                              checkpoint, {"source": "input", "step": -1, "who": secret},
                              dict(checkpoint["channel_versions"]))
    await saver.aput_writes(config, [("notes", f"{secret} write")], "task-1")


async def read_everything(store: SqlStore, task_id: str, thread: str, secret: str) -> None:
    from meshpoint.integrations.langgraph import MeshpointSaver

    ctx = (await store.restore_task(task_id)).context
    assert ctx.a2a_context == {"session_id": secret}
    assert ctx.session_events == [{"role": "user", "content": f"{secret} request"}]
    assert ctx.active_peer_sub_tasks[f"{task_id}/b"]["query"] == f"{secret} b"
    assert ctx.parallel_tool_calls["turn-1"].results == {
        "local": f"{secret} local result", "a": f"{secret} answer"}
    assert (await store.get_peer_sub_task(f"{task_id}/a")).result == f"{secret} answer"
    [event] = await EventStore(store).get_events(thread_id=task_id)
    assert event.input_data == f"{secret} event"
    got = await MeshpointSaver(store).aget_tuple({"configurable": {"thread_id": thread}})
    assert got is not None and got.checkpoint["channel_values"]["notes"] == [f"{secret} note"]
    assert got.metadata["who"] == secret  # type: ignore[typeddict-item]
    assert [w[2] for w in got.pending_writes or ()] == [f"{secret} write"]


async def test_rotation_keeps_every_family_readable_and_shredding_makes_each_unreadable(
        store: SqlStore) -> None:
    keys = EncryptionKeys.generate("default")
    before = store.with_history(HistoryOptions(encryption=keys))
    await write_everything(before, "t1", "thread-1", "first")
    rotated, new_id = keys.rotated("default")
    after = store.with_history(HistoryOptions(encryption=rotated))
    await write_everything(after, "t2", "thread-2", "second")
    # The rotated ring reads what either key sealed; each value names its key.
    await read_everything(after, "t1", "thread-1", "first")
    await read_everything(after, "t2", "thread-2", "second")
    kids = await store.run(lambda conn: {
        row.logical_task_id: json.loads(row.data)["$encrypted"]["kid"]
        if isinstance(row.data, str) else row.data["$encrypted"]["kid"]
        for row in conn.execute(select(session_events))})
    assert kids == {"t1": "k1", "t2": new_id}

    # Shredded: every family unreadable, a clear error or marker, never clear text.
    shredded = store.with_history(HistoryOptions(encryption=rotated.shredded("default")))
    with pytest.raises(UnreadableValueError, match="holds no encryption key"):
        await shredded.restore_task("t2", verify=False)
    with pytest.raises(HistoryIntegrityError, match="cannot be read"):
        await shredded.restore_task("t2")  # a reader: nothing is changed
    sub = await shredded.get_peer_sub_task("t2/a")
    assert set(sub.correlation_data) == {UNREADABLE} and set(sub.result) == {UNREADABLE}
    assert all(set(s.correlation_data) == {UNREADABLE}
               for s in await shredded.next_deadlines())
    [event] = await EventStore(shredded).get_events(thread_id="t2")
    assert set(event.input_data) == {UNREADABLE}
    from meshpoint.integrations.langgraph import MeshpointSaver

    with pytest.raises(UnreadableValueError, match=r"agent_langgraph_checkpoints\.data"):
        await MeshpointSaver(shredded).aget_tuple({"configurable": {"thread_id": "thread-2"}})
    # The history still verifies (it hashes what is stored), its snapshot is lost.
    assert (await shredded.history.verify_task("t2")).ok
    # The holder of the lease handles the task as any corrupt one: blocked.
    assert await shredded.take_resume_lease("t2", "ops", 30, statuses=("waiting_peers",))
    with pytest.raises(TaskBlockedError, match="cannot be read"):
        await shredded.restore_task("t2", lease_owner="ops")
    assert [t.status for t in await shredded.list_paused_tasks()
            if t.task_id == "t2"] == ["blocked"]


@pytest.mark.parametrize("exclude", [(), ("context",)], ids=["all", "context-in-clear"])
async def test_an_instance_that_lost_a_key_blocks_what_it_cannot_read_and_serves_the_rest(
        live_store: SqlStore, exclude: tuple[str, ...]) -> None:
    """An instance whose key ring lost the key a paused task was sealed with: the
    task's answer is recorded, the task is blocked as any corrupt task, and the
    instance goes on serving new tasks (sealed with the key it holds). With the
    context left in clear, what is still sealed in it (its security context and
    history annotations) is what cannot be read."""
    keys = EncryptionKeys.generate("default")
    rotated, new_id = keys.rotated("default")
    lost = EncryptionKeys(keys={"default": {new_id: rotated.keys["default"][new_id]}},
                          active={"default": new_id})
    options = HistoryOptions(encryption=keys, encrypt_exclude=frozenset(exclude))
    mesh = await Mesh(live_store.with_history(options)).start()
    try:
        peer = await ManualPeer(mesh, "researcher").start()
        agent = Agent("coordinator", ScriptedModel(), peers=[Peer("researcher", timeout_s=30)])
        [old] = await mesh.run(agent)
        await mesh.client.submit("coordinator", "Look into it")
        await eventually(lambda: len(peer.requests) == 1, what="the peer's request")
        await old.stop()
        mesh.store = live_store.with_history(replace(options, encryption=lost))
        [instance] = await mesh.run(agent)
        await peer.answer(next(iter(peer.requests)), "found it")

        async def blocked() -> bool:
            return [t.status for t in await mesh.store.list_paused_tasks()] == ["blocked"]

        await eventually(blocked, what="the unreadable task blocked")
        request_id = await mesh.client.submit("coordinator", "Look into this instead")
        await eventually(lambda: len(peer.requests) == 2, what="the new task's request")
        await peer.answer(list(peer.requests)[-1], "found that")
        answer = await mesh.client.wait(request_id, timeout_s=10)
        assert answer.status.state is a2a.TaskState.COMPLETED
        assert len(mesh.events("blocked")) == 1 and instance.running
    finally:
        await mesh.close()


async def test_a_family_left_out_by_name_rests_in_clear_and_only_it(
        live_store: SqlStore, at_rest: AtRest) -> None:
    """``history.encryption.exclude: [events]``: the event log's payloads are stored in
    clear (searchable by SQL), every other family is still sealed."""
    mark = f"mk{uuid.uuid4().hex[:12]}"
    keys = EncryptionKeys.generate("default")
    partial = live_store.with_history(HistoryOptions(
        encryption=keys, encrypt_exclude=frozenset({"events"})))
    await partial.checkpoint_task(paused_task("t1", f"{mark}-task"), "coordinator")
    async with EventStore(partial) as log:
        log.log_event("coordinator", "t1", "step_start", input_data=f"{mark}-event")
    assert await at_rest.where(f"{mark}-event")
    assert await at_rest.where(f"{mark}-task") == []
    [event] = await EventStore(partial).get_events()
    assert event.input_data == f"{mark}-event"


@pytest.mark.parametrize("answer", [Approve(call_id="t1/send", arguments={"query": "edited"}),
                                    Reply(text="do this instead")], ids=["approve", "reply"])
async def test_an_answer_given_without_the_key_ring_is_refused_and_writes_nothing(
        store: SqlStore, answer: Approve | Reply) -> None:
    """``meshpoint tasks approve --url`` (no config, so no key ring) on a tenant whose
    calls are sealed: the approval cannot be read, so nothing is decided, and no
    decision is written in clear beside the sealed rows."""
    sealing = store.with_history(HistoryOptions(encryption=EncryptionKeys.generate("default")))
    ctx = TaskExecutionContext("t1", {})
    ctx.current_invocation_id = "turn-1"
    ctx.register_peer_sub_task("t1/send", {
        "invocation_id": "turn-1", "function_call_id": "c1",
        "approval": {"tool": "send", "description": "Send it", "parameters": {},
                     "arguments": {"query": "the secret draft"}}})
    await sealing.checkpoint_task(ctx, "coordinator", status="input_required")
    before = await snapshot(store)
    with pytest.raises(UnreadableValueError, match="no encryption key ring"):
        await decide(store, "t1", answer, by="alice")
    assert await snapshot(store) == before
    decided = await decide(sealing, "t1", answer, by="alice")  # with the ring, it is
    assert decided.completing is not None
