"""Render every named statement as SQL files, so the store's SQL can be reviewed as SQL.

    python -m meshpoint.store.render          # rewrite the SQL folders
    python -m meshpoint.store.render --check  # exit 1 if a file there is stale

Each statement (:mod:`meshpoint.store.statement`) becomes one file per dialect it
runs on, ``sql/<name>.<dialect>.sql``, opening with one line on what it does: the
store's own in ``src/meshpoint/store/sql/``, a registered integration's in the
``sql/`` folder beside its statements (:mod:`meshpoint.store.integrations`). The
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

from sqlalchemy.dialects.postgresql.asyncpg import PGDialect_asyncpg
from sqlalchemy.dialects.sqlite.pysqlite import SQLiteDialect_pysqlite
from sqlalchemy.engine import Dialect

from meshpoint.store import (  # noqa: F401  (they define the statements)
    event_queries,
    history_queries,
    integrations,
    postgres,
    postgres_queries,
    queries,
    recovery_queries,
)
from meshpoint.store.sa_internals import sql_with_own_values_inline
from meshpoint.store.statement import Statement, registered

integrations.load_statements()

SQL_DIR = Path(__file__).parent / "sql"
#: The dialects the store runs on, as their drivers compile, placeholders by name.
DIALECTS: dict[str, Dialect] = {"sqlite": SQLiteDialect_pysqlite(paramstyle="named"),
                                "postgresql": PGDialect_asyncpg(  # type: ignore[no-untyped-call]
                                    paramstyle="named")}


def render(statement: Statement, dialect: Dialect) -> str:
    """The statement's SQL for ``dialect``, formatted, fixed values inline."""
    import sqlparse

    sql = sql_with_own_values_inline(statement.clause, dialect)
    formatted = sqlparse.format(sql, reindent=True, indent_columns=True, wrap_after=90)
    lines = [line.rstrip() for line in formatted.splitlines()]
    return f"-- {statement.doc}\n" + "\n".join(lines) + ";\n"


def folder(statement: Statement) -> Path:
    """The folder of ``statement``'s SQL files: its integration's, if its name has a
    registered integration's prefix, else the store's."""
    for integration in integrations.INTEGRATIONS:
        if statement.name.startswith(integration.prefix):
            return integration.sql_dir
    return SQL_DIR


#: Every folder of SQL files: the store's, then each registered integration's.
FOLDERS = (SQL_DIR, *(integration.sql_dir for integration in integrations.INTEGRATIONS))


def path(statement: Statement, dialect: str) -> Path:
    """The SQL file of ``statement`` on ``dialect``."""
    return folder(statement) / f"{statement.name}.{dialect}.sql"


@functools.cache
def expected(directory: Path | None = None) -> dict[str, str]:
    """File name -> content of every SQL file of ``directory``, one of :data:`FOLDERS`,
    as the statements are (rendered once: statements are fixed when their modules
    are imported). Any other folder (a test's), or none, gets every statement's."""
    return {f"{statement.name}.{name}.sql": render(statement, DIALECTS[name])
            for statement in registered()
            if directory not in FOLDERS or folder(statement) == directory
            for name in statement.dialects}


def stale(directory: Path | None = None) -> list[str]:
    """The files that differ from :func:`expected`, are missing, or name no statement:
    of ``directory``, or (by default) of every folder in :data:`FOLDERS`, each then
    named by its path under ``src/``."""
    if directory is None:
        return sorted(str(d.relative_to(SQL_DIR.parents[2]) / name)
                      for d in FOLDERS for name in stale(d))
    want = expected(directory)
    have = {path.name: path.read_text() for path in directory.glob("*.sql")}
    return sorted(name for name in want.keys() | have.keys() if want.get(name) != have.get(name))


def write(directory: Path | None = None) -> list[str]:
    """Bring ``directory`` (by default, every folder in :data:`FOLDERS`) up to date;
    returns the names of the files changed."""
    if directory is None:
        return [name for d in FOLDERS for name in write(d)]
    want = expected(directory)
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
            print(f"stale: src/{name}")
        if outdated:
            print("run `make sql` to render them again", file=sys.stderr)
        return 1 if outdated else 0
    changed = write()
    print(f"{len(changed)} file(s) rewritten" if changed else "up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
