"""Every benchmark still imports: nothing else runs them between `make bench` runs, so a
name moved in the package would otherwise break one unseen (as it once did)."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.mark.parametrize("name", sorted(p.stem for p in BENCHMARKS.glob("bench_*.py")))
def test_a_benchmark_imports(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(BENCHMARKS))  # as `python benchmarks/<name>.py` runs it
    try:
        module = importlib.import_module(name)
    finally:
        sys.modules.pop(name, None)
        sys.modules.pop("_results", None)
    assert callable(module.main)
