"""What meshpoint's LangGraph saver guarantees beyond LangGraph's conformance suite, on
SQLite and PostgreSQL: growing conversations stored as deltas, delta channel history
as LangGraph's reference walk gives it (forks and prune included), rows checked
before they are decoded, listings a statement per page, a superseded writer refused
(across OS processes), SQLite shared by processes, tenants isolated by row-level
security, and ``get_checkpointer`` from synchronous code."""

from __future__ import annotations

import asyncio
import multiprocessing
import random
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Annotated, Any, TypedDict

import pytest

pytest.importorskip("langgraph")

from langchain_core.messages import AIMessage, HumanMessage
from langgraph.channels import DeltaChannel
from langgraph.checkpoint.base import BaseCheckpointSaver, Checkpoint, empty_checkpoint
from langgraph.checkpoint.base.id import uuid6
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.serde.types import _DeltaSnapshot
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from sqlalchemy import Connection, text

from meshpoint.errors import (
    ConfigurationError,
    ContextSerializationError,
    CorruptCheckpointError,
    StoreError,
    ThreadSupersededError,
)
from meshpoint.integrations.langgraph import MeshpointSaver, get_checkpointer
from meshpoint.integrations.langgraph.tables import graph_blobs
from meshpoint.store import SqlStore, open_store
from tests.integration import test_rls

pytestmark = pytest.mark.portable_too
#: The runtime role's fixtures (a role held by row-level security, a tenant's store).
tenancy, acme = test_rls.tenancy, test_rls.acme


@pytest.fixture
async def saver(live_store: SqlStore) -> AsyncIterator[MeshpointSaver]:
    yield MeshpointSaver(live_store)


class Chat(TypedDict):
    messages: Annotated[list[Any], add_messages]


def _reply(state: Chat) -> dict[str, Any]:
    n = len(state["messages"])
    return {"messages": [AIMessage(content=f"answer {n}: " + "lorem ipsum " * 20,
                                   id=f"a{n}")]}


def chat_graph() -> StateGraph[Chat]:
    builder = StateGraph(Chat)
    builder.add_node("reply", _reply)
    builder.add_edge(START, "reply")
    builder.add_edge("reply", END)
    return builder


def config(thread: str, **extra: Any) -> Any:
    return {"configurable": {"thread_id": thread, "checkpoint_ns": "", **extra}}


# -- storage ----------------------------------------------------------------------------

async def test_a_growing_conversation_is_stored_as_deltas_and_reads_back_whole(
        saver: MeshpointSaver, live_store: SqlStore) -> None:
    steps = 150
    ours = chat_graph().compile(checkpointer=saver)
    reference = chat_graph().compile(checkpointer=InMemorySaver())
    for step in range(steps):
        turn = {"messages": [HumanMessage(content=f"question {step}", id=f"q{step}")]}
        await ours.ainvoke(turn, config("grow"))
        await reference.ainvoke(turn, config("grow"))

    def sizes(conn: Connection) -> list[Any]:
        return list(conn.execute(text(
            "SELECT base_version IS NULL, length(data) FROM agent_langgraph_blobs "
            "WHERE channel = 'messages'")))

    rows = await live_store.run(sizes)
    stored = sum(size for _, size in rows)
    # What a saver storing the whole list at each version (LangGraph's) would hold:
    # the list's bytes at each of its versions.
    whole = sum([len(saver.serde.dumps(snapshot.values["messages"]))
                 async for snapshot in reference.aget_state_history(config("grow"))
                 if snapshot.values.get("messages")])
    assert stored < 0.1 * whole, (stored, whole)
    assert sum(is_root for is_root, _ in rows) < len(rows) / 10  # mostly deltas
    # A saver that never saw the thread (another process, say) reads it whole.
    fresh = chat_graph().compile(checkpointer=MeshpointSaver(live_store))
    assert (await fresh.aget_state(config("grow"))).values == \
        (await reference.aget_state(config("grow"))).values
    history = [s.values async for s in fresh.aget_state_history(config("grow"), limit=30)]
    expected = [s.values async for s in reference.aget_state_history(config("grow"),
                                                                      limit=30)]
    assert history == expected


# -- delta channel history ------------------------------------------------------------------

async def _random_thread(saver: MeshpointSaver, rng: random.Random, thread: str) -> list[Any]:
    """A thread of 30 checkpoints with forks, snapshots and plain values of two
    channels at random steps, and writes of several tasks on most of them."""
    configs: list[Any] = []
    for step in range(30):
        parent = rng.choice(configs[-3:]) if configs and rng.random() < 0.9 else None
        cp: Checkpoint = empty_checkpoint()
        cp["id"] = str(uuid6(clock_seq=step))
        values: dict[str, Any] = {}
        for channel in ("a", "b"):
            roll = rng.random()
            if roll < 0.15:
                values[channel] = _DeltaSnapshot([f"{channel}{step}"])
            elif roll < 0.2:
                values[channel] = [f"plain-{channel}{step}"]
        cp["channel_values"] = values
        cp["channel_versions"] = {ch: f"{step + 1:032}.{rng.random():016}" for ch in values}
        conf = config(thread) if parent is None else config(
            thread, checkpoint_id=parent["configurable"]["checkpoint_id"])
        source = "fork" if parent is not None and parent is not configs[-1] else "loop"
        stored = await saver.aput(conf, cp, {"source": source, "step": step, "parents": {}},
                                  dict(cp["channel_versions"]))
        configs.append(stored)
        for task in range(rng.randrange(3)):
            await saver.aput_writes(stored, [(rng.choice("abc"), f"w{step}.{task}.{i}")
                                             for i in range(rng.randrange(1, 3))],
                                    task_id=f"task-{rng.randrange(5)}",
                                    task_path=rng.choice(["", "~a", "~b"]))
    return configs


async def test_delta_channel_history_is_langgraph_reference_walk(saver: MeshpointSaver) -> None:
    rng = random.Random(7)
    for round_ in range(3):
        thread = f"delta-{round_}"
        configs = await _random_thread(saver, rng, thread)
        for target in [*configs, config(thread)]:
            got = await saver.aget_delta_channel_history(config=target, channels=["a", "b", "c"])
            want = await BaseCheckpointSaver.aget_delta_channel_history(
                saver, config=target, channels=["a", "b", "c"])
            assert got == want, target
    assert await saver.aget_delta_channel_history(config=configs[-1], channels=[]) == {}


class Log(TypedDict):
    log: Annotated[list[str], DeltaChannel(lambda state, writes: [*state, *writes],
                                           snapshot_frequency=4)]


def _log_graph() -> StateGraph[Log]:
    def append(state: Log) -> dict[str, Any]:
        return {"log": [f"entry {len(state['log'])}"]}

    builder = StateGraph(Log)
    builder.add_node("append", append)
    builder.add_edge(START, "append")
    builder.add_edge("append", END)
    return builder


async def test_a_delta_channel_survives_prune_keep_latest(saver: MeshpointSaver) -> None:
    ours = _log_graph().compile(checkpointer=saver)
    reference = _log_graph().compile(checkpointer=InMemorySaver())
    for step in range(11):
        await ours.ainvoke({"log": [f"input {step}"]}, config("log"))
        await reference.ainvoke({"log": [f"input {step}"]}, config("log"))
    expected = (await reference.aget_state(config("log"))).values
    assert (await ours.aget_state(config("log"))).values == expected
    await saver.aprune(["log"], strategy="keep_latest")
    assert len([t async for t in saver.alist(config("log"))]) == 1
    assert (await ours.aget_state(config("log"))).values == expected
    await ours.ainvoke({"log": ["after prune"]}, config("log"))
    await reference.ainvoke({"log": ["after prune"]}, config("log"))
    assert (await ours.aget_state(config("log"))).values == \
        (await reference.aget_state(config("log"))).values


# -- integrity ----------------------------------------------------------------------------

@pytest.mark.parametrize("table", ["agent_langgraph_checkpoints", "agent_langgraph_blobs",
                                   "agent_langgraph_writes"])
async def test_a_changed_byte_is_found_before_anything_is_decoded(
        saver: MeshpointSaver, live_store: SqlStore, table: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    graph = chat_graph().compile(checkpointer=saver)
    await graph.ainvoke({"messages": [HumanMessage(content="hello", id="q")]},
                        config("tamper"))
    latest = await saver.aget_tuple(config("tamper"))
    assert latest is not None
    await saver.aput_writes(latest.config, [("messages", ["pending"])], "t1")

    which = {"agent_langgraph_checkpoints": "checkpoint_id = :id",
             "agent_langgraph_blobs": "channel = 'messages'",
             "agent_langgraph_writes": "task_id = 't1'"}[table]

    def tamper(conn: Connection) -> None:
        # One letter of a string swapped: still valid JSON, a different value.
        row = conn.execute(text(f"SELECT data FROM {table} WHERE thread_id = 'tamper' "
                                f"AND {which} ORDER BY length(data) DESC LIMIT 1"),
                           {"id": latest.checkpoint["id"]}).one()
        data = bytes(row.data)
        index = data.index(b"e")
        changed = data[:index] + b"E" + data[index + 1:]
        conn.execute(text(f"UPDATE {table} SET data = :new WHERE data = :old"),
                     {"new": changed, "old": data})

    await live_store.run(tamper, write=True)
    decoded: list[bytes] = []
    loads = saver.serde.loads
    monkeypatch.setattr(saver.serde, "loads", lambda data: decoded.append(data) or loads(data))
    with pytest.raises(CorruptCheckpointError, match="does not hash to its stored digest"):
        await saver.aget_tuple(config("tamper"))
    assert all(b"E" not in data for data in decoded)  # the changed bytes were not decoded


# -- listing --------------------------------------------------------------------------------

async def test_list_reads_a_page_per_statement(saver: MeshpointSaver,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    parent = None
    for step in range(230):
        cp = empty_checkpoint()
        cp["channel_values"] = {"n": step}
        cp["channel_versions"] = {"n": step + 1}
        conf = config("many") if parent is None else parent
        parent = await saver.aput(conf, cp, {"source": "loop", "step": step}, {"n": step + 1})
        await saver.aput_writes(parent, [("x", step)], "task")
    statements: list[str] = []
    run = saver.store.statement

    async def counted(statement: Any, params: Any, **kwargs: Any) -> Any:
        statements.append(statement.name)
        return await run(statement, params, **kwargs)

    monkeypatch.setattr(saver.store, "statement", counted)
    listed = [t async for t in saver.alist(config("many"))]
    assert [t.metadata["step"] for t in listed] == list(range(229, -1, -1))
    assert [t.checkpoint["channel_values"]["n"] for t in listed] == list(range(229, -1, -1))
    assert all(t.pending_writes == [("task", "x", t.metadata["step"])] for t in listed)
    assert statements == ["lg_list_ns"] * 3  # 100 + 100 + 30: no query per checkpoint
    statements.clear()
    assert len([t async for t in saver.alist(config("many"), limit=5)]) == 5
    assert statements == ["lg_list_ns"]


# -- superseded writers ----------------------------------------------------------------------

async def test_a_superseded_loop_step_is_refused_instead_of_forking(
        saver: MeshpointSaver, live_store: SqlStore) -> None:
    head = await saver.aput(config("race"), empty_checkpoint(), {"source": "input",
                                                                 "step": -1}, {})
    worker_a, worker_b = MeshpointSaver(live_store), MeshpointSaver(live_store)
    await worker_a.aput(head, empty_checkpoint(), {"source": "loop", "step": 0}, {})
    with pytest.raises(ThreadSupersededError, match="superseded"):
        await worker_b.aput(head, empty_checkpoint(), {"source": "loop", "step": 0}, {})
    children = [t async for t in saver.alist(config("race"))
                if t.parent_config is not None]
    assert len(children) == 1
    # An explicit branch (time travel, update_state) is not a superseded writer.
    await worker_b.aput(head, empty_checkpoint(), {"source": "fork", "step": 0}, {})
    assert len([t async for t in saver.alist(config("race"))]) == 3


def _race_worker(url: str, options: dict[str, Any], head: Any, barrier: Any,
                 results: Any) -> None:
    async def run() -> str:
        async with await MeshpointSaver.open(url, migrate=False, **options) as worker:
            await asyncio.get_running_loop().run_in_executor(None, barrier.wait)
            try:
                await worker.aput(head, empty_checkpoint(), {"source": "loop", "step": 0}, {})
            except ThreadSupersededError:
                return "superseded"
            return "wrote"

    results.put(asyncio.run(run()))


@pytest.mark.race
async def test_processes_resuming_one_thread_at_once_write_one_step(
        saver: MeshpointSaver, store_url: str, store_options: dict[str, Any]) -> None:
    head = await saver.aput(config("procs"), empty_checkpoint(), {"source": "input"}, {})
    context = multiprocessing.get_context("spawn")
    barrier, results = context.Barrier(4), context.Queue()
    workers = [context.Process(target=_race_worker,
                               args=(store_url, store_options, head, barrier, results))
               for _ in range(4)]
    for worker in workers:
        worker.start()
    outcomes = sorted(results.get(timeout=120) for _ in workers)
    for worker in workers:
        worker.join(timeout=30)
    assert outcomes == ["superseded"] * 3 + ["wrote"]
    assert len([t async for t in saver.alist(config("procs"))]) == 2


def _writer(url: str, n: int, results: Any) -> None:
    async def run() -> int:
        async with await MeshpointSaver.open(url, migrate=False) as worker:
            parent = config(f"writer-{n}")
            for step in range(60):
                cp = empty_checkpoint()
                cp["channel_values"] = {"messages": [f"m{i}" for i in range(step + 1)]}
                cp["channel_versions"] = {"messages": step + 1}
                parent = await worker.aput(parent, cp, {"source": "loop", "step": step},
                                           {"messages": step + 1})
                await worker.aput_writes(parent, [("messages", [f"m{step + 1}"])], "t")
                await worker.aget_tuple(config(f"writer-{(n + 1) % 4}"))
            return step + 1

    results.put(asyncio.run(run()))


@pytest.mark.race
@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
async def test_processes_share_a_sqlite_file_without_database_is_locked(
        saver: MeshpointSaver, store_url: str) -> None:
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    workers = [context.Process(target=_writer, args=(store_url, n, results)) for n in range(4)]
    for worker in workers:
        worker.start()
    done = [results.get(timeout=180) for _ in workers]
    for worker in workers:
        worker.join(timeout=30)
        assert worker.exitcode == 0
    assert done == [60] * 4
    for n in range(4):
        latest = await saver.aget_tuple(config(f"writer-{n}"))
        assert latest is not None
        assert latest.checkpoint["channel_values"]["messages"] == [f"m{i}" for i in range(60)]
        assert latest.pending_writes == [("t", "messages", ["m60"])]


# -- tenants and the factory -------------------------------------------------------------------

async def test_another_tenants_threads_are_invisible(saver: MeshpointSaver,
                                                     live_store: SqlStore) -> None:
    other = MeshpointSaver(live_store.for_tenant("globex"))
    graph = chat_graph()
    await graph.compile(checkpointer=saver).ainvoke(
        {"messages": [HumanMessage(content="ours")]}, config("shared-name"))
    await graph.compile(checkpointer=other).ainvoke(
        {"messages": [HumanMessage(content="theirs")]}, config("shared-name"))
    ours = await saver.aget_tuple(config("shared-name"))
    theirs = await other.aget_tuple(config("shared-name"))
    assert ours is not None and theirs is not None
    assert ours.checkpoint["channel_values"]["messages"][0].content == "ours"
    assert theirs.checkpoint["channel_values"]["messages"][0].content == "theirs"
    await other.adelete_thread("shared-name")
    assert await saver.aget_tuple(config("shared-name")) is not None

    def tenants(conn: Connection) -> set[str]:
        return {r[0] for r in conn.execute(graph_blobs.select().with_only_columns(
            graph_blobs.c.tenant_id))}

    assert await live_store.run(tenants) == {"default"}


def test_get_checkpointer_from_synchronous_code(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/graphs.db"
    with get_checkpointer(url) as checkpointer:
        graph = chat_graph().compile(checkpointer=checkpointer)
        graph.invoke({"messages": [HumanMessage(content="hi")]}, config("sync"))
    with get_checkpointer(url) as again:  # persistent
        state = chat_graph().compile(checkpointer=again).get_state(config("sync"))
        assert [m.content[:8] for m in state.values["messages"]] == ["hi", "answer 1"]
    with get_checkpointer(use_memory=True) as memory:
        graph = chat_graph().compile(checkpointer=memory)
        graph.invoke({"messages": [HumanMessage(content="hi")]}, config("m"))
        assert len(graph.get_state(config("m")).values["messages"]) == 2

        async def on_its_own_loop() -> None:
            await graph.ainvoke({"messages": [HumanMessage(content="again")]}, config("m"))

        asyncio.run(on_its_own_loop())  # async from another loop is handed over
        assert len(graph.get_state(config("m")).values["messages"]) == 4


def test_a_closed_saver_says_so_and_closes_once(tmp_path: Path) -> None:
    checkpointer = get_checkpointer(f"sqlite:///{tmp_path}/graphs.db")
    graph = chat_graph().compile(checkpointer=checkpointer)
    graph.invoke({"messages": [HumanMessage(content="hi")]}, config("c"))
    checkpointer.close()
    checkpointer.close()  # a second close does nothing
    for call in (lambda: checkpointer.get_tuple(config("c")),
                 lambda: list(checkpointer.list(None))):
        with pytest.raises(StoreError, match="MeshpointSaver is closed"):
            call()


def test_a_string_that_is_not_unicode_text_is_refused_naming_where(tmp_path: Path) -> None:
    with get_checkpointer(f"sqlite:///{tmp_path}/graphs.db") as checkpointer:
        graph = chat_graph().compile(checkpointer=checkpointer)
        with pytest.raises(ContextSerializationError, match="lone surrogate"):
            graph.invoke({"messages": [HumanMessage(content="x\ud800y")]}, config("u"))
        graph.invoke({"messages": [HumanMessage(content="fine")]}, config("u"))


async def test_a_synchronous_call_on_the_stores_loop_is_refused(
        saver: MeshpointSaver) -> None:
    with pytest.raises(ConfigurationError, match="async methods"):
        saver.get_tuple(config("any"))


async def test_a_fresh_store_url_gets_the_tables_by_migration(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/{uuid.uuid4().hex}.db"
    async with await MeshpointSaver.open(url) as opened:
        assert await opened.aget_tuple(config("none")) is None
    async with await open_store(url, migrate=False) as store:  # already at the head
        assert store.dialect == "sqlite"


@pytest.mark.postgres
async def test_as_the_runtime_role_row_level_security_holds_every_table(
        tenancy: Any, acme: SqlStore) -> None:
    """Connected as the role ``serve`` uses (it owns nothing and cannot bypass row-level
    security), each tenant's saver does all it does, and raw SQL under one tenant sees
    none of the other's rows in the saver's tables."""
    savers = {"acme": MeshpointSaver(acme), "globex": MeshpointSaver(acme.for_tenant("globex"))}
    for name, each in savers.items():
        graph = _log_graph().compile(checkpointer=each)
        for step in range(6):
            await graph.ainvoke({"log": [f"{name} {step}"]}, config("t"))
        await each.acopy_thread("t", "copy")
        await each.aprune(["copy"], strategy="keep_latest")
        assert (await graph.aget_state(config("copy"))).values == \
            (await graph.aget_state(config("t"))).values
        await each.adelete_for_runs(["no-such-run"])
    for table in ("agent_langgraph_checkpoints", "agent_langgraph_blobs",
                  "agent_langgraph_writes"):
        seen = await test_rls.raw(acme, f"SELECT DISTINCT tenant_id FROM {table}", "acme")
        assert [r.tenant_id for r in seen] == ["acme"], table
        assert await test_rls.raw(acme, f"SELECT * FROM {table}") == [], table  # no tenant set
    state = await _log_graph().compile(checkpointer=savers["acme"]).aget_state(config("t"))
    assert "acme 0" in str(state.values) and "globex" not in str(state.values)


async def test_pages_of_every_thread_list_copies_that_share_ids(
        saver: MeshpointSaver, monkeypatch: pytest.MonkeyPatch) -> None:
    """Copied threads share checkpoint ids; a page boundary between two equal ids must
    not skip any (pages of 2 here, over 3 copies of 3 checkpoints)."""
    from meshpoint.integrations.langgraph import saver as saver_module

    parent = config("src")
    for step in range(3):
        parent = await saver.aput(parent, empty_checkpoint(), {"source": "loop", "step": step},
                                  {})
    for copy in ("copy-a", "copy-b"):
        await saver.acopy_thread("src", copy)
    monkeypatch.setattr(saver_module, "PAGE", 2)
    listed = [(t.config["configurable"]["thread_id"], t.metadata["step"])
              async for t in saver.alist(None)]
    assert sorted(listed) == sorted((thread, step) for thread in ("copy-a", "copy-b", "src")
                                    for step in range(3))
    assert [step for _, step in listed] == [2, 2, 2, 1, 1, 1, 0, 0, 0]
