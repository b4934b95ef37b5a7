"""``meshpoint tasks``: the operator's view of paused tasks, and a human's answers.

Every command works on the store directly, from any host with its URL (``--url``
or ``MESHPOINT_STORE_URL``) or the mesh config (``--config``), see
:mod:`meshpoint.cli.common`: no instance needs to be reached. An answer
(``approve``, ``deny``, ``reply``) is checked and recorded exactly as an instance
would (:func:`meshpoint.runtime.approvals.decide`); when it completes the task's
join, the first instance of the agent whose recovery pass runs next resumes the
task. With ``--key`` an answer is signed as approver ``--by`` (the mesh's
approvers then take it; :mod:`meshpoint.runtime.approvers`), and with ``--config``
it is verified against the config's approvers before anything is written; the
instance that settles the task verifies it again in any case. Each command prints
a table, or one JSON object with ``--json``, and exits 1 with the reason on an
unknown task (another tenant's tasks are unknown), a call that is not pending,
arguments that fail the tool's schema, or a decision no approver signed.
"""

from __future__ import annotations

import getpass
import json
import os
import socket
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from meshpoint.cli.common import (
    AsJson,
    Config,
    Schema,
    Tenant,
    Url,
    console,
    err,
    run_on_store,
    run_sync,
    shown,
)
from meshpoint.errors import (
    InvalidArgumentError,
    MeshpointError,
    NotFoundError,
    UnknownTaskError,
)

tasks_app = typer.Typer(help="Tasks: list and show them (paused, and with --all ended ones "
                        "from their history), and answer those waiting for a human.",
                        no_args_is_help=True)
By = Annotated[str | None, typer.Option(
    "--by", help="Who answers: with --key, the approver whose key signs; without, a name "
                 "recorded only as claimed (default: user@host).")]


def _key_kept_off_the_command_line(value: str | None) -> str | None:
    """``--key`` as a reference (``env:VAR``, ``file:PATH``); the key itself only
    through ``MESHPOINT_APPROVER_KEY``: a key written in the command line is seen by
    every user of the host (``ps``) and kept in shell history."""
    if value is None or value.startswith(("env:", "file:")) or \
            value == os.environ.get("MESHPOINT_APPROVER_KEY"):
        return value
    raise typer.BadParameter(
        "a private key written in the command line is seen by every user of this host "
        "(ps) and kept in shell history: give env:VAR or file:PATH, or set "
        "MESHPOINT_APPROVER_KEY")


Key = Annotated[str | None, typer.Option(
    "--key", envvar="MESHPOINT_APPROVER_KEY", callback=_key_kept_off_the_command_line,
    help="Sign the decision as approver --by with this private key: env:VAR or file:PATH "
         "(`meshpoint keys approver new` makes one), or the key itself in "
         "MESHPOINT_APPROVER_KEY, never in the command line. Needed when the mesh has "
         "approvers.")]


def _who(by: str | None, key: str | None) -> str:
    if key is not None and by is None:
        raise typer.BadParameter("--key signs as an approver: name it with --by (its id in "
                                 "the config's approvers)", param_hint="--by")
    return by or f"{getpass.getuser()}@{socket.gethostname()}"


def _print_decisions(decisions: list[dict[str, Any]], task_id: str, as_json: bool) -> None:
    from meshpoint.runtime.approvals import decided_by

    if as_json:
        print(json.dumps({"task_id": task_id, "decisions": decisions}))
        return
    for d in decisions:
        # An edit is a patch: what the tool runs with is the merged arguments.
        what = {"approved": "approved" + (f" with edited arguments {json.dumps(d['arguments'])}"
                                          if d.get("edited") else ""),
                "denied": f"denied ({d.get('reason')})",
                "replied": "answered in words"}[d["decision"]]
        console.print(f"call {shown(d['call_id'])} of task {shown(task_id)}: {shown(what)}, "
                      f"{shown(decided_by(d))}")


def _answer(url: str | None, config: Path | None, schema: str | None, tenant: str | None,
            as_json: bool, task_id: str, answer: Any, key: str | None) -> None:
    """Check and record ``answer`` as an instance would, signed with ``key`` if given;
    with ``--config``, checked against its approvers too (the instance that settles
    the task checks it again in any case)."""
    from meshpoint.runtime.approvals import APPROVAL, Approve, Reply, as_shown, decide
    from meshpoint.runtime.approvers import ApproverKey

    async def body(store: Any) -> list[dict[str, Any]]:
        approvers = None
        if config is not None:
            from meshpoint.config import load_config

            approvers = load_config(config).build_approvers()
        signed = answer
        if key is not None:
            if isinstance(answer, Reply):  # a signed reply names the calls it answers
                pending = [s.sub_task_id for s in await store.get_peer_sub_tasks_for_task(
                    task_id) if s.status == "pending" and APPROVAL in s.correlation_data]
                signed = answer.model_copy(update={"call_ids": pending or None})
            if isinstance(answer, Approve):  # signed over the call as the store holds it
                signed = await as_shown(store, task_id, answer)
            if not isinstance(signed, Approve) or signed.proposed is not None:
                signed = ApproverKey.load(answer.by, key).sign(
                    tenant=store.tenant_id, task_id=task_id, answer=signed)
        return (await decide(store, task_id, signed, by=answer.by,
                             approvers=approvers)).decisions

    _print_decisions(run_on_store(url, config, schema, tenant, as_json, body), task_id,
                     as_json)


@tasks_app.command()
def approve(task_id: Annotated[str, typer.Argument(help="The task.")],
            call_id: Annotated[str, typer.Argument(help="The pending call (tasks show).")],
            arguments: Annotated[str | None, typer.Option(
                "--arguments", help="Edited arguments: a JSON object merged into the "
                "proposed ones as a JSON merge patch (RFC 7396): give only the keys to "
                "change; null removes a key, objects merge, anything else replaces. "
                "E.g. '{\"amount\": 50}'.")] = None,
            url: Url = None, config: Config = None, schema: Schema = None,
            tenant: Tenant = None,
            by: By = None, key: Key = None, as_json: AsJson = False) -> None:
    """Approve a call waiting for approval, as the model gave it or with edited
    arguments: --arguments is merged into the proposed arguments (a JSON merge
    patch), and the result is checked against the tool's JSON schema before anything
    is written; it is what the tool runs with, and what the decision records."""
    from meshpoint.runtime.approvals import Approve

    edited = None
    if arguments is not None:
        try:
            edited = json.loads(arguments)
        except ValueError as error:
            raise typer.BadParameter(f"not JSON: {error}", param_hint="--arguments") from None
        if not isinstance(edited, dict):
            raise typer.BadParameter("must be a JSON object", param_hint="--arguments")
    _answer(url, config, schema, tenant, as_json, task_id,
            Approve(call_id=call_id, arguments=edited, by=_who(by, key)), key)


@tasks_app.command()
def deny(task_id: Annotated[str, typer.Argument(help="The task.")],
         call_id: Annotated[str, typer.Argument(help="The pending call (tasks show).")],
         reason: Annotated[str, typer.Option("--reason", help="Shown to the model.")],
         url: Url = None, config: Config = None, schema: Schema = None,
         tenant: Tenant = None,
         by: By = None, key: Key = None, as_json: AsJson = False) -> None:
    """Deny a call waiting for approval; the model is told the reason."""
    from meshpoint.runtime.approvals import Deny

    _answer(url, config, schema, tenant, as_json, task_id,
            Deny(call_id=call_id, reason=reason, by=_who(by, key)), key)


@tasks_app.command()
def reply(task_id: Annotated[str, typer.Argument(help="The task.")],
          text: Annotated[str, typer.Argument(help="The answer, in words.")],
          url: Url = None, config: Config = None, schema: Schema = None,
          tenant: Tenant = None,
          by: By = None, key: Key = None, as_json: AsJson = False) -> None:
    """Answer a waiting task in words: its pending calls are not run and the model is
    shown the text."""
    from meshpoint.runtime.approvals import Reply

    _answer(url, config, schema, tenant, as_json, task_id, Reply(text=text, by=_who(by, key)),
            key)


@tasks_app.command("list")
def list_tasks(agent: Annotated[str | None, typer.Option("--agent")] = None,
               status: Annotated[str | None, typer.Option(
                   "--status", help="waiting_peers, input_required, handoff, resuming, working "
                   "or blocked; with --all also completed, failed, canceled or "
                   "expired.")] = None,
               older_than: Annotated[float | None, typer.Option(
                   "--older-than", min=0, help="Only tasks paused longer, in seconds.")] = None,
               everything: Annotated[bool, typer.Option(
                   "--all", help="Ended tasks too, from their history: how each ended, its "
                   "answer or failure reason (the latest --limit).")] = False,
               limit: Annotated[int, typer.Option(min=1)] = 100,
               url: Url = None, config: Config = None, schema: Schema = None,
               tenant: Tenant = None,
               as_json: AsJson = False) -> None:
    """Paused tasks, oldest first; with ``--all``, then the ended ones, the latest
    first (a task that never paused wrote nothing, so is not among them)."""
    from meshpoint.cli.ended import ended_rows
    from meshpoint.history.planning import END_PHASES
    from meshpoint.store.schema import TASK_STATUSES

    statuses = (*TASK_STATUSES, *END_PHASES) if everything else TASK_STATUSES
    if status is not None and status not in statuses:
        raise typer.BadParameter(
            f"{status!r} is not a status of a {'' if everything else 'live '}task; one of "
            f"{', '.join(statuses)}" + ("" if everything else
                                        " (an ended task's, with --all)"),
            param_hint="--status")

    async def body(store: Any) -> tuple[list[Any], list[dict[str, Any]]]:
        live = [] if status in END_PHASES else list(await store.list_paused_tasks(
            agent_name=agent, status=status, limit=limit))
        ended = [] if not everything or status in TASK_STATUSES else await ended_rows(
            store, agent=agent, status=status, limit=limit)
        return live, ended

    now = time.time()
    live, ended = run_on_store(url, config, schema, tenant, as_json, body)
    rows = [t for t in live if older_than is None or now - t.checkpointed_at > older_than]
    if as_json:
        print(json.dumps({"tasks": [{
            "task_id": t.task_id, "agent": t.agent_name, "status": t.status, "live": True,
            "paused_s": round(now - t.checkpointed_at, 3), "pending": t.pending_sub_tasks,
            "next_deadline": t.next_deadline, "owner": t.owner} for t in rows] + ended}))
        return
    table = Table(title="paused tasks")
    for column in ("task", "agent", "status", "paused (s)", "pending", "next deadline in (s)"):
        table.add_column(column, overflow="fold")  # an id is shown whole, folded
    for t in rows:
        table.add_row(shown(t.task_id), shown(t.agent_name), shown(t.status),
                      f"{now - t.checkpointed_at:.1f}", str(t.pending_sub_tasks),
                      "-" if t.next_deadline is None else f"{t.next_deadline - now:.1f}")
    console.print(table)
    if everything:
        done = Table(title="ended tasks (from their history)")
        for column in ("task", "agent", "ended", "at (UTC)", "answer or reason"):
            done.add_column(column, overflow="fold")
        for e in ended:
            said = e["answer"] if e["answer"] is not None else e["reason"]
            done.add_row(shown(e["task_id"]), shown(e["agent"]), shown(e["status"]),
                         shown(e["ended_at"][:19]), shown(
                             f"unverified: {e['integrity_error']}" if e["integrity_error"]
                             else "-" if said is None else said[:200]))
        console.print(done)


@tasks_app.command()
def show(task_id: Annotated[str, typer.Argument(help="The task.")],
         turns: Annotated[int, typer.Option(min=0, help="Conversation events to show.")] = 6,
         url: Url = None, config: Config = None, schema: Schema = None,
         tenant: Tenant = None,
         as_json: AsJson = False) -> None:
    """One task: its status, what it waits on (peers and approvals, with their
    deadlines), who answered what, the last turns of its conversation, and its
    iterations (a task that hands off runs as several: how each started and ended,
    with the context utilization at its handoff), and a workflow agent's progress
    (each stage's state, a loop's round). A task that has ended (no live rows) is
    shown from its history: how it ended, its answer or failure reason, its
    iterations and its workflow's last progress."""
    from meshpoint.cli.details import task_details
    from meshpoint.cli.handoffs import print_iterations
    from meshpoint.cli.workflows import print_workflow

    async def body(store: Any) -> dict[str, Any]:
        return await task_details(store, task_id, turns=turns)

    task = run_on_store(url, config, schema, tenant, as_json, body)
    if as_json:
        print(json.dumps(task))
        return
    now = time.time()
    if not task["live"]:
        console.print(f"task [bold]{shown(task_id)}[/bold] of {shown(task['agent'])}: "
                      f"ended ({shown(task['status'])}) at {shown(task['ended_at'][:19])}; "
                      "no live rows: what follows is its verified history")
        if task["answer"] is not None:
            console.print(f"answer: {shown(task['answer'])}", highlight=False)
        if task["reason"] is not None:
            console.print(f"reason: {shown(task['reason'])}", highlight=False)
        print_iterations(task["iterations"], title="iterations")
        if task["workflow"] is not None:
            print_workflow(console, task["workflow"], ended=True)
        return
    console.print(f"task [bold]{shown(task_id)}[/bold] of {shown(task['agent'])}: "
                  f"{shown(task['status'])}, paused {now - task['checkpointed_at']:.1f} s ago")
    if not task["verified"]:
        console.print(f"[red]unverified:[/red] {shown(task['integrity_error'])}. What follows "
                      f"is its live row, not checked against its history; `meshpoint verify "
                      f"--task {shown(task_id)}` walks the chain, and a cancel ends the task.")
    if task["workflow"] is not None:
        print_workflow(console, task["workflow"], ended=False)
    table = Table(title="waiting on")
    for column in ("call", "kind", "what", "deadline in (s)"):
        table.add_column(column)
    for w in task["waiting_on"]:
        what = (f"{w['tool']}({json.dumps(w['arguments'])})" if w["kind"] == "approval"
                else f"{w['peer']}: {w['query']}")
        table.add_row(shown(w["call_id"]), shown(w["kind"]), shown(what),
                      f"{w['deadline'] - now:.1f}")
    console.print(table)
    if task["answered"]:
        from meshpoint.runtime.approvals import decided_by

        done = Table(title="answered")
        for column in ("call", "tool", "decision", "by", "at"):
            done.add_column(column)
        for a in task["answered"]:
            done.add_row(shown(a.get("call_id")), shown(a.get("tool")), shown(a["decision"]),
                         shown(decided_by(a)), time.strftime(
                             "%Y-%m-%d %H:%M:%S", time.localtime(a.get("at") or 0)))
        console.print(done)
    if task["iterations"] and len(task["iterations"]) > 1:  # one is the whole task
        print_iterations(task["iterations"], title="iterations")
    for event in task["conversation"]:
        console.print(f"[dim]{shown(event.get('role'))}:[/dim] {shown(_said(event))}",
                      highlight=False)


def _said(event: dict[str, Any]) -> str:
    """A conversation event in one line (plain text): its text, else the tools it
    called."""
    content = str(event.get("content") or "")
    if content:
        return content[:200]
    calls = [str((call.get("function") or {}).get("name") or call.get("name") or "?")
             for call in event.get("tool_calls") or [] if isinstance(call, dict)]
    return f"(calls {', '.join(calls)})" if calls else "(no text)"


@tasks_app.command()
def cancel(task_id: Annotated[str, typer.Argument(help="The task.")],
           config: Annotated[Path, typer.Option(
               "--config", "-c", envvar="MESHPOINT_CONFIG",
               help="The mesh config: its broker reaches the agent's instances.")],
           agent: Annotated[str | None, typer.Option(
               "--agent", help="The task's agent (default: read from the task id).")] = None,
           force: Annotated[bool, typer.Option(
               "--force", help="Send the cancel even if the store knows no such task (it "
               "may be running in memory on an instance, before its first "
               "checkpoint).")] = False,
           as_json: AsJson = False) -> None:
    """Cancel a task wherever it is (paused, or running on an instance): the agent's
    instance that takes the request cancels its peers, answers its caller
    ``canceled`` and removes its rows. Needs the mesh's broker (NATS): a cancel is
    carried out by the instances, which the store alone cannot reach. A task the
    store does not know (no live rows, no history) is refused, exit 1, unless
    ``--force``; one whose history says it ended is refused always."""
    from meshpoint.config import load_config
    from meshpoint.history.planning import END_PHASES
    from meshpoint.runtime import wire

    async def run() -> str:
        mesh = load_config(config)
        if mesh.broker.url.startswith("memory://"):
            raise InvalidArgumentError(
                "the config's broker is memory://, which reaches only its own process: "
                "cancel from that process (Client.cancel)")
        name = agent or wire.agent_of_task(task_id)
        known = await _known(mesh, task_id)
        if known in END_PHASES:
            raise InvalidArgumentError(
                f"task {task_id!r} has already ended ({known}); there is nothing to cancel")
        if known == "unknown" and not force:
            raise NotFoundError(
                f"the store knows no task {task_id!r} in tenant {mesh.store.tenant!r}: no "
                "live rows and no history (a typo, another tenant's task, or one that "
                "ended without a history). It may still be running in memory on an "
                "instance, before its first checkpoint: --force sends the cancel anyway")
        async with mesh.open_client() as client:  # never creates the namespace's stream
            await client.cancel(name, task_id)
        return name

    name = run_sync(run, as_json)
    if as_json:
        print(json.dumps({"task_id": task_id, "agent": name, "cancel": "sent"}))
    else:
        console.print(f"cancel of task {shown(task_id)} sent to agent {shown(name)}: the "
                      "instance that takes it answers the task's caller canceled")


async def _known(mesh: Any, task_id: str) -> str:
    """What the store knows of the task: ``live`` (it has live rows), the phase of
    its history's last record (an end, or the pause its rows were removed after),
    ``unknown`` (neither), or ``unreadable`` (the store could not be read: the
    cancel is sent, the instances may still know the task)."""

    try:
        store = await mesh.open_store()
        try:
            try:
                await store.get_peer_sub_tasks_for_task(task_id)
                return "live"
            except UnknownTaskError:
                pass
            record = await store.history.get_latest_checkpoint(task_id)
        finally:
            await store.close()
    except MeshpointError:  # the store away, say: the instances may still know it
        return "unreadable"
    return "unknown" if record is None else str(record.execution_state.phase)


def recover(dry_run: Annotated[bool, typer.Option(
                "--dry-run", help="Show what the next recovery pass would do.")] = False,
            url: Url = None, config: Config = None, schema: Schema = None,
            tenant: Tenant = None,
            timeout: Annotated[float | None, typer.Option(
                "--timeout", min=0, help="The recovery timeout_s to apply (default: each "
                "agent's, from --config, or a day).")] = None,
            as_json: AsJson = False) -> None:
    """What recovery (run by every instance of an agent) would do now, by the
    rules, one action per task, the first that matches: fail the tasks not
    checkpointed within the timeout, resume those whose instance died
    (auto_resume), remind or leave alone those waiting for a human
    (auto_resume_hitl)."""
    from meshpoint.runtime.agent import RecoveryPolicy
    from meshpoint.runtime.loops import recovery_plan

    if not dry_run:
        err.print("[red]error:[/red] recovery runs in every instance of an agent "
                  "(meshpoint serve); use --dry-run to see what its next pass would do")
        raise typer.Exit(code=2)
    policies: dict[str, RecoveryPolicy] = {}
    if config is not None:
        from meshpoint.config import load_config

        mesh = load_config(config)
        policies = {name: mesh.build_agent(name).recovery for name in mesh.agents}

    async def body(store: Any) -> list[dict[str, Any]]:
        agents = set(policies) | {a for a, _ in (await store.stats()).paused_tasks}
        plan: list[dict[str, Any]] = []
        for name in sorted(agents):
            # One action per task, the first that matches, as the live pass takes them.
            plan += [{"action": action, "agent": name, "task_id": task_id}
                     for task_id, action in await recovery_plan(
                         store, name, policies.get(name, RecoveryPolicy()),
                         timeout_s=timeout)]
        return plan

    plan = run_on_store(url, config, schema, tenant, as_json, body)
    if as_json:
        print(json.dumps({"dry_run": True, "plan": plan}))
        return
    table = Table(title="the next recovery pass would")
    for column in ("action", "agent", "task"):
        table.add_column(column)
    for step in plan:
        table.add_row(*(shown(step[key]) for key in ("action", "agent", "task_id")))
    console.print(table if plan else "nothing to recover")


@tasks_app.command()
def resume(task_id: Annotated[str, typer.Argument(help="The task.")],
           url: Url = None, config: Config = None, schema: Schema = None,
           tenant: Tenant = None, as_json: AsJson = False) -> None:
    """Resume a stored task by hand: a ``blocked`` task after an operator's fix, or a
    ``resuming``/``working`` task of an agent with ``auto_resume: false``. Under the
    lease rules of every resume: the command takes the task's lease (refused, exit 1,
    while an instance or another operator holds it: exactly one resumer), the task
    becomes ``resuming`` with its count of take-overs cleared and a ``recovering``
    history record naming who, and the lease is given up at once for the first
    instance of its agent whose recovery pass runs next (with ``auto_resume`` off
    too; while the agent's breaker is open, once it lets it through). The only way a
    blocked task goes back to resuming without a restart; a task waiting on peers or a
    human is not resumed (it resumes when they answer)."""
    from meshpoint.errors import ConflictError
    from meshpoint.runtime import wire

    owner = f"operator-{getpass.getuser()}@{socket.gethostname()}-{wire.new_id()[:8]}"

    async def body(store: Any) -> dict[str, Any]:
        before = await store.restore_task(task_id, verify=False)
        if before.status not in ("blocked", "resuming", "working"):
            raise InvalidArgumentError(
                f"task {task_id!r} is {before.status}: it resumes when what it waits for "
                "answers (meshpoint tasks show says what); only a blocked, resuming or "
                "working task is resumed by hand")
        lease = await store.recovery.take_task_by_hand(task_id, owner, 30.0)
        if lease is None:
            raise ConflictError(
                f"task {task_id!r} is being resumed (an instance or another operator holds "
                "its lease): nothing was changed; look again with meshpoint tasks show")
        await store.release_resume_lease(task_id, owner)
        return {"task_id": task_id, "agent": before.agent_name, "was": before.status,
                "status": "resuming", "by": owner}

    done = run_on_store(url, config, schema, tenant, as_json, body)
    if as_json:
        print(json.dumps(done))
        return
    console.print(f"task {shown(task_id)}: {shown(done['was'])} -> resuming; the next "
                  f"recovery pass of an instance of agent {shown(done['agent'])} resumes it")

