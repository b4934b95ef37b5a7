"""The store's registration point for integrations (``store/integrations.py``): a
registered integration's tables join the store's ``metadata``, its SQL files sit in
its own folder, and the store opens, and ``make sql`` renders, without the
integration's framework installed (LangGraph is an optional extra)."""

from __future__ import annotations

import importlib
import subprocess
import sys
import textwrap

from sqlalchemy import Table

from meshpoint.store import integrations, render, schema
from meshpoint.store.statement import Statement, registered

#: Run in a fresh interpreter whose imports of ``langgraph`` and ``langchain_core``
#: fail, as where ``pip install meshpoint`` ran without the ``langgraph`` extra.
WITHOUT_LANGGRAPH = textwrap.dedent("""
    import asyncio, sys

    class Refuse:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in ("langgraph", "langchain_core"):
                raise ModuleNotFoundError(f"No module named {name!r} (refused)", name=name)
            return None

    sys.meta_path.insert(0, Refuse())

    from sqlalchemy import func, select
    from meshpoint.store import open_store, render, schema

    async def main():
        # migrated, and its schema checked against every table of schema.metadata
        async with open_store("sqlite:///:memory:") as store:
            table = schema.metadata.tables["agent_langgraph_checkpoints"]
            count = await store.run(
                lambda conn: conn.execute(select(func.count()).select_from(table)).scalar())
        assert count == 0, count

    asyncio.run(main())
    assert "agent_langgraph_blobs" in schema.metadata.tables
    assert any(name.startswith("lg_") for name in render.expected()), "no saver statement"
    assert not [m for m in sys.modules if m.split(".")[0] in ("langgraph", "langchain_core")]
    import meshpoint.integrations.langgraph as lg
    try:
        lg.MeshpointSaver
    except ModuleNotFoundError as error:
        assert "refused" in str(error), error
    else:
        raise AssertionError("the saver imported without LangGraph")
    print("ok")
""")


def test_the_store_opens_and_renders_without_langgraph_installed() -> None:
    done = subprocess.run([sys.executable, "-c", WITHOUT_LANGGRAPH], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


def test_each_integrations_tables_are_on_the_stores_metadata() -> None:
    for integration in integrations.INTEGRATIONS:
        module = importlib.import_module(integration.tables)
        tables = [value for value in vars(module).values() if isinstance(value, Table)]
        assert tables, f"{integration.tables} defines no table"
        for table in tables:
            assert schema.metadata.tables.get(table.name) is table


def test_each_integrations_sql_files_are_in_its_folder_only() -> None:
    for integration in integrations.INTEGRATIONS:
        importlib.import_module(integration.statements)
        names = [s.name for s in registered() if s.name.startswith(integration.prefix)]
        assert names, f"{integration.name} registers no statement"
        # The prefix is what routes a statement's files: every statement the
        # integration's module defines has it (one without would land in the store's).
        module = importlib.import_module(integration.statements)
        defined = [v for v in vars(module).values() if isinstance(v, Statement)]
        assert defined and {s.name for s in defined} <= set(names), \
            [s.name for s in defined if s.name not in names]
        for name in names:
            assert list(integration.sql_dir.glob(f"{name}.*.sql")), name
            assert not list(render.SQL_DIR.glob(f"{name}.*.sql")), name
