"""The checkpoint history from the command line: ``meshpoint verify`` walks chains,
``meshpoint purge`` applies retention and ``meshpoint keys`` manages the encryption key
ring (``meshpoint tasks cost``, which reads a task's history, is with the other
``tasks`` commands, :mod:`meshpoint.cli.tasks`).

Like ``meshpoint tasks``, every command works on the store directly (see
:mod:`meshpoint.cli.common` for ``--url``/``--config``/``--tenant``), prints a table
or, with ``--json``, one JSON object, and exits 1 with the reason on an error.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
from rich.table import Table

from meshpoint.cli.common import (
    AsJson,
    Config,
    Schema,
    Tenant,
    Url,
    console,
    err,
    fail,
    run_on_store,
    shown,
)
from meshpoint.errors import (
    ConfigurationError,
    InvalidArgumentError,
    MeshpointError,
)
from meshpoint.history.verification import ChainReport

R = TypeVar("R")
#: Tasks whose history is read per query when walking every chain.
_PAGE = 500


def verify(task: Annotated[str | None, typer.Option(
               "--task", help="Verify this task's chain.")] = None,
           every: Annotated[bool, typer.Option(
               "--all", help="Verify every chain of the tenant.")] = False,
           url: Url = None, config: Config = None, schema: Schema = None,
           tenant: Tenant = None, as_json: AsJson = False) -> None:
    """Walk checkpoint history chains: each record's hash and signature, each link to
    its parent, the signed head (a cut-off tail) and the columns stored beside the
    hash. Names the first bad record of each chain and why; exits 1 if any chain
    fails. With any key in the config's history.signing (a public key is enough), an
    unsigned record or head fails; signatures_checked says whether every signature
    was checked."""
    if (task is None) == (not every):
        err.print("[red]error:[/red] give --task ID or --all"
                  + (", not both" if every else ""))
        raise typer.Exit(code=2)

    async def body(store: Any) -> tuple[list[ChainReport], bool]:
        options = store.history.options
        # Without a signing key there is nothing to check a signature against: the
        # hashes, links and heads are checked, and the report says signatures were not.
        keys = options.signing.verifies
        if not keys:
            store = store.with_history(replace(options, check_signatures=False))
        return await walk(store), keys

    async def walk(store: Any) -> list[ChainReport]:
        if task is not None:
            return [await store.history.verify_task(task)]
        reports: list[ChainReport] = []
        with Progress(TextColumn("verifying chains"), BarColumn(), MofNCompleteColumn(),
                      console=err, disable=as_json) as progress:
            job = progress.add_task("chains", total=None)
            # The chains their heads list, then those whose head is gone.
            for listing in (store.history.task_ids, store.history.headless_task_ids):
                after = ""
                while True:
                    ids = await listing(after=after, limit=_PAGE)
                    for task_id in ids:
                        reports.append(await store.history.verify_task(task_id))
                        progress.advance(job)
                    if len(ids) < _PAGE:
                        break
                    after = ids[-1]
            return reports

    reports, keys = run_on_store(url, config, schema, tenant, as_json, body)
    failed = [r for r in reports if not r.ok]
    # True only if every record's and every head's signature was checked and held.
    checked = keys and all(r.signatures_checked for r in reports)
    if as_json:
        print(json.dumps({"chains": len(reports), "ok": len(reports) - len(failed),
                          "failed": len(failed), "signatures_checked": checked,
                          "reports": [
                              {"task_id": r.task_id, "records": r.records, "ok": r.ok,
                               "kind": r.kind, "first_bad_seq": r.first_bad_seq,
                               "first_bad_id": r.first_bad_id, "reason": r.reason,
                               "last_good_seq": r.last_good_seq,
                               "signatures_checked": r.signatures_checked}
                              for r in reports]}))
    else:
        table = Table(title=f"checkpoint history: {len(reports)} chain(s), "
                            f"{len(failed)} failed")
        for column in ("task", "records", "result", "first bad record", "why"):
            table.add_column(column, overflow="fold")
        for r in reports if task is not None else failed:
            bad = "-" if r.first_bad_seq is None and r.ok else (
                f"{r.first_bad_seq or 'head'} {r.first_bad_id or ''}".strip())
            table.add_row(shown(r.task_id), str(r.records),
                          "[green]ok[/green]" if r.ok else f"[red]{shown(r.kind)}[/red]",
                          shown(bad), shown(r.reason or ""))
        if table.row_count:
            console.print(table)
        console.print(f"{len(reports) - len(failed)} of {len(reports)} chain(s) verify")
        if not reports:
            console.print("this tenant has no checkpoint history (is --tenant right?)")
        if not keys:
            console.print("no signing keys were given: signatures, if any, were not "
                          "checked (--config with history.signing checks them)")
        elif not checked and not failed:
            unsigned = sum(not r.signatures_checked for r in reports)
            console.print(f"{unsigned} chain(s) hold unsigned records or heads, accepted "
                          "because history.signing.require_signatures is false")
    if failed:
        raise typer.Exit(code=1)


def purge(dry_run: Annotated[bool, typer.Option(
              "--dry-run", help="Show what would be removed; remove nothing.")] = False,
          url: Url = None, config: Config = None, schema: Schema = None,
          tenant: Tenant = None, as_json: AsJson = False) -> None:
    """Remove what retention lets go from the checkpoint history of tasks that ended:
    ``last:N`` keeps a chain's newest N records, ``days:N`` its last N days, ``hold``
    everything (per task or agent, else the config's ``history.retention``), as the
    records themselves say. What stays still verifies. A chain that does not verify,
    or a signed one when the config holds no active signing key, is left alone and
    listed with why. ``serve`` does the same every ``history.purge_interval_s``."""
    examined = [0]

    async def body(store: Any) -> list[Any]:
        def advance(n: int) -> None:
            examined[0] += n
            progress.advance(job, n)

        with Progress(TextColumn("purging" if not dry_run else "planning a purge"),
                      BarColumn(), MofNCompleteColumn(), console=err,
                      disable=as_json) as progress:
            job = progress.add_task("chains", total=None)
            return list(await store.history.purge(dry_run=dry_run, progress=advance))

    purged = run_on_store(url, config, schema, tenant, as_json, body)
    done = [p for p in purged if p.skipped is None]
    left = len(purged) - len(done)
    if as_json:
        # "chains": those the purge cuts (or would); "examined": every chain it read;
        # "skipped": those it would cut but leaves alone (each purge says why)
        print(json.dumps({"dry_run": dry_run, "examined": examined[0], "chains": len(done),
                          "skipped": left, "records_removed": sum(p.removed for p in done),
                          "purges": [{"task_id": p.task_id, "policy": p.policy,
                                      "records": p.records, "removed": p.removed,
                                      "through": p.through, "whole": p.whole,
                                      "skipped": p.skipped} for p in purged]}))
        return
    table = Table(title="what the purge " + ("would remove" if dry_run else "removed"))
    for column in ("task", "policy", "records", "removed", "result"):
        table.add_column(column, overflow="fold")
    for p in purged:
        result = (f"skipped: {p.skipped}" if p.skipped else
                  ("the whole chain and its head" if p.whole else
                   f"records 1-{p.through}; the rest verifies"))
        table.add_row(shown(p.task_id), shown(p.policy), str(p.records), str(p.removed),
                      shown(result))
    if not purged:
        console.print(f"nothing to purge in {examined[0]} chain(s)")
        return
    console.print(table)
    verb = "would remove" if dry_run else "removed"
    console.print(f"{verb} {sum(p.removed for p in done)} record(s) of {len(done)} chain(s) "
                  f"({examined[0]} examined)"
                  + (f"; {left} chain(s) left alone (see why above)" if left else ""))


keys_app = typer.Typer(help="Keys: the encryption key ring of the checkpoint history; "
                            "approvers' key pairs (keys approver new).",
                       no_args_is_help=True)
KeyRing = Annotated[Path | None, typer.Option(
    "--keyring", help="The key ring file (default: the config's history.encryption.keyring).")]


def _keyring_path(keyring: Path | None, config: Path | None) -> Path:
    if keyring is not None:
        return keyring
    if config is not None:
        from meshpoint.config import load_config

        encryption = load_config(config).history.encryption
        if encryption is not None:
            return Path(encryption.keyring)
        raise ConfigurationError(f"{config}: history.encryption.keyring is not set")
    raise InvalidArgumentError("give --keyring PATH or --config (its "
                               "history.encryption.keyring)")


@keys_app.command()
def rotate(tenant: Annotated[str, typer.Option("--tenant", help="Whose key.")],
           keyring: KeyRing = None, config: Config = None, as_json: AsJson = False) -> None:
    """Add a new encryption key for TENANT and make it active (the ring file is created
    if it does not exist). New records are encrypted with it; the older keys stay to
    read what they encrypted. Restart (or reload) the processes that read the ring."""
    from meshpoint.history.encryption import EncryptionKeys, load_keyring, save_keyring

    def run() -> tuple[Path, str]:
        path = _keyring_path(keyring, config)
        ring = load_keyring(path) if path.exists() else EncryptionKeys()
        ring, key_id = ring.rotated(tenant)
        save_keyring(ring, path)
        return path, key_id

    path, key_id = _sync(run, as_json)
    if as_json:
        print(json.dumps({"keyring": str(path), "tenant": tenant, "active": key_id}))
    else:
        console.print(f"tenant {shown(repr(tenant))}: key {shown(key_id)} is active in "
                      f"{shown(path)}")


@keys_app.command("list")
def list_keys(keyring: KeyRing = None, config: Config = None, as_json: AsJson = False) -> None:
    """The tenants of the key ring, their key ids and active key (never the keys)."""
    from meshpoint.history.encryption import load_keyring

    ring = _sync(lambda: load_keyring(_keyring_path(keyring, config)), as_json)
    rows: list[dict[str, Any]] = [
        {"tenant": t, "active": ring.active.get(t), "keys": sorted(keys)}
        for t, keys in sorted(ring.keys.items())]
    if as_json:
        print(json.dumps({"tenants": rows}))
        return
    table = Table(title="encryption keys")
    for column in ("tenant", "active", "key ids"):
        table.add_column(column)
    for row in rows:
        table.add_row(shown(row["tenant"]), shown(row["active"]),
                      shown(", ".join(row["keys"])))
    console.print(table)


@keys_app.command()
def shred(tenant: Annotated[str, typer.Option("--tenant", help="Whose keys.")],
          yes: Annotated[bool, typer.Option("--yes", help="Confirm: this cannot be "
                                            "undone.")] = False,
          keyring: KeyRing = None, config: Config = None, as_json: AsJson = False) -> None:
    """Crypto-shredding: delete every key of TENANT. Its encrypted fields can never be
    read again (by anyone, from any backup that lacks the keys); its chains still
    verify, since each record's hash covers the ciphertext."""
    from meshpoint.history.encryption import load_keyring, save_keyring

    if not yes:
        err.print("[red]error:[/red] this deletes the keys for good; confirm with --yes")
        raise typer.Exit(code=2)

    def run() -> Path:
        path = _keyring_path(keyring, config)
        ring = load_keyring(path)
        if tenant not in ring.keys:
            raise InvalidArgumentError(f"the key ring {path} has no keys of tenant {tenant!r}")
        save_keyring(ring.shredded(tenant), path)
        return path

    path = _sync(run, as_json)
    if as_json:
        print(json.dumps({"keyring": str(path), "tenant": tenant, "shredded": True}))
    else:
        console.print(f"tenant {shown(repr(tenant))}: every key deleted from {shown(path)}")


def _sync(run: Callable[[], R], as_json: bool) -> R:
    try:
        return run()
    except MeshpointError as error:
        fail(error, as_json)


def history_commands(app: typer.Typer) -> None:
    """Register this module's commands on the ``meshpoint`` app."""
    app.command()(verify)
    app.command()(purge)
    app.add_typer(keys_app, name="keys")
