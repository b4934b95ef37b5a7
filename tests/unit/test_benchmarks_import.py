"""Every benchmark still imports: nothing else runs them between `make bench` runs, so a
name moved in the package would otherwise break one unseen (as it once did). Each is
imported in a process of its own, as `python benchmarks/<name>.py` would (a benchmark
may define statements, which must not join this process's registry)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCHMARKS = ROOT / "benchmarks"


@pytest.mark.parametrize("name", sorted(p.stem for p in BENCHMARKS.glob("bench_*.py")))
def test_a_benchmark_imports(name: str) -> None:
    done = subprocess.run(
        [sys.executable, "-c", f"import {name}; assert callable({name}.main)"],
        cwd=BENCHMARKS, capture_output=True, text=True, timeout=120, check=False,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(
            [str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])})
    assert done.returncode == 0, done.stderr[-2000:]
