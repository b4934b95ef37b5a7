"""Render every named statement as SQL files, so the store's SQL can be reviewed as SQL.

    python -m meshpoint.store.render          # rewrite src/meshpoint/store/sql/
    python -m meshpoint.store.render --check  # exit 1 if a file there is stale

Each statement (:mod:`meshpoint.store.statement`) becomes one file per dialect it
runs on, ``sql/<name>.<dialect>.sql``, opening with one line on what it does. The
SQL is what the store sends, compiled by SQLAlchemy for that dialect, with two
changes for the reader: placeholders are shown by name (``:p_task``), and values
fixed in the statement itself are shown inline (``status = 'pending'``).
``tests/unit/test_sql_files.py`` fails while a file is stale; ``make sql`` (this
module) brings them up to date. Formatting uses sqlparse, a test dependency.
"""

from __future__ import annotations

import argparse
import functools
import sys
from pathlib import Path
from typing import Any

from sqlalchemy.dialects.postgresql.asyncpg import PGDialect_asyncpg
from sqlalchemy.dialects.sqlite.pysqlite import SQLiteDialect_pysqlite
from sqlalchemy.engine import Dialect

from meshpoint.store import (  # noqa: F401  (they define the statements)
    event_queries,
    history_queries,
    langgraph_queries,
    postgres,
    queries,
)
from meshpoint.store.statement import Statement, registered

SQL_DIR = Path(__file__).parent / "sql"
#: The dialects the store runs on, as their drivers compile, placeholders by name.
DIALECTS: dict[str, Dialect] = {"sqlite": SQLiteDialect_pysqlite(paramstyle="named"),
                                "postgresql": PGDialect_asyncpg(  # type: ignore[no-untyped-call]
                                    paramstyle="named")}


def render(statement: Statement, dialect: Dialect) -> str:
    """The statement's SQL for ``dialect``, formatted, fixed values inline."""
    import sqlparse

    class Compiler(dialect.statement_compiler):  # type: ignore[name-defined, misc]
        def visit_bindparam(self, bindparam: Any, **kw: Any) -> str:
            if not bindparam.key.startswith("p_") and bindparam.value is not None \
                    and bindparam.callable is None:
                kw["literal_binds"] = True  # a value of the statement's own
            result: str = super().visit_bindparam(bindparam, **kw)
            return result

    sql = Compiler(dialect, statement.clause).string
    formatted = sqlparse.format(sql, reindent=True, indent_columns=True, wrap_after=90)
    lines = [line.rstrip() for line in formatted.splitlines()]
    return f"-- {statement.doc}\n" + "\n".join(lines) + ";\n"


@functools.cache
def expected() -> dict[str, str]:
    """File name -> content of every SQL file, as the statements are (rendered once:
    statements are fixed when their modules are imported)."""
    return {f"{statement.name}.{name}.sql": render(statement, DIALECTS[name])
            for statement in registered() for name in statement.dialects}


def stale(directory: Path = SQL_DIR) -> list[str]:
    """The files of ``directory`` that differ from :func:`expected`, are missing, or
    name no statement."""
    want = expected()
    have = {path.name: path.read_text() for path in directory.glob("*.sql")}
    return sorted(name for name in want.keys() | have.keys() if want.get(name) != have.get(name))


def write(directory: Path = SQL_DIR) -> list[str]:
    """Bring ``directory`` up to date; returns the names of the files changed."""
    want = expected()
    changed = stale(directory)
    directory.mkdir(exist_ok=True)
    for name in changed:
        path = directory / name
        if name in want:
            path.write_text(want[name])
        else:
            path.unlink()
    return changed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="change nothing; exit 1 if a file is stale")
    args = parser.parse_args(argv)
    if args.check:
        outdated = stale()
        for name in outdated:
            print(f"stale: {SQL_DIR / name}")
        if outdated:
            print("run `make sql` to render them again", file=sys.stderr)
        return 1 if outdated else 0
    changed = write()
    print(f"{len(changed)} file(s) rewritten in {SQL_DIR}" if changed else "up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
