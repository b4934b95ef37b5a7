"""Row-level security on every table, per tenant (docs/store.md, "Tenant isolation").

PostgreSQL only. Each table gets row-level security enabled *and forced* (so its
owner is held to it too, unless a superuser or a role with BYPASSRLS) and one policy,
for every command::

    USING (tenant_id = nullif(current_setting('meshpoint.tenant_id', true), ''))
    WITH CHECK (the same)

The store sets ``meshpoint.tenant_id`` with ``set_config(..., true)`` and a bind
parameter at the start of every transaction, so it lasts exactly that transaction
(docs/store.md, *Tenant isolation*); with no tenant set, ``current_setting`` is
empty or NULL and no row is visible or writable. The runtime role that ``serve``
connects as (``meshpoint migrate --runtime-role``) owns nothing and cannot bypass
the policies; migrations run as the tables' owner.

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-24
"""

from __future__ import annotations

from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

TABLES = ("agent_paused_tasks", "agent_peer_sub_tasks", "agent_parallel_invocations",
          "agent_session_events", "agent_checkpoints", "agent_checkpoint_heads",
          "agent_events", "agent_ended_tasks")
_TENANT = "tenant_id = nullif(current_setting('meshpoint.tenant_id', true), '')"
POLICY = "meshpoint_tenant"


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    for table in TABLES:
        op.execute(f"ALTER TABLE {table} ENABLE ROW LEVEL SECURITY")
        op.execute(f"ALTER TABLE {table} FORCE ROW LEVEL SECURITY")
        op.execute(f"CREATE POLICY {POLICY} ON {table} USING ({_TENANT}) "
                   f"WITH CHECK ({_TENANT})")


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    for table in TABLES:
        op.execute(f"DROP POLICY IF EXISTS {POLICY} ON {table}")
        op.execute(f"ALTER TABLE {table} NO FORCE ROW LEVEL SECURITY")
        op.execute(f"ALTER TABLE {table} DISABLE ROW LEVEL SECURITY")
