"""Moving a paused task to the cloud (docs/sync.md, *Moving a paused task*): a task
paused on a local SQLite file (waiting for an approval and on a peer) is handed to a
cloud PostgreSQL store; the local instance is killed; a cloud instance on NATS
resumes it and it is answered exactly once. At every step of the move exactly one
side can resume it: the move's process is SIGKILLed after each step and run again.
Bad input changes nothing."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import uuid
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select, update

from meshpoint.broker.base import Delivery
from meshpoint.errors import SubTaskMovingError, UnknownSubTaskError
from meshpoint.history.encryption import EncryptionKeys, is_envelope, save_keyring
from meshpoint.history.planning import HistoryOptions
from meshpoint.llm import ScriptedModel
from meshpoint.runtime import Agent, Peer
from meshpoint.runtime.approvals import Approve, decide
from meshpoint.runtime.subjects import Subjects
from meshpoint.store import SqlStore, open_store
from meshpoint.store.schema import ended_tasks, paused_tasks, peer_sub_tasks
from meshpoint.sync.move import OWNER_PREFIX, Mover, MoveRefusedError
from meshpoint.sync.move_tables import sync_moves
from meshpoint.sync.push import Syncer
from tests.integration.mesh import FAST, ManualPeer, Mesh, eventually
from tests.integration.test_approvals import SideEffects, approving, paused
from tests.integration.test_sync import Cloud, cloud

pytestmark = [pytest.mark.postgres, pytest.mark.xdist_group("pg_roles")]
__all__ = ["cloud"]  # the fixture this module uses

TENANT = "acme"
REPO = Path(__file__).resolve().parents[2]


def coordinator(effects: SideEffects) -> Agent:
    """Asked for a trip, it calls the flights agent and a tool that needs approval."""
    return approving(effects, peers=[Peer("flights", timeout_s=120)])


@dataclass
class Local:
    """A local deployment whose coordinator paused one task, then was killed."""

    db: Path
    keyring: Path
    history: HistoryOptions
    namespace: str
    task_id: str
    call_id: str  # the approval's
    answers_prefix: str  # where the task's caller listens

    @property
    def url(self) -> str:
        return f"sqlite:///{self.db}"

    def open(self, tenant: str = TENANT) -> Any:
        return open_store(self.url, tenant_id=tenant, migrate=False, history=self.history)


async def pause_locally(where: Path) -> Local:
    keys = EncryptionKeys.generate(TENANT)
    keyring = where / "keyring.json"
    save_keyring(keys, keyring)
    history = HistoryOptions(encryption=keys)
    db = where / "local.db"
    namespace = f"t{uuid.uuid4().hex[:12]}"
    store = await open_store(f"sqlite:///{db}", tenant_id=TENANT, history=history)
    mesh = await Mesh(store, replace(FAST, namespace=namespace)).start()
    try:
        [instance] = await mesh.run(coordinator(SideEffects()))
        _, task_id, pending = await paused(mesh, "Trip: flights")
        subs = await store.get_peer_sub_tasks_for_task(task_id)
        assert sorted((s.peer_agent_name or "approval", s.status) for s in subs) == [
            ("approval", "pending"), ("flights", "pending")]
        prefix = mesh.client._prefix
        await instance.kill()  # the local instance dies; the request to flights with it
    finally:
        await mesh.close()
        await store.close()
    return Local(db, keyring, history, namespace, task_id, pending[0]["call_id"], prefix)


@pytest.fixture
async def local(tmp_path: Path) -> Local:
    return await pause_locally(tmp_path)


async def rows_of(store: SqlStore, task_id: str) -> dict[str, Any]:
    """The task's live row (owner, status), sub-task statuses and ledger rows."""
    def read(conn: Any) -> dict[str, Any]:
        task = conn.execute(select(paused_tasks.c.status, paused_tasks.c.owner,
                                   paused_tasks.c.lease_expires_at).where(
            paused_tasks.c.logical_task_id == task_id)).first()
        subs = sorted(r.status for r in conn.execute(select(peer_sub_tasks.c.status).where(
            peer_sub_tasks.c.logical_task_id == task_id)))
        moves = sorted(r.state for r in conn.execute(select(sync_moves.c.state).where(
            sync_moves.c.logical_task_id == task_id)))
        ended = conn.execute(select(ended_tasks.c.agent_name).where(
            ended_tasks.c.logical_task_id == task_id)).first()
        return {"task": None if task is None else tuple(task), "subs": subs,
                "moves": moves, "ended": ended is not None}

    return await store.transaction(read)


def resumable(rows: dict[str, Any]) -> bool:
    """Whether an instance of that side could resume or answer the task: its row is
    there, nobody holds it for ever, and its items are claimable."""
    task = rows["task"]
    return task is not None and (task[1] is None or not str(task[1]).startswith(
        OWNER_PREFIX)) and "moving" not in rows["subs"]


async def owners(local: Local, cloud: Cloud) -> tuple[bool, bool]:
    async with local.open() as here, cloud.open(history=local.history) as there:
        return (resumable(await rows_of(here, local.task_id)),
                resumable(await rows_of(there, local.task_id)))


def sync_cli(local: Local, cloud: Cloud, *args: str, crash: str | None = None,
             command: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    """``meshpoint sync [command] --from the file --to the cloud ...``; ``crash``: the
    step of a move after which the process SIGKILLs itself."""
    env = {**os.environ, "PYTHONPATH": f"{REPO / 'src'}:{REPO}", "COLUMNS": "400"}
    env.pop("MESHPOINT_SYNC_MOVE_CRASH", None)
    if crash is not None:
        env["MESHPOINT_SYNC_MOVE_CRASH"] = crash
    # The file's history is not signed: its chains travel with --unsigned.
    unsigned = () if command else ("--unsigned",)
    return subprocess.run(
        [sys.executable, "-m", "meshpoint.cli", "sync", *command, "--from", local.url,
         "--to", cloud.role_url, "--schema", cloud.schema, "--tenant", TENANT, *unsigned,
         *args],
        capture_output=True, text=True, env=env, timeout=120, cwd=REPO)


@pytest.mark.parametrize("step", ["held", "copied", "released"])
async def test_a_move_killed_after_each_step_leaves_one_owner_and_a_rerun_completes_it(
        local: Local, cloud: Cloud, step: str) -> None:
    """``meshpoint sync --move-paused`` SIGKILLed after a step: the task is resumable on
    one side at most (after the hold: on neither, frozen locally; after the copy: in
    the cloud only), and a rerun completes the move exactly once."""
    killed = sync_cli(local, cloud, "--move-paused", "--task", local.task_id, crash=step)
    assert killed.returncode == -9, killed.stderr
    assert await owners(local, cloud) == (False, step != "held")
    status = sync_cli(local, cloud, "--json", command=("status",))
    assert json.loads(status.stdout)["moves_under_way"] == (
        [local.task_id] if step != "released" else [])
    if step == "held":
        async with local.open() as store:
            assert (await rows_of(store, local.task_id))["subs"] == ["moving", "moving"]
    done = sync_cli(local, cloud, "--move-paused", "--task", local.task_id, "--json")
    assert done.returncode == 0, done.stderr + done.stdout
    moved = json.loads(done.stdout)["moved"]
    assert [(m["task_id"], m["outcome"]) for m in moved] == [
        (local.task_id, "already moved" if step == "released" else "moved")]
    await landed_once(local, cloud)
    async with local.open() as here:  # a local answer now is late: its task ended here
        assert await here.task_known(local.task_id, "coordinator")
        with pytest.raises(UnknownSubTaskError):
            await here.resolve_peer_sub_task(local.call_id, {"decision": "approved"})
    again = sync_cli(local, cloud, "--move-paused", "--json")  # a rerun changes nothing
    assert [m["outcome"] for m in json.loads(again.stdout)["moved"]] == []
    await landed_once(local, cloud)


async def test_moves_of_one_task_at_once_land_it_once(local: Local, cloud: Cloud) -> None:
    """Four ``sync --move-paused`` processes at once: one moves the task, the others
    find it held (skipped), moved (already moved) or gone; it lands in the cloud once
    (one ``arrived`` row, one copy of its rows), and the local side lets it go once."""
    env = {**os.environ, "PYTHONPATH": f"{REPO / 'src'}:{REPO}"}
    args = [sys.executable, "-m", "meshpoint.cli", "sync", "--from", local.url, "--to",
            cloud.role_url, "--schema", cloud.schema, "--tenant", TENANT, "--move-paused",
            "--unsigned", "--json"]
    runs = [subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, env=env, cwd=REPO) for _ in range(4)]
    outcomes = []
    for run in runs:
        out, errors = run.communicate(timeout=120)
        assert run.returncode == 0, errors
        outcomes += [m["outcome"] for m in json.loads(out)["moved"]]
    assert outcomes.count("moved") == 1, outcomes
    assert set(outcomes) <= {"moved", "skipped", "already moved"}, outcomes
    await landed_once(local, cloud)


async def landed_once(local: Local, cloud: Cloud) -> None:
    """The task is the cloud's, as it was paused, and the local side let it go."""
    assert await owners(local, cloud) == (False, True)
    async with local.open() as here:
        assert await rows_of(here, local.task_id) == {
            "task": None, "subs": [], "moves": ["moved"], "ended": True}
    async with cloud.open(history=local.history) as there:
        assert await rows_of(there, local.task_id) == {
            "task": ("input_required", None, None), "subs": ["pending", "pending"],
            "moves": ["arrived"], "ended": False}
        # Encrypted fields travelled as ciphertext: the context, the calls.
        raw = await there.transaction(lambda conn: conn.execute(select(
            paused_tasks.c.context, peer_sub_tasks.c.correlation_data).where(
            peer_sub_tasks.c.logical_task_id == paused_tasks.c.logical_task_id)).first())
        assert b"Trip: flights" not in bytes(raw[0]) and is_envelope(raw[1])


@pytest.mark.nats
@pytest.mark.parametrize("via", ["store", "client"])
async def test_a_moved_task_is_resumed_by_a_cloud_instance_and_answered_once(
        local: Local, cloud: Cloud, nats_url: str, via: str) -> None:
    """The issue's proof: paused locally on an approval and a peer call, moved (the
    move's process killed after its copy committed, then run again), the local
    instance dead; a cloud instance on NATS asks the peer again, the approval is
    decided in the cloud's store (as ``meshpoint tasks approve`` does), and the task
    is answered once: one answer to its caller, the tool run once, one end."""
    from meshpoint.broker.nats import NatsBroker

    assert sync_cli(local, cloud, "--move-paused", crash="copied").returncode == -9
    assert sync_cli(local, cloud, "--move-paused").returncode == 0
    await landed_once(local, cloud)

    # The cloud: its instances on NATS, the same namespace and tenant.
    broker = await NatsBroker.connect(nats_url, pull_expires_s=0.3)
    answers: list[str] = []

    async def count(delivery: Delivery) -> None:
        if ".response." in delivery.message.subject:
            answers.append(delivery.message.subject)
        await delivery.ack()

    effects = SideEffects()
    async with cloud.open(history=local.history) as store:
        mesh = await Mesh(store, replace(FAST, namespace=local.namespace), broker).start()
        try:
            await broker.subscribe(f"{local.answers_prefix}.>", "answers-counted", count)
            await mesh.run(coordinator(effects), 2)
            flights = await mesh.run(Agent("flights", ScriptedModel(persona="flights desk")))

            async def peer_answered() -> bool:
                subs = await store.get_peer_sub_tasks_for_task(local.task_id)
                return any(s.peer_agent_name == "flights" and s.status == "resolved"
                           for s in subs)

            await eventually(peer_answered, timeout_s=30, what="flights' answer in the cloud")
            # Asked again on the cloud's broker, once, by one of the cloud's instances.
            assert len(mesh.events("announced_again", "coordinator")) == 1
            assert len(flights[0].stats.tasks("completed")) == 1
            if via == "store":  # as meshpoint tasks approve --url <cloud> does
                await decide(store, local.task_id, Approve(call_id=local.call_id), by="alice")
            else:  # a client of the cloud's mesh, through an instance
                decision = await mesh.client.approve(local.task_id, local.call_id, by="alice")
                assert decision["decision"] == "approved"
            await eventually(lambda: answers != [], timeout_s=30, what="the answer")
            await asyncio.sleep(1.0)  # a second answer would have come by now
            assert len(answers) == 1, answers
            assert list(effects.runs.values()) == [1]
            assert sum(len(i.stats.tasks("completed")) for i in mesh.of("coordinator")) == 1
            ended = await rows_of(store, local.task_id)
            assert ended["task"] is None and ended["ended"]
            # A pass after the cloud ended it: the local end of the move does not
            # travel, so nothing clashes with the cloud's end.
            after = sync_cli(local, cloud, "--json")
            assert after.returncode == 0, after.stdout + after.stderr
        finally:
            await mesh.close()
            cleanup = await NatsBroker.connect(nats_url)
            await cleanup.delete_namespace(local.namespace)
            await cleanup.close()


async def test_bad_input_is_a_clear_error_and_changes_nothing(
        local: Local, cloud: Cloud) -> None:
    async with local.open() as store:
        before = await rows_of(store, local.task_id)
    dry = sync_cli(local, cloud, "--move-paused", "--dry-run", "--json")
    assert dry.returncode == 0, dry.stdout + dry.stderr
    [would] = json.loads(dry.stdout)["moved"]
    assert (would["task_id"], would["outcome"], would["peer_calls"], would["approvals"]) == (
        local.task_id, "would move", 1, 1)
    # The file holds another tenant's paused task too: a task of one tenant is not
    # another's to move.
    async with local.open() as store:
        def other_tenant(conn: Any) -> None:
            row = dict(conn.execute(select(paused_tasks)).first()._mapping)
            conn.execute(paused_tasks.insert().values(
                {**row, "tenant_id": "globex", "logical_task_id": "globex-task"}))

        await store.transaction(other_tenant, write=True)
    for args, words in (
            (("--task", "no-such-task"), "no paused task 'no-such-task' of tenant 'acme'"),
            (("--task", local.task_id, "--tenant", "globex"),
             f"no paused task '{local.task_id}' of tenant 'globex'"),
            (("--task", local.task_id, "--tenant", "initech"), "no rows of tenant 'initech'"),
            (("--task", local.task_id, "--follow"), "a move is one run"),
            (("--task",), "requires an argument")):
        run = sync_cli(local, cloud, "--move-paused", *args)
        assert run.returncode == 2, run.stdout + run.stderr
        assert words in " ".join((run.stdout + run.stderr).split()), run.stderr
    no_move = sync_cli(local, cloud, "--task", local.task_id)
    assert no_move.returncode == 2 and "give --move-paused too" in no_move.stderr
    async with local.open() as store:
        assert await rows_of(store, local.task_id) == before
        assert await Syncer(store, store).source_id(create=False) is None
    async with cloud.open(history=local.history) as there:
        assert await rows_of(there, local.task_id) == {
            "task": None, "subs": [], "moves": [], "ended": False}


async def test_a_task_that_is_not_paused_or_that_the_cloud_holds_does_not_move(
        local: Local, cloud: Cloud) -> None:
    # Not paused: a turn of it is due (its join completed).
    async with local.open() as store:
        await store.transaction(lambda conn: conn.execute(update(paused_tasks).values(
            status="resuming")), write=True)
        async with cloud.open(history=local.history) as there:
            with pytest.raises(MoveRefusedError, match="a turn of it is running or due"):
                await Mover(Syncer(store, there), "cloud").run([local.task_id])
            # Unnamed, it is skipped with why, and nothing is written either.
            [report] = await Mover(Syncer(store, there), "cloud").run()
            assert (report.outcome, report.reason) == (
                "skipped", "a turn of it is running or due (status resuming): move it "
                "once it waits on peers or for approval")
        await store.transaction(lambda conn: conn.execute(update(paused_tasks).values(
            status="input_required")), write=True)
        before = await rows_of(store, local.task_id)
        # The cloud has a task of that id already: refused, nothing written anywhere.
        async with cloud.open(history=local.history) as there:
            await there.transaction(lambda conn: conn.execute(ended_tasks.insert().values(
                tenant_id=TENANT, logical_task_id=local.task_id, agent_name="coordinator",
                ended_at=1.0)), write=True)
            with pytest.raises(MoveRefusedError, match="the cloud's ledger of ended tasks"):
                await Mover(Syncer(store, there), "cloud").run([local.task_id])
            assert (await rows_of(there, local.task_id))["moves"] == []
        assert await rows_of(store, local.task_id) == before


async def test_an_answer_arriving_locally_during_the_move_is_handed_back_not_lost(
        tmp_path: Path, cloud: Cloud, caplog: pytest.LogCaptureFixture) -> None:
    """While a task is held for its move, the live local instance is refused every
    claim of its items (``SubTaskMovingError``): a peer's answer is handed back to the
    broker, never acknowledged, and no timeout takes the item. The move given up, the
    redelivered answer is taken locally, once."""
    keys = EncryptionKeys.generate(TENANT)
    history = HistoryOptions(encryption=keys)
    async with open_store(f"sqlite:///{tmp_path / 'local.db'}", tenant_id=TENANT,
                          history=history) as store, cloud.open(history=history) as there:
        mesh = await Mesh(store, replace(FAST, namespace=f"t{uuid.uuid4().hex[:12]}")).start()
        try:
            await mesh.run(coordinator(SideEffects()))
            peer = ManualPeer(mesh, "flights")
            ns = mesh.options.namespace
            await mesh.broker.subscribe(Subjects(ns, TENANT).request("flights"),
                                        f"{ns}-flights-requests", peer._on_request)
            _, task_id, _ = await paused(mesh, "Trip: flights")
            await eventually(lambda: bool(peer.requests), what="the request to flights")
            [sub_task_id] = list(peer.requests)
            mover = Mover(Syncer(store, there), "cloud")
            await mover.plan([task_id])
            await mover._hold(task_id, "coordinator", "m-1")
            with pytest.raises(SubTaskMovingError, match="being moved to the cloud"):
                await store.resolve_peer_sub_task(sub_task_id, "a flight",
                                                  agent_name="coordinator")
            assert await store.sweep_expired_timeouts("coordinator") == []

            await peer.answer(sub_task_id, "a flight")
            await eventually(lambda: f"could not record the answer to {sub_task_id}"
                             in caplog.text, what="the refused claim")
            assert not [d for kind, subject, d in mesh.broker.log  # type: ignore[attr-defined]
                        if kind == "ack" and subject.endswith(sub_task_id)]
            assert (await rows_of(store, task_id))["subs"] == ["moving", "moving"]

            await mover._give_back(task_id, "m-1")

            async def taken() -> bool:
                subs = await store.get_peer_sub_tasks_for_task(task_id)
                return any(s.sub_task_id == sub_task_id and s.status == "resolved"
                           and s.result is not None for s in subs)

            await eventually(taken, what="the redelivered answer, taken locally")
            rows = await rows_of(store, task_id)
            assert rows["subs"] == ["pending", "resolved"] and rows["moves"] == []
            assert resumable(rows)
        finally:
            await mesh.close()
