"""``meshpoint tasks``, run as a subprocess against the store of a running mesh
(issue 14 §4): an operator lists and inspects paused tasks and answers approvals
from another process; an instance of the mesh resumes the task."""

from __future__ import annotations

import asyncio
import json
import sys
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import update

from meshpoint import a2a
from meshpoint.llm import ScriptedModel
from meshpoint.runtime import Agent, LocalTool, Peer, wire
from meshpoint.runtime.agent import RecoveryPolicy
from meshpoint.store import SqlStore, open_store
from meshpoint.store.schema import paused_tasks
from tests.conftest import snapshot
from tests.integration.mesh import ManualPeer, Mesh, eventually
from tests.integration.test_approvals import SideEffects, approving, paused
from tests.integration.test_runtime import no_rows_left
from tests.integration.test_store import AGENT, fan_out


@pytest.fixture
def where(store_url: str, store_options: dict[str, object]) -> list[str]:
    """The options that name the test's store to the command line: ``--url``, and on
    PostgreSQL the test's ``--schema``."""
    schema = store_options.get("schema")
    return ["--url", store_url, *(["--schema", str(schema)] if schema else [])]


def store_section(where: list[str]) -> str:
    """The config's ``store:`` section naming the same store."""
    options = dict(zip(where[::2], where[1::2], strict=True))
    schema = f", schema: {options['--schema']}" if "--schema" in options else ""
    return f"store: {{url: '{options['--url']}'{schema}}}\n"


async def tasks(where: list[str], *args: str) -> tuple[int, str, str]:
    """``meshpoint tasks ARGS`` on the store ``where`` names (``meshpoint stats``,
    ``recover``, ``events``, ``keys``: without ``tasks``); the event loop keeps serving
    the mesh meanwhile."""
    command = (list(args) if args[0] in ("stats", "recover", "events", "keys", "alerts")
               else ["tasks", *args])
    if args[0] not in ("cancel", "keys") and "--config" not in args:
        command += where
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "meshpoint.cli", *command,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(process.communicate(), 120)
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


async def ok_json(where: list[str], *args: str) -> Any:
    code, out, err = await tasks(where, *args, "--json")
    assert code == 0, err
    return json.loads(out)


async def test_an_operator_lists_shows_and_approves_from_another_process(
        mesh: Mesh, live_store: SqlStore, where: list[str]) -> None:
    effects = SideEffects()
    await mesh.run(approving(effects), 2)
    request_id, task_id, pending = await paused(mesh, "Send the report")
    call_id = pending[0]["call_id"]

    listed = await ok_json(where, "list", "--status", "input_required")
    assert [t["task_id"] for t in listed["tasks"]] == [task_id]
    assert (await ok_json(where, "list", "--status", "waiting_peers"))["tasks"] == []
    code, _, err = await tasks(where, "list", "--status", "completed")  # not a typo's []
    assert code == 2 and "not a status of a live task" in " ".join(err.split()), err
    shown = await ok_json(where, "show", task_id)
    assert shown["status"] == "input_required"
    assert [(w["kind"], w["call_id"], w["tool"]) for w in shown["waiting_on"]] == [
        ("approval", call_id, "send")]
    assert shown["conversation"][0] == {"role": "user", "content": "Send the report"}
    code, out, err = await tasks(where, "show", task_id)  # the table, for an operator
    assert code == 0, err
    said = [line.strip() for line in out.splitlines() if line.startswith(("user:",
                                                                          "assistant:"))]
    assert said[0] == "user: Send the report"
    assert "assistant: (calls send)" in said and "assistant:" not in said, out

    for args, reason in (
            (("approve", task_id, call_id, "--arguments", '{"query": 5}'),
             "do not satisfy its schema: query: 5 is not of type 'string'"),
            (("approve", task_id, call_id, "--arguments", "[1]"), "must be a JSON object"),
            (("approve", task_id, "nope"), "has no pending call 'nope'"),
            (("approve", "coordinator-" + "0" * 32, call_id), "no paused task"),
            (("deny", task_id, call_id), "Missing option '--reason'")):
        code, out, err = await tasks(where, *args)
        assert code != 0 and reason in " ".join((out + err).split()), (args, out, err)
    assert not effects.runs and (await ok_json(where, "show", task_id))["answered"] == []

    # A partial edit: merged into the proposed arguments (a JSON merge patch).
    done = await ok_json(where, "approve", task_id, call_id, "--arguments",
                         '{"to": "ops@example.com"}', "--by", "ops")
    assert [(d["decision"], d["claimed_by"], d["edited"]) for d in done["decisions"]] == [
        ("approved", "ops", True)]
    merged = {"query": "Send the report", "to": "ops@example.com"}
    assert done["decisions"][0]["arguments"] == merged
    answer = await mesh.client.wait(request_id, timeout_s=20)  # recovery resumes it
    assert answer.status.state is a2a.TaskState.COMPLETED
    assert list(effects.runs.values()) == [1]
    assert list(effects.arguments.values()) == [merged]
    await no_rows_left(live_store)
    code, _, err = await tasks(where, "approve", task_id, call_id)
    assert code == 1 and "no paused task" in err


async def test_deny_and_reply_from_the_command_line(
        mesh: Mesh, live_store: SqlStore, where: list[str]) -> None:
    effects = SideEffects()
    await mesh.run(approving(effects))
    denied_request, denied, pending = await paused(mesh, "Send the report")
    replied_request, replied, _ = await paused(mesh, "Send the memo")
    code, out, err = await tasks(where, "deny", denied, pending[0]["call_id"],
                                 "--reason", "not today")
    assert code == 0 and "denied (not today)" in out, err
    code, out, err = await tasks(where, "reply", replied, "Ask Dana first")
    assert code == 0 and "answered in words" in out, err
    for request_id, expected in ((denied_request, "not approved: not today"),
                                 (replied_request, "Ask Dana first")):
        answer = await mesh.client.wait(request_id, timeout_s=20)
        assert expected in answer.status.message.text  # type: ignore[union-attr]
    assert not effects.runs


async def test_another_tenant_sees_nothing_and_a_second_answer_is_told_who_won(
        mesh: Mesh, live_store: SqlStore, where: list[str], tmp_path: Path) -> None:
    """Another tenant's task is unknown to every command (and an answer to it writes
    nothing); the config names the store as ``--url`` does; a second answer to a call
    exits 1 with the decision that stands."""
    effects = SideEffects()
    peer = await ManualPeer(mesh, "researcher").start()
    await mesh.run(approving(effects, peers=[Peer("researcher", timeout_s=60)]))
    request_id, task_id, pending = await paused(mesh, "Send the report")
    call_id = pending[0]["call_id"]
    await eventually(lambda: len(peer.requests) == 1, what="the peer's request")
    before = await snapshot(live_store)

    other = [*where, "--tenant", "other"]
    assert (await ok_json(other, "list"))["tasks"] == []
    assert (await ok_json(other, "stats"))["total"] == 0
    for args in (("show", task_id), ("approve", task_id, call_id),
                 ("deny", task_id, call_id, "--reason", "no"), ("reply", task_id, "hi")):
        code, out, err = await tasks(other, *args, "--json")
        assert code == 1 and json.loads(out)["kind"] == "UnknownTaskError", (args, out, err)
        assert "no paused task" in json.loads(out)["error"]
    assert await snapshot(live_store) == before

    config = tmp_path / "mesh.yaml"
    config.write_text(store_section(where) + "agents: {coordinator: {}}\n")
    shown = await ok_json(where, "show", task_id, "--config", str(config))
    assert shown["status"] == "input_required"
    assert (await ok_json(where, "stats", "--config", str(config),
                          "--tenant", "other"))["total"] == 0

    done = await ok_json(where, "approve", task_id, call_id, "--by", "ops")
    assert [d["decision"] for d in done["decisions"]] == ["approved"]
    code, out, _ = await tasks(where, "deny", task_id, call_id, "--reason", "late",
                               "--by", "dana", "--json")
    refused = json.loads(out)
    assert code == 1 and refused["kind"] == "AlreadyAnsweredError"
    assert (refused["decision"]["decision"], refused["decision"]["claimed_by"]) == (
        "approved", "ops")
    code, _, err = await tasks(where, "approve", task_id, call_id)
    assert code == 1 and "already answered (approved, claimed by ops, unverified)" in \
        " ".join(err.split())
    assert not effects.runs  # the task still waits on its peer

    await peer.answer(next(iter(peer.requests)), "the figures")
    answer = await mesh.client.wait(request_id, timeout_s=20)
    assert answer.status.state is a2a.TaskState.COMPLETED
    assert list(effects.runs.values()) == [1]


async def test_stats_count_each_task_once_and_recover_shows_its_plan(
        mesh: Mesh, live_store: SqlStore, where: list[str]) -> None:
    effects = SideEffects()
    await mesh.run(approving(effects, peers=[Peer("researcher", timeout_s=60)]))
    peer = await ManualPeer(mesh, "researcher").start()
    await paused(mesh, "Send the report")
    await eventually(lambda: len(peer.requests) == 1, what="the peer's request")
    await mesh.run(Agent("planner", ScriptedModel(), peers=[Peer("researcher")]))
    await mesh.client.submit("planner", "Plan it")
    await eventually(lambda: len(peer.requests) == 2, what="the second task's request")

    stats = await ok_json(where, "stats")  # `meshpoint stats`, not `tasks stats`
    assert (stats["total"], stats["input_required"], stats["working"], stats["expired"]) \
        == (2, 1, 0, 0)
    stats = await ok_json(where, "stats", "--expire-after", "0.001")
    assert (stats["total"], stats["expired"], stats["input_required"]) == (2, 2, 0)

    plan = (await ok_json(where, "recover", "--dry-run"))["plan"]
    assert [(p["action"], p["agent"]) for p in plan] == [
        ("leave (waits for a human)", "coordinator")]
    plan = (await ok_json(where, "recover", "--dry-run", "--timeout", "0.001"))["plan"]
    # each task once: the one waiting for a human is expired first
    assert sorted((p["action"], p["agent"]) for p in plan) == [
        ("fail (expired)", "coordinator"), ("fail (expired)", "planner")]
    code, _, err = await tasks(where, "recover")
    assert code == 2 and "use --dry-run" in " ".join(err.split())


async def test_recover_dry_run_names_one_action_per_task_as_the_live_pass_takes_them(
        mesh: Mesh, live_store: SqlStore, where: list[str]) -> None:
    """Four stored tasks of one agent: waiting for a human, and orphaned (its join
    complete, the instance that took it dead), each fresh and old. ``recover
    --dry-run`` names one action per task, the first that matches in the live pass's
    order (expired first, then resume, then a human's wait), and an instance's
    recovery pass then does exactly that."""
    for task_id in ("waits", "waits-old", "orphan", "orphan-old"):
        status = "input_required" if task_id.startswith("waits") else "waiting_peers"
        await live_store.checkpoint_task(fan_out(task_id, peers=1), AGENT, status=status)
        if task_id.startswith("orphan"):
            await live_store.resolve_peer_sub_task(f"{task_id}/sub-0", "found",
                                                   lease_owner="dead#1")
    await live_store.run(lambda conn: conn.execute(update(paused_tasks).values(
        lease_expires_at=paused_tasks.c.lease_expires_at - 3600)), write=True)
    await live_store.run(lambda conn: conn.execute(update(paused_tasks).where(
        paused_tasks.c.logical_task_id.like("%-old")).values(
        checkpointed_at=paused_tasks.c.checkpointed_at - 3600)), write=True)

    plan = (await ok_json(where, "recover", "--dry-run", "--timeout", "600"))["plan"]
    assert sorted((p["task_id"], p["action"]) for p in plan) == [
        ("orphan", "resume"), ("orphan-old", "fail (expired)"),
        ("waits", "leave (waits for a human)"), ("waits-old", "fail (expired)")]
    code, out, err = await tasks(where, "recover", "--dry-run", "--timeout", "600")
    assert code == 0 and out.count("orphan-old") == 1 and out.count("waits-old") == 1, err

    # what the live pass does as an instance starts
    await mesh.run(Agent(AGENT, ScriptedModel(), peers=[Peer("peer-0")],
                         recovery=RecoveryPolicy(timeout_s=600)))
    await eventually(lambda: len(mesh.events("expired")) == 2 and bool(mesh.events("recovered")),
                     what="the recovery pass")
    assert sorted(task for _, task in mesh.events("expired")) == ["orphan-old", "waits-old"]
    assert [task for _, task in mesh.events("recovered")] == ["orphan"]


async def test_cancel_needs_a_broker_that_reaches_the_instances(
        mesh: Mesh, live_store: SqlStore, where: list[str], tmp_path: Path) -> None:
    config = tmp_path / "mesh.yaml"
    config.write_text(store_section(where) + "broker: memory://\nagents: {coordinator: {}}\n")
    code, _, err = await tasks(where, "cancel", "coordinator-" + "0" * 32,
                               "--config", str(config))
    assert code == 1 and "memory://" in err
    config.write_text(store_section(where) + "broker: nats://127.0.0.1:1\n"
                      "agents: {coordinator: {}}\n")
    code, _, err = await tasks(where, "cancel", "not-a-task-id", "--config", str(config))
    assert code == 1 and "cannot tell the agent of task" in err


@pytest.mark.nats
async def test_cancel_from_another_process_over_nats(
        live_store: SqlStore, where: list[str], nats_url: str, tmp_path: Path) -> None:
    """``meshpoint tasks cancel`` reaches, over NATS, an instance of the agent, which
    cancels the task waiting for approval and answers its caller."""
    from meshpoint.broker.nats import NatsBroker
    from meshpoint.runtime import AgentInstance, Client, RuntimeOptions

    ns = f"cli{wire.new_id()[:10]}"
    broker = await NatsBroker.connect(nats_url, pull_expires_s=0.5)
    instance = AgentInstance(approving(SideEffects()), live_store, broker,
                             options=RuntimeOptions(namespace=ns))
    try:
        await instance.start()
        async with Client(broker, namespace=ns) as client:
            request_id = await client.submit("coordinator", "Send the report")
            await client.wait_input(request_id, timeout_s=20)
            config = tmp_path / "mesh.yaml"
            config.write_text(f"namespace: {ns}\n{store_section(where)}broker: {nats_url}\n"
                              "agents: {coordinator: {}}\n")
            task_id = client.task_id("coordinator", request_id)
            code, out, err = await tasks(where, "cancel", task_id, "--config", str(config),
                                         "--json")
            assert code == 0, err
            assert json.loads(out)["cancel"] == "sent"
            answer = await client.wait(request_id, timeout_s=20)
            assert answer.status.state is a2a.TaskState.CANCELED
        await no_rows_left(live_store)
        # a task that has ended is not cancelled again, and the CLI says so
        code, out, err = await tasks(where, "cancel", task_id, "--config", str(config))
        assert code == 1 and "has already ended (canceled)" in " ".join(err.split()), err
    finally:
        await instance.stop()
        await broker.delete_namespace(ns)
        await broker.close()


@pytest.mark.nats
async def test_cancel_of_a_task_the_store_does_not_know_is_refused_unless_forced(
        live_store: SqlStore, where: list[str], nats_url: str, tmp_path: Path) -> None:
    """A well-formed id the store has never seen (a typo, another tenant's task, or a
    task still running in memory before its first checkpoint) is not "sent": the
    command says the store knows no such task and exits 1, writing and publishing
    nothing; ``--force`` sends the cancel anyway."""
    from meshpoint.broker.nats import NatsBroker

    ns = f"cli{wire.new_id()[:10]}"
    config = tmp_path / "mesh.yaml"
    config.write_text(f"namespace: {ns}\n{store_section(where)}broker: {nats_url}\n"
                      "agents: {coordinator: {}}\n")
    broker = await NatsBroker.connect(nats_url, pull_expires_s=0.5)
    seen: list[bytes] = []  # what reaches the agent's instances

    async def control(delivery: Any) -> None:
        seen.append(delivery.message.data)
        await delivery.ack()

    try:
        await broker.subscribe(wire.request_subject(ns, "coordinator"),
                               f"{ns}-coordinator-requests", control)
        unknown = "coordinator-" + "0" * 32
        before = await snapshot(live_store)
        code, out, err = await tasks(where, "cancel", unknown, "--config", str(config),
                                     "--json")
        assert code == 1, (out, err)
        refused = json.loads(out)
        assert refused["kind"] == "NotFoundError"
        assert "the store knows no task" in refused["error"] and "--force" in refused["error"]
        code, _, err = await tasks(where, "cancel", unknown, "--config", str(config))
        assert code == 1 and "may still be running in memory" in " ".join(err.split())
        assert await snapshot(live_store) == before and seen == []

        code, out, err = await tasks(where, "cancel", unknown, "--config", str(config),
                                     "--force", "--json")
        assert code == 0, err
        assert json.loads(out)["cancel"] == "sent"
        await eventually(lambda: len(seen) == 1, what="the forced cancel")
    finally:
        await broker.delete_namespace(ns)
        await broker.close()


async def meshpoint_env(env: dict[str, str], *args: str) -> tuple[int, str, str]:
    """``meshpoint ARGS`` with ``env`` added to (or, for a None value, taken out of)
    this process's environment."""
    import os

    merged = {k: v for k, v in {**os.environ, **env}.items() if v}
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "meshpoint.cli", *args, env=merged,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(process.communicate(), 120)
    assert process.returncode is not None
    return process.returncode, out.decode(), " ".join(err.decode().split())


async def test_an_explicit_flag_beats_the_config_which_beats_the_environment(
        live_store: SqlStore, where: list[str], tmp_path: Path) -> None:
    """The config names the test's store, its schema (PostgreSQL) and tenant ``acme``,
    whose one task is paused there; ``MESHPOINT_STORE_URL`` names another, empty
    database (as the examples' README has users set it). Commands given ``--config``
    read the config's store, schema and tenant and say the variable was not used; a
    ``--url`` flag wins over the config, and one naming another database than the
    config's is refused while the config's schema or tenant would silently not apply."""
    acme = live_store.for_tenant("acme")
    await acme.checkpoint_task(fan_out("acme-task", peers=1), AGENT)
    other = f"sqlite:///{tmp_path / 'other.db'}"
    async with await open_store(other):
        pass  # an empty, migrated database
    config = tmp_path / "mesh.yaml"
    config.write_text(store_section(where).replace("}\n", ", tenant: acme}\n")
                      + "agents: {coordinator: {}}\n")
    env = {"MESHPOINT_STORE_URL": other, "MESHPOINT_CONFIG": ""}

    for args in (("stats",), ("tasks", "list"), ("migrate",)):
        code, out, err = await meshpoint_env(env, *args, "--config", str(config), "--json")
        assert code == 0, (args, out, err)
        shown = json.loads(out)
        if args == ("stats",):
            assert shown["total"] == 1
        elif args == ("tasks", "list"):
            assert [t["task_id"] for t in shown["tasks"]] == ["acme-task"]
        else:
            assert shown["dialect"] == live_store.dialect
        assert "MESHPOINT_STORE_URL" in err and "not used" in err, (args, err)
    # MESHPOINT_CONFIG is the config too: it beats MESHPOINT_STORE_URL
    code, out, err = await meshpoint_env({**env, "MESHPOINT_CONFIG": str(config)},
                                         "stats", "--json")
    assert code == 0 and json.loads(out)["total"] == 1, err

    # --url beats both; naming another database than the config's, it is refused while
    # the config's tenant (or schema) would not apply to it, and names that
    code, out, err = await meshpoint_env(env, "stats", "--url", other, "--config", str(config))
    assert code == 2 and "tenant 'acme'" in err and "--url" in err, (out, err)
    code, out, err = await meshpoint_env(env, "stats", "--url", other, "--config", str(config),
                                         "--tenant", "acme", "--json")
    assert code == 0 and json.loads(out)["total"] == 0, err  # the other database's
    code, out, err = await meshpoint_env(env, "stats", *where, "--config", str(config),
                                         "--json")
    assert code == 0 and json.loads(out)["total"] == 1, err  # the config's own database
    # with no config, the variable names the store (the flags add schema and tenant)
    code, out, err = await meshpoint_env(
        {"MESHPOINT_STORE_URL": where[1], "MESHPOINT_CONFIG": ""}, "stats", *where[2:],
        "--tenant", "acme", "--json")
    assert code == 0 and json.loads(out)["total"] == 1, err
async def test_with_approvers_the_command_line_signs_its_decisions_or_is_refused(
        mesh: Mesh, where: list[str], tmp_path: Path) -> None:
    """``meshpoint keys approver new`` makes the CFO's key pair; with the mesh's
    approvers, ``tasks approve`` without the CFO's key is refused (nothing written),
    and with it the decision is recorded as the CFO's, verified, and the task runs
    its tool once."""
    from meshpoint.config import load_config

    key = tmp_path / "keys" / "cfo.key"
    code, out, err = await tasks(where, "keys", "approver", "new", "--id", "cfo@example.com",
                                 "--out", str(key), "--json")
    made = json.loads(out)
    assert code == 0 and made["private_key"] == str(key), err
    assert key.stat().st_mode & 0o777 == 0o600 and "PRIVATE KEY" in key.read_text()
    code, _, err = await tasks(where, "keys", "approver", "new", "--id", "x", "--out", str(key))
    assert code == 1 and "exists" in err
    config = tmp_path / "mesh.yaml"
    config.write_text(store_section(where) + (
        "agents:\n  coordinator:\n    tools: [{name: send, function: 'os:getcwd', "
        "needs_approval: true}]\n"
        f"approvers:\n  cfo@example.com: {{key: 'file:{made['public_key']}', "
        "agents: {coordinator: [send]}}\n"))
    effects = SideEffects()
    await mesh.run(approving(effects), approvers=load_config(config).build_approvers())
    request_id, task_id, pending = await paused(mesh, "Send the report")
    call_id = pending[0]["call_id"]

    code, out, _ = await tasks(where, "approve", task_id, call_id, "--config", str(config),
                               "--by", "cfo@example.com", "--json")
    assert code == 1 and json.loads(out)["kind"] == "DecisionRefusedError"
    assert "unsigned" in json.loads(out)["error"]
    code, _, err = await tasks(where, "approve", task_id, call_id, "--config", str(config),
                               "--key", f"file:{key}")
    assert code == 2 and "--by" in err
    # The key itself in the command line (seen by ps, kept in shell history): refused.
    code, _, err = await tasks(where, "approve", task_id, call_id, "--config", str(config),
                               "--key", key.read_text(), "--by", "cfo@example.com")
    assert code == 2 and "command line" in " ".join(err.split()) and "PRIVATE" not in err
    done = await ok_json(where, "approve", task_id, call_id, "--config", str(config),
                         "--key", f"file:{key}", "--by", "cfo@example.com")
    assert [(d["by"], d["verified"]) for d in done["decisions"]] == [("cfo@example.com", True)]
    # What it signed: the call as the store held it (meshpoint.decision/2).
    assert done["decisions"][0]["signed"]["proposed"] == {
        "tool": pending[0]["tool"], "arguments": pending[0]["arguments"]}
    answer = await mesh.client.wait(request_id, timeout_s=20)
    assert answer.status.state is a2a.TaskState.COMPLETED
    assert list(effects.runs.values()) == [1]


@pytest.mark.nats
async def test_an_operator_hands_a_running_task_off_and_reads_its_iterations(
        live_store: SqlStore, where: list[str], nats_url: str, tmp_path: Path) -> None:
    """``meshpoint tasks handoff`` reaches, over NATS, the instance running the task,
    which hands it off before its next model call (trigger ``operator``, the reason
    in its record); the task completes in its second iteration. Refused, exit 1 and
    nothing sent: an agent without a handoff policy, a task the store does not know,
    one waiting for a human, one that ended. Then ``tasks show`` lists the ended
    task's iterations, ``tasks cost`` costs each (the rows add up to the total), and
    ``meshpoint events --type agent_handoff`` finds the handoff."""
    import dataclasses

    from meshpoint.broker.nats import NatsBroker
    from meshpoint.runtime import AgentInstance, Client, RuntimeOptions
    from meshpoint.runtime.options import CheckpointPolicy, HandoffPolicy
    from tests.integration.test_handoff import tools

    ns = f"cli{wire.new_id()[:10]}"
    config = tmp_path / "mesh.yaml"
    config.write_text(f"namespace: {ns}\n{store_section(where)}broker: {nats_url}\n"
                      "agents: {worker: {handoff: {}}, coordinator: {handoff: {}}, plain: {}}\n")
    handoff = ("handoff", "--config", str(config))
    for task_id, reason in (("plain-" + "0" * 32, "agent 'plain' has no handoff policy"),
                            ("worker-" + "0" * 32, "the store knows no task")):
        code, out, err = await tasks(where, *handoff[:1], task_id, *handoff[1:])
        assert code == 1 and reason in " ".join(err.split()), (out, err)

    broker = await NatsBroker.connect(nats_url, pull_expires_s=0.5)
    options = RuntimeOptions(namespace=ns)
    gate = asyncio.Event()  # the first round's tool waits: the task runs while asked

    async def gated(arguments: dict[str, Any]) -> str:
        await gate.wait()
        return f"waited for {arguments['query']}"

    worker = Agent("worker", ScriptedModel("worker", rounds=4),
                   tools=[*tools(), LocalTool("wait", "Waits.", gated)],
                   handoff=HandoffPolicy(context_utilization=None, explicit=False),
                   checkpoint=CheckpointPolicy(before_llm=True), events=True)
    waiter = dataclasses.replace(approving(SideEffects()), handoff=HandoffPolicy())
    instances = [AgentInstance(agent, live_store, broker, options=options)
                 for agent in (worker, waiter)]
    try:
        for instance in instances:
            await instance.start()
        async with Client(broker, namespace=ns) as client:
            waiting = await client.submit("coordinator", "Send the report")
            await client.wait_input(waiting, timeout_s=20)
            code, out, err = await tasks(where, "handoff", client.task_id(
                "coordinator", waiting), "--config", str(config))
            assert code == 1 and "is not running: it waits for a human's answer" in \
                " ".join(err.split()), (out, err)
            shown = await ok_json(where, "show", client.task_id("coordinator", waiting))
            assert (shown["live"], shown["status"]) == (True, "input_required")
            assert [(i["iteration"], i["started_by"], i["ended_by"])
                    for i in shown["iterations"]] == [(1, "request", "-")]
            # --force sends a request the store cannot vouch for (a task running before
            # its first checkpoint): nobody runs this one, and nothing happens.
            forced = await ok_json(where, "handoff", "worker-" + "1" * 32, "--config",
                                   str(config), "--force")
            assert (forced["handoff"], forced["state"]) == ("sent", "unknown")

            request_id = await client.submit("worker", "Survey: alpha")
            task_id = client.task_id("worker", request_id)

            async def working() -> bool:  # stored before a model call, leased
                listed = await live_store.list_paused_tasks(agent_name="worker")
                return any(t.task_id == task_id and t.status == "working" for t in listed)

            await eventually(working, what="the task running past a checkpoint")
            sent = await ok_json(where, "handoff", task_id, "--config", str(config),
                                 "--reason", "fresh eyes")
            assert sent == {"task_id": task_id, "agent": "worker", "handoff": "sent",
                            "state": "running"}
            await eventually(lambda: task_id in instances[0].stats.tasks(
                "handoff_requested"), what="the request reaching the instance")
            gate.set()
            answer = await client.wait(request_id, timeout_s=30)
            assert answer.status.state is a2a.TaskState.COMPLETED, answer
            text = answer.status.message.text  # type: ignore[union-attr]
            assert all(f"(round {n})" in text for n in range(1, 5)), text

        async def ended() -> bool:  # its last record written, just after the answer
            last = await live_store.history.get_latest_checkpoint(task_id)
            return last is not None and last.execution_state.phase == "completed"

        await eventually(ended, what="the task's last record")
        for instance in instances:
            await instance.stop()  # the event log's buffer written

        code, _, err = await tasks(where, "handoff", task_id, "--config", str(config))
        assert code == 1 and "has ended (completed)" in " ".join(err.split()), err
        shown = await ok_json(where, "show", task_id)
        assert (shown["live"], shown["status"], shown["agent"]) == (False, "completed",
                                                                  "worker")
        assert [(i["iteration"], i["started_by"], i["ended_by"], i["reason"])
                for i in shown["iterations"]] == [(1, "request", "operator", "fresh eyes"),
                                                  (2, "operator", "completed", None)]
        code, out, err = await tasks(where, "show", task_id)
        assert code == 0 and "ended (completed)" in out and "iterations" in out, err
        assert "fresh eyes" in out and "operator" in out, out
        cost = await ok_json(where, "cost", task_id)
        assert [i["iteration"] for i in cost["iterations"]] == [1, 2]
        assert sum(i["records"] for i in cost["iterations"]) == len(cost["checkpoints"])
        assert sum(Decimal(i["cost"]) for i in cost["iterations"]) == Decimal(
            cost["total"]["cost"]["total"])
        for kind in ("prompt_tokens", "completion_tokens"):
            assert sum(i["tokens"][kind] for i in cost["iterations"]) == \
                cost["total"]["tokens"]["totals"][kind] > 0
        code, out, err = await tasks(where, "cost", task_id)
        assert code == 0 and "iteration by iteration" in out, err
        events = await ok_json(where, "events", "--type", "agent_handoff", "--task", task_id)
        assert [(e["event_type"], e["step_name"]) for e in events["events"]] == [
            ("agent_handoff", "operator")], events
        received = await ok_json(where, "events", "--type", "agent_handoff_received",
                                 "--task", task_id)
        (handoff_record,) = [c["checkpoint_id"] for c in cost["checkpoints"]
                             if c["phase"] == "handoff"]
        # (Written by the store with the iteration's first record, and logged by the
        # runtime for an agent with events: true; each names the record it read.)
        assert received["events"] and {e["output_data"]["record"] for e in
                                       received["events"]} == {handoff_record}, received
    finally:
        for instance in instances:
            if instance.running:
                await instance.stop()
        await broker.delete_namespace(ns)
        await broker.close()
