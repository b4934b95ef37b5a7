"""``meshpoint sync``: push a local SQLite store to a cloud PostgreSQL one
(:mod:`meshpoint.sync`), and see where it stands.

    meshpoint sync --from sqlite:///local.db --to postgresql://... [--tenant T] [--dry-run]
    meshpoint sync --from sqlite:///local.db --to postgresql://... --follow [--interval-s 10]
    meshpoint sync status --from sqlite:///local.db --to postgresql://...
    meshpoint sync conflicts --to postgresql://...

``--config`` names a mesh config whose ``history.signing`` keys (public halves are
enough) verify each chain's signatures on arrival, as ``meshpoint verify`` does; without
such a key a sync is refused (exit 2) unless ``--unsigned``; a local
config (a SQLite store) with a ``sync:`` section also gives ``--from``, ``--to``,
``--schema`` and ``--tenant``, and any config its store's tenant (flags win). Each
command prints a table, or with ``--json`` one JSON object. A wrong
``--from``/``--to`` or an unknown tenant is a usage error (exit 2) found before
anything is written; an unreachable database or a schema that is not migrated exits 1
with the reason; a pass that left conflicts or quarantined chains exits 3.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
from rich.table import Table

from meshpoint.cli.common import AsJson, Config, console, err, run_sync, shown

sync_app = typer.Typer(help="Push a local SQLite store to a cloud PostgreSQL store.",
                       invoke_without_command=True, no_args_is_help=False)

From = Annotated[str | None, typer.Option(
    "--from", help="The local store: sqlite:///path.db.")]
To = Annotated[str | None, typer.Option(
    "--to", help="The cloud store: postgresql://user@host/db (migrated: meshpoint migrate).")]
Tenant = Annotated[str | None, typer.Option(
    "--tenant", help="The tenant whose rows travel (the same on both sides: a record's "
                     "hash covers its tenant). Default: the config's store tenant, or "
                     "'default'.")]
Schema = Annotated[str | None, typer.Option(
    "--schema", help="The cloud's PostgreSQL schema (default: the search path).")]
Unsigned = Annotated[bool, typer.Option(
    "--unsigned", help="Push without signing keys: the history chains' signatures are "
                       "not checked on arrival (refused without it when --config gives "
                       "no history.signing key).")]
#: The exit code of a pass that left conflicts or quarantined chains.
EXIT_CONFLICTS = 3
#: How long a one-off pass that lost the cloud mid-way keeps trying (with backoff)
#: before it exits 1; and its longest wait between tries.
RETRY_S, RETRY_MAX_BACKOFF_S = 60.0, 8.0


def _check_keys(config: Path | None, unsigned: bool) -> bool:
    """Whether ``unsigned`` goes (given, or a ``sync:`` section's ``unsigned``); a usage
    error if the config gives no key to check the chains' signatures with and the sync
    may not go unsigned."""
    keys = False
    if config is not None:
        from meshpoint.config import load_config

        mesh = load_config(config)
        keys = bool(mesh.history.signing.keys)
        unsigned = unsigned or (mesh.sync is not None and mesh.sync.unsigned)
    if not keys and not unsigned:
        raise typer.BadParameter(
            "no signing key to check the history chains' signatures with on arrival: give "
            "--config naming a config whose history.signing holds the public halves of "
            "the signing keys, or --unsigned to push chains whose signatures nobody "
            "checks", param_hint="--config")
    return unsigned


def _defaults(config: Path | None, source: str | None, target: str | None,
              tenant: str | None, schema: str | None
              ) -> tuple[str | None, str | None, str, str | None]:
    """``--from``, ``--to``, ``--tenant`` and ``--schema``, those not given taken from
    the config: a local one (a SQLite store) with a ``sync:`` section gives all four;
    any other gives its store's tenant. Flags win."""
    if config is None:
        return source, target, tenant or "default", schema
    from meshpoint.config import load_config

    mesh = load_config(config)
    if mesh.sync is not None:
        source = source or mesh.store.url
        target = target or mesh.sync.to
        schema = schema if schema is not None else mesh.sync.schema_name
    return source, target, tenant or mesh.store.tenant, schema


def _check_urls(source: str | None, target: str | None, *, need_source: bool = True) -> None:
    from meshpoint.errors import ConfigurationError
    from meshpoint.store.engine import parse_url
    from meshpoint.store.sqlite import is_memory

    if need_source:
        if source is None:
            raise typer.BadParameter("give the local store, sqlite:///path.db",
                                     param_hint="--from")
        try:
            parsed = parse_url(source)
        except ConfigurationError as error:
            raise typer.BadParameter(str(error), param_hint="--from") from None
        if parsed.get_backend_name() != "sqlite" or is_memory(parsed):
            raise typer.BadParameter(
                f"the local store is a SQLite file (sqlite:///path.db), got "
                f"{parsed.render_as_string(hide_password=True)!r}", param_hint="--from")
        if not Path(str(parsed.database)).expanduser().exists():
            raise typer.BadParameter(f"there is no SQLite database at {parsed.database}",
                                     param_hint="--from")
    if target is None:
        raise typer.BadParameter("give the cloud store, postgresql://user@host/db",
                                 param_hint="--to")
    try:
        parsed = parse_url(target)
    except ConfigurationError as error:
        raise typer.BadParameter(str(error), param_hint="--to") from None
    if parsed.get_backend_name() != "postgresql":
        raise typer.BadParameter(
            f"the cloud store is PostgreSQL (postgresql://user@host/db), got "
            f"{parsed.render_as_string(hide_password=True)!r}", param_hint="--to")


@asynccontextmanager
async def _stores(source: str | None, target: str | None, tenant: str, schema: str | None,
                  config: Path | None) -> AsyncIterator[tuple[Any, Any]]:
    """The local store (None without ``source``) and the cloud store (None without
    ``target``), both of ``tenant``; UsageError for a tenant the local store has no
    row of."""
    from meshpoint.store import open_store

    history = None
    if config is not None:
        from meshpoint.config import load_config

        history = load_config(config).history_options()
    local = None
    if source is not None:
        local = await open_store(source, tenant_id=tenant, migrate=False)
    try:
        if local is not None:
            await _check_tenant(local, tenant)
        if target is None:
            yield local, None
            return
        async with open_store(target, tenant_id=tenant, schema=schema, migrate=False,
                              history=history) as cloud:
            yield local, cloud
    finally:
        if local is not None:
            await local.close()


async def _check_tenant(local: Any, tenant: str) -> None:
    from sqlalchemy import select, union

    from meshpoint.store.schema import paused_tasks
    from meshpoint.sync.queries import GRAPH_TABLES, TABLES

    # Every table the sync reads, the saver's too (a file of LangGraph threads only has
    # its tenants there), and the paused tasks (one may move, --move-paused).
    held = (*TABLES.values(), *GRAPH_TABLES, paused_tasks)

    def tenants(conn: Any) -> list[str]:
        # Found by its primary key's first column; only a tenant that is not there
        # costs a scan, to name the ones that are.
        if any(conn.execute(select(t.c.tenant_id).where(t.c.tenant_id == tenant).limit(1))
               .first() for t in held):
            return [tenant]
        query = union(*(select(t.c.tenant_id) for t in held))
        return sorted(str(r[0]) for r in conn.execute(query))

    found = await local.run(tenants)
    if found and tenant not in found:
        raise typer.BadParameter(
            f"the local store has no rows of tenant {tenant!r}; its tenants: "
            f"{', '.join(found)}", param_hint="--tenant")


@sync_app.callback()
def sync(ctx: typer.Context, source: From = None, target: To = None,
         tenant: Tenant = None, schema: Schema = None, config: Config = None,
         dry_run: Annotated[bool, typer.Option(
             "--dry-run", help="Count what would travel; write nothing.")] = False,
         batch: Annotated[int, typer.Option(min=1, max=10_000,
                                            help="Rows per cloud transaction.")] = 500,
         follow: Annotated[bool, typer.Option(
             "--follow", help="Keep pushing, every --interval-s, retrying with backoff "
                              "while the cloud is unreachable (Ctrl-C stops).")] = False,
         interval_s: Annotated[float, typer.Option(
             "--interval-s", min=0.01, help="The longest wait between passes with --follow "
                                             "(a pass starts as soon as the local file has "
                                             "new rows).")] = 10.0,
         move_paused: Annotated[bool, typer.Option(
             "--move-paused", help="After the pass, hand paused tasks (waiting on peers "
                                   "or for approval) to the cloud, whose instances "
                                   "resume them: every one that can move, or those of "
                                   "--task; a move left half-way is completed.")] = False,
         tasks: Annotated[list[str] | None, typer.Option(
             "--task", help="With --move-paused: a task to move (repeat the option); "
                            "one that cannot move is an error, nothing written.")] = None,
         unsigned: Unsigned = False, as_json: AsJson = False) -> None:
    """Push the local store's history chains (records and heads), event log,
    ended-task ledger and LangGraph threads to the cloud store, exactly once: each
    batch is applied in one cloud transaction with its cursor, so a sync killed
    anywhere and run again applies each row once, and a rerun changes nothing. Chains
    are verified on arrival; conflicts and chains that do not verify are kept aside
    (``meshpoint sync conflicts``), never applied over what the cloud holds. With
    --move-paused, paused tasks are then handed to the cloud's instances."""
    if ctx.invoked_subcommand is not None:
        return
    source, target, tenant, schema = _defaults(config, source, target, tenant, schema)
    _check_urls(source, target)
    assert target is not None
    if tasks and not move_paused:
        raise typer.BadParameter("--task names a task to move: give --move-paused too",
                                 param_hint="--task")
    if not dry_run:
        unsigned = _check_keys(config, unsigned)
    if follow:
        if dry_run:
            raise typer.BadParameter("--dry-run writes nothing; it cannot --follow",
                                     param_hint="--follow")
        if move_paused:
            raise typer.BadParameter("a move is one run: without --follow",
                                     param_hint="--move-paused")
        _follow(source, target, tenant, schema, config, batch, interval_s, as_json,
                unsigned)
        return

    checked = False
    moves: list[Any] = []

    async def run() -> tuple[str | None, list[Any]]:
        from meshpoint.sync.follow import unreachable_retrying
        from meshpoint.sync.push import Syncer

        nonlocal checked
        async with _stores(source, target, tenant, schema, config) as (local, cloud):
            syncer = Syncer(local, cloud, batch=batch, unsigned=unsigned)
            checked = syncer.options.check_signatures
            mover = None
            if move_paused:  # every task named checked before anything is written
                mover, plans = await _move_plans(syncer, target, tasks)
            if dry_run:
                if mover is not None:
                    moves.extend(report for report, _ in plans)
                return await syncer.run(dry_run=True)
            with Progress(TextColumn("{task.description}"), BarColumn(),
                          MofNCompleteColumn(), console=err, disable=as_json) as bar:
                jobs: dict[str, Any] = {}

                def advance(table: str, rows: int, behind: int) -> None:
                    if table not in jobs:
                        jobs[table] = bar.add_task(f"syncing {table}", total=behind)
                    bar.advance(jobs[table], rows)

                done: tuple[str | None, list[Any]] = await unreachable_retrying(
                    _say_unreachable, max_backoff_s=RETRY_MAX_BACKOFF_S,
                    give_up_after_s=RETRY_S)(syncer.run, progress=advance)
            if mover is not None:
                moves.extend(await mover.move(plans))
            return done

    source_id, reports = run_sync(run, as_json)
    troubled = sum(len(r.conflicts) + len(r.quarantined) for r in reports)
    if as_json:
        print(json.dumps({"source_id": source_id, "tenant": tenant, "dry_run": dry_run,
                          "signatures_checked": checked,
                          "tables": [r.as_json() for r in reports],
                          **({"moved": [m.as_json() for m in moves]} if move_paused else {})}))
    else:
        table = Table(title=f"sync of tenant {shown(tenant)}"
                            + (" (dry run: nothing written)" if dry_run else ""))
        for column in ("table", "behind", "applied", "already there", "conflicts",
                       "quarantined", "kept (cloud's end)"):
            table.add_column(column)
        for r in reports:
            table.add_row(r.table, str(r.behind), "-" if dry_run else str(r.applied),
                          "-" if dry_run else str(r.identical), str(len(r.conflicts)),
                          str(len(r.quarantined)), str(len(r.kept)))
        console.print(table)
        if not checked and not dry_run:
            console.print("[yellow]signatures were not checked[/yellow] (--unsigned): a "
                          "chain re-hashed by anyone who can write the file would pass")
        if troubled:
            console.print(f"{troubled} row(s) or chain(s) were kept aside: meshpoint sync "
                          "conflicts lists them")
        if move_paused:
            _print_moves(moves, dry_run)
    if troubled:
        raise typer.Exit(code=EXIT_CONFLICTS)


async def _move_plans(syncer: Any, target: str, tasks: list[str] | None
                      ) -> tuple[Any, list[Any]]:
    """The mover and its plan; a task named that cannot move is a usage error."""
    from sqlalchemy.engine import make_url

    from meshpoint.sync.move import Mover, MoveRefusedError

    shown_url = make_url(target).render_as_string(hide_password=True)
    mover = Mover(syncer, shown_url)
    try:
        return mover, await mover.plan(tasks or None)
    except MoveRefusedError as error:
        raise typer.BadParameter(str(error), param_hint="--task") from None


def _print_moves(moves: list[Any], dry_run: bool) -> None:
    table = Table(title="paused tasks moved to the cloud" + (" (dry run: nothing written)"
                                                             if dry_run else ""))
    for column in ("task", "agent", "status", "outcome", "peer calls", "approvals",
                   "answered", "why"):
        table.add_column(column, overflow="fold")
    for m in moves:
        table.add_row(shown(m.task_id), m.agent_name, m.status, m.outcome,
                      str(m.peer_calls), str(m.approvals), str(m.resolved),
                      shown(m.reason or ""))
    console.print(table if moves else "no paused task to move")


def _say_unreachable(error: BaseException, wait_s: float) -> None:
    err.print(f"[yellow]the cloud store is unreachable[/yellow] ({shown(error)}); "
              f"next try in {wait_s:.1f} s")


def _follow(source: str | None, target: str, tenant: str, schema: str | None,
            config: Path | None, batch: int, interval_s: float, as_json: bool,
            unsigned: bool) -> None:
    """``sync --follow``: a pass every ``interval_s``, one line (or JSON object) each."""
    def on_pass(source_id: str | None, reports: list[Any]) -> None:
        if as_json:
            print(json.dumps({"source_id": source_id, "tenant": tenant,
                              "tables": [r.as_json() for r in reports]}), flush=True)
            return
        kept = sum(len(r.conflicts) + len(r.quarantined) for r in reports)
        console.print(f"synced: {sum(r.applied for r in reports)} row(s) applied"
                      + (f", {kept} kept aside (meshpoint sync conflicts)" if kept else ""))

    async def run() -> None:
        from meshpoint.store import open_store
        from meshpoint.sync.follow import follow

        history = None
        if config is not None:
            from meshpoint.config import load_config

            history = load_config(config).history_options()
        async with _stores(source, None, tenant, schema, config) as (local, _):
            await follow(local, lambda: open_store(
                target, tenant_id=tenant, schema=schema, migrate=False, history=history),
                interval_s=interval_s, batch=batch, on_pass=on_pass, on_retry=_say_unreachable,
                unsigned=unsigned)

    try:
        run_sync(run, as_json)
    except KeyboardInterrupt:
        err.print("stopped")


@sync_app.command()
def status(source: From = None, target: To = None, tenant: Tenant = None,
           schema: Schema = None, config: Config = None, as_json: AsJson = False) -> None:
    """Per table: the cloud's cursor for this local store and the rows behind it; and
    the moves of paused tasks left half-way (--move-paused completes them)."""
    source, target, tenant, schema = _defaults(config, source, target, tenant, schema)
    _check_urls(source, target)
    assert target is not None

    leaving: list[str] = []

    async def run() -> tuple[str | None, list[Any]]:
        from meshpoint.sync.move_queries import LEAVING
        from meshpoint.sync.push import Syncer

        async with _stores(source, target, tenant, schema, None) as (local, cloud):
            leaving.extend(r.logical_task_id for r in await local.transaction(
                lambda conn: LEAVING.rows(conn, {"p_tenant": tenant})))
            return await Syncer(local, cloud).status()

    source_id, statuses = run_sync(run, as_json)
    if as_json:
        print(json.dumps({"source_id": source_id, "tenant": tenant,
                          "tables": [s.as_json() for s in statuses],
                          "moves_under_way": leaving}))
        return
    table = Table(title=f"sync status of tenant {shown(tenant)}, source "
                        f"{source_id or '(never synced)'}")
    for column in ("table", "cursor", "rows applied", "behind"):
        table.add_column(column)
    for s in statuses:
        table.add_row(s.table, str(s.position), str(s.rows_applied),
                      f"{s.behind}" + (" (read again: the row at the cursor was purged)"
                                       if s.rescan else ""))
    console.print(table)
    if leaving:
        console.print(f"[yellow]{len(leaving)} move(s) left half-way[/yellow] (held here, "
                      f"resumable nowhere until done): {', '.join(leaving)}; run meshpoint "
                      "sync --move-paused again to complete them")


@sync_app.command()
def conflicts(target: To = None, tenant: Tenant = None, schema: Schema = None,
              config: Config = None, as_json: AsJson = False) -> None:
    """The rows a sync kept aside: conflicts (both versions), quarantined chains and
    tasks' ends the cloud holds otherwise (the cloud's stayed)."""
    _, target, tenant, schema = _defaults(config, None, target, tenant, schema)
    _check_urls(None, target, need_source=False)
    assert target is not None

    async def run() -> list[Any]:
        from meshpoint.sync.queries import LIST_CONFLICTS

        async with _stores(None, target, tenant, schema, None) as (_, cloud):
            return list(await cloud.transaction(
                lambda conn: LIST_CONFLICTS.rows(conn, {"p_tenant": tenant})))

    rows = run_sync(run, as_json)
    if as_json:
        print(json.dumps({"tenant": tenant, "conflicts": [
            {k: v for k, v in r._asdict().items() if k != "tenant_id"} for r in rows]}))
        return
    table = Table(title=f"sync conflict log of tenant {shown(tenant)}: {len(rows)} row(s)")
    for column in ("kind", "table", "key", "source", "why"):
        table.add_column(column, overflow="fold")
    for r in rows:
        table.add_row(r.kind, r.table_name, shown(r.row_key), r.source_id, shown(r.reason))
    console.print(table)
