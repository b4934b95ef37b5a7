"""The SQL files (store/sql/, an integration's sql/) are the statements the store runs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from meshpoint.store import render
from meshpoint.store.statement import registered


def test_every_statement_is_rendered_and_no_file_is_stale() -> None:
    stale = render.stale()
    assert stale == [], f"stale SQL files (run `make sql`): {stale}"


def test_a_changed_statement_makes_its_file_stale(tmp_path: Path) -> None:
    render.write(tmp_path)
    assert render.stale(tmp_path) == []
    victim = sorted(tmp_path.glob("*.sql"))[0]
    victim.write_text(victim.read_text().replace("WHERE", "WHERE 1 = 1 AND", 1))
    (tmp_path / "gone.sqlite.sql").write_text("-- a statement that no longer exists.\n")
    assert render.stale(tmp_path) == sorted([victim.name, "gone.sqlite.sql"])
    assert sorted(render.write(tmp_path)) == sorted([victim.name, "gone.sqlite.sql"])
    assert render.stale(tmp_path) == []


def test_each_file_opens_with_one_line_on_what_it_does() -> None:
    for statement in registered():
        for dialect in statement.dialects:
            text = render.path(statement, dialect).read_text()
            first, _, sql = text.partition("\n")
            assert first == f"-- {statement.doc}" and sql.strip().endswith(";")


def test_the_dialect_modules_build_their_statements_whatever_ran_before() -> None:
    """Statements built on a portable clause (the PostgreSQL first checkpoint adds
    RETURNING to insert_task's) must not inherit what compiling that clause memoized:
    a process that ran SQLite statements before it first opened PostgreSQL could not
    import the PostgreSQL module (its first checkpoint saw no returned column)."""
    script = (
        "from sqlalchemy.dialects import sqlite\n"
        "from meshpoint.store.statement import registered\n"
        "import meshpoint.store.queries\n"
        "for s in registered():\n"
        "    if 'sqlite' in s.dialects: s.compiled(sqlite.dialect())\n"
        "import meshpoint.store.postgres\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
