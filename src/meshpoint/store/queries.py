"""The store's portable SQL, as named statements (see :mod:`meshpoint.store.statement`).

Each statement is built once with SQLAlchemy Core, runs on SQLite and PostgreSQL
alike, and is rendered for both into ``store/sql/``. The store only picks a
statement and binds values. Bind parameters are prefixed ``p_`` so they never
clash with column names; values fixed in the statement are not.

Lock order. Resolvers, sweeps and cleanups touch rows in the order sub-tasks →
invocations → session events → paused task, and batches (the sweeper) take
invocations and tasks sorted by key, so they wait for each other instead of
deadlocking. A re-checkpoint starts from the task row (its lease check); it only
runs once the task's join completed, when no resolver can lock its sub-tasks, and
any deadlock PostgreSQL still detects is retried whole by the store.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    Boolean,
    Float,
    Integer,
    String,
    and_,
    bindparam,
    case,
    delete,
    func,
    insert,
    literal,
    or_,
    select,
    text,
    tuple_,
    update,
)
from sqlalchemy.sql.dml import Insert, Update

from meshpoint.store.rows import EventRow, InvocationRow, SubTaskRow, TaskRow
from meshpoint.store.schema import (
    LIVE_TABLES,
    OPEN_SUB_TASK_PREDICATE,
    RESUMING_PREDICATE,
    TASK_STATUSES,
    JSONText,
    ended_tasks,
    parallel_invocations,
    paused_tasks,
    peer_sub_tasks,
    session_events,
)
from meshpoint.store.statement import Statement

# Short names keep the statements readable.
T, S, I, E = paused_tasks, peer_sub_tasks, parallel_invocations, session_events  # noqa: E741
N = ended_tasks

tenant = bindparam("p_tenant", type_=String)
task = bindparam("p_task", type_=String)
sub = bindparam("p_sub", type_=String)
agent = bindparam("p_agent", type_=String)
#: True: a statement that can be limited to one agent's rows (p_agent) is not.
any_agent = bindparam("p_any_agent", type_=Boolean)
invocation = bindparam("p_invocation", type_=String)
now = bindparam("p_now", type_=Float)
owner = bindparam("p_owner", type_=String)
lease_until = bindparam("p_lease_until", type_=Float)
result = bindparam("p_result", type_=JSONText)
resolved_by = bindparam("p_resolved_by", type_=String)
limit = bindparam("p_limit", type_=Integer)

TASK_KEY = and_(T.c.tenant_id == tenant, T.c.logical_task_id == task)
SUB_KEY = and_(S.c.tenant_id == tenant, S.c.sub_task_id == sub)
OF_TASK = {table: and_(table.c.tenant_id == tenant, table.c.logical_task_id == task)
           for table in (S, I, E)}
INVOCATION_KEY = and_(I.c.tenant_id == tenant, I.c.logical_task_id == task,
                      I.c.invocation_id == invocation)
#: Sub-tasks whose deadline can still pass. Rendered as literal SQL, word for word the
#: partial index's predicate: as bound parameters, PostgreSQL's generic plans could
#: not prove the index applies.
OPEN = text(OPEN_SUB_TASK_PREDICATE)
#: A task's open sub-tasks read by the task's key: the rows OPEN matches (a sub-task is
#: pending, claimed or resolved), written so that it does not imply the partial
#: deadline index's predicate. Without statistics PostgreSQL costed that index (on
#: agent and tenant) as high as the task's own, and now and then scanned the whole
#: tenant through it (test_statements_by_key_use_the_primary_key_without_statistics).
OPEN_OF_TASK = S.c.status != "resolved"
#: A sub-task whose deadline is its announcement check (earlier than its timeout:
#: ``announce_check_s`` in its correlation data): when it passes with no word from the
#: peer, the request is published again, once, and the deadline becomes the timeout's.
#: (The margin keeps float sums of the same terms from telling them apart.)
ANNOUNCE_CHECK = S.c.timeout_deadline < S.c.created_at + S.c.timeout_s - 0.001
_TIMEOUT_DUE = S.c.timeout_deadline >= S.c.created_at + S.c.timeout_s - 0.001
#: When a sub-task times out, whatever its deadline now is (what operators are shown).
TIMES_OUT_AT = case((ANNOUNCE_CHECK, S.c.created_at + S.c.timeout_s),
                    else_=S.c.timeout_deadline)

#: Columns that make a :class:`~meshpoint.store.results.SubTask`.
SUB_COLUMNS = (S.c.sub_task_id, S.c.logical_task_id, S.c.agent_name, S.c.invocation_id,
               S.c.function_call_id, S.c.peer_agent_name, S.c.peer_task_id,
               S.c.correlation_data, S.c.timeout_deadline, S.c.status, S.c.resolved_by,
               S.c.result)

# -- checkpoint ------------------------------------------------------------------------

#: A task id the ledger of ended tasks still holds.
ENDED = (select(literal(1))
         .where(N.c.tenant_id == tenant, N.c.logical_task_id == task).exists())
_NEW_TASK = {  # column -> the value a first checkpoint gives it
    "tenant_id": tenant, "logical_task_id": task, "agent_name": agent,
    "status": bindparam("p_status", type_=String), "current_invocation_id": invocation,
    "context": bindparam("p_context", type_=T.c.context.type),
    "context_encoding": bindparam("p_encoding", type_=String),
    "context_sha256": bindparam("p_sha256", type_=String),
    "session_event_count": bindparam("p_event_count", type_=Integer),
    "version": literal(1), "created_at": now, "checkpointed_at": now,
    "expires_at": bindparam("p_expires_at", type_=Float),
    # A mid-turn checkpoint (status working) is written with its writer's lease.
    "owner": bindparam("p_holder", type_=String),
    "lease_expires_at": bindparam("p_hold_until", type_=Float)}
#: It inserts nothing for a task that already ended: a late copy of its request must
#: not store it again (the store reads the driver's row count).


def insert_task() -> Insert:
    """A new copy of insert_task's clause, for a statement built on it (the PostgreSQL
    first checkpoint adds RETURNING): a clause a Statement has compiled carries
    memoized state, such as its exported columns, that generative copies inherit."""
    return insert(T).from_select(list(_NEW_TASK),
                                 select(*_NEW_TASK.values()).where(~ENDED))


INSERT_TASK = Statement(
    "insert_task", "Inserts the task row of a first checkpoint (version 1, no lease), "
    "unless the task already ended.", insert_task())
INSERT_SUB_TASK = Statement(
    "insert_sub_task", "Inserts one pending peer sub-task of a checkpoint (one parameter "
    "set per sub-task).",
    insert(S).values(
        tenant_id=tenant, logical_task_id=task, agent_name=agent,
        sub_task_id=bindparam("sub_task_id"), invocation_id=bindparam("invocation_id"),
        function_call_id=bindparam("function_call_id"),
        peer_agent_name=bindparam("peer_agent_name"), peer_task_id=bindparam("peer_task_id"),
        correlation_data=bindparam("correlation_data", type_=JSONText),
        timeout_s=bindparam("timeout_s", type_=Float),
        timeout_deadline=bindparam("timeout_deadline", type_=Float), status="pending",
        created_at=now))
INSERT_INVOCATION = Statement(
    "insert_invocation", "Inserts one parallel invocation of a checkpoint with the results "
    "known at checkpoint time (one parameter set per invocation).",
    insert(I).values(
        tenant_id=tenant, logical_task_id=task, invocation_id=bindparam("invocation_id"),
        total_expected=bindparam("total_expected"),
        completed_count=bindparam("completed_count"),
        call_order=bindparam("call_order", type_=JSONText),
        results=bindparam("results", type_=JSONText), created_at=now))


#: The take-overs in a row a re-checkpoint leaves (RecoveryPolicy.max_recoveries): none
#: once the task made progress (its conversation grew, or it paused), as many as before
#: for a mid-turn checkpoint that adds nothing to the conversation (a crash loop's
#: checkpoint before the model call that kills it is no progress).
_RECOVERIES_AFTER = case(
    (and_(bindparam("p_status", type_=String) == "working",
          bindparam("p_event_count", type_=Integer) <= T.c.session_event_count),
     T.c.recoveries), else_=literal(0))


def recheckpoint_task() -> Update:
    """A new copy of recheckpoint_task's clause (see :func:`insert_task`): only the
    lease holder may overwrite the row, only from the conversation it restored
    (``p_first`` events stored, no more, no less), and only for the task's own agent
    (a task never changes agent: its agent column is written once, by the first
    checkpoint). The lease is released by the same
    write, since the task leaves memory again, unless the write is a mid-turn
    checkpoint (``p_holder``: the task stays in its writer's memory)."""
    return (
        update(T)
        .where(TASK_KEY, T.c.owner == owner, T.c.session_event_count == bindparam("p_first"),
               T.c.agent_name == agent)
        .values(status=bindparam("p_status"),
                current_invocation_id=invocation,
                context=bindparam("p_context"), context_encoding=bindparam("p_encoding"),
                context_sha256=bindparam("p_sha256"),
                session_event_count=bindparam("p_event_count"),
                owner=bindparam("p_holder", type_=String),
                lease_expires_at=bindparam("p_hold_until", type_=Float),
                version=T.c.version + 1, recoveries=_RECOVERIES_AFTER,
                checkpointed_at=now, expires_at=bindparam("p_expires_at", type_=Float))
        .returning(T.c.version))


RECHECKPOINT_TASK = Statement(
    "recheckpoint_task", "Rewrites the row of a resumed task for the holder of its lease, "
    "from the conversation it restored, for the task's own agent, and releases the lease "
    "(or keeps it, for a mid-turn checkpoint).", recheckpoint_task())


def append_events(*where: Any) -> Any:
    """One row per checkpoint rather than per event: ``seq`` is the index of its first
    event, ``data`` the JSON array of them. Written only if there are any
    (``p_has_events``, and ``where``), so a later checkpoint's batch can start at the
    same index. The rows (and index entries) a checkpoint writes were its cost."""
    return insert(E).from_select(
        ["tenant_id", "logical_task_id", "seq", "data", "created_at"],
        select(tenant, task, bindparam("p_first", type_=Integer),
               bindparam("p_events", type_=JSONText), now)
        .where(bindparam("p_has_events", type_=Boolean), *where))


APPEND_EVENTS = Statement(
    "append_events", "Appends the conversation events of one checkpoint as one row, if "
    "it has any.", append_events())
COUNT_OPEN_SUB_TASKS = Statement(
    "count_open_sub_tasks", "Counts a task's sub-tasks that can still be resolved.",
    select(func.count()).where(OF_TASK[S], OPEN_OF_TASK))
DELETE_TASK_SUB_TASKS = Statement(
    "delete_task_sub_tasks", "Deletes every sub-task of a task.", delete(S).where(OF_TASK[S]))
DELETE_TASK_INVOCATIONS = Statement(
    "delete_task_invocations", "Deletes every parallel invocation of a task.",
    delete(I).where(OF_TASK[I]))
DELETE_EVENTS_FROM = Statement(
    "delete_events_from", "Deletes a task's conversation rows from event p_first on (a "
    "rewind to an earlier checkpoint).",
    delete(E).where(OF_TASK[E], E.c.seq >= bindparam("p_first", type_=Integer)))
#: A rewind (meshpoint.store.history_restore): the lease holder's task takes the state of an
#: earlier, verified checkpoint, its join complete (the calls it waited on are lost).
REWIND_TASK = Statement(
    "rewind_task", "Rewrites a task's row, for the holder of its lease, with the state "
    "of an earlier checkpoint or a fresh one, ready to resume by agent p_agent (a "
    "handoff at a phase change hands the task to the next phase's agent).",
    update(T).where(TASK_KEY, T.c.owner == owner)
    .values(status="resuming", agent_name=agent, current_invocation_id=invocation,
            context=bindparam("p_context", type_=T.c.context.type),
            context_encoding=bindparam("p_encoding", type_=String),
            context_sha256=bindparam("p_sha256", type_=String),
            session_event_count=bindparam("p_event_count", type_=Integer),
            version=T.c.version + 1, checkpointed_at=now))
BLOCK_TASK = Statement(
    "block_task", "Marks a task blocked for an operator and releases its lease, for the "
    "holder of the lease.",
    update(T).where(TASK_KEY, T.c.owner == owner)
    .values(status="blocked", owner=None, lease_expires_at=None, version=T.c.version + 1))
DELETE_TASK_EVENTS = Statement(
    "delete_task_events", "Deletes a task's conversation.", delete(E).where(OF_TASK[E]))
DELETE_TASK = Statement(
    "delete_task", "Deletes a task's row.",
    delete(T).where(TASK_KEY).returning(T.c.agent_name))
DELETE_TASK_OF_OWNER = Statement(
    "delete_task_of_owner", "Deletes a task's row if the caller holds its lease.",
    delete(T).where(TASK_KEY, T.c.owner == owner).returning(T.c.agent_name))
RECORD_ENDED = Statement(
    "record_ended", "Records in the ledger of ended tasks that a task ended.",
    insert(N).from_select(["tenant_id", "logical_task_id", "agent_name", "ended_at"],
                          select(tenant, task, agent, now).where(~ENDED)))
TASK_KNOWN = Statement(
    "task_known", "Whether agent p_agent's task p_task is paused, or is remembered in the "
    "ledger of ended tasks.",
    select(or_(select(literal(1)).where(TASK_KEY, T.c.agent_name == agent).exists(),
               select(literal(1)).where(N.c.tenant_id == tenant, N.c.logical_task_id == task,
                                        N.c.agent_name == agent).exists())))
FORGET_ENDED = Statement(
    "forget_ended", "Forgets an agent's tasks that ended before p_before.",
    delete(N).where(N.c.agent_name == agent, N.c.tenant_id == tenant,
                    N.c.ended_at < bindparam("p_before", type_=Float))
    .returning(N.c.logical_task_id))
TASK_STATE = Statement(
    "task_state", "Reads a task's status, lease, stored event count and agent (to explain "
    "a refusal).",
    select(T.c.status, T.c.owner, T.c.lease_expires_at, T.c.session_event_count,
           T.c.agent_name)
    .where(TASK_KEY))

# -- claims and resolutions ---------------------------------------------------------------

RESOLVE_PENDING = Statement(
    "resolve_pending", "Claims a pending sub-task (of agent p_agent's task, unless "
    "p_any_agent) and records its result: the exactly-once step, since only one "
    "transaction can move a row out of pending.",
    update(S)
    .where(SUB_KEY, S.c.status == "pending", or_(any_agent, S.c.agent_name == agent))
    .values(status="resolved", resolved_by=resolved_by, result=result, resolved_at=now)
    .returning(*SUB_COLUMNS), row=SubTaskRow)
CLAIM_PENDING = Statement(
    "claim_pending", "Claims a pending sub-task without recording a result (the first of "
    "two steps).",
    update(S)
    .where(SUB_KEY, S.c.status == "pending")
    # A claim ends an announcement check: a claimer that dies leaves the call to
    # time out (its deadline still runs), never to be published again.
    .values(status="claimed", resolved_at=now, timeout_deadline=TIMES_OUT_AT)
    .returning(*SUB_COLUMNS), row=SubTaskRow)
_CALL_KEY = and_(S.c.tenant_id == tenant, S.c.logical_task_id == task,
                 S.c.invocation_id == invocation,
                 S.c.function_call_id == bindparam("p_call", type_=String))
RECORD_CLAIMED = Statement(
    "record_claimed", "Records the result of a claimed call (the second step of the two: claim, "
    "then record).",
    update(S)
    .where(_CALL_KEY, S.c.status == "claimed")
    .values(status="resolved", resolved_by=resolved_by, result=result, resolved_at=now)
    .returning(*SUB_COLUMNS), row=SubTaskRow)
SUB_TASK_STATUS = Statement(
    "sub_task_status", "Reads a sub-task's status and the agent of its task.",
    select(S.c.status, S.c.agent_name).where(SUB_KEY))
CALL_STATUS = Statement(
    "call_status", "Reads the status and id of a call's sub-task.",
    select(S.c.status, S.c.sub_task_id).where(_CALL_KEY))
GET_SUB_TASK = Statement(
    "get_sub_task", "Reads one sub-task.", select(*SUB_COLUMNS).where(SUB_KEY), row=SubTaskRow)
#: The row lock serialises concurrent resolvers, so exactly one of them reads
#: ``completed_count == total_expected``.
ADVANCE_INVOCATION = Statement(
    "advance_invocation", "Counts p_n more finished calls on an invocation and returns "
    "its counts.",
    update(I)
    .where(INVOCATION_KEY)
    .values(completed_count=I.c.completed_count + bindparam("p_n", type_=Integer))
    .returning(I.c.completed_count, I.c.total_expected))
#: The lease goes to ``p_owner`` only if nobody holds it (a canceler, say): a held
#: lease is never taken away here. SET expressions all read the old row, so both
#: CASEs decide alike.
_LEASE_FREE = or_(T.c.owner.is_(None), T.c.lease_expires_at <= now)
MARK_RESUMING_VALUES = {
    "status": "resuming", "owner": case((_LEASE_FREE, owner), else_=T.c.owner),
    "lease_expires_at": case((_LEASE_FREE, lease_until), else_=T.c.lease_expires_at),
    "version": T.c.version + 1}
MARK_RESUMING = Statement(
    "mark_resuming", "Marks a task whose join completed as resuming, leasing it to the "
    "resolver if the lease is free.",
    update(T).where(TASK_KEY).values(MARK_RESUMING_VALUES).returning(T.c.owner))
#: So that one bad task cannot stop the sweeper from resolving every other task's
#: deadlines.
QUARANTINE = Statement(
    "quarantine", "Parks a sub-task of a task whose rows are corrupt.",
    update(S).where(SUB_KEY)
    .values(status="quarantined", resolved_by=None, result=None, resolved_at=now))

#: On SQLite the IMMEDIATE transaction already excludes every other writer; on
#: PostgreSQL the picking SELECT locks the rows it picks and skips rows another
#: sweeper (or a resolver) holds. The pick is a MATERIALIZED CTE, evaluated once: as
#: an ``IN (subquery)`` PostgreSQL may re-run it and, with tied deadlines, update more
#: than ``p_limit`` rows. The rows picked are locked (or the transaction holds the
#: write lock), so they are still open: the UPDATE takes them by their whole primary
#: key from the pick, and tests no tenant of its own: given ``tenant_id = :p_tenant``
#: as well, PostgreSQL without statistics scanned the tenant's rows by that prefix of
#: the key and compared each with every picked row.
_PICK_EXPIRED = (
    select(S.c.tenant_id, S.c.sub_task_id)
    .where(S.c.tenant_id == tenant, S.c.agent_name == agent, OPEN,
           S.c.timeout_deadline <= now, _TIMEOUT_DUE)
    .order_by(S.c.timeout_deadline, S.c.sub_task_id)
    .limit(limit)
    .with_for_update(skip_locked=True)
    .cte("expired")
    .prefix_with("MATERIALIZED"))
SWEEP_EXPIRED = Statement(
    "sweep_expired", "Resolves up to p_limit of an agent's open sub-tasks whose deadline "
    "passed with the timeout result.",
    update(S)
    .where(tuple_(S.c.tenant_id, S.c.sub_task_id).in_(
        select(_PICK_EXPIRED.c.tenant_id, _PICK_EXPIRED.c.sub_task_id)))
    .values(status="resolved", resolved_by="timeout", result=result, resolved_at=now)
    .returning(*SUB_COLUMNS), row=SubTaskRow)
_PICK_UNCHECKED = (
    select(S.c.tenant_id, S.c.sub_task_id)
    .where(S.c.tenant_id == tenant, S.c.agent_name == agent, OPEN,
           S.c.timeout_deadline <= now, S.c.status == "pending", ANNOUNCE_CHECK)
    .order_by(S.c.timeout_deadline, S.c.sub_task_id)
    .limit(limit)
    .with_for_update(skip_locked=True)
    .cte("unchecked")
    .prefix_with("MATERIALIZED"))
CHECK_ANNOUNCED = Statement(
    "check_announced", "Takes up to p_limit of an agent's pending sub-tasks whose "
    "announcement check is due: their deadline becomes their timeout's, and they are "
    "returned to be published again.",
    update(S)
    .where(tuple_(S.c.tenant_id, S.c.sub_task_id).in_(
        select(_PICK_UNCHECKED.c.tenant_id, _PICK_UNCHECKED.c.sub_task_id)))
    .values(timeout_deadline=S.c.created_at + S.c.timeout_s)
    .returning(*SUB_COLUMNS), row=SubTaskRow)
_TIMEOUT = bindparam("p_timeout", type_=Float)
RESET_DEADLINE = Statement(
    "reset_deadline", "Restarts a pending sub-task's deadline (a status update from its "
    "peer) and records the peer's task id.",
    update(S)
    .where(SUB_KEY, S.c.status == "pending")
    .values(timeout_deadline=now + func.coalesce(_TIMEOUT, S.c.timeout_s),
            timeout_s=func.coalesce(_TIMEOUT, S.c.timeout_s),
            peer_task_id=func.coalesce(bindparam("p_peer_task", type_=String),
                                       S.c.peer_task_id))
    .returning(S.c.timeout_deadline))

# -- leases ------------------------------------------------------------------------------

#: One slot per status a task can have; unused slots are bound to NULL, which
#: ``IN`` never matches. (Fixed slots rather than an expanding list keep the SQL one
#: fixed statement.)
STATUS_SLOTS = tuple(f"p_status_{n}" for n in range(len(TASK_STATUSES)))
#: The status is tested as ``status || ''``: the same test, but one from which
#: PostgreSQL cannot prove the predicate of the index of resuming tasks. From
#: ``status = 'resuming'`` it could, and on a table never analyzed it took a scan of
#: that whole index, with a heap fetch per entry, for as cheap as the primary key.
TAKE_LEASE = Statement(
    "take_lease", "Takes a task's resume lease if its status is one of the given ones, "
    "the lease is free, expired or already the caller's, and the task is agent p_agent's "
    "(unless p_any_agent).",
    update(T)
    .where(TASK_KEY, or_(any_agent, T.c.agent_name == agent),
           T.c.status.concat("").in_([bindparam(slot, type_=String) for slot in STATUS_SLOTS]),
           or_(T.c.owner.is_(None), T.c.lease_expires_at <= now, T.c.owner == owner))
    .values(owner=owner, lease_expires_at=lease_until, status="resuming",
            version=T.c.version + 1)
    .returning(T.c.version))
RENEW_LEASE = Statement(
    "renew_lease", "Extends a resume lease its holder still holds.",
    update(T)
    .where(TASK_KEY, T.c.owner == owner)
    .values(lease_expires_at=lease_until, version=T.c.version + 1)
    .returning(T.c.version))
RELEASE_LEASE = Statement(
    "release_lease", "Gives a held resume lease up.",
    update(T)
    .where(TASK_KEY, T.c.owner == owner)
    .values(owner=None, lease_expires_at=None, version=T.c.version + 1)
    .returning(T.c.version))

# -- reads -------------------------------------------------------------------------------

#: The columns of a task's row that a restore reads (:class:`TaskRow`): not its count of
#: take-overs (0014), which only recovery reads (meshpoint.store.recovery_queries).
TASK_COLUMNS = tuple(T.c[name] for name in TaskRow._fields)
GET_TASK = Statement("get_task", "Reads a paused task's row.",
                     select(*TASK_COLUMNS).where(TASK_KEY), row=TaskRow)
GET_EVENTS = Statement(
    "get_events", "Reads a task's conversation rows in order.",
    select(E.c.seq, E.c.data).where(OF_TASK[E]).order_by(E.c.seq), row=EventRow)
GET_INVOCATIONS = Statement(
    "get_invocations", "Reads a task's parallel invocations.",
    select(I.c.invocation_id, I.c.call_order, I.c.results).where(OF_TASK[I]),
    row=InvocationRow)
GET_INVOCATION = Statement(
    "get_invocation", "Reads one parallel invocation.",
    select(I.c.invocation_id, I.c.call_order, I.c.results).where(INVOCATION_KEY),
    row=InvocationRow)
GET_TASK_SUB_TASKS = Statement(
    "get_task_sub_tasks", "Reads every sub-task of a task, oldest first.",
    select(*SUB_COLUMNS).where(OF_TASK[S]).order_by(S.c.created_at, S.c.sub_task_id),
    row=SubTaskRow)
GET_INVOCATION_RESULTS = Statement(
    "get_invocation_results", "Reads the results recorded on an invocation's sub-tasks.",
    select(S.c.sub_task_id, S.c.function_call_id, S.c.result)
    .where(S.c.tenant_id == tenant, S.c.logical_task_id == task,
           S.c.invocation_id == invocation, S.c.status == "resolved"))

# -- operators ---------------------------------------------------------------------------

_PENDING = and_(S.c.tenant_id == tenant, OPEN)  # open: pending, or claimed and unrecorded
COUNT_BY_AGENT_STATUS = Statement(
    "count_by_agent_status", "Counts paused tasks by agent and status.",
    select(T.c.agent_name, T.c.status, func.count())
    .where(T.c.tenant_id == tenant).group_by(T.c.agent_name, T.c.status))
PENDING_SUMMARY = Statement(
    "pending_summary", "Counts open sub-tasks and reads the next deadline.",
    select(func.count(), func.min(TIMES_OUT_AT)).where(_PENDING))
EXPIRED_COUNT = Statement(
    "expired_count", "Counts open sub-tasks whose deadline passed.",
    select(func.count()).where(_PENDING, S.c.timeout_deadline <= now, _TIMEOUT_DUE))
_OPEN_BY_TASK = (select(S.c.logical_task_id, func.count().label("n"),
                        func.min(TIMES_OUT_AT).label("next_deadline"))
                 .where(_PENDING).group_by(S.c.logical_task_id).subquery())
_ANY_STATUS = bindparam("p_any_status", type_=Boolean)
LIST_PAUSED_TASKS = Statement(
    "list_paused_tasks", "Lists paused tasks, oldest checkpoint first, with their open "
    "sub-tasks and next deadline (optionally of one agent, in one status).",
    select(T.c.logical_task_id, T.c.agent_name, T.c.status, T.c.owner,
           T.c.lease_expires_at, T.c.version, T.c.checkpointed_at,
           _OPEN_BY_TASK.c.n, _OPEN_BY_TASK.c.next_deadline)
    .select_from(T.outerjoin(_OPEN_BY_TASK,
                             _OPEN_BY_TASK.c.logical_task_id == T.c.logical_task_id))
    .where(T.c.tenant_id == tenant, or_(any_agent, T.c.agent_name == agent),
           or_(_ANY_STATUS, T.c.status == bindparam("p_status", type_=String)))
    .order_by(T.c.checkpointed_at, T.c.logical_task_id).limit(limit))
#: A page of the dashboard's task list: keyset paging on the primary key (the
#: tasks after ``p_after`` in id order, ids from ``p_from`` below ``p_to``: a prefix
#: as a range the index reads), so a page costs the same over any number of tasks; the
#: open sub-tasks are counted per row of the page only (their task index).
_PAGE_OPEN = (select(func.count()).where(_PENDING, S.c.logical_task_id == T.c.logical_task_id)
              .scalar_subquery())
TASKS_PAGE = Statement(
    "tasks_page", "Lists one page of paused tasks in id order after a given id, of an id "
    "range, optionally of one agent and one status, with each one's open sub-tasks.",
    select(T.c.logical_task_id, T.c.agent_name, T.c.status, T.c.owner,
           T.c.lease_expires_at, T.c.version, T.c.checkpointed_at, _PAGE_OPEN)
    .where(T.c.tenant_id == tenant,
           T.c.logical_task_id > bindparam("p_after", type_=String),
           T.c.logical_task_id >= bindparam("p_from", type_=String),
           T.c.logical_task_id < bindparam("p_to", type_=String),
           or_(any_agent, T.c.agent_name == agent),
           or_(_ANY_STATUS, T.c.status == bindparam("p_status", type_=String)))
    .order_by(T.c.logical_task_id).limit(limit))
RESUMABLE_TASKS = Statement(
    "resumable_tasks", "Lists an agent's tasks whose join completed, or that were "
    "checkpointed mid-turn, and that nobody is resuming (no lease, or an expired one).",
    select(T.c.logical_task_id)
    .where(T.c.agent_name == agent, T.c.tenant_id == tenant,
           text(RESUMING_PREDICATE),  # word for word: the partial index's
           or_(T.c.owner.is_(None), T.c.lease_expires_at <= now))
    .order_by(T.c.lease_expires_at).limit(limit))
_BEFORE = bindparam("p_before", type_=Float)
EXPIRED_TASKS = Statement(
    "expired_tasks", "Lists an agent's tasks last checkpointed before a time that nobody "
    "holds a lease on, oldest first (for recovery to fail them).",
    select(T.c.logical_task_id)
    .where(T.c.agent_name == agent, T.c.tenant_id == tenant, T.c.checkpointed_at < _BEFORE,
           or_(T.c.owner.is_(None), T.c.lease_expires_at <= now))
    .order_by(T.c.checkpointed_at).limit(limit))
#: Each task counts once, the first that matches: expired, input_required, working.
_EXPIRED = and_(bindparam("p_expiring", type_=Boolean), T.c.checkpointed_at < _BEFORE)
TASK_COUNTS = Statement(
    "task_counts", "Counts paused tasks as expired, waiting for input, working (or "
    "resuming), or waiting on peers, each once, and reads the oldest and mean "
    "checkpoint time.",
    select(func.count(),
           func.count(case((_EXPIRED, 1))),
           func.count(case((_EXPIRED, None), (T.c.status == "input_required", 1))),
           func.count(case((_EXPIRED, None),
                           (or_(T.c.status == "working", T.c.status == "resuming"), 1))),
           func.min(T.c.checkpointed_at), func.avg(T.c.checkpointed_at))
    .where(T.c.tenant_id == tenant))
NEXT_DEADLINES = Statement(
    "next_deadlines", "Lists the open sub-tasks that expire soonest.",
    select(*SUB_COLUMNS).where(_PENDING).order_by(S.c.timeout_deadline).limit(limit),
    row=SubTaskRow)
NEXT_DEADLINES_OF_AGENT = Statement(
    "next_deadlines_of_agent", "Lists an agent's open sub-tasks that expire soonest.",
    select(*SUB_COLUMNS).where(_PENDING, S.c.agent_name == agent)
    .order_by(S.c.timeout_deadline).limit(limit), row=SubTaskRow)
LIVE_ROW_COUNTS = Statement(
    "live_row_counts", "Counts the rows of every live table, across tenants.",
    select(*(select(func.count()).select_from(table).scalar_subquery().label(table.name)
             for table in LIVE_TABLES)))
