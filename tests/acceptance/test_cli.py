"""The real ``meshpoint`` command, run as a subprocess."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path


def meshpoint(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "meshpoint.cli", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=120)


def test_demo_resolves_every_sub_task_once_and_resumes_every_task_once(tmp_path: Path) -> None:
    done = meshpoint("demo", "--tasks", "60", "--fan-out", "4", "--instances", "3",
                     "--json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    figures = json.loads(done.stdout)
    assert figures["sub_tasks"] == 240
    assert figures["answered"] + figures["timed_out"] == 240
    assert figures["timed_out"] > 0  # some peers never answer
    assert figures["resumed"] == 60 and sum(figures["resumed_by_instance"].values()) == 60
    # Every answer was delivered twice: all but the winners were ignored.
    assert figures["duplicates_ignored"] == figures["deliveries"] - figures["answered"]
    assert figures["rows_left"] == 0
    assert set(figures["checkpoint_write_ms"]) == {"p50", "p99"}


def test_demo_prints_a_table(tmp_path: Path) -> None:
    done = meshpoint("demo", "--tasks", "20", "--instances", "2", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "tasks resumed (exactly once each)" in done.stdout
    assert "nothing left behind" in done.stdout


def test_migrate_then_stats(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'ops.db'}"
    assert meshpoint("stats", "--url", url, cwd=tmp_path).returncode == 1  # not migrated
    done = meshpoint("migrate", "--url", url, cwd=tmp_path)
    assert done.returncode == 0 and "up to date" in done.stdout
    done = meshpoint("stats", "--url", url, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "pending sub-tasks: 0" in done.stdout


def test_bad_urls_fail_with_a_message_not_a_traceback(tmp_path: Path) -> None:
    done = meshpoint("migrate", "--url", "mysql://x/y", cwd=tmp_path)
    assert done.returncode == 1
    assert "unsupported store URL scheme" in done.stderr
    assert "Traceback" not in done.stderr
    done = meshpoint("stats", "--url", f"sqlite:///{tmp_path / 'empty.db'}", cwd=tmp_path)
    assert "meshpoint migrate" in done.stderr and "Traceback" not in done.stderr


def test_demo_refuses_to_replace_a_file_that_is_not_its_own(tmp_path: Path) -> None:
    precious = tmp_path / "notes.db"
    precious.write_text("my notes")
    done = meshpoint("demo", "--db", str(precious), "--tasks", "5", cwd=tmp_path)
    assert done.returncode == 1 and "is not a meshpoint database" in done.stderr
    assert precious.read_text() == "my notes"
