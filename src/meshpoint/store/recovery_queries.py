"""The named statements of recovery limits and each agent's circuit breaker (0014;
docs/runtime.md, "Recovery limits, the circuit breaker and alerts")."""

from __future__ import annotations

from sqlalchemy import (
    Boolean,
    Float,
    Integer,
    String,
    and_,
    bindparam,
    case,
    literal,
    or_,
    select,
    update,
)
from sqlalchemy.dialects.postgresql import insert as upsert

from meshpoint.store.queries import (
    TASK_KEY,
    T,
    agent,
    lease_until,
    now,
    owner,
    tenant,
)
from meshpoint.store.schema import breakers as B
from meshpoint.store.statement import Statement

RECOVERY_STATE = Statement(
    "recovery_state", "Reads what a take-over of a task needs: its status, lease, agent, "
    "the state its live row holds and its take-overs in a row.",
    select(T.c.status, T.c.owner, T.c.lease_expires_at, T.c.agent_name, T.c.context_sha256,
           T.c.session_event_count, T.c.recoveries).where(TASK_KEY))
#: Recovery's take of a task whose lease holder died: as take_lease, for agent p_agent's
#: resumable tasks only, counting one more take-over in a row when the lease was
#: another's (it expired) and not when it was free (given up on purpose).
TAKE_OVER = Statement(
    "take_over", "Takes the lease of agent p_agent's resumable task if it is free or "
    "(unless p_only_free) expired, and counts a take-over when it was another holder's.",
    update(T)
    .where(TASK_KEY, T.c.agent_name == agent,
           or_(*(T.c.status.concat("") == status for status in ("resuming", "working"))),
           or_(T.c.owner.is_(None),
               and_(~bindparam("p_only_free", type_=Boolean), T.c.lease_expires_at <= now)))
    .values(owner=owner, lease_expires_at=lease_until, status="resuming",
            version=T.c.version + 1,
            recoveries=T.c.recoveries + case((T.c.owner.is_(None), literal(0)), else_=1))
    .returning(T.c.version, T.c.recoveries))
#: An operator's resume (``meshpoint tasks resume``): a blocked or resumable task whose
#: lease is free or expired; its count of take-overs starts again.
TAKE_BY_HAND = Statement(
    "take_by_hand", "Takes the lease of a blocked or resumable task for an operator's "
    "resume if it is free or expired, and clears its count of take-overs.",
    update(T)
    .where(TASK_KEY, or_(*(T.c.status.concat("") == status
                           for status in ("resuming", "working", "blocked"))),
           or_(T.c.owner.is_(None), T.c.lease_expires_at <= now))
    .values(owner=owner, lease_expires_at=lease_until, status="resuming",
            version=T.c.version + 1, recoveries=0)
    .returning(T.c.version, T.c.agent_name))

# -- the breaker ------------------------------------------------------------------------

_KEY = and_(B.c.tenant_id == tenant, B.c.agent_name == agent)
ENSURE_BREAKER = Statement(
    "ensure_breaker", "Writes agent p_agent's breaker, closed, unless it has one.",
    upsert(B).values(tenant_id=tenant, agent_name=agent, state="closed", failures=0,
                     updated_at=now).on_conflict_do_nothing())
GET_BREAKER = Statement(
    "get_breaker", "Reads agent p_agent's breaker, locked until the transaction ends.",
    select(B.c.state, B.c.failures, B.c.window_started_at, B.c.opened_until,
           B.c.trial_owner, B.c.trial_until).where(_KEY).with_for_update())
READ_BREAKER = Statement(
    "read_breaker", "Reads agent p_agent's breaker.",
    select(B.c.state, B.c.failures, B.c.window_started_at, B.c.opened_until,
           B.c.trial_owner, B.c.trial_until).where(_KEY))
SET_BREAKER = Statement(
    "set_breaker", "Writes agent p_agent's breaker's new state.",
    update(B).where(_KEY).values(
        state=bindparam("p_state", type_=String),
        failures=bindparam("p_failures", type_=Integer),
        window_started_at=bindparam("p_window_started_at", type_=Float),
        opened_until=bindparam("p_opened_until", type_=Float),
        trial_owner=bindparam("p_trial_owner", type_=String),
        trial_until=bindparam("p_trial_until", type_=Float),
        updated_at=now))
