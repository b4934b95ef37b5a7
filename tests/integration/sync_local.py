"""A local meshpoint deployment for the sync's tests: a SQLite file served by the
embedded runtime (history signed and encrypted, every agent's event log on), the
cloud's config (public signing key only), and row-by-row reads of both sides.

Run as a script, it is the local runtime that keeps writing while a sync is killed:
``python -m tests.integration.sync_local CONFIG TASKS [START [PAUSE_S [graphs]]]`` runs
TASKS tasks, one at a time, PAUSE_S apart, printing ``done N`` after each; with
``graphs``, each task is followed by a step of a LangGraph thread on the same file
(three threads, each pruned in place every fourth step).
"""

from __future__ import annotations

import asyncio
import base64
import json
import sys
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from sqlalchemy import select

from meshpoint import a2a
from meshpoint.embedded import embedded
from meshpoint.history.encryption import EncryptionKeys, save_keyring
from meshpoint.integrations.langgraph.tables import graph_blobs, graph_checkpoints, graph_writes
from meshpoint.store import SqlStore, open_store
from meshpoint.store.schema import checkpoint_heads, checkpoints, ended_tasks, events

TENANT = "acme"
#: The tables that travel, and their keys (beside tenant_id), for comparisons.
SYNCED = {checkpoints: ("checkpoint_id",), checkpoint_heads: ("logical_task_id",),
          events: ("event_id",), ended_tasks: ("logical_task_id",),
          graph_checkpoints: ("thread_id", "checkpoint_ns", "checkpoint_id"),
          graph_blobs: ("thread_id", "checkpoint_ns", "channel", "version"),
          graph_writes: ("thread_id", "checkpoint_ns", "checkpoint_id", "task_id", "idx")}


def local_config(where: Path, *, tenant: str = TENANT, key_id: str = "k1"
                 ) -> tuple[Path, Path]:
    """A local mesh config (SQLite file, signed and encrypted history, event logs on)
    and the cloud's verifier config fragment's public key file; returns (config,
    public key PEM path). ``key_id``: the signing key's id (two stores that sync into
    one cloud need two)."""
    key = Ed25519PrivateKey.generate()
    seed = base64.b64encode(key.private_bytes(
        serialization.Encoding.Raw, serialization.PrivateFormat.Raw,
        serialization.NoEncryption())).decode()
    (where / "k1.seed").write_text(seed)
    public = where / "k1.pub.pem"
    public.write_bytes(key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    save_keyring(EncryptionKeys.generate(tenant), where / "keyring.json")
    config = where / "local.yaml"
    config.write_text(f"""\
store: {{url: "sqlite:///{where / 'local.db'}", tenant: {tenant}}}
broker: memory://
history:
  signing: {{active: {key_id}, keys: {{{key_id}: "file:{where / 'k1.seed'}"}}}}
  encryption: {{keyring: "{where / 'keyring.json'}"}}
agents:
  coordinator:
    peers: [{{agent: flights, timeout_s: 30}}, {{agent: hotels, timeout_s: 30}}]
    events: true
  flights: {{events: true}}
  hotels: {{events: true}}
""")
    return config, public


def cloud_config(where: Path, url: str, schema: str, public: Path, *,
                 tenant: str = TENANT) -> Path:
    """The cloud's config: its store (as the runtime role) and the public signing key
    chains are verified with on arrival and by ``meshpoint verify``."""
    config = where / "cloud.yaml"
    config.write_text(f"store: {json.dumps({'url': url, 'schema': schema, 'tenant': tenant})}\n"
                      f"history:\n  signing: {{keys: {{k1: 'file:{public}'}}}}\n")
    return config


async def run_tasks(config: Path, count: int, *, start: int = 0, pause_s: float = 0.0,
                    announce: bool = False, graphs: bool = False) -> None:
    """Run ``count`` tasks through the embedded runtime, one at a time, ``pause_s``
    apart; with ``graphs``, each followed by a step of a LangGraph thread."""
    from meshpoint.config import load_config

    mesh = load_config(config)
    async with embedded(config) as client, open_store(
            mesh.store.url, tenant_id=mesh.store.tenant, migrate=False,
            history=mesh.history_options()) as store:
        for n in range(start, start + count):
            task = await client.ask("coordinator", f"Trip {n}: flights, hotels",
                                    timeout_s=60)
            assert task.status.state is a2a.TaskState.COMPLETED, task.status
            if graphs:
                await graph_step(store, f"thread-{n % 3}", f"Trip {n}", prune=n % 4 == 3)
            if announce:
                print(f"done {n}", flush=True)
            await asyncio.sleep(pause_s)


async def graph_step(store: SqlStore, thread: str, said: str, *, prune: bool = False) -> None:
    """One step of a LangGraph chat thread through meshpoint's saver (then, with
    ``prune``, the thread pruned to its latest checkpoint, in place)."""
    from typing import Annotated, TypedDict

    from langchain_core.messages import AIMessage, HumanMessage
    from langgraph.graph import END, START, StateGraph
    from langgraph.graph.message import add_messages

    from meshpoint.integrations.langgraph import MeshpointSaver

    # The functional form: evaluated here (this module's annotations are strings).
    Chat = TypedDict("Chat", {"messages": Annotated[list[Any], add_messages]})  # noqa: UP013

    def reply(state: Any) -> dict[str, Any]:
        return {"messages": [AIMessage(content=f"reply {len(state['messages'])}")]}

    builder = StateGraph(Chat)
    builder.add_node("reply", reply)
    builder.add_edge(START, "reply")
    builder.add_edge("reply", END)
    saver = MeshpointSaver(store)
    await builder.compile(checkpointer=saver).ainvoke(
        {"messages": [HumanMessage(content=said)]},
        {"configurable": {"thread_id": thread}})
    if prune:
        await saver.aprune([thread], strategy="keep_latest")


async def tenant_rows(store: SqlStore, tenant: str = TENANT) -> dict[str, dict[str, Any]]:
    """Every synced table's rows of ``tenant``, by table and key, as dicts (raw SQL, in
    a transaction of the tenant: row-level security shows its rows)."""
    def read(conn: Any) -> dict[str, dict[str, Any]]:
        out: dict[str, dict[str, Any]] = {}
        for table, key in SYNCED.items():
            rows = conn.execute(select(table).where(table.c.tenant_id == tenant))
            out[table.name] = {"/".join(str(getattr(r, k)) for k in key):
                               _plain(r._asdict()) for r in rows}
        return out

    return await store.for_tenant(tenant).transaction(read)


def _plain(row: dict[str, Any]) -> dict[str, Any]:
    return {k: bytes(v) if isinstance(v, memoryview) else v for k, v in row.items()}


if __name__ == "__main__":
    asyncio.run(run_tasks(Path(sys.argv[1]), int(sys.argv[2]),
                          start=int(sys.argv[3]) if len(sys.argv) > 3 else 0,
                          pause_s=float(sys.argv[4]) if len(sys.argv) > 4 else 0.0,
                          announce=True, graphs=sys.argv[5:6] == ["graphs"]))
