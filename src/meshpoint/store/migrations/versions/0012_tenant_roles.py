"""Row-level security keyed on the connected role, for deployments that isolate tenants
from one another's runtime (PostgreSQL only).

0009's policies compare ``tenant_id`` with the setting ``meshpoint.tenant_id``, which
any session may set: they keep a correct runtime on its tenant, not a runtime role
that sets another tenant on purpose. This migration adds a mapping of database roles
to tenants, ``meshpoint_tenant_roles``, that only the tables' owner can read or
write (``meshpoint migrate --tenant-role ROLE=TENANT`` fills it), and one function
the policies of every table now call, once per statement (an InitPlan)::

    USING (tenant_id = (SELECT meshpoint_tenant(current_user)))
    WITH CHECK (the same)

``meshpoint_tenant(role)`` is the tenant the role is mapped to, whatever the setting
says. For a role mapped to none, it is the setting, as before, while the mapping is
empty (a shared runtime role, for single-tenant use), and no tenant at all once the
database isolates tenants by role (one role is mapped), except for the tables' owner,
who may switch row security off anyway. The function runs as its owner (SECURITY
DEFINER, so the mapping needs no grant), with a search path of ``pg_catalog`` and
``pg_temp`` last and the mapping named with its schema, so that nothing a runtime role
creates (in ``pg_temp``, say) is ever looked up in its place. docs/store.md, *Tenant
isolation*, has the whole picture.

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-26
"""

from __future__ import annotations

from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None

TABLES = ("agent_paused_tasks", "agent_peer_sub_tasks", "agent_parallel_invocations",
          "agent_session_events", "agent_checkpoints", "agent_checkpoint_heads",
          "agent_events", "agent_ended_tasks", "agent_langgraph_checkpoints",
          "agent_langgraph_blobs", "agent_langgraph_writes")
POLICY = "meshpoint_tenant"
_BY_ROLE = "tenant_id = (SELECT meshpoint_tenant(current_user))"
_BY_SETTING = "tenant_id = nullif(current_setting('meshpoint.tenant_id', true), '')"

_FUNCTION = """
CREATE FUNCTION meshpoint_tenant(who name) RETURNS text
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $meshpoint$
DECLARE
    mapped text;
BEGIN
    SELECT r.tenant_id INTO mapped FROM {roles} r WHERE r.role_name = who;
    IF FOUND THEN
        RETURN mapped;  -- a tenant's own role: its tenant, whatever the setting says
    END IF;
    -- current_user is the function's owner here, the tables' owner (SECURITY DEFINER)
    IF NOT EXISTS (SELECT FROM {roles}) OR pg_has_role(who, current_user, 'MEMBER') THEN
        RETURN nullif(current_setting('meshpoint.tenant_id', true), '');
    END IF;
    RETURN NULL;  -- tenants are isolated by role, and this role is no tenant's
END
$meshpoint$"""


def upgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name != "postgresql":
        return
    schema = bind.exec_driver_sql("SELECT quote_ident(current_schema())").scalar()
    op.execute("CREATE TABLE meshpoint_tenant_roles (role_name VARCHAR(63) NOT NULL, "
               "tenant_id VARCHAR(64) NOT NULL, "
               "CONSTRAINT pk_meshpoint_tenant_roles PRIMARY KEY (role_name))")
    op.execute("REVOKE ALL ON meshpoint_tenant_roles FROM PUBLIC")
    op.execute(_FUNCTION.format(roles=f"{schema}.meshpoint_tenant_roles"))
    for table in TABLES:
        op.execute(f"DROP POLICY {POLICY} ON {table}")
        op.execute(f"CREATE POLICY {POLICY} ON {table} USING ({_BY_ROLE}) "
                   f"WITH CHECK ({_BY_ROLE})")


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    for table in TABLES:
        op.execute(f"DROP POLICY {POLICY} ON {table}")
        op.execute(f"CREATE POLICY {POLICY} ON {table} USING ({_BY_SETTING}) "
                   f"WITH CHECK ({_BY_SETTING})")
    op.execute("DROP FUNCTION meshpoint_tenant(name)")
    op.execute("DROP TABLE meshpoint_tenant_roles")
