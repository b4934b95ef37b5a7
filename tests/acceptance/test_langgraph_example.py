"""``examples/langgraph_interrupt.py`` as real processes: a LangGraph graph that stops at
``interrupt()`` in one process and is resumed with ``Command(resume=...)`` in another,
through meshpoint's saver, on a SQLite file and on PostgreSQL (issue 16 §3)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import pg_execute_async

pytest.importorskip("langgraph")

EXAMPLE = Path(__file__).parents[2] / "examples" / "langgraph_interrupt.py"


def run(*args: str) -> tuple[int, dict[str, Any]]:
    done = subprocess.run([sys.executable, str(EXAMPLE), *args], capture_output=True,
                          text=True, timeout=120)
    assert done.stderr == "", done.stderr
    return done.returncode, json.loads(done.stdout.strip().splitlines()[-1])


def start_then_resume(url: str, *options: str) -> None:
    code, started = run("start", "--url", url, "--thread", "trip-1", *options)
    assert code == 0
    assert started == {"waiting_for": [{"question": "Book this trip?", "plan": (
        "2 nights in Lisbon for: a quiet hotel near the river")}], "next": ["approve"]}
    code, second = run("start", "--url", url, "--thread", "trip-2", *options)
    assert code == 0 and second["next"] == ["approve"]
    # Resumed by other processes: plan ran once (in the first), the answer is used.
    code, resumed = run("resume", "--url", url, "--thread", "trip-1", "--answer", "approve",
                        *options)
    assert (code, resumed) == (0, {"decision": "approve",
                                   "log": ["planned", "human said approve", "booked"]})
    code, denied = run("resume", "--url", url, "--thread", "trip-2", "--answer", "deny",
                       *options)
    assert denied["log"] == ["planned", "human said deny", "not booked"]
    code, again = run("resume", "--url", url, "--thread", "trip-1", *options)
    assert code == 1 and "not waiting" in again["error"]


def test_interrupt_in_one_process_resume_in_another_on_sqlite(tmp_path: Path) -> None:
    start_then_resume(f"sqlite:///{tmp_path / 'trips.db'}")


@pytest.mark.postgres
async def test_interrupt_in_one_process_resume_in_another_on_postgresql(
        postgres_url: str) -> None:
    import uuid

    schema = f"mp_example_{uuid.uuid4().hex[:8]}"
    await pg_execute_async(f"CREATE SCHEMA {schema}")
    try:
        start_then_resume(postgres_url, "--schema", schema)
    finally:
        await pg_execute_async(f"DROP SCHEMA {schema} CASCADE")
