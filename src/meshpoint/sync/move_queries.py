"""The statements of a paused task's move to the cloud (:mod:`meshpoint.sync.move`),
as named statements (see :mod:`meshpoint.store.statement`).

Reads of a task's live rows and the holds and releases run on the local SQLite (the
portable ones run on both: the cloud is asked whether it holds the task); the
inserts of the rows that arrive and the move's advisory lock run on the cloud
PostgreSQL, in a transaction of the tenant, under its row-level security. The
store's own statements do the rest (``delete_task_*``, ``record_ended``,
``release_lease``). This module imports SQLAlchemy and the store only.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Float, String, Table, and_, bindparam, func, or_, select, update
from sqlalchemy.dialects.postgresql import insert as pg_insert

from meshpoint.store.schema import (
    ended_tasks,
    parallel_invocations,
    paused_tasks,
    peer_sub_tasks,
    session_events,
)
from meshpoint.store.statement import Statement
from meshpoint.sync.move_tables import sync_moves

T, S, I, E, M = paused_tasks, peer_sub_tasks, parallel_invocations, session_events, sync_moves  # noqa: E741
tenant = bindparam("p_tenant", type_=String)
task = bindparam("p_task", type_=String)
owner = bindparam("p_owner", type_=String)
move = bindparam("p_move", type_=String)
now = bindparam("p_now", type_=Float)
#: The status of a sub-task whose task is leaving for the cloud: no claim, sweep or
#: announcement check takes it (they take ``pending`` ones), and an answer for it
#: is handed back for redelivery (``SubTaskMovingError``), not dropped.
MOVING = "moving"
#: The statuses a task may be moved in.
MOVABLE = ("waiting_peers", "input_required")


def _of_task(table: Table) -> Any:
    return and_(table.c.tenant_id == tenant, table.c.logical_task_id == task)


def _values(table: Table, **fixed: Any) -> dict[str, Any]:
    return {c.name: tenant if c.name == "tenant_id" else fixed.get(
        c.name, bindparam(f"p_{c.name}", type_=c.type)) for c in table.c}


# -- reads (both sides) ----------------------------------------------------------------

TASK_ROW = Statement("move_task_row", "Reads a paused task's whole row.",
                     select(*T.c).where(_of_task(T)))
SUB_TASK_ROWS = Statement("move_sub_task_rows", "Reads every sub-task of a task.",
                          select(*S.c).where(_of_task(S)).order_by(S.c.sub_task_id))
INVOCATION_ROWS = Statement("move_invocation_rows", "Reads every invocation of a task.",
                            select(*I.c).where(_of_task(I)).order_by(I.c.invocation_id))
EVENT_ROWS = Statement("move_event_rows", "Reads a task's conversation rows, in order.",
                       select(*E.c).where(_of_task(E)).order_by(E.c.seq))
ENDED_ROW = Statement("move_ended_row", "Reads a task's row in the ledger of ended tasks.",
                      select(*ended_tasks.c).where(_of_task(ended_tasks)))
MOVES_OF_TASK = Statement(
    "move_moves_of_task", "Reads a task's rows in the ledger of moves, the latest first.",
    select(*M.c).where(_of_task(M)).order_by(M.c.started_at.desc(), M.c.move_id.desc()))
PAUSED = Statement(
    "move_paused", "Lists the tenant's paused tasks (their ids, agents and statuses).",
    select(T.c.logical_task_id, T.c.agent_name, T.c.status)
    .where(T.c.tenant_id == tenant).order_by(T.c.logical_task_id))
LEAVING = Statement(
    "move_leaving", "Lists the tenant's moves under way (left half-way by a crash).",
    select(M.c.logical_task_id).where(M.c.tenant_id == tenant, M.c.state == "leaving")
    .order_by(M.c.logical_task_id))

# -- the local side: hold, release, give back ------------------------------------------

HOLD = Statement(
    "move_hold", "Holds a paused task for its move: its lease taken, never to expire, if "
    "it waits on peers or for approval and nobody holds it.",
    update(T).where(_of_task(T), or_(*(T.c.status == status for status in MOVABLE)),
                    (T.c.owner.is_(None)) | (T.c.lease_expires_at <= now))
    .values(owner=owner, lease_expires_at=bindparam("p_until", type_=Float),
            version=T.c.version + 1)
    .returning(T.c.version))
FREEZE = Statement(
    "move_freeze", "Takes a held task's pending sub-tasks out of every local claim.",
    update(S).where(_of_task(S), S.c.status == "pending").values(status=MOVING))
THAW = Statement(
    "move_thaw", "Gives a task's sub-tasks taken out for a move back to local claims.",
    update(S).where(_of_task(S), S.c.status == MOVING).values(status="pending"))
ADD = Statement(
    "move_add", "Records a move in the ledger of moves.",
    M.insert().values(_values(M)))
FINISH = Statement(
    "move_finish", "Marks a move moved (local) once the task's rows were released.",
    update(M).where(_of_task(M), M.c.move_id == move)
    .values(state="moved", finished_at=now))
FORGET = Statement(
    "move_forget", "Forgets a move that was given up (the task stays local).",
    M.delete().where(_of_task(M), M.c.move_id == move))

# -- the cloud side ----------------------------------------------------------------------

LOCK = Statement(
    "move_lock", "Serialises the moves of one task (until commit).",
    select(func.pg_advisory_xact_lock(func.hashtext(func.concat(tenant, "/move/", task)))),
    dialects=("postgresql",))
PUT: dict[str, Statement] = {
    table.name: Statement(
        f"move_put_{short}", f"Inserts a moved task's row of {table.name}.",
        pg_insert(table).values(_values(table)), dialects=("postgresql",))
    for table, short in ((T, "task"), (S, "sub_task"), (I, "invocation"), (E, "events"))}
