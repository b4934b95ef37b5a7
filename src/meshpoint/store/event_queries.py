"""The named statements of the event log (``agent_events``; :mod:`meshpoint.events`)."""

from __future__ import annotations

from sqlalchemy import Boolean, Float, String, bindparam, or_, select
from sqlalchemy.dialects.postgresql import insert as upsert

from meshpoint.store.queries import agent, limit, now, task, tenant
from meshpoint.store.schema import events as V
from meshpoint.store.statement import Statement

INSERT_EVENT = Statement(
    "insert_log_event", "Appends one event to the event log (one parameter set per event); "
    "an event already written (a write retried after its commit) is left as it is.",
    upsert(V).values(
        tenant_id=tenant, event_id=bindparam("p_event_id", type_=String),
        agent_name=agent, logical_task_id=task,
        event_type=bindparam("p_event_type", type_=String),
        step_name=bindparam("p_step", type_=String),
        input_data=bindparam("p_input", type_=V.c.input_data.type),
        output_data=bindparam("p_output", type_=V.c.output_data.type),
        state_snapshot=bindparam("p_state", type_=V.c.state_snapshot.type),
        created_at=now).on_conflict_do_nothing())

_FILTERS = (
    V.c.tenant_id == tenant,
    or_(bindparam("p_any_task", type_=Boolean), V.c.logical_task_id == task),
    or_(bindparam("p_any_agent", type_=Boolean), V.c.agent_name == agent),
    or_(bindparam("p_any_type", type_=Boolean),
        V.c.event_type == bindparam("p_event_type", type_=String)),
    V.c.created_at >= bindparam("p_since", type_=Float),
    V.c.created_at < bindparam("p_until", type_=Float))
_COLUMNS = (V.c.event_id, V.c.agent_name, V.c.logical_task_id, V.c.event_type, V.c.step_name,
            V.c.input_data, V.c.output_data, V.c.state_snapshot, V.c.created_at)

GET_LOG_EVENTS = Statement(
    "get_log_events", "Reads the events matching the filters given, oldest first.",
    select(*_COLUMNS).where(*_FILTERS).order_by(V.c.created_at, V.c.event_id).limit(limit))
GET_LOG_EVENTS_DESC = Statement(
    "get_log_events_desc", "Reads the events matching the filters given, newest first.",
    select(*_COLUMNS).where(*_FILTERS)
    .order_by(V.c.created_at.desc(), V.c.event_id.desc()).limit(limit))
