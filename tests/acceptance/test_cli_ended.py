"""Ended tasks from the command line, as subprocesses against a running mesh's store
(SQLite and PostgreSQL): ``tasks list --all`` and ``tasks show`` find a task once its
live rows are gone, with how it ended and its answer; ``tasks reconstruct`` summarises
it; ``tasks cost`` of a task that never paused says so; and the event log says which
instance did what, an approval given in the store resuming the task as an approval,
not a recovery."""

from __future__ import annotations

import re
from dataclasses import replace
from decimal import Decimal

import pytest

from meshpoint import a2a
from meshpoint.events import EventStore
from meshpoint.history import Prices
from meshpoint.llm import ScriptedModel
from meshpoint.runtime import Agent
from meshpoint.store import SqlStore
from tests.acceptance.test_cli_tasks import ok_json, tasks
from tests.integration.mesh import Mesh
from tests.integration.test_approvals import SideEffects, approving, paused
from tests.integration.test_runtime import no_rows_left
from tests.integration.test_store import AGENT, fan_out


@pytest.fixture
def where(store_url: str, store_options: dict[str, object]) -> list[str]:
    """The options that name the test's store to the command line."""
    schema = store_options.get("schema")
    return ["--url", store_url, *(["--schema", str(schema)] if schema else [])]


async def ended(mesh: Mesh, live_store: SqlStore, where: list[str]) -> tuple[str, str]:
    """A task of two instances (``ops-a``, ``ops-b``) whose agent keeps an event log,
    that paused for approval, was approved from the command line (straight into the
    store) and completed: (its id, its answer)."""
    effects = SideEffects()
    agent = replace(approving(effects), events=True)
    await mesh.run(agent, instance_id="ops-a")
    await mesh.run(agent, instance_id="ops-b")
    request_id, task_id, pending = await paused(mesh, "Send the report")
    await ok_json(where, "approve", task_id, pending[0]["call_id"], "--by", "ops")
    answer = await mesh.client.wait(request_id, timeout_s=20)
    assert answer.status.state is a2a.TaskState.COMPLETED
    said = answer.status.message.text  # type: ignore[union-attr]
    assert "sent 'Send the report'" in said
    await no_rows_left(live_store)
    for instance in mesh.instances:
        await instance.events.flush()  # type: ignore[union-attr]
    return task_id, said


async def test_an_ended_task_is_listed_and_shown_with_how_it_ended_and_its_answer(
        mesh: Mesh, live_store: SqlStore, where: list[str]) -> None:
    task_id, said = await ended(mesh, live_store, where)
    # Only paused tasks without --all; with it, the ended one, with its answer.
    assert (await ok_json(where, "list"))["tasks"] == []
    (row,) = (await ok_json(where, "list", "--all"))["tasks"]
    assert (row["task_id"], row["agent"], row["status"], row["live"], row["answer"],
            row["reason"], row["integrity_error"]) == (
        task_id, "coordinator", "completed", False, said, None, None)
    assert (await ok_json(where, "list", "--all", "--status", "failed"))["tasks"] == []
    assert (await ok_json(where, "list", "--all", "--status", "completed"))["tasks"] == [row]
    code, _, err = await tasks(where, "list", "--status", "completed")  # not without --all
    assert code == 2 and "with --all)" in err, err
    code, out, err = await tasks(where, "list", "--all")
    assert code == 0 and "ended tasks" in out and "completed" in out and "sent" in out, err

    shown = await ok_json(where, "show", task_id)
    assert (shown["live"], shown["status"], shown["answer"], shown["reason"]) == (
        False, "completed", said, None)
    code, out, err = await tasks(where, "show", task_id)
    assert code == 0, err
    assert f"answer: {' '.join(said.split())}" in " ".join(out.split()), out


async def test_a_task_that_did_not_complete_is_listed_with_why(
        mesh: Mesh, live_store: SqlStore, where: list[str]) -> None:
    """A canceled task: its reason, not an answer, in the list and in show."""
    await mesh.run(approving(SideEffects()))
    request_id, task_id, _ = await paused(mesh, "Send the report")
    await mesh.client.cancel("coordinator", task_id)
    answer = await mesh.client.wait(request_id, timeout_s=10)
    assert answer.status.state is a2a.TaskState.CANCELED
    why = answer.status.message.text  # type: ignore[union-attr]
    assert why
    await no_rows_left(live_store)
    (row,) = (await ok_json(where, "list", "--all", "--status", "canceled"))["tasks"]
    assert (row["task_id"], row["status"], row["answer"], row["reason"]) == (
        task_id, "canceled", None, why)
    shown = await ok_json(where, "show", task_id)
    assert (shown["status"], shown["answer"], shown["reason"]) == ("canceled", None, why)


async def test_reconstructing_an_ended_task_summarises_how_it_ended(
        mesh: Mesh, live_store: SqlStore, where: list[str]) -> None:
    task_id, said = await ended(mesh, live_store, where)
    rebuilt = await ok_json(where, "reconstruct", task_id)
    assert rebuilt["ended"] == {"status": "completed", "answer": said, "reason": None}
    assert "The task has ended: completed." in rebuilt["prompt"]
    assert f"Its answer: {said}" in rebuilt["prompt"]
    assert "Nothing is left to resume" in rebuilt["prompt"]
    assert "Continue from here" not in rebuilt["prompt"]


async def test_each_event_names_the_instance_as_it_was_given(
        mesh: Mesh, live_store: SqlStore, where: list[str]) -> None:
    """Who did what: each event names the instance by the id it was given, the
    lease's per-attempt owner (``ID#N``) kept apart where a lease was taken."""
    task_id, _ = await ended(mesh, live_store, where)
    async with EventStore(live_store) as log:
        events = await log.get_events(thread_id=task_id)
    assert events and {e.state_snapshot["instance_id"] for e in events} <= {"ops-a", "ops-b"}
    leased = [e for e in events if isinstance(e.output_data, dict)
              and "lease_owner" in e.output_data]
    assert leased and all(e.output_data["lease_owner"].startswith(
        e.state_snapshot["instance_id"] + "#") for e in leased)
    code, out, err = await tasks(where, "events", "--task", task_id)  # the table says it too
    assert code == 0 and ("ops-a" in out or "ops-b" in out), out + err


async def test_an_approval_given_in_the_store_resumes_the_task_as_an_approval(
        mesh: Mesh, live_store: SqlStore, where: list[str]) -> None:
    """``meshpoint tasks approve`` completes the join with no instance holding the
    lease; the instance that takes it up logs an approval's resume, not a recovery
    (no instance died)."""
    task_id, _ = await ended(mesh, live_store, where)
    async with EventStore(live_store) as log:
        events = await log.get_events(thread_id=task_id)
    resumed = [(e.event_type, e.step_name) for e in events
               if e.event_type in ("resume", "recovery")]
    assert resumed == [("resume", "approval_resumed"), ("resume", "resumed")], resumed
    assert mesh.events("approval_resumed") and not mesh.events("recovered")


async def test_the_cost_of_a_task_that_never_paused_says_so(
        mesh: Mesh, where: list[str]) -> None:
    (solo,) = await mesh.run(Agent("solo", ScriptedModel(), events=True))
    request_id = await mesh.client.submit("solo", "Say hello")
    answer = await mesh.client.wait(request_id, timeout_s=20)
    assert answer.status.state is a2a.TaskState.COMPLETED
    task_id = mesh.client.task_id("solo", request_id)
    await solo.events.flush()  # type: ignore[union-attr]

    never = await ok_json(where, "cost", task_id)
    assert (never["task_id"], never["history"]) == (task_id, False)
    assert "never paused" in never["note"] and never["events"] > 0
    assert never["tokens"]["prompt_tokens"] > 0
    code, out, err = await tasks(where, "cost", task_id)
    assert code == 0 and "never paused" in " ".join(out.split()), out + err
    # Neither a history nor an event: exit 1, saying what a task that never paused
    # leaves behind.
    code, out, err = await tasks(where, "cost", "solo-" + "0" * 32)
    assert code == 1 and "runs to its end without pausing" in " ".join(err.split()), err
    assert "Traceback" not in err


#: Per million tokens: m-1 cheap, m-2 ten times dearer.
PRICES = Prices({"m-1": {"prompt_tokens": 1, "completion_tokens": 2},
                 "m-2": {"prompt_tokens": 10, "completion_tokens": 20}})


async def test_tasks_cost_prices_each_source_and_says_what_no_source_can_be_given(
        store: SqlStore, where: list[str]) -> None:
    """The by-source table's cost column: an iteration with one source is that
    source's; one with one model is split by each source's tokens at its price; one
    with several of both is the task's but no source's, a row of its own. The column
    adds up to the total exactly."""
    priced = store.with_history(replace(store.history.options, prices=PRICES))
    ctx = fan_out("t-src", peers=1, local=False)
    ctx.record_token_usage(model="m-1", source=AGENT, prompt_tokens=10, completion_tokens=5)
    await priced.checkpoint_task(ctx, AGENT)  # the agent alone
    spend = ([("m-2", "peer-0", 3)],  # the peer alone
             [("m-1", AGENT, 1), ("m-1", "peer-0", 2)],  # one model, two sources
             [("m-1", AGENT, 1), ("m-2", "peer-0", 1)])  # two of each: no source's
    for turn, calls in enumerate(spend, start=1):
        sub = "t-src/sub-0" if turn == 1 else f"t-src/again-{turn - 1}"
        await priced.resolve_peer_sub_task(sub, {"text": "ok"}, lease_owner="i-1")
        ctx = (await priced.restore_task("t-src", lease_owner="i-1")).context
        for model, source, count in calls:
            ctx.record_token_usage(model=model, source=source, prompt_tokens=count,
                                   completion_tokens=count)
        if turn < len(spend):
            ctx.current_invocation_id = f"inv-{turn + 1}"
            ctx.register_peer_sub_task(f"t-src/again-{turn}", {"peer_agent_name": "peer-0"})
            await priced.checkpoint_task(ctx, AGENT, lease_owner="i-1")
    await priced.cleanup_task("t-src", outcome="completed", ctx=ctx)

    shown = await ok_json(where, "cost", "t-src")
    cost = shown["total"]["cost"]
    million = Decimal(1_000_000)
    assert {name: Decimal(c["total"]) for name, c in cost["by_source"].items()} == {
        AGENT: (10 + 2 * 5 + 1 + 2) / million, "peer-0": (30 + 60 + 2 + 4) / million}
    assert Decimal(cost["unattributed"]) == (1 + 2 + 10 + 20) / million
    assert sum(Decimal(c["total"]) for c in cost["by_source"].values()) + Decimal(
        cost["unattributed"]) == Decimal(cost["total"]) == 152 / million

    code, out, err = await tasks(where, "cost", "t-src")
    assert code == 0, err
    by_source = out.split("in total, by source")[1].split("total:")[0]
    printed = {line.split("│")[1].strip(): Decimal(line.split("│")[-2].strip())
               for line in by_source.splitlines() if re.match(r"^│\s*\S", line)}
    assert printed == {AGENT: Decimal("0.000023"), "peer-0": Decimal("0.000096"),
                       "(not attributable)": Decimal("0.000033")}, out
