"""PostgreSQL: set the compression of columns, on servers that can (shared by the
migrations that set it, 0003, and that must set it again after a type change, 0005)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from alembic import op


def set_compression(columns: Mapping[str, Sequence[str]], method: str) -> None:
    """``ALTER COLUMN ... SET COMPRESSION method`` for every column of every table, in
    one block; a server too old for it (before 14) or built without the method keeps
    its compression and says so with a NOTICE. Nothing on SQLite."""
    if op.get_bind().dialect.name != "postgresql":
        return
    executes = "\n".join(
        f"EXECUTE 'ALTER TABLE {table} " + ", ".join(
            f"ALTER COLUMN {column} SET COMPRESSION {method}" for column in names) + "';"
        for table, names in columns.items())
    # EXECUTE, so that a server too old for the syntax fails at run time, inside the
    # block, where the handler can catch it (and nothing of the block is kept).
    op.execute(f"""
        DO $$
        BEGIN
            {executes}
        EXCEPTION WHEN feature_not_supported OR syntax_error THEN
            RAISE NOTICE 'meshpoint: this server cannot set compression %; columns keep '
                         'their compression', '{method}';
        END
        $$""")
