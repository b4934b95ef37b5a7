"""The README's store example runs as written."""

from __future__ import annotations

import os
import re
from pathlib import Path

README = Path(__file__).parents[2] / "README.md"


def test_the_readme_store_example_runs(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    code = re.search(r"```python\n(.*?)```", README.read_text(), re.S)
    assert code is not None, "the README lost its Python example"
    cwd = os.getcwd()
    os.chdir(tmp_path)  # the example writes meshpoint.db in the working directory
    try:
        exec(compile(code.group(1), str(README), "exec"), {"__name__": "__readme__"})
    finally:
        os.chdir(cwd)
    assert "('task-42/a', {'text': 'A is...'})" in capsys.readouterr().out
