"""The vendored A2A TCK (tests/vendor/a2a_tck) stays what its README says: every
requirement of its venv pinned (the venv is cached by the file's hash), every change
to the kit's code marked and listed, and its results table readable."""

from __future__ import annotations

from tests import a2a_tck


def test_every_requirement_of_the_kits_venv_is_pinned() -> None:
    lines = [line.strip() for line in a2a_tck.REQUIREMENTS.read_text().splitlines()
             if line.strip() and not line.startswith("#")]
    assert lines and all("==" in line for line in lines), lines
    assert any(line.startswith("pytest-json-report==") for line in lines)
    assert a2a_tck.venv_dir().name.startswith("a2a-tck-")


def test_every_change_to_the_kit_is_listed_in_its_readme() -> None:
    readme = (a2a_tck.KIT / "README.md").read_text()
    changed = sorted(str(p.relative_to(a2a_tck.KIT)) for p in a2a_tck.KIT.rglob("*.py")
                     if "# meshpoint:" in p.read_text())
    assert changed, "the kit's own bugs are fixed in place, each marked '# meshpoint:'"
    assert [p for p in changed if f"`{p}`" not in readme] == []
    assert "Apache License" in (a2a_tck.KIT / "LICENSE").read_text()


def test_the_results_table_has_a_row_per_category() -> None:
    mandatory = a2a_tck.Result("mandatory", {"a": "passed", "b": "skipped"}, 12.3)
    quality = a2a_tck.Result("quality", {"c": "failed", "d": "error"}, 1.0)
    rows = a2a_tck.table([mandatory, quality]).splitlines()
    assert rows[0].split() == ["category", "passed", "failed", "skipped", "error",
                               "seconds"]
    assert rows[1].split() == ["mandatory", "1", "0", "1", "0", "12"]
    assert rows[2].split() == ["quality", "0", "1", "0", "1", "1"]
    assert quality.failing() == ["c", "d"] and mandatory.failing() == []
