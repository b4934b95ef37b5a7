"""The sync's SQL, as named statements (see :mod:`meshpoint.store.statement`).

Reads of the source run on the local SQLite (``sync_read_*``, ``sync_key_at_*``,
``sync_behind_*``, the chain reads) and select by ``rowid``: SQLite assigns it under
its one write lock, so rowid order is commit order, and a reader that sees row n has
seen every committed row below it. (The UUIDv7 ids are made before the write
transaction begins, so two writers commit them out of order: a cursor on them could
pass a row that commits later.) Writes run on the cloud PostgreSQL, in transactions
of the tenant, under its row-level security (``sync_put_*``, the cursor and the
conflict log). The LangGraph saver's threads follow ``change_seq`` instead (see
:mod:`meshpoint.sync.tables`): their rows change in place. This module imports
SQLAlchemy, the store and the saver's tables (never LangGraph) only.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    BigInteger,
    Float,
    Integer,
    String,
    Table,
    Text,
    and_,
    bindparam,
    delete,
    func,
    literal_column,
    select,
)
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.sql.elements import ColumnElement

from meshpoint.integrations.langgraph.tables import graph_blobs, graph_checkpoints, graph_writes
from meshpoint.store.schema import checkpoint_heads, checkpoints, ended_tasks, events
from meshpoint.store.statement import Statement
from meshpoint.sync.move_tables import sync_moves
from meshpoint.sync.tables import (
    sync_conflicts,
    sync_cursors,
    sync_sources,
    sync_thread_changes,
    sync_threads,
)

tenant = bindparam("p_tenant", type_=String)
after = bindparam("p_after", type_=BigInteger)
limit = bindparam("p_limit", type_=Integer)
ROWID = literal_column("rowid", BigInteger)

#: The tables that travel, by name: each row's key columns (beside tenant_id).
KEYS: dict[str, tuple[str, ...]] = {
    checkpoints.name: ("checkpoint_id",),
    events.name: ("event_id",),
    ended_tasks.name: ("logical_task_id",),
}
TABLES: dict[str, Table] = {t.name: t for t in (checkpoints, events, ended_tasks)}
_SHORT = {checkpoints.name: "records", events.name: "events", ended_tasks.name: "ended"}


def _key(table: Table) -> ColumnElement[bool]:
    return and_(table.c.tenant_id == tenant,
                *(table.c[name] == bindparam(f"p_{name}", type_=table.c[name].type)
                  for name in KEYS[table.name]))


def _values(table: Table) -> dict[str, Any]:
    return {c.name: tenant if c.name == "tenant_id" else bindparam(f"p_{c.name}", type_=c.type)
            for c in table.c}


#: Per table: the next rows after a position, in commit order (SQLite).
READ: dict[str, Statement] = {}
#: Per table: the key of the row at a position, if it is still there (SQLite).
KEY_AT: dict[str, Statement] = {}
#: Per table: how many rows are after a position (SQLite).
BEHIND: dict[str, Statement] = {}
#: Per table but events: the cloud's row under a key (PostgreSQL).
GET: dict[str, Statement] = {}
#: Per table: the row inserted unless its key (or a unique position) is taken (PostgreSQL).
PUT: dict[str, Statement] = {}

#: A task moved to the cloud (meshpoint.sync.move) is in the local ledger of ended
#: tasks (so the local side never starts it again) but lives on in the cloud: its
#: local end does not travel.
_NOT_MOVED = ~select(sync_moves.c.logical_task_id).where(
    sync_moves.c.tenant_id == tenant,
    sync_moves.c.logical_task_id == ended_tasks.c.logical_task_id,
    sync_moves.c.state == "moved").exists()

for name, table in TABLES.items():
    short = _SHORT[name]
    travels = [_NOT_MOVED] if table is ended_tasks else []
    READ[name] = Statement(
        f"sync_read_{short}", f"Reads the next rows of {name} after a position, in "
        "commit order (rowid)" + (", but the ends of tasks moved to the cloud."
                                  if travels else "."),
        select(ROWID.label("sync_rowid"), *table.c)
        .where(table.c.tenant_id == tenant, ROWID > after, *travels).order_by(ROWID)
        .limit(limit), dialects=("sqlite",))
    KEY_AT[name] = Statement(
        f"sync_key_at_{short}", f"Reads the key of the row of {name} at a position.",
        select(*(table.c[k] for k in KEYS[name]))
        .where(table.c.tenant_id == tenant, ROWID == after), dialects=("sqlite",))
    BEHIND[name] = Statement(
        f"sync_behind_{short}", f"Counts the rows of {name} after a position.",
        select(func.count()).select_from(table)
        .where(table.c.tenant_id == tenant, ROWID > after, *travels), dialects=("sqlite",))
    if table is not events:  # a batch of events is read by its ids (GET_EVENTS)
        GET[name] = Statement(
            f"sync_get_{short}", f"Reads the cloud's row of {name} under a key.",
            select(*table.c).where(_key(table)), dialects=("postgresql",))

#: The cloud's events among a batch's ids (PostgreSQL): one round trip per batch.
GET_EVENTS = Statement(
    "sync_get_events_many", "Reads the cloud's events of a batch of ids.",
    select(*events.c).where(events.c.tenant_id == tenant, events.c.event_id == func.any(
        bindparam("p_ids", type_=ARRAY(String)))), dialects=("postgresql",))

PUT[checkpoints.name] = Statement(
    "sync_put_records", "Inserts a history record unless its id or its place in its "
    "task's chain is taken (the caller compares what is there).",
    pg_insert(checkpoints).values(_values(checkpoints)).on_conflict_do_nothing(),
    dialects=("postgresql",))
PUT[events.name] = Statement(
    "sync_put_events", "Inserts an event unless its id is taken (the caller compares "
    "what is there).",
    pg_insert(events).values(_values(events)).on_conflict_do_nothing(),
    dialects=("postgresql",))
PUT[ended_tasks.name] = Statement(
    "sync_put_ended", "Inserts a task's end unless the cloud holds one (an end is never "
    "replaced: the caller compares what is there).",
    pg_insert(ended_tasks).values(_values(ended_tasks)).on_conflict_do_nothing(),
    dialects=("postgresql",))

GET_RECORD_AT_SEQ = Statement(
    "sync_get_record_at_seq", "Reads the cloud's record at one place of a task's chain.",
    select(*checkpoints.c).where(
        checkpoints.c.tenant_id == tenant,
        checkpoints.c.logical_task_id == bindparam("p_logical_task_id", type_=String),
        checkpoints.c.seq == bindparam("p_seq", type_=Integer)),
    dialects=("postgresql",))

# -- chains (the whole chain of a task travels with any of its records) ----------------

_task = bindparam("p_task", type_=String)
CHAIN_ROWS = Statement(
    "sync_chain_rows", "Reads every record of a task's chain, oldest first.",
    select(*checkpoints.c).where(checkpoints.c.tenant_id == tenant,
                                 checkpoints.c.logical_task_id == _task)
    .order_by(checkpoints.c.seq), dialects=("sqlite",))
HEAD_ROW = Statement(
    "sync_head_row", "Reads a task's history head.",
    select(*checkpoint_heads.c).where(checkpoint_heads.c.tenant_id == tenant,
                                      checkpoint_heads.c.logical_task_id == _task))
_head = pg_insert(checkpoint_heads).values(_values(checkpoint_heads))
PUT_HEAD = Statement(
    "sync_put_head", "Inserts a task's history head, or moves the cloud's to this one "
    "if it names a longer chain.",
    _head.on_conflict_do_update(
        index_elements=["tenant_id", "logical_task_id"],
        set_={c.name: _head.excluded[c.name] for c in checkpoint_heads.c
              if c.name not in ("tenant_id", "logical_task_id")},
        where=checkpoint_heads.c.records < _head.excluded.records),
    dialects=("postgresql",))

#: The largest rowid of each table that travels (SQLite): a follower passes as soon
#: as it changes. Each is the end of a b-tree, read without a scan.
WATCH = Statement(
    "sync_watch", "Reads the largest rowid of each table that travels, and the largest "
    "change sequence number of LangGraph threads.",
    select(*(select(func.max(ROWID)).select_from(t).scalar_subquery().label(name)
             for name, t in TABLES.items()),
           select(func.max(sync_thread_changes.c.change_seq)).scalar_subquery()
           .label("langgraph_threads")), dialects=("sqlite",))

# -- the fast path of a batch (an anomaly sends it the careful way, above) ------------

_tasks = bindparam("p_tasks", type_=ARRAY(String))
GET_HEADS = Statement(
    "sync_get_heads", "Reads the cloud's history heads of a batch's tasks.",
    select(*checkpoint_heads.c).where(checkpoint_heads.c.tenant_id == tenant,
                                      checkpoint_heads.c.logical_task_id == func.any(_tasks)),
    dialects=("postgresql",))
GET_MARKS = Statement(
    "sync_get_marks", "Reads the id, place, hash and signature of the cloud's records of "
    "a batch's tasks.",
    select(checkpoints.c.logical_task_id, checkpoints.c.seq, checkpoints.c.checkpoint_id,
           checkpoints.c.hash, checkpoints.c.signature, checkpoints.c.key_id)
    .where(checkpoints.c.tenant_id == tenant, checkpoints.c.logical_task_id == func.any(_tasks)),
    dialects=("postgresql",))
ADD_RECORD = Statement(
    "sync_add_record", "Inserts a verified history record (a taken id or place fails the "
    "statement: the batch is then applied chain by chain).",
    pg_insert(checkpoints).values(_values(checkpoints)), dialects=("postgresql",))
ADD_EVENT = Statement(
    "sync_add_event", "Inserts an event (a taken id fails the statement: the batch is then "
    "compared with the cloud's rows, inserted unless taken and read back).",
    pg_insert(events).values(_values(events)), dialects=("postgresql",))

# -- the source id (local) -------------------------------------------------------------

GET_SOURCE = Statement(
    "sync_get_source", "Reads this database's id as a sync source.",
    select(sync_sources.c.source_id).where(sync_sources.c.tenant_id == tenant))
ADD_SOURCE = Statement(
    "sync_add_source", "Names this database as a sync source (at its first sync).",
    sync_sources.insert().values(tenant_id=tenant,
                                 source_id=bindparam("p_source", type_=String),
                                 created_at=bindparam("p_now", type_=Float)))

# -- cursors and the conflict log (cloud) ----------------------------------------------

_source = bindparam("p_source", type_=String)
_table = bindparam("p_table", type_=String)
LOCK_CURSOR = Statement(
    "sync_lock_cursor", "Serialises the syncs of one source table (until commit).",
    select(func.pg_advisory_xact_lock(func.hashtext(
        func.concat(tenant, "/", _source, "/", _table)))),
    dialects=("postgresql",))
GET_CURSOR = Statement(
    "sync_get_cursor", "Reads a source table's cursor.",
    select(sync_cursors.c.position, sync_cursors.c.position_key,
           sync_cursors.c.rows_applied, sync_cursors.c.updated_at)
    .where(sync_cursors.c.tenant_id == tenant, sync_cursors.c.source_id == _source,
           sync_cursors.c.table_name == _table))
_cursor = pg_insert(sync_cursors).values(
    tenant_id=tenant, source_id=_source, table_name=_table,
    position=bindparam("p_position", type_=BigInteger),
    position_key=bindparam("p_position_key", type_=Text),
    rows_applied=bindparam("p_rows", type_=BigInteger),
    updated_at=bindparam("p_now", type_=Float))
PUT_CURSOR = Statement(
    "sync_put_cursor", "Moves a source table's cursor to the last row of the batch "
    "applied in this transaction.",
    _cursor.on_conflict_do_update(
        index_elements=["tenant_id", "source_id", "table_name"],
        set_={"position": _cursor.excluded.position,
              "position_key": _cursor.excluded.position_key,
              "rows_applied": sync_cursors.c.rows_applied + _cursor.excluded.rows_applied,
              "updated_at": _cursor.excluded.updated_at}),
    dialects=("postgresql",))
ADD_CONFLICT = Statement(
    "sync_add_conflict", "Logs a row the sync did not apply (once per row and kind).",
    pg_insert(sync_conflicts).values(_values(sync_conflicts)).on_conflict_do_nothing(),
    dialects=("postgresql",))
LIST_CONFLICTS = Statement(
    "sync_list_conflicts", "Lists the tenant's conflict log, oldest first.",
    select(*sync_conflicts.c).where(sync_conflicts.c.tenant_id == tenant)
    .order_by(sync_conflicts.c.detected_at, sync_conflicts.c.table_name,
              sync_conflicts.c.row_key))

# -- the LangGraph saver's threads -----------------------------------------------------

_thread = bindparam("p_thread", type_=String)
#: The saver's tables, in the order a thread's rows are deleted (then inserted reversed).
GRAPH_TABLES: tuple[Table, ...] = (graph_writes, graph_blobs, graph_checkpoints)
#: Per saver table: the key of a row within its thread.
GRAPH_KEYS: dict[str, tuple[str, ...]] = {
    t.name: tuple(c.name for c in t.primary_key.columns if c.name not in ("tenant_id",
                                                                         "thread_id"))
    for t in GRAPH_TABLES}
_C = sync_thread_changes.c
READ_THREAD_CHANGES = Statement(
    "sync_read_thread_changes", "Reads the next changed LangGraph threads after a change "
    "sequence number, in commit order.",
    select(_C.change_seq.label("sync_rowid"), _C.thread_id)
    .where(_C.tenant_id == tenant, _C.change_seq > after).order_by(_C.change_seq)
    .limit(limit), dialects=("sqlite",))
BEHIND_THREADS = Statement(
    "sync_behind_threads", "Counts the LangGraph threads changed after a change sequence "
    "number.",
    select(func.count()).select_from(sync_thread_changes)
    .where(_C.tenant_id == tenant, _C.change_seq > after), dialects=("sqlite",))
LAST_THREAD_CHANGE = Statement(
    "sync_last_thread_change", "Reads the tenant's largest change sequence number of "
    "LangGraph threads.",
    select(func.coalesce(func.max(_C.change_seq), 0)).where(_C.tenant_id == tenant),
    dialects=("sqlite",))
#: Per saver table: a thread's rows without their bytes (``digest`` stands for them).
THREAD_SIGNS = {t.name: Statement(
    f"sync_thread_signs_{t.name.removeprefix('agent_langgraph_')}",
    f"Reads a LangGraph thread's rows of {t.name} without their bytes.",
    select(*(c for c in t.c if c.name != "data"))
    .where(t.c.tenant_id == tenant, t.c.thread_id == _thread),
    dialects=("postgresql",)) for t in GRAPH_TABLES}
DELETE_THREAD_ROW = {t.name: Statement(
    f"sync_delete_thread_row_{t.name.removeprefix('agent_langgraph_')}",
    f"Deletes one row of a LangGraph thread in {t.name}.",
    delete(t).where(t.c.tenant_id == tenant, t.c.thread_id == _thread,
                    *(t.c[k] == bindparam(f"p_{k}", type_=t.c[k].type)
                      for k in GRAPH_KEYS[t.name])),
    dialects=("postgresql",)) for t in GRAPH_TABLES}
PUT_THREAD_ROW = {t.name: Statement(
    f"sync_put_thread_row_{t.name.removeprefix('agent_langgraph_')}",
    f"Inserts one row of a LangGraph thread in {t.name}.",
    pg_insert(t).values(_values(t)), dialects=("postgresql",)) for t in GRAPH_TABLES}
LOCK_THREAD = Statement(
    "sync_lock_thread", "Serialises the syncs of one LangGraph thread, from any source "
    "(until commit).",
    select(func.pg_advisory_xact_lock(func.hashtext(
        func.concat(tenant, "/langgraph/", _thread)))),
    dialects=("postgresql",))
_T = sync_threads.c
GET_THREAD_BASE = Statement(
    "sync_get_thread_base", "Reads the fingerprint of a LangGraph thread as this source "
    "last left it in the cloud.",
    select(_T.version, _T.fingerprint).where(_T.tenant_id == tenant,
                                            _T.source_id == _source, _T.thread_id == _thread),
    dialects=("postgresql",))
_base = pg_insert(sync_threads).values(
    tenant_id=tenant, source_id=_source, thread_id=_thread,
    version=bindparam("p_version", type_=String),
    fingerprint=bindparam("p_fingerprint", type_=String),
    synced_at=bindparam("p_now", type_=Float))
PUT_THREAD_BASE = Statement(
    "sync_put_thread_base", "Records the fingerprint of a LangGraph thread as this source "
    "leaves it in the cloud (unchanged if it is the same).",
    _base.on_conflict_do_update(
        index_elements=["tenant_id", "source_id", "thread_id"],
        set_={"version": _base.excluded.version, "fingerprint": _base.excluded.fingerprint,
              "synced_at": _base.excluded.synced_at},
        where=_T.fingerprint != _base.excluded.fingerprint),
    dialects=("postgresql",))
