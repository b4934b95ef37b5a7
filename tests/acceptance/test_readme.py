"""The README's Python examples run as written."""

from __future__ import annotations

import os
import re
import sqlite3
import subprocess
from pathlib import Path

import pytest

README = Path(__file__).parents[2] / "README.md"
EXAMPLES = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)


@pytest.mark.parametrize(("index", "expected"), [
    (0, "('task-42/a', {'text': 'A is...'})"),   # the store
    (1, "completed Answer to 'Plan a trip: flights, hotels'"),  # the runtime
    (2, "refund {'query': 'Refund order 1042'}\ncompleted Answer to 'Refund order 1042':\n"
        "- refund(Refund order 1042) = refunded half of order 1042"),  # approvals
    (3, "2 completed 0.00036 k1\n1 waiting_peers 0.00036 k1\nTrue"),  # the history
])
def test_the_readme_examples_run(index: int, expected: str, tmp_path: Path,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    assert len(EXAMPLES) > index, "the README lost a Python example"
    cwd = os.getcwd()
    os.chdir(tmp_path)  # the examples write their database in the working directory
    try:
        exec(compile(EXAMPLES[index], str(README), "exec"), {"__name__": "__readme__"})
    finally:
        os.chdir(cwd)
    assert expected in capsys.readouterr().out
    live = {1: "mesh.db", 2: "approvals.db"}.get(index)
    if live is not None:  # the runtime's examples leave no live row behind
        with sqlite3.connect(tmp_path / live) as conn:
            assert conn.execute("SELECT count(*) FROM agent_paused_tasks").fetchone() == (0,)


def test_the_benchmark_results_kept_are_those_the_readme_cites() -> None:
    """benchmarks/results/ keeps a run only while the README cites it (new runs are
    ignored by git); every file the README cites is there."""
    results = README.parent / "benchmarks" / "results"
    cited = set(re.findall(r"\d{4}-\d\d-\d\dT\d{6}Z-[a-z0-9-]+\.json", README.read_text()))
    assert cited, "the README cites no benchmark result"
    missing = sorted(name for name in cited if not (results / name).is_file())
    assert missing == [], f"the README cites results that are not in {results}: {missing}"
    listed = subprocess.run(["git", "-C", str(README.parent), "ls-files", "benchmarks/results"],
                            capture_output=True, text=True, check=False)
    tracked = listed.stdout.split() if listed.returncode == 0 else []
    if tracked:  # a git checkout: nothing else is committed
        assert {Path(name).name for name in tracked} == cited
