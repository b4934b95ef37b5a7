"""Alembic environment for meshpoint's store.

meshpoint runs migrations itself (``open_store(..., migrate=True)`` or
``meshpoint migrate``) and hands Alembic an open connection through
``config.attributes["connection"]``; there is no alembic.ini.
"""

from __future__ import annotations

from alembic import context

from meshpoint.store.schema import metadata

connection = context.config.attributes.get("connection")
if connection is None:
    raise RuntimeError(
        "meshpoint's migrations run through `meshpoint migrate` or open_store(migrate=True), "
        "which provide the database connection"
    )

context.configure(
    connection=connection,
    target_metadata=metadata,
    render_as_batch=connection.dialect.name == "sqlite",
    compare_type=True,
)
with context.begin_transaction():
    context.run_migrations()
