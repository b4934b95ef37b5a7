"""The README's Python examples, and the whole programs of the docs, run as written;
the benchmark results kept are those the docs cite."""

from __future__ import annotations

import os
import re
import sqlite3
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
README = ROOT / "README.md"
BENCHMARKS = ROOT / "docs" / "benchmarks.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md")), ROOT / "examples" / "README.md"]
RESULT = re.compile(r"\d{4}-\d\d-\d\dT\d{6}Z-[a-z0-9-]+\.json")
MAX_RESULTS = 12


def examples(page: Path) -> list[str]:
    """The page's Python blocks: on the README every one, elsewhere the whole programs
    (those that run themselves with ``asyncio.run(main())``), not the fragments."""
    blocks = re.findall(r"```python\n(.*?)```", page.read_text(), re.S)
    if page == README:
        return blocks
    return [block for block in blocks if "\nasyncio.run(main())" in block]


@pytest.mark.parametrize(("page", "index", "expected", "live"), [
    ("README.md", 0, "('task-42/a', {'text': 'A is...'})", None),  # the store
    ("README.md", 1, "completed Answer to 'Plan a trip: flights, hotels'", "mesh.db"),
    ("README.md", 2, "{'question': 'Book this?', 'plan': '2 nights in Lisbon'}\n"
                     "{'plan': '2 nights in Lisbon', 'decision': 'approve'}", None),
    ("docs/runtime.md", 0, "refund {'query': 'Refund order 1042'}\ncompleted Answer to "
                           "'Refund order 1042':\n- refund(Refund order 1042) = refunded "
                           "half of order 1042", "approvals.db"),  # approvals
    ("docs/a2a.md", 0, "True book\nTrue - ask_flights(flights) = [flights] flights",
     "a2a.db"),  # a stock A2A client through the gateway
    ("docs/history.md", 0, "2 completed 0.00036 k1\n1 waiting_peers 0.00036 k1\nTrue", None),
    ("docs/handoff.md", 0, "completed 12\n1 context_utilization True\n"
                           "2 context_utilization True\n3 context_utilization True",
     "handoff.db"),
    ("docs/workflows.md", 0, "completed reviser, call 1, on 'Heat pumps'\n{'web': 1, 'papers': 1, "
                             "'writer': 1, 'critic': 2, 'reviser': 1}", "workflows.db"),
], ids=["store", "runtime", "langgraph-saver", "approvals", "a2a", "history", "handoff",
        "workflows"])
def test_the_examples_run(page: str, index: int, expected: str, live: str | None,
                          tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    found = examples(ROOT / page)
    assert len(found) > index, f"{page} lost a Python example"
    cwd = os.getcwd()
    os.chdir(tmp_path)  # the examples write their database in the working directory
    try:
        exec(compile(found[index], str(ROOT / page), "exec"), {"__name__": "__readme__"})
    finally:
        os.chdir(cwd)
    assert expected in capsys.readouterr().out
    if live is not None:  # the runtime's examples leave no live row behind
        with sqlite3.connect(tmp_path / live) as conn:
            assert conn.execute("SELECT count(*) FROM agent_paused_tasks").fetchone() == (0,)


def test_every_example_of_the_docs_is_run() -> None:
    """A whole program added to a page is added to the test above, not left unrun."""
    counted = {page.name: len(examples(page)) for page in PAGES if examples(page)}
    assert counted == {"README.md": 3, "runtime.md": 1, "a2a.md": 1, "history.md": 1,
                       "handoff.md": 1, "workflows.md": 1}


def cited(page: Path) -> set[str]:
    return set(RESULT.findall(page.read_text()))


def test_the_benchmark_results_kept_are_those_the_docs_cite() -> None:
    """benchmarks/results/ keeps a run only while docs/benchmarks.md cites it (new runs
    are ignored by git), and at most twelve; every file the README or a docs page
    cites is one of them, and is there."""
    results = ROOT / "benchmarks" / "results"
    kept = cited(BENCHMARKS)
    assert kept, "docs/benchmarks.md cites no benchmark result"
    assert len(kept) <= MAX_RESULTS, (
        f"docs/benchmarks.md cites {len(kept)} result files; keep at most {MAX_RESULTS}")
    elsewhere = {name: page.name for page in PAGES for name in cited(page) - kept}
    assert elsewhere == {}, f"cited, but not by docs/benchmarks.md: {elsewhere}"
    missing = sorted(name for name in kept if not (results / name).is_file())
    assert missing == [], f"docs/benchmarks.md cites results not in {results}: {missing}"
    listed = subprocess.run(["git", "-C", str(ROOT), "ls-files", "benchmarks/results"],
                            capture_output=True, text=True, check=False)
    tracked = listed.stdout.split() if listed.returncode == 0 else []
    if tracked:  # a git checkout: nothing else is committed
        assert {Path(name).name for name in tracked} == kept
