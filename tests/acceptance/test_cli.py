"""The real ``meshpoint`` command, run as a subprocess."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path

from meshpoint.store.engine import head_revision


def meshpoint(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "meshpoint.cli", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=120)


def test_demo_completes_every_task_while_instances_are_killed(tmp_path: Path) -> None:
    done = meshpoint("demo", "--tasks", "80", "--fan-out", "4", "--instances", "3",
                     "--kill-rate", "3", "--stall-rate", "0.05", "--json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    figures = json.loads(done.stdout)
    assert figures["submitted"] == figures["completed"] == 80 and figures["failed"] == 0
    assert figures["kills"] > 0  # instances really died mid-run
    assert figures["checkpoints_written"] >= 80
    assert figures["resumed"] >= 80 and figures["resumed_elsewhere"] > 0
    assert figures["timeouts"] > 0  # stalled peers timed out and the tasks went on
    assert figures["rows_left"] == 0
    # A share of the bookings waited for the approver, who answered each once: the
    # tasks completed all the same (a denied booking is reported to the model).
    assert figures["approvals_requested"] > 0
    assert figures["approved"] + figures["approved_edited"] + figures["denied"] \
        == figures["approvals_requested"]
    assert figures["approved"] > 0 and figures["denied"] > 0
    # A twentieth are workflow tasks: each of their three stages ran once.
    assert figures["workflow_tasks"] == figures["workflow_completed"] == 4
    assert figures["stages_run"] == 3 * 4 and figures["stages_run_again"] == 0
    for key in ("checkpoint_write_ms", "pause_resume_ms"):
        assert set(figures[key]) == {"p50", "p99"}
        assert 0 < figures[key]["p50"] <= figures[key]["p99"]


def test_demos_long_tasks_hand_off_across_instances_while_they_are_killed(
        tmp_path: Path) -> None:
    """A fifth of 40 tasks are long ones: each hands off at least twice (the model's
    own request and context utilization, never at 0.70 of its window or past it),
    mostly to another instance, while researcher instances are killed; each
    completes, and the chains, handoff and iteration records included, verify."""
    done = meshpoint("demo", "--tasks", "40", "--long-rate", "0.2", "--kill-rate", "3",
                     "--json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    figures = json.loads(done.stdout)
    assert figures["long_tasks"] == figures["long_completed"] == 8
    assert figures["submitted"] == figures["completed"] == 40
    assert figures["fewest_handoffs_per_long_task"] >= 2
    # Each handoff starts one iteration: a task's iterations are its handoffs plus one.
    assert figures["iterations"] == figures["handoffs"] + figures["long_tasks"]
    assert set(figures["handoffs_by_trigger"]) == {"context_utilization", "explicit"}
    assert sum(figures["handoffs_by_trigger"].values()) == figures["handoffs"]
    assert 0 < figures["max_utilization_at_handoff"] < 0.70
    assert figures["handoffs_taken_elsewhere"] > 0
    assert figures["researcher_kills"] > 0
    assert figures["chains_verified"] == 40 and figures["chains_failed"] == 0
    assert figures["rows_left"] == 0 and figures["duplicate_answers"] == 0
    assert isinstance(figures["long_recoveries"], int)
    # The breakers may trip in this kill storm (their cool-down is a second): each trip
    # is alerted, and closes again (every task completed).
    assert figures["alerts"] >= figures["breaker_trips"] >= 0
    assert figures["resumes_held_by_the_breaker"] >= 0
    url = f"sqlite:///{tmp_path / 'meshpoint-demo.db'}"
    done = meshpoint("events", "--type", "agent_handoff", "--url", url, "--limit", "1000",
                     "--json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    logged = json.loads(done.stdout)["events"]
    assert logged and {e["agent_id"] for e in logged} == {"researcher"}


def test_demo_prints_a_progress_bar_and_a_table(tmp_path: Path) -> None:
    done = meshpoint("demo", "--tasks", "20", "--instances", "2", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "tasks answered" in done.stdout  # the progress bar's label
    assert "tasks completed" in done.stdout and "pause-to-resume p50 / p99" in done.stdout
    assert "approvals requested" in done.stdout
    assert "handoffs by trigger" in done.stdout  # one of the 20 is a long task
    assert "workflow tasks completed (sequential, 3 stages)" in done.stdout  # and one a workflow
    assert "max context use at a handoff (< 0.7)" in done.stdout
    assert "breaker trips · resumes it held · alerts" in done.stdout
    assert "nothing left behind" in done.stdout
    assert "meshpoint dashboard --url sqlite:///meshpoint-demo.db" in done.stdout


def test_demo_rejects_bad_options(tmp_path: Path) -> None:
    done = meshpoint("demo", "--tasks", "0", cwd=tmp_path)
    assert done.returncode == 2 and "--tasks" in done.stderr


def test_migrate_then_stats(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'ops.db'}"
    assert meshpoint("stats", "--url", url, cwd=tmp_path).returncode == 1  # not migrated
    done = meshpoint("migrate", "--url", url, cwd=tmp_path)
    assert done.returncode == 0 and "up to date" in done.stdout
    done = meshpoint("migrate", "--url", url, "--json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"up_to_date": True, "revision": head_revision(),
                                       "dialect": "sqlite", "runtime_role": None,
                                       "tenant_roles": {}}
    for roles in (("--runtime-role", "rt"), ("--tenant-role", "rt=acme")):
        done = meshpoint("migrate", "--url", url, *roles, "--json", cwd=tmp_path)
        assert done.returncode == 1 and json.loads(done.stdout)["kind"] == \
            "ConfigurationError"
    done = meshpoint("migrate", "--url", url, "--tenant-role", "rt", cwd=tmp_path)
    assert done.returncode == 2 and "ROLE=TENANT" in done.stderr
    done = meshpoint("stats", "--url", url, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "pending sub-tasks: 0" in done.stdout


def test_bad_urls_fail_with_a_message_not_a_traceback(tmp_path: Path) -> None:
    done = meshpoint("migrate", "--url", "mysql://x/y", cwd=tmp_path)
    assert done.returncode == 1
    assert "unsupported store URL scheme" in done.stderr
    assert "postgres://" in " ".join(done.stderr.split())  # accepted, so named
    assert "Traceback" not in done.stderr
    done = meshpoint("stats", "--url", f"sqlite:///{tmp_path / 'empty.db'}", cwd=tmp_path)
    assert "meshpoint migrate" in done.stderr and "Traceback" not in done.stderr
    done = meshpoint("stats", "--url", f"sqlite:///{tmp_path / 'x.db'}", "--schema", "s",
                     cwd=tmp_path)
    assert done.returncode == 2 and "--schema" in done.stderr, done.stderr
    done = meshpoint("stats", "--url", f"sqlite:///{tmp_path / 'x.db'}", "--tenant", "",
                     "--json", cwd=tmp_path)  # not taken for the default tenant
    assert done.returncode == 1
    assert json.loads(done.stdout) == {"error": "tenant_id must be a str of 1 to 64 "
                                       "characters, got ''", "kind": "InvalidArgumentError"}


def test_demo_refuses_to_replace_a_file_that_is_not_its_own(tmp_path: Path) -> None:
    precious = tmp_path / "notes.db"
    precious.write_text("my notes")
    done = meshpoint("demo", "--db", str(precious), "--tasks", "5", cwd=tmp_path)
    assert done.returncode == 1 and "is not a meshpoint database" in done.stderr
    assert precious.read_text() == "my notes"


def test_demo_replaces_its_own_database_and_no_other_meshpoint_database(
        tmp_path: Path) -> None:
    db = tmp_path / "demo.db"
    for _ in range(2):  # a second run replaces the first's database
        done = meshpoint("demo", "--db", str(db), "--tasks", "5", "--kill-rate", "0",
                         "--json", cwd=tmp_path)
        assert done.returncode == 0, done.stderr
    writer = ("import asyncio\nfrom meshpoint import open_store\n"
              "from meshpoint.events.log import EventStore\n"
              "async def main():\n"
              f"    async with open_store({f'sqlite:///{db}'!r}) as store:\n"
              "        async with EventStore(store) as log:\n"
              "            log.log_event('billing', 't', 'step_start')\n"
              "asyncio.run(main())\n")
    subprocess.run([sys.executable, "-c", writer], cwd=tmp_path, check=True, timeout=60)
    done = meshpoint("demo", "--db", str(db), "--tasks", "5", cwd=tmp_path)
    assert done.returncode == 1, done.stdout
    assert "data the demo did not write (of billing)" in " ".join(done.stderr.split())
    with sqlite3.connect(db) as conn:  # left as it was
        assert conn.execute("SELECT count(*) FROM agent_events WHERE agent_name = "
                            "'billing'").fetchone() == (1,)
        # the demo's own agents, as another tenant, are not the demo's either
        conn.execute("UPDATE agent_events SET agent_name = 'coordinator', "
                     "tenant_id = 'acme' WHERE agent_name = 'billing'")
    done = meshpoint("demo", "--db", str(db), "--tasks", "5", cwd=tmp_path)
    assert done.returncode == 1
    assert "(of tenant acme)" in " ".join(done.stderr.split()), done.stderr


def test_demo_deletes_no_wal_or_shm_file_that_is_not_its_own(tmp_path: Path) -> None:
    """``-wal`` and ``-shm`` files are checked as the database is: beside no database,
    beside one that is not the demo's, or not SQLite's at all, they are left alone."""
    db = tmp_path / "trip.db"
    wal, shm = Path(f"{db}-wal"), Path(f"{db}-shm")
    wal.write_text("my notes")  # no trip.db at all: these are not the demo's
    shm.write_text("my other notes")
    done = meshpoint("demo", "--db", str(db), "--tasks", "5", cwd=tmp_path)
    assert done.returncode == 1, done.stdout
    said = " ".join(done.stderr.split())
    assert f"{wal} exists but {db} does not" in said, said
    assert wal.read_text() == "my notes" and shm.read_text() == "my other notes"
    assert not db.exists()

    db.write_text("my database")  # beside a file that is not the demo's
    done = meshpoint("demo", "--db", str(db), "--tasks", "5", cwd=tmp_path)
    assert done.returncode == 1 and "is not a SQLite write-ahead log" in " ".join(
        done.stderr.split()), done.stderr
    assert db.read_text() == "my database"
    assert wal.read_text() == "my notes" and shm.read_text() == "my other notes"

    # Beside a meshpoint database of the demo's kind, but not SQLite's files (written
    # after the database is made: SQLite removes a stray log when it creates one).
    db.unlink()
    assert meshpoint("migrate", "--url", f"sqlite:///{db}", cwd=tmp_path).returncode == 0
    wal.write_text("my notes")
    shm.write_text("my other notes")
    done = meshpoint("demo", "--db", str(db), "--tasks", "5", cwd=tmp_path)
    assert done.returncode == 1, done.stdout
    said = " ".join(done.stderr.split())
    assert f"{wal} is not a SQLite write-ahead log" in said, said
    assert wal.read_text() == "my notes" and shm.read_text() == "my other notes"
    wal.unlink()
    done = meshpoint("demo", "--db", str(db), "--tasks", "5", cwd=tmp_path)
    assert done.returncode == 1 and f"{shm} is not a SQLite shared-memory index" in " ".join(
        done.stderr.split()), done.stderr
    assert shm.read_text() == "my other notes" and db.exists()


def test_demo_replaces_its_database_with_its_wal_and_shm(tmp_path: Path) -> None:
    """SQLite's own -wal and -shm beside a previous demo's database go with it (a
    killed demo leaves them)."""
    db = tmp_path / "trip.db"
    assert meshpoint("migrate", "--url", f"sqlite:///{db}", cwd=tmp_path).returncode == 0
    conn = sqlite3.connect(db)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA wal_autocheckpoint=0")
    conn.execute("PRAGMA user_version = 7")  # in the WAL only, until a checkpoint
    conn.commit()
    wal, shm = Path(f"{db}-wal"), Path(f"{db}-shm")
    kept = {path: path.read_bytes() for path in (wal, shm)}
    conn.close()  # the last connection checkpoints and deletes them: put them back
    for path, data in kept.items():
        path.write_bytes(data)
    done = meshpoint("demo", "--db", str(db), "--tasks", "5", "--kill-rate", "0", "--json",
                     cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["completed"] == 5
