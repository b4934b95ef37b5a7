"""The ``meshpoint`` command line: ``demo``, ``migrate`` and ``stats``."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn
from rich.table import Table

from meshpoint.errors import MeshpointError

app = typer.Typer(help="meshpoint: AI agents that are stateless while they wait.",
                  no_args_is_help=True, add_completion=False)
console = Console()
err = Console(stderr=True)

UrlOption = Annotated[str, typer.Option("--url", envvar="MESHPOINT_STORE_URL",
                                        help="Store URL (sqlite:///file.db or "
                                             "postgresql+asyncpg://user@host/db).")]
TenantOption = Annotated[str, typer.Option("--tenant", help="Tenant id.")]


def _fail(error: MeshpointError) -> typer.Exit:
    err.print(f"[red]error:[/red] {error}")
    return typer.Exit(code=1)


@app.command()
def demo(
    tasks: Annotated[int, typer.Option(min=1, help="Paused tasks to resume.")] = 300,
    fan_out: Annotated[int, typer.Option(min=1, max=50, help="Peer calls per task.")] = 3,
    instances: Annotated[int, typer.Option(min=1, max=32, help="Racing instances.")] = 3,
    silent_peer_rate: Annotated[float, typer.Option(
        min=0.0, max=1.0, help="Share of peers that never answer (their deadline expires)."
    )] = 0.1,
    db: Annotated[Path, typer.Option(help="SQLite file (recreated).")] = Path(
        "meshpoint-demo.db"),
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Checkpoint paused tasks on the embedded default and let instances race to resume them."""
    from meshpoint.demo import DemoConfig, run_demo

    config = DemoConfig(db_path=db, tasks=tasks, fan_out=fan_out, instances=instances,
                        silent_peer_rate=silent_peer_rate)
    try:
        if as_json:
            figures = run_demo(config)
        else:
            with Progress("[progress.description]{task.description}", BarColumn(),
                          MofNCompleteColumn(), TimeElapsedColumn(), console=console) as bar:
                job = bar.add_task(f"{instances} instances resolving sub-tasks", total=None)
                figures = run_demo(config, on_progress=lambda done, total: bar.update(
                    job, completed=done, total=total))
    except MeshpointError as error:
        raise _fail(error) from None
    if as_json:
        print(json.dumps(figures))
        return
    table = Table(title=f"meshpoint demo: {tasks} paused tasks x {fan_out} peers, "
                        f"{instances} instances, SQLite file {db}")
    table.add_column("measure")
    table.add_column("value", justify="right")
    rows = [
        ("paused tasks checkpointed", figures["tasks"]),
        ("peer sub-tasks", figures["sub_tasks"]),
        ("answer deliveries (each answer twice)", figures["deliveries"]),
        ("resolved by an answer", figures["answered"]),
        ("resolved by the deadline (timeout)", figures["timed_out"]),
        ("duplicate or late answers ignored", figures["duplicates_ignored"]),
        ("tasks resumed (exactly once each)", figures["resumed"]),
        ("  by instance", ", ".join(f"{k}: {v}" for k, v in
                                     figures["resumed_by_instance"].items())),
        ("live rows left", figures["rows_left"]),
        ("checkpoint write p50 / p99 (ms)", "{p50:.3f} / {p99:.3f}".format(
            **figures["checkpoint_write_ms"])),
        ("resolve p50 / p99 (ms)", "{p50:.3f} / {p99:.3f}".format(**figures["resolve_ms"])),
        ("wall time (s)", figures["seconds"]),
    ]
    for name, value in rows:
        table.add_row(name, str(value))
    console.print(table)
    exactly_once = (figures["answered"] + figures["timed_out"] == figures["sub_tasks"]
                    and figures["resumed"] == figures["tasks"] and figures["rows_left"] == 0)
    if not exactly_once:
        err.print("[red]exactly-once violated: the counts above do not add up[/red]")
        raise typer.Exit(code=2)
    console.print("[green]every sub-task resolved once, every task resumed once, "
                  "nothing left behind[/green]")


@app.command()
def migrate(url: UrlOption) -> None:
    """Bring a database's schema up to date (safe to run from many hosts at once)."""
    from meshpoint.store import open_store

    async def run() -> None:
        store = await open_store(url)
        await store.close()

    try:
        asyncio.run(run())
    except MeshpointError as error:
        raise _fail(error) from None
    console.print("schema is up to date")


@app.command()
def stats(url: UrlOption, tenant: TenantOption = "default",
          limit: Annotated[int, typer.Option(min=1, help="Tasks to list.")] = 20) -> None:
    """Paused tasks by agent and status, the oldest ones, and the next deadlines."""
    from meshpoint.store import open_store

    async def run() -> None:
        async with open_store(url, tenant_id=tenant, migrate=False) as store:
            counts, tasks = await store.stats(), await store.list_paused_tasks(limit=limit)
        now = time.time()
        table = Table(title=f"paused tasks of tenant {tenant!r}")
        for column in ("agent", "status", "tasks"):
            table.add_column(column)
        for (agent, status), n in sorted(counts.paused_tasks.items()):
            table.add_row(agent, status, str(n))
        console.print(table)
        console.print(f"pending sub-tasks: {counts.pending_sub_tasks}, of which expired: "
                      f"{counts.expired_sub_tasks}")
        listing = Table(title="oldest paused tasks")
        for column in ("task", "agent", "status", "age (s)", "pending", "next deadline in (s)",
                       "lease owner"):
            listing.add_column(column)
        for t in tasks:
            listing.add_row(t.task_id, t.agent_name, t.status, f"{now - t.checkpointed_at:.1f}",
                            str(t.pending_sub_tasks),
                            "-" if t.next_deadline is None else f"{t.next_deadline - now:.1f}",
                            t.owner or "-")
        console.print(listing)

    try:
        asyncio.run(run())
    except MeshpointError as error:
        raise _fail(error) from None


if __name__ == "__main__":
    app()
