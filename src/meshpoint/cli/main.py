"""The ``meshpoint`` command line: ``demo``, ``serve``, ``submit``, ``migrate``, ``stats``,
``alerts`` (:mod:`meshpoint.cli.alerts`) and ``tasks`` (:mod:`meshpoint.cli.tasks`)."""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn
from rich.table import Table

from meshpoint import a2a
from meshpoint.cli.alerts import alert_commands
from meshpoint.cli.broker import broker_commands
from meshpoint.cli.common import (
    AsJson,
    Config,
    PlainFormatter,
    Schema,
    Tenant,
    Url,
    console,
    err,
    fail,
    run_on_store,
    shown,
)
from meshpoint.cli.costs import cost_commands
from meshpoint.cli.dashboard import dashboard_commands
from meshpoint.cli.events import event_commands
from meshpoint.cli.gateway import gateway_commands
from meshpoint.cli.handoffs import handoff_commands
from meshpoint.cli.history import history_commands, keys_app
from meshpoint.cli.llm import llm_app
from meshpoint.cli.sync import sync_app
from meshpoint.cli.tasks import recover, tasks_app
from meshpoint.errors import ConfigurationError, MeshpointError

app = typer.Typer(help="meshpoint: AI agents that are stateless while they wait.",
                  no_args_is_help=True, add_completion=False)
app.add_typer(tasks_app, name="tasks")
app.command()(recover)
history_commands(app)
event_commands(app, tasks_app)
alert_commands(app)
handoff_commands(tasks_app)
cost_commands(tasks_app)
broker_commands(app, keys_app)
dashboard_commands(app)
gateway_commands(app)
app.add_typer(llm_app, name="llm")
app.add_typer(sync_app, name="sync")

#: ``serve`` and ``submit`` need the whole mesh, not only its store.
ConfigOption = Annotated[Path, typer.Option("--config", "-c", envvar="MESHPOINT_CONFIG",
                                            help="The mesh config (YAML).")]


@app.command()
def demo(
    tasks: Annotated[int, typer.Option(min=1, help="Tasks to submit.")] = 200,
    instances: Annotated[int, typer.Option(min=1, max=32,
                                           help="Coordinator instances.")] = 3,
    fan_out: Annotated[int, typer.Option(min=1, max=50, help="Peer calls per task.")] = 3,
    concurrency: Annotated[int, typer.Option(min=1, help="Tasks in flight at once.")] = 16,
    kill_rate: Annotated[float, typer.Option(
        min=0.0, help="Coordinator instances killed (and restarted) per second.")] = 1.0,
    stall_rate: Annotated[float, typer.Option(
        min=0.0, max=1.0, help="Share of peer calls that stall past their deadline.")] = 0.02,
    approval_rate: Annotated[float, typer.Option(
        min=0.0, max=1.0, help="Share of bookings that need a human's approval.")] = 0.25,
    long_rate: Annotated[float, typer.Option(
        min=0.0, max=1.0, help="Share of the tasks that are long ones (a researcher's, "
        "handed off to fresh contexts at least twice each), rounded down.")] = 0.05,
    workflow_rate: Annotated[float, typer.Option(
        min=0.0, max=1.0, help="Share of the tasks that are workflow tasks (a sequential "
        "workflow of three stages), rounded down.")] = 0.05,
    db: Annotated[Path, typer.Option(help=(
        "SQLite file, recreated with its -wal and -shm files; refused if they hold "
        "anything but a previous demo's data."))] = Path(
        "meshpoint-demo.db"),
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Run a coordinator, a researcher, a workflow and their peer agents on the
    embedded default (a SQLite file, the in-process broker) while coordinator and
    researcher instances are killed and restarted; an approver answers the bookings
    that need a human's approval; the researcher's long tasks hand off to
    fresh-context iterations; each of the workflow's stages runs once."""
    from meshpoint.demo.scripted import DemoConfig, run_demo, shortfalls

    config = DemoConfig(db_path=db, tasks=tasks, instances=instances, fan_out=fan_out,
                        concurrency=concurrency, kill_rate=kill_rate, stall_rate=stall_rate,
                        approval_rate=approval_rate, long_rate=long_rate,
                        workflow_rate=workflow_rate)
    try:
        if as_json:
            figures = run_demo(config)
        else:
            with Progress("[progress.description]{task.description}", BarColumn(),
                          MofNCompleteColumn(), TimeElapsedColumn(), console=console) as bar:
                job = bar.add_task(f"tasks answered ({instances} instances an agent, "
                                   f"{kill_rate:g} kills/s each)", total=tasks)
                figures = run_demo(config, on_progress=lambda done, total: bar.update(
                    job, completed=done, total=total))
    except MeshpointError as error:
        fail(error)
    problems = shortfalls(figures)
    if as_json:
        print(json.dumps(figures))
    else:
        _demo_table(figures, db, ok=not problems)
    if problems:
        err.print(f"[red]the demo did not prove what it shows: {'; '.join(problems)}[/red]")
        raise typer.Exit(code=2)


def _demo_table(figures: dict[str, Any], db: Path, *, ok: bool) -> None:
    def pair(ms: dict[str, float | None]) -> str:
        return " / ".join("-" if v is None else f"{v:.2f}" for v in (ms["p50"], ms["p99"]))

    table = Table(title=f"meshpoint demo: coordinator, researcher and workflow x "
                        f"{figures['instances']} "
                        f"instances, fan-out {figures['fan_out']}, SQLite file {shown(db)}")
    table.add_column("measure")
    table.add_column("value", justify="right")
    for name, value in [
        ("tasks submitted", figures["submitted"]),
        ("tasks completed", figures["completed"]),
        ("tasks failed or unanswered", figures["failed"]),
        ("duplicate answers (ignored by the client)", figures["duplicate_answers"]),
        ("coordinator instances killed (and restarted)", figures["kills"]),
        ("checkpoints written", figures["checkpoints_written"]),
        ("tasks resumed", figures["resumed"]),
        ("  on an instance other than the one that paused them",
         figures["resumed_elsewhere"]),
        ("  taken over after the resuming instance died", figures["recovered_after_kill"]),
        ("requests redelivered after a kill", figures["redelivered_requests"]),
        ("peer calls timed out (peer canceled)", figures["timeouts"]),
        ("approvals requested (the task paused for a human)",
         figures["approvals_requested"]),
        ("  approved · with edited arguments · denied",
         f"{figures['approved']} · {figures['approved_edited']} · {figures['denied']}"),
        *_long_rows(figures),
        *_workflow_rows(figures),
        ("breaker trips · resumes it held · alerts",
         f"{figures['breaker_trips']} · {figures['resumes_held_by_the_breaker']} · "
         f"{figures['alerts']}"),
        ("live rows left", figures["rows_left"]),
        ("history records (a chain per task)", figures["history_records"]),
        ("  chains that verify · that fail", f"{figures['chains_verified']} · "
                                             f"{figures['chains_failed']}"),
        ("cost of every task, from the records (USD)", f"{figures['cost_usd']:.6f}"),
        ("checkpoint write p50 / p99 (ms)", pair(figures["checkpoint_write_ms"])),
        ("pause-to-resume p50 / p99 (ms)", pair(figures["pause_resume_ms"])),
        ("wall time (s)", figures["seconds"]),
    ]:
        table.add_row(name, str(value))
    console.print(table)
    if ok:
        console.print("[green]every task completed while instances were being killed; "
                      "nothing left behind; every history chain verifies[/green]")
        # Soft wrap: a long path wraps on screen, but each command stays one line
        # when copied.
        console.print(f"try: meshpoint verify --all --url sqlite:///{shown(db)}",
                      soft_wrap=True)
        if figures["a_task"]:
            for command in ("tasks cost", "events --task", "tasks reconstruct"):
                console.print(f"     meshpoint {command} {shown(figures['a_task'])} --url "
                              f"sqlite:///{shown(db)}", soft_wrap=True)
    console.print(f"dashboard: meshpoint dashboard --url sqlite:///{shown(db)}, then open "
                  "http://127.0.0.1:8080/", soft_wrap=True)


def _long_rows(figures: dict[str, Any]) -> list[tuple[str, object]]:
    """The table's rows of the long tasks (none if there were none)."""
    if not figures["long_tasks"]:
        return []
    most = figures["max_utilization_at_handoff"]
    return [
        ("long tasks completed (researcher)",
         f"{figures['long_completed']} of {figures['long_tasks']}"),
        ("  iterations · handoffs (fewest a task)",
         f"{figures['iterations']} · {figures['handoffs']} "
         f"({figures['fewest_handoffs_per_long_task']})"),
        ("  handoffs by trigger", "\n".join(
            f"{trigger} {n}" for trigger, n in figures["handoffs_by_trigger"].items()) or "-"),
        ("  taken by another instance", figures["handoffs_taken_elsewhere"]),
        (f"  max context use at a handoff (< {figures['utilization_threshold']:g})",
         "-" if most is None else f"{most:.2f}"),
        ("  researcher instances killed", figures["researcher_kills"]),
        ("  long tasks recovered after a kill", figures["long_recoveries"]),
    ]


def _workflow_rows(figures: dict[str, Any]) -> list[tuple[str, object]]:
    """The table's rows of the workflow tasks (none if there were none)."""
    if not figures["workflow_tasks"]:
        return []
    return [
        (f"workflow tasks completed (sequential, {figures['workflow_stages']} stages)",
         f"{figures['workflow_completed']} of {figures['workflow_tasks']}"),
        ("  stages run · run twice", f"{figures['stages_run']} · "
                                     f"{figures['stages_run_again']}"),
        ("  itinerary instances killed", figures.get("workflow_kills", 0)),
    ]


@app.command()
def migrate(url: Url = None, config: Config = None, schema: Schema = None,
            runtime_role: Annotated[str | None, typer.Option(
                "--runtime-role", help="PostgreSQL: create (if missing) and grant a role "
                "serve connects as, shared by the tenants: no ownership, no BYPASSRLS. It "
                "names its tenant itself: isolation against mistakes, not against a "
                "malicious runtime (use --tenant-role for that).")] = None,
            password_env: Annotated[str | None, typer.Option(
                "--runtime-password-env", help="Set the runtime role's password from this "
                "environment variable (sent as a SCRAM verifier, never in clear).")] = None,
            tenant_roles: Annotated[list[str] | None, typer.Option(
                "--tenant-role", help="PostgreSQL, repeatable: ROLE=TENANT creates (if "
                "missing) and grants ROLE as --runtime-role does, and makes it TENANT's "
                "only: row-level security then keys on the connected role, whatever "
                "tenant a session sets, and a role of no tenant sees nothing.")] = None,
            tenant_password_envs: Annotated[list[str] | None, typer.Option(
                "--tenant-password-env", help="Repeatable: ROLE=VAR sets a --tenant-role's "
                "password from environment variable VAR (a SCRAM verifier).")] = None,
            as_json: AsJson = False) -> None:
    """Bring a database's schema up to date (safe to run from many hosts at once), as
    the owner of meshpoint's tables; on PostgreSQL, optionally set up the roles that
    row-level security holds to their tenant: one shared role (--runtime-role), or a
    role per tenant (--tenant-role)."""
    import os

    def env(variable: str, hint: str) -> str:
        value = os.environ.get(variable)
        if not value:
            raise typer.BadParameter(f"the environment variable {variable} is not set",
                                     param_hint=hint)
        return value

    def pairs(values: list[str] | None, hint: str, what: str) -> dict[str, str]:
        found: dict[str, str] = {}
        for value in values or []:
            left, sep, right = value.partition("=")
            if not sep or not left or not right:
                raise typer.BadParameter(f"{value!r} is not {what}", param_hint=hint)
            found[left] = right
        return found

    password = None if password_env is None else env(password_env, "--runtime-password-env")
    roles = pairs(tenant_roles, "--tenant-role", "ROLE=TENANT")
    role_passwords = {role: env(variable, "--tenant-password-env") for role, variable in
                      pairs(tenant_password_envs, "--tenant-password-env",
                            "ROLE=VAR").items()}
    for role in role_passwords.keys() - roles.keys():
        raise typer.BadParameter(f"{role!r} is not given to --tenant-role",
                                 param_hint="--tenant-password-env")

    async def grant(store: Any) -> str:
        if (runtime_role is not None or roles) and store.dialect != "postgresql":
            raise ConfigurationError("--runtime-role and --tenant-role are for PostgreSQL "
                                     "(SQLite has no roles)")
        from meshpoint.store.postgres_tenancy import grant_runtime_role, grant_tenant_role

        for role, tenant in roles.items():
            await grant_tenant_role(store, role, tenant, password=role_passwords.get(role))
        if runtime_role is not None:
            await grant_runtime_role(store, runtime_role, password=password)
        return str(store.dialect)

    dialect = run_on_store(url, config, schema, None, as_json, grant, migrate=True)
    if as_json:
        from meshpoint.store.engine import head_revision

        print(json.dumps({"up_to_date": True, "revision": head_revision(),
                          "dialect": dialect, "runtime_role": runtime_role,
                          "tenant_roles": roles}))
        return
    said = "schema is up to date"
    if runtime_role:
        said += (f"; role {shown(runtime_role)} may use it (row-level security holds it to "
                 "the tenant it sets, per transaction)")
    for role, tenant in roles.items():
        said += f"; role {shown(role)} is tenant {shown(repr(tenant))}'s and no other's"
    console.print(said)


@app.command()
def serve(
    config: ConfigOption,
    agent: Annotated[str, typer.Option("--agent", "-a", help="The agent to serve.")],
    instance_id: Annotated[str | None, typer.Option(
        "--instance-id", help="This instance's id (default: agent name + random).")] = None,
    log_level: Annotated[str, typer.Option(help="debug, info, warning or error.")] = "info",
    stats_json: Annotated[Path | None, typer.Option(
        help="On a graceful exit, write this instance's counts and latency samples "
             "here (JSON).")] = None,
    metrics_port: Annotated[int | None, typer.Option(
        min=0, max=65535, help="Serve Prometheus metrics on this port (0: a free one; "
        "the URL is logged), at /metrics. Default: the config's metrics: port, if any.")
    ] = None,
    metrics_host: Annotated[str | None, typer.Option(
        help="The address the metrics are served on. Default: the config's metrics: "
             "host, else 127.0.0.1.")] = None,
) -> None:
    """Run one instance of AGENT until SIGTERM/SIGINT; then stop taking work, let the
    work in hand checkpoint or finish, and exit 0."""
    from meshpoint.config import MetricsConfig, load_config
    from meshpoint.serve import print_ready
    from meshpoint.serve import serve as run_serve

    level = getattr(logging, log_level.upper(), None)
    if not isinstance(level, int):
        raise typer.BadParameter(f"unknown log level {log_level!r}", param_hint="--log-level")
    # Log lines quote task ids, requests and errors a requester caused: plain text.
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(PlainFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=level, handlers=[handler])
    try:
        mesh = load_config(config)
        metrics = mesh.metrics
        if metrics_port is not None or metrics_host is not None:
            port = metrics_port if metrics_port is not None else \
                metrics.port if metrics is not None else None
            if port is None:
                raise typer.BadParameter("--metrics-host needs --metrics-port (or the "
                                         "config's metrics: port)", param_hint="--metrics-host")
            metrics = MetricsConfig(port=port, host=metrics_host or (
                metrics.host if metrics is not None else "127.0.0.1"))
        asyncio.run(run_serve(mesh, agent, instance_id=instance_id, on_ready=print_ready,
                              stats_path=stats_json, metrics=metrics))
    except MeshpointError as error:
        fail(error)


@app.command()
def submit(
    config: ConfigOption,
    agent: Annotated[str, typer.Argument(help="The agent to ask.")],
    text: Annotated[str, typer.Argument(help="The task, in words.")],
    timeout: Annotated[float, typer.Option(
        min=0.1, help="Seconds to wait for the answer, pauses for a human included.")
    ] = 120.0,
    no_wait: Annotated[bool, typer.Option(
        "--no-wait", help="Return once the request is published: print the task id "
        "(stdout) and exit 0.")] = False,
    as_json: Annotated[bool, typer.Option(
        "--json", help="Print JSON lines on stdout: submitted, input_required (each "
        "pause), then the A2A Task.")] = False,
) -> None:
    """Send TEXT to AGENT and print its answer (exit 1 unless it completed).

    The task id is told at once (stderr; each line there starts with it); each pause
    for a human is told with its pending calls and the `meshpoint tasks approve /
    deny / reply` commands that answer them, and the wait goes on."""
    from meshpoint.cli.submitting import Reporter
    from meshpoint.config import load_config
    from meshpoint.serve import submit as run_submit

    reporter = Reporter(config, as_json=as_json, no_wait=no_wait)
    try:
        mesh = load_config(config)
        reporter.approvers = sorted(mesh.approvers)
        task = asyncio.run(run_submit(mesh, agent, text, timeout_s=timeout,
                                      wait=not no_wait, on_submitted=reporter.submitted,
                                      on_input=reporter.input_required))
    except TimeoutError as error:  # serve.NoAnswerError: where the task stands
        reporter.timed_out(str(error))
        raise typer.Exit(code=1) from None
    except MeshpointError as error:
        fail(error, as_json)
    if task is None:  # --no-wait
        return
    reporter.answered(task)
    if task.status.state != a2a.TaskState.COMPLETED:
        raise typer.Exit(code=1)


@app.command()
def stats(url: Url = None, config: Config = None, schema: Schema = None,
          tenant: Tenant = None,
          limit: Annotated[int, typer.Option(min=1, help="Tasks to list.")] = 20,
          expire_after: Annotated[float, typer.Option(
              "--expire-after", min=0, help="Count tasks not checkpointed for longer than "
              "this many seconds as expired (0: none).")] = 0.0,
          as_json: AsJson = False) -> None:
    """Paused tasks: the recovery counts (each task once: expired, then input_required,
    then working), their ages, by agent and status, and the next deadlines."""
    async def read(store: Any) -> tuple[Any, list[Any]]:
        return (await store.stats(expire_after_s=expire_after),
                list(await store.list_paused_tasks(limit=limit)))

    counts, tasks = run_on_store(url, config, schema, tenant, as_json, read)
    now = time.time()
    if as_json:
        print(json.dumps({
            "total": counts.total, "expired": counts.expired,
            "input_required": counts.input_required, "working": counts.working,
            "oldest_age_s": counts.oldest_age_s, "mean_age_s": counts.mean_age_s,
            "by_agent_status": [{"agent": a, "status": st, "tasks": n}
                                for (a, st), n in sorted(counts.paused_tasks.items())],
            "pending_sub_tasks": counts.pending_sub_tasks,
            "expired_sub_tasks": counts.expired_sub_tasks,
            "next_deadline_in_s": None if counts.next_deadline is None
            else counts.next_deadline - now}))
        return
    summary = Table(title="paused tasks")
    for column in ("total", "expired", "input_required", "working", "oldest age (s)",
                   "mean age (s)"):
        summary.add_column(column)
    summary.add_row(*(str(n) for n in (counts.total, counts.expired,
                                       counts.input_required, counts.working)),
                    *("-" if age is None else f"{age:.1f}"
                      for age in (counts.oldest_age_s, counts.mean_age_s)))
    console.print(summary)
    table = Table(title="by agent and status")
    for column in ("agent", "status", "tasks"):
        table.add_column(column)
    for (agent, status), n in sorted(counts.paused_tasks.items()):
        table.add_row(shown(agent), shown(status), str(n))
    console.print(table)
    console.print(f"pending sub-tasks: {counts.pending_sub_tasks}, of which expired: "
                  f"{counts.expired_sub_tasks}")
    listing = Table(title="oldest paused tasks")
    for column in ("task", "agent", "status", "age (s)", "pending", "next deadline in (s)",
                   "lease owner"):
        listing.add_column(column, overflow="fold")  # ids are shown whole, folded
    for t in tasks:
        listing.add_row(shown(t.task_id), shown(t.agent_name), shown(t.status),
                        f"{now - t.checkpointed_at:.1f}", str(t.pending_sub_tasks),
                        "-" if t.next_deadline is None else f"{t.next_deadline - now:.1f}",
                        shown(t.owner or "-"))
    console.print(listing)


if __name__ == "__main__":
    app()
