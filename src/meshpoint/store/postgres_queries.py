"""PostgreSQL's one-statement fast paths, as named statements (see
:mod:`meshpoint.store.statement`): a first checkpoint, a re-checkpoint, a resolution,
a restore and a task's end, each chained through data-modifying CTEs or subqueries, with and
without the history. :class:`~meshpoint.store.postgres.PostgresFastPaths` runs them;
``make sql`` renders them into ``store/sql/`` (``pg_*.postgresql.sql``).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    JSON,
    Float,
    Integer,
    String,
    Text,
    bindparam,
    cast,
    column,
    delete,
    func,
    insert,
    literal,
    literal_column,
    or_,
    select,
    true,
    type_coerce,
    update,
)
from sqlalchemy.dialects.postgresql import JSON as PG_JSON
from sqlalchemy.dialects.postgresql import aggregate_order_by

from meshpoint.store import history_queries as hq
from meshpoint.store import queries as q
from meshpoint.store.statement import Statement

T, S, I, E = q.T, q.S, q.I, q.E  # noqa: E741
ONLY = ("postgresql",)

# A checkpoint's children travel as JSON arrays (p_subs, p_invs), expanded by
# json_to_recordset, so that a checkpoint is one statement however many it has. The
# caller's JSON in them (correlation data, results, call order) travels as JSON text,
# cast to json: PostgreSQL's JSON functions de-escape every string of what they parse
# and refuse a \u0000 in any of them, which the json type stores (the portable body
# binds each value as json and stores it). As text inside the array it is never NUL:
# JSON text escapes it.
SUB_FIELDS = (("sub_task_id", String), ("invocation_id", String),
               ("function_call_id", String), ("peer_agent_name", String),
               ("peer_task_id", String), ("correlation_data", Text), ("timeout_s", Float),
               ("timeout_deadline", Float))
_INVOCATION_FIELDS = (("invocation_id", String), ("total_expected", Integer),
                      ("completed_count", Integer), ("call_order", Text), ("results", Text))
#: The fields of p_subs and p_invs that hold the caller's JSON, as JSON text.
JSON_TEXT = {"p_subs": ("correlation_data",), "p_invs": ("call_order", "results")}


def _records(param: str, fields: tuple[tuple[str, Any], ...]) -> Any:
    return (func.json_to_recordset(bindparam(param, type_=PG_JSON))
            .table_valued(*(column(name, kind) for name, kind in fields))
            .render_derived(name=param.removeprefix("p_"), with_types=True))


def _columns(records: Any, param: str, fields: tuple[tuple[str, Any], ...]) -> list[Any]:
    """The recordset's columns, the caller's JSON cast from its text to json."""
    return [cast(records.c[name], PG_JSON) if name in JSON_TEXT[param] else records.c[name]
            for name, _ in fields]


def _child_inserts(*where: Any) -> tuple[Any, ...]:
    """The CTEs inserting a checkpoint's children, each under ``where``."""
    subs = _records("p_subs", SUB_FIELDS)
    invs = _records("p_invs", _INVOCATION_FIELDS)
    sub_names = [name for name, _ in SUB_FIELDS]
    inv_names = [name for name, _ in _INVOCATION_FIELDS]
    insert_subs = insert(S).from_select(
        ["tenant_id", "logical_task_id", "agent_name", *sub_names, "status", "created_at"],
        select(q.tenant, q.task, q.agent, *_columns(subs, "p_subs", SUB_FIELDS),
               literal("pending"), q.now).where(*where))
    insert_invs = insert(I).from_select(
        ["tenant_id", "logical_task_id", *inv_names, "created_at"],
        select(q.tenant, q.task, *_columns(invs, "p_invs", _INVOCATION_FIELDS), q.now)
        .where(*where))
    return (insert_subs.cte("new_sub_tasks"), insert_invs.cte("new_invocations"),
            q.append_events(*where).cte("new_events"))


def _first_checkpoint(history: bool) -> Any:
    """The task row and its children (and its history record, with ``history``); the
    children only if the task row was written (insert_task writes none for a task
    that already ended). Returns how many task rows it wrote: 0 means the portable
    body must say why."""
    new_task = q.insert_task().returning(T.c.logical_task_id).cte("new_task")
    written = select(new_task.c.logical_task_id).exists()
    if not history:
        return (select(func.count()).select_from(new_task)
                .add_cte(new_task, *_child_inserts(written)))
    record, head, moved = _record_inserts(written)
    return (select(func.count(), head_moved_or_fail(written, moved))
            .select_from(new_task).add_cte(new_task, *_child_inserts(written),
                                           record, head, moved))


def _record_inserts(*where: Any) -> tuple[Any, Any, Any]:
    """The CTEs writing a checkpoint's history record and moving its task's head
    (insert_record, and insert_head or advance_head), each under ``where``."""
    return (hq.insert_record(*where).cte("new_record"),
            hq.insert_head(*where).cte("new_head"),
            hq.advance_head().where(*where).returning(hq.H.c.records)
            .cte("moved_head"))


def head_moved_or_fail(written: Any, moved: Any) -> Any:
    """1, or a division by zero (the whole statement rolled back) if a record after
    the first was written and did not move its head: the head was not its parent
    when the update ran (a purge or another writer moved it after the statement's
    snapshot). The portable body then says so."""
    fine = or_(~written, ~hq.has_record, hq.seq == 1, select(moved.c.records).exists())
    return (literal(1) / cast(fine, Integer)).label("head_moved_or_fail")


#: Each write and the restore come in two forms, built by one function: with the
#: history (the default) and without it, for a store that keeps none, which touches
#: none of the history's tables (it runs on a schema older than them). One statement
#: with the history's part guarded by p_history would not; the restore's also took
#: 1.6x the time at p50 (docs/benchmarks.md, "The history's part of a fast path").
FIRST_CHECKPOINT = {
    True: Statement(
        "pg_first_checkpoint", "Writes a first checkpoint in one statement: the task row "
        "(insert_task), and if it was written its sub-tasks, invocations, new events and "
        "history record.", _first_checkpoint(True), dialects=ONLY),
    False: Statement(
        "pg_first_checkpoint_no_history", "pg_first_checkpoint without the history record.",
        _first_checkpoint(False), dialects=ONLY)}


def _recheckpoint(history: bool) -> Any:
    """recheckpoint_task guarded as count_open_sub_tasks guards it (no sub-task still
    open) and as advance_head does (the history's head is the new record's parent),
    then delete_task_sub_tasks, delete_task_invocations, the inserts of the new
    children and the history record, each only if the task row was rewritten.
    Returns the new version, or no row if the rewrite was refused: the portable body
    then says why (or finds that the open sub-tasks were resolved since).

    A data-modifying CTE that no other reads runs in an order PostgreSQL does not
    promise, and an invocation checkpointed again keeps its key: so each insert's
    condition counts the rows the deletes returned, which runs the deletes to
    completion before any row is inserted (the unique check then sees the old row
    deleted by this transaction). The task row is locked first, as the portable body
    locks it."""
    no_open_sub_task = ~select(literal(1)).where(q.OF_TASK[S], q.OPEN_OF_TASK).exists()
    rewritten = (q.recheckpoint_task()
                 .where(no_open_sub_task, *((hq.head_is_parent(),) if history else ()))
                 .cte("rewritten"))
    done = select(rewritten.c.version).exists()
    old_subs = (delete(S).where(q.OF_TASK[S], done).returning(S.c.sub_task_id)
                .cte("old_sub_tasks"))
    old_invs = (delete(I).where(q.OF_TASK[I], done).returning(I.c.invocation_id)
                .cte("old_invocations"))
    deletes_done = (select(func.count()).select_from(old_subs).scalar_subquery()
                    + select(func.count()).select_from(old_invs).scalar_subquery()) >= 0
    children = _child_inserts(done, deletes_done)
    if not history:
        return select(rewritten.c.version).add_cte(rewritten, old_subs, old_invs, *children)
    record, head, moved = _record_inserts(done)
    return (select(rewritten.c.version, head_moved_or_fail(done, moved))
            .add_cte(rewritten, old_subs, old_invs, *children, record, head, moved))


RECHECKPOINT = {
    True: Statement(
        "pg_recheckpoint", "Writes a re-checkpoint in one statement: recheckpoint_task (if "
        "no sub-task is open and the history's head is the new record's parent), the old "
        "children deleted, the new ones and the history record inserted.",
        _recheckpoint(True), dialects=ONLY),
    False: Statement(
        "pg_recheckpoint_no_history", "pg_recheckpoint without the history record.",
        _recheckpoint(False), dialects=ONLY)}


def _cleanup(history: bool) -> Any:
    """delete_task_sub_tasks, delete_task_invocations, delete_task_events,
    delete_task_of_owner (of agent p_agent too), record_ended and, with the history,
    the task's last record (the end of finalize), chained through data-modifying CTEs.
    The children are deleted first, as the portable body deletes them (the lock order
    of resolvers, see queries.py): the task row's delete counts the rows they
    returned, which runs them to completion before it. If the task row was not
    deleted (its lease is not held, the task is unknown or another agent's), or the
    record did not move the head, the statement fails by a division by zero and is
    rolled back whole: the portable body then says why."""
    def count(cte: Any) -> Any:
        return select(func.count()).select_from(cte).scalar_subquery()

    old_subs = delete(S).where(q.OF_TASK[S]).returning(S.c.sub_task_id).cte("old_sub_tasks")
    old_invs = (delete(I).where(q.OF_TASK[I]).returning(I.c.invocation_id)
                .cte("old_invocations"))
    old_events = delete(E).where(q.OF_TASK[E]).returning(E.c.seq).cte("old_events")
    gone = (delete(T).where(q.TASK_KEY, T.c.owner == q.owner, T.c.agent_name == q.agent,
                            count(old_subs) + count(old_invs) + count(old_events) >= 0)
            .returning(T.c.agent_name).cte("gone"))
    done = select(gone.c.agent_name).exists()
    ended = (insert(q.N).from_select(["tenant_id", "logical_task_id", "agent_name", "ended_at"],
                                     select(q.tenant, q.task, q.agent, q.now)
                                     .where(~q.ENDED, done))
             .returning(q.N.c.logical_task_id).cte("ended"))
    deleted_or_fail = (literal(1) / cast(done, Integer)).label("deleted_or_fail")
    ctes = (old_subs, old_invs, old_events, gone, ended)
    if not history:
        return select(deleted_or_fail).add_cte(*ctes)
    record, head, moved = _record_inserts(done)
    return (select(deleted_or_fail, head_moved_or_fail(done, moved))
            .add_cte(*ctes, record, head, moved))


CLEANUP = {
    True: Statement(
        "pg_cleanup", "Ends a task in one statement for its lease holder: its sub-tasks, "
        "invocations and events deleted, then its row, its end recorded in the ledger and "
        "its last history record written.", _cleanup(True), dialects=ONLY),
    False: Statement(
        "pg_cleanup_no_history", "pg_cleanup without the history record.", _cleanup(False),
        dialects=ONLY)}


def _resolve_one() -> Any:
    """The same three updates as resolve_pending, advance_invocation and mark_resuming,
    in the same lock order, chained through data-modifying CTEs. Run without BEGIN
    and COMMIT it is one round trip instead of five, and still atomic, but nothing
    can be rolled back once it returns: so it leaves alone every row the store would
    refuse after reading it (correlation data that is not an object, an invocation
    row missing or already full). It then returns no row, and the portable body
    runs, which explains the refusal. If the invocation filled up between the guard
    and the count (which consistent rows never do), the statement fails by a
    division by zero and is rolled back; the portable body then runs too.
    """
    # Every row is found by its primary key through a scalar subquery, never by a
    # join: PostgreSQL evaluates those as lookups whatever its estimates, whereas
    # without statistics (a table never analyzed) it joined the one returned row to a
    # scan of the whole tenant.
    open_slot = (select(I.c.completed_count < I.c.total_expected)
                 .where(I.c.tenant_id == S.c.tenant_id,
                        I.c.logical_task_id == S.c.logical_task_id,
                        I.c.invocation_id == S.c.invocation_id)
                 .scalar_subquery())
    resolved = (
        update(S)
        .where(q.SUB_KEY, S.c.status == "pending", or_(q.any_agent, S.c.agent_name == q.agent),
               func.json_typeof(S.c.correlation_data) == "object", open_slot)
        .values(status="resolved", resolved_by=q.resolved_by, result=q.result,
                resolved_at=q.now)
        .returning(*q.SUB_COLUMNS)
        .cte("resolved"))
    counted = (
        update(I)
        .where(I.c.tenant_id == q.tenant,
               I.c.logical_task_id == select(resolved.c.logical_task_id).scalar_subquery(),
               I.c.invocation_id == select(resolved.c.invocation_id).scalar_subquery(),
               I.c.completed_count < I.c.total_expected)
        .values(completed_count=I.c.completed_count + 1)
        .returning(I.c.logical_task_id, I.c.completed_count, I.c.total_expected)
        .cte("counted"))
    resumed = (
        update(T)
        .where(T.c.tenant_id == q.tenant, T.c.logical_task_id == (
            select(counted.c.logical_task_id)
            .where(counted.c.completed_count == counted.c.total_expected)
            .scalar_subquery()))
        .values(q.MARK_RESUMING_VALUES)
        .returning(T.c.owner)
        .cte("resumed"))
    # Division by zero if the sub-task was resolved but not counted: the statement
    # fails and rolls back whole (an expression of a column, so never folded early).
    counted_or_fail = literal(1) / cast(counted.c.completed_count.is_not(None), Integer)
    return (select(*resolved.c, counted.c.completed_count.label("completed"),
                   counted.c.total_expected.label("total"), resumed.c.owner.label("holder"),
                   counted_or_fail.label("counted_or_fail"))
            .select_from(resolved.outerjoin(counted, true()).outerjoin(resumed, true())))


RESOLVE_ONE = Statement(
    "pg_resolve_one", "Resolves one sub-task in one statement: resolve_pending, "
    "advance_invocation and, if that completes the join, mark_resuming.",
    _resolve_one(), dialects=ONLY)
def _restore(history: bool) -> Any:
    """A paused task's row with its children as JSON arrays of arrays (``[seq, data]``
    per event row, ``[invocation_id, call_order, results]`` per invocation, a
    sub-task's SUB_COLUMNS in order), each read by key in a subquery. One statement
    sees one snapshot by itself, so it needs no REPEATABLE READ transaction."""
    def rows_of(table: Any, columns: Any, *, order_by: Any = ()) -> Any:
        aggregated = (func.json_agg(aggregate_order_by(func.json_build_array(*columns),
                                                       *order_by)) if order_by
                      else func.json_agg(func.json_build_array(*columns)))
        return (select(func.coalesce(aggregated, literal_column("'[]'::json")))
                .where(table.c.tenant_id == q.tenant, table.c.logical_task_id == q.task)
                .scalar_subquery())

    return select(
        *q.TASK_COLUMNS,
        type_coerce(rows_of(E, (E.c.seq, E.c.data), order_by=(E.c.seq,)),
                    JSON).label("event_rows"),
        type_coerce(rows_of(I, (I.c.invocation_id, I.c.call_order, I.c.results)),
                    JSON).label("invocation_rows"),
        type_coerce(rows_of(S, q.SUB_COLUMNS, order_by=(S.c.created_at, S.c.sub_task_id)),
                    JSON).label("sub_task_rows"),
        *((type_coerce(select(func.json_build_array(*hq.HEAD_COLUMNS)).where(hq.HEAD_KEY)
                       .scalar_subquery(), JSON).label("head_row"),
           type_coerce(select(func.json_build_array(*hq.RECORD_COLUMNS)).where(
               hq.OF_TASK, hq.C.c.seq == select(hq.H.c.records).where(hq.HEAD_KEY)
               .scalar_subquery()).scalar_subquery(), JSON).label("latest_row"))
          if history else ()),
    ).where(q.TASK_KEY)


RESTORE = {
    True: Statement(
        "pg_restore", "Reads a paused task's row, all its children and its history head "
        "with the record it names in one statement (get_task, get_events, "
        "get_invocations, get_task_sub_tasks, get_head and get_record_at).",
        _restore(True), dialects=ONLY),
    False: Statement(
        "pg_restore_no_history", "pg_restore without the history's head and record.",
        _restore(False), dialects=ONLY)}
