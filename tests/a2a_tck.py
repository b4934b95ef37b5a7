"""The A2A project's conformance kit (vendored in tests/vendor/a2a_tck, see its
README.md) run against an A2A server: its own venv, its categories, their results.

The kit's dependencies (grpcio, pyOpenSSL, aiohttp, deepdiff, pytest 9.2…) are not
meshpoint's: :func:`kit_python` builds a venv of its own from the kit's pinned
``requirements.txt``, once per machine, under ``~/.cache/meshpoint/a2a-tck-<hash>``
(the hash of that file: a new pin builds a new venv). :func:`run_category` runs one
category of the kit in a subprocess of that venv and reads its JSON report; nothing is
written into the repository (no cache, no bytecode, the report in a temporary dir).

By hand (a gateway listening on PORT)::

    python -m tests.a2a_tck http://localhost:PORT [mandatory capabilities quality]
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

KIT = Path(__file__).resolve().parent / "vendor" / "a2a_tck"
REQUIREMENTS = KIT / "requirements.txt"
CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "meshpoint"

#: Each category as the kit's run_tck.py selects it for a JSON-RPC run: its directory
#: and its markers (``mandatory`` with ``--transports jsonrpc`` adds ``mandatory_jsonrpc``).
CATEGORIES: dict[str, tuple[str, str | None]] = {
    "mandatory": ("tests/mandatory/", "mandatory or mandatory_protocol or mandatory_jsonrpc"),
    "capabilities": ("tests/optional/capabilities/", None),
    "quality": ("tests/optional/quality/", None),
}
OUTCOMES = ("passed", "failed", "skipped", "xfailed", "xpassed", "error")


def venv_dir() -> Path:
    digest = hashlib.sha256(REQUIREMENTS.read_bytes()).hexdigest()[:16]
    return CACHE / f"a2a-tck-{digest}"


def kit_python() -> tuple[Path, float | None]:
    """The kit venv's python, built if this machine has none for these requirements;
    and the seconds the build took (None: it was cached). Builders on one machine
    take turns (a lock file), and a venv is used only once its build finished."""
    target = venv_dir()
    python = target / "bin" / "python"
    if (target / "ready").exists():
        return python, None
    CACHE.mkdir(parents=True, exist_ok=True)
    with (CACHE / "a2a-tck.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (target / "ready").exists():  # another built it while this one waited
            return python, None
        started = time.monotonic()
        shutil.rmtree(target, ignore_errors=True)  # a build that was interrupted
        try:
            # The base interpreter, not meshpoint's venv: the kit sees none of its packages.
            base = getattr(sys, "_base_executable", sys.executable)
            subprocess.run([base, "-m", "venv", str(target)], check=True,
                           capture_output=True, timeout=300)
            installed = subprocess.run(
                [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                 "-r", str(REQUIREMENTS)], capture_output=True, text=True, timeout=1200)
            if installed.returncode != 0:
                raise RuntimeError(f"installing the kit's requirements failed:\n"
                                   f"{installed.stderr[-3000:]}")
        except BaseException:
            shutil.rmtree(target, ignore_errors=True)
            raise
        (target / "ready").write_text(REQUIREMENTS.read_text())
        return python, time.monotonic() - started


@dataclass
class Result:
    """One category's run: the outcome of each test (its node id), the seconds it took."""

    category: str
    outcomes: dict[str, str] = field(default_factory=dict)
    seconds: float = 0.0
    output: str = ""

    def count(self, outcome: str) -> int:
        return sum(1 for o in self.outcomes.values() if o == outcome)

    def failing(self) -> list[str]:
        return sorted(n for n, o in self.outcomes.items() if o in ("failed", "error"))


def run_category(python: Path, category: str, sut_url: str, *,
                 timeout_s: float = 900.0) -> Result:
    """Run ``category`` of the kit against ``sut_url`` over JSON-RPC and read its
    JSON report."""
    path, markers = CATEGORIES[category]
    with tempfile.TemporaryDirectory(prefix="a2a-tck-") as scratch:
        report = Path(scratch) / "report.json"
        command = [str(python), "-m", "pytest", path, f"--sut-url={sut_url}",
                   "--test-scope=all", "--transports=jsonrpc", "--tb=short", "-q",
                   "-p", "no:cacheprovider", "--json-report", "--json-report-omit=log",
                   f"--json-report-file={report}"]
        if markers:
            command += ["-m", markers]
        env = {k: v for k, v in os.environ.items()
               if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTEST_ADDOPTS")}
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        started = time.monotonic()
        ran = subprocess.run(command, cwd=KIT, env=env, capture_output=True, text=True,
                             timeout=timeout_s)
        result = Result(category, seconds=time.monotonic() - started,
                        output=ran.stdout[-20000:] + ran.stderr[-5000:])
        if not report.exists():
            raise RuntimeError(f"the kit wrote no report ({category}, exit "
                               f"{ran.returncode}):\n{result.output}")
        data = json.loads(report.read_text())
    for test in data.get("tests", []):
        outcome = test["outcome"]
        if any(test.get(stage, {}).get("outcome") == "failed"
               for stage in ("setup", "teardown")) and outcome != "failed":
            outcome = "error"
        result.outcomes[test["nodeid"]] = outcome
    for collector in data.get("collectors", []):
        if collector.get("outcome") == "failed":
            result.outcomes[collector["nodeid"] or "<collection>"] = "error"
    return result


def table(results: list[Result]) -> str:
    """The results as a table: a row per category, a column per outcome."""
    shown = [o for o in OUTCOMES if any(r.count(o) for r in results)] or ["passed"]
    rows = [["category", *shown, "seconds"]]
    rows += [[r.category, *(str(r.count(o)) for o in shown), f"{r.seconds:.0f}"]
             for r in results]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True))
                     for row in rows)


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__)
        return 2
    url, categories = argv[0], argv[1:] or list(CATEGORIES)
    python, built = kit_python()
    if built is not None:
        print(f"built the kit's venv in {built:.0f} s: {python.parent.parent}")
    results = [run_category(python, c, url) for c in categories]
    print(table(results))
    for result in results:
        for name in result.failing():
            print(f"{result.category}: FAILED {name}")
    return 1 if any(r.failing() for r in results if r.category == "mandatory") else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
