"""A verifier's view of the checkpoint history from the command line, on a SQLite file
and on PostgreSQL: a config holding only public keys (no ``agents:``) runs ``meshpoint
verify``, ``purge``, ``tasks cost`` and ``tasks show``, and none of them takes a chain
forged by someone who can write the database but holds no key for a signed one."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from meshpoint.history.integrity import SigningKeys
from meshpoint.history.planning import HistoryOptions
from meshpoint.store import open_store
from tests.acceptance.test_cli_history import meshpoint
from tests.integration.test_history import _ended_with, three_checkpoints
from tests.integration.test_history_security import _decide, forge


def verifier_config(where: Path, url: str, options: dict[str, Any], keys: SigningKeys) -> Path:
    """A verifier's config: the store and the signing key's public half, nothing else."""
    public = where / "k1.pub.pem"
    public.write_text(keys.public_pem("k1"))
    store = json.dumps({"url": url, **({"schema": options["schema"]}
                                       if "schema" in options else {})})  # YAML too
    config = where / "verifier.yaml"
    config.write_text(f"store: {store}\n"
                      "history:\n"
                      f"  signing: {{keys: {{k1: 'file:{public}'}}}}\n")
    return config


def run_json(*args: str, cwd: Path) -> tuple[int, Any]:
    done = meshpoint(*args, "--json", cwd=cwd)
    try:
        return done.returncode, json.loads(done.stdout)
    except json.JSONDecodeError:
        raise AssertionError(f"exit {done.returncode}: {done.stdout}{done.stderr}") from None


async def test_a_public_key_config_verifies_and_refuses_a_chain_forged_without_the_key(
        empty_database: tuple[str, dict[str, Any]], tmp_path: Path) -> None:
    url, options = empty_database
    keys = SigningKeys.generate("k1")
    async with open_store(url, history=HistoryOptions(signing=keys), **options) as signed:
        await three_checkpoints(signed)  # t1: paused, 3 records
        await _ended_with(signed, "ended", "last:1")  # 4 records, 3 a purge may cut
        config = str(verifier_config(tmp_path, url, options, keys))

        code, report = run_json("verify", "--all", "--config", config, cwd=tmp_path)
        assert code == 0, report
        assert (report["ok"], report["failed"], report["signatures_checked"]) == (2, 0, True)

        await forge(signed, 2, _decide)  # t1's record 2 changed, its chain recomputed
        code, report = run_json("verify", "--all", "--config", config, cwd=tmp_path)
        assert code == 1 and report["signatures_checked"] is False, report
        (bad,) = [r for r in report["reports"] if not r["ok"]]
        assert (bad["task_id"], bad["first_bad_seq"]) == ("t1", 2), bad
        assert "not signed" in bad["reason"] and not bad["signatures_checked"]
        done = meshpoint("verify", "--task", "t1", "--config", config, cwd=tmp_path)
        assert done.returncode == 1 and "not signed" in " ".join(done.stdout.split())

        # The history reads refuse what verify refuses.
        code, shown = run_json("tasks", "cost", "t1", "--config", config, cwd=tmp_path)
        assert code == 1 and shown["kind"] == "HistoryIntegrityError" and "not signed" in \
            shown["error"], shown
        code, shown = run_json("tasks", "show", "t1", "--config", config, cwd=tmp_path)
        assert code == 0 and shown["verified"] is False, shown
        assert "not signed" in shown["integrity_error"]

        # A purge with the verifier's config (or none) cannot sign: it leaves the signed
        # chain alone and says so, in JSON and in its table.
        for how in (("--config", config), ("--url", url, *(
                ("--schema", options["schema"]) if "schema" in options else ()))):
            code, purged = run_json("purge", *how, cwd=tmp_path)
            assert code == 0, purged
            assert (purged["chains"], purged["records_removed"], purged["skipped"]) == \
                (0, 0, 1), purged
            (left,) = purged["purges"]
            assert left["task_id"] == "ended" and "no signing key" in left["skipped"]
            done = meshpoint("purge", *how, cwd=tmp_path)
            said = " ".join(done.stdout.split())
            assert done.returncode == 0 and "skipped: its chain is signed" in said, said
            assert "1 chain(s) left alone" in said, said
        code, report = run_json("verify", "--task", "ended", "--config", config, cwd=tmp_path)
        assert code == 0 and report["reports"][0]["records"] == 4


def test_a_config_without_agents_serves_no_agent_and_says_so(tmp_path: Path) -> None:
    config = tmp_path / "verifier.yaml"
    config.write_text(f"store: sqlite:///{tmp_path / 'none.db'}\n")
    done = meshpoint("serve", "--agent", "coordinator", "--config", str(config), cwd=tmp_path)
    assert done.returncode != 0
    said = " ".join(done.stderr.split())
    assert "no agent 'coordinator' in the config (it defines none: add it under " \
        "agents:)" in said, said
