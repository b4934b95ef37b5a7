"""The README's Python examples run as written."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

README = Path(__file__).parents[2] / "README.md"
EXAMPLES = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)


@pytest.mark.parametrize(("index", "expected"), [
    (0, "('task-42/a', {'text': 'A is...'})"),   # the store
    (1, "completed Answer to 'Plan a trip: flights, hotels'"),  # the runtime
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
