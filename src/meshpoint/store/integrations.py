"""The store's one registration point for an integration's tables, statements and SQL.

An integration that keeps rows in the store's database (``integrations/langgraph``:
LangGraph's checkpoint saver) is named here, by module names only: the store knows
nothing else of it. :func:`load_tables` (run when :mod:`meshpoint.store.schema` is
imported) imports each integration's tables module, which defines its tables on the
shared ``schema.metadata``: the runtime roles' grants, the migration test and
``tests/conftest.py``'s cleanup then cover them as the store's own. Row-level security
is the integration's migration's job (enabled, forced, under the tenant roles'
policy; ``tests/integration/test_rls.py`` checks every table of ``metadata``).
``make sql`` (:mod:`meshpoint.store.render`) imports each integration's statements
module and writes their SQL files into the integration's ``sql/`` folder.

Those modules must import SQLAlchemy and the store only, never their framework
(``langgraph`` is an optional extra): the store opens, and ``make sql`` renders,
without it (``tests/unit/test_store_integrations.py``).

Migrations: an integration's tables are created by the store's one Alembic chain
(``store/migrations/versions``; the saver's is ``0010_langgraph_saver``), so that one
``meshpoint migrate`` brings every table to the version the code expects.
"""

from __future__ import annotations

import importlib
import importlib.util
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Integration:
    """One integration's parts the store loads (see the module docstring)."""

    name: str
    #: Defines the integration's tables on ``meshpoint.store.schema.metadata``.
    tables: str
    #: Defines its named statements (:class:`~meshpoint.store.statement.Statement`).
    statements: str
    #: The prefix of its statements' names, which sends their SQL files to :attr:`sql_dir`:
    #: every statement of the integration has it, no statement of the store does.
    prefix: str

    @property
    def sql_dir(self) -> Path:
        """Where ``make sql`` writes the integration's SQL files: ``sql/`` beside its
        statements module."""
        spec = importlib.util.find_spec(self.statements)
        assert spec is not None and spec.origin is not None, self.statements
        return Path(spec.origin).parent / "sql"


INTEGRATIONS = (
    Integration("langgraph", tables="meshpoint.integrations.langgraph.tables",
                statements="meshpoint.integrations.langgraph.queries", prefix="lg_"),
    # Local-to-cloud sync: its cursors, conflicts and source ids (0015_sync).
    Integration("sync", tables="meshpoint.sync.tables",
                statements="meshpoint.sync.queries", prefix="sync_"),
    # Paused tasks moved to the cloud: the ledger of moves (0017_sync_move).
    Integration("sync_move", tables="meshpoint.sync.move_tables",
                statements="meshpoint.sync.move_queries", prefix="move_"),
)


def load_tables() -> None:
    """Define every registered integration's tables on the store's ``metadata``."""
    for integration in INTEGRATIONS:
        importlib.import_module(integration.tables)


def load_statements() -> None:
    """Define every registered integration's named statements."""
    for integration in INTEGRATIONS:
        importlib.import_module(integration.statements)
