"""The named statements of the event log (``agent_events``; :mod:`meshpoint.events.log`).

An event's time is integer microseconds since the epoch (``created_at_us``): one
exact value, stored and returned as it is, so that bounds and cursors compare what
the reader was given. The log's order is (time, event id); a reader pages through it
by a cursor of both, never by time alone, which could not move past a page of events
logged in one microsecond.
"""

from __future__ import annotations

from sqlalchemy import BigInteger, Boolean, String, and_, bindparam, or_, select
from sqlalchemy.dialects.postgresql import insert as upsert

from meshpoint.store.queries import agent, limit, task, tenant
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
        created_at_us=bindparam("p_at_us", type_=BigInteger)).on_conflict_do_nothing())

#: The cursor: the time and id of the last event read (``p_no_cursor``: none yet).
_AFTER_US = bindparam("p_after_us", type_=BigInteger)
_AFTER_ID = bindparam("p_after_id", type_=String)
_NO_CURSOR = bindparam("p_no_cursor", type_=Boolean)
_FILTERS = (
    V.c.tenant_id == tenant,
    or_(bindparam("p_any_task", type_=Boolean), V.c.logical_task_id == task),
    or_(bindparam("p_any_agent", type_=Boolean), V.c.agent_name == agent),
    or_(bindparam("p_any_type", type_=Boolean),
        V.c.event_type == bindparam("p_event_type", type_=String)),
    # since inclusive, until exclusive
    V.c.created_at_us >= bindparam("p_since_us", type_=BigInteger),
    V.c.created_at_us < bindparam("p_until_us", type_=BigInteger))
_COLUMNS = (V.c.event_id, V.c.agent_name, V.c.logical_task_id, V.c.event_type, V.c.step_name,
            V.c.input_data, V.c.output_data, V.c.state_snapshot, V.c.created_at_us)

GET_LOG_EVENTS = Statement(
    "get_log_events", "Reads the events matching the filters given, oldest first (by time, "
    "then id), after the cursor's event if one is given.",
    select(*_COLUMNS).where(*_FILTERS, or_(
        _NO_CURSOR, V.c.created_at_us > _AFTER_US,
        and_(V.c.created_at_us == _AFTER_US, V.c.event_id > _AFTER_ID)))
    .order_by(V.c.created_at_us, V.c.event_id).limit(limit))
GET_LOG_EVENTS_DESC = Statement(
    "get_log_events_desc", "Reads the events matching the filters given, newest first (by "
    "time, then id), after the cursor's event (older than it) if one is given.",
    select(*_COLUMNS).where(*_FILTERS, or_(
        _NO_CURSOR, V.c.created_at_us < _AFTER_US,
        and_(V.c.created_at_us == _AFTER_US, V.c.event_id < _AFTER_ID)))
    .order_by(V.c.created_at_us.desc(), V.c.event_id.desc()).limit(limit))
