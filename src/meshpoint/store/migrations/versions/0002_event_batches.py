"""Conversation events: one row per checkpoint instead of one row per event.

A row of ``agent_session_events`` now holds the JSON array of the events one
checkpoint appended, and its ``seq`` is the index of the first of them. Existing
rows become batches of one event (same ``seq``), so no conversation moves. The
downgrade splits every batch back into one row per event.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-21
"""

from __future__ import annotations

from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

_COLUMNS = "tenant_id, logical_task_id, seq, data, created_at"


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("UPDATE agent_session_events SET data = jsonb_build_array(data)")
    else:
        op.execute("UPDATE agent_session_events SET data = json_array(json(data))")


def downgrade() -> None:
    # Events are JSON objects, so the rows holding an array are exactly the batches.
    # Their second and later events go to seq + k, inside the batch's own range (free,
    # since batches are contiguous); then each batch row keeps its first event.
    if op.get_bind().dialect.name == "postgresql":
        op.execute(
            f"INSERT INTO agent_session_events ({_COLUMNS}) "
            "SELECT e.tenant_id, e.logical_task_id, e.seq + x.ord - 1, x.value, e.created_at "
            "FROM agent_session_events e, "
            "jsonb_array_elements(e.data) WITH ORDINALITY AS x(value, ord) "
            "WHERE jsonb_typeof(e.data) = 'array' AND x.ord > 1")
        op.execute("UPDATE agent_session_events SET data = data -> 0 "
                   "WHERE jsonb_typeof(data) = 'array'")
    else:
        op.execute(
            f"INSERT INTO agent_session_events ({_COLUMNS}) "
            "SELECT e.tenant_id, e.logical_task_id, e.seq + x.key, json(x.value), e.created_at "
            "FROM agent_session_events e, json_each(e.data) AS x "
            "WHERE json_type(e.data) = 'array' AND x.key > 0")
        op.execute("UPDATE agent_session_events SET data = json(json_extract(data, '$[0]')) "
                   "WHERE json_type(data) = 'array'")  # not ->: that needs SQLite 3.38
