"""The LangGraph saver's SQL, as named statements (see :mod:`meshpoint.store.statement`).

The saver (:mod:`meshpoint.integrations.langgraph`) runs these on the store's
database, in transactions of the store's tenant. This module imports SQLAlchemy and
the store only, never LangGraph, so that ``make sql`` renders them (into ``sql/``
beside it: :mod:`meshpoint.store.integrations` registers them) without LangGraph.

A read is one statement whatever it returns: the checkpoints it selects (one by id,
the latest of a namespace, or a page of a listing) as a CTE, and then, in one
``UNION ALL``, those rows (kind 0), every row of the value chains of the channel
versions they name (kind 1) and their pending writes (kind 2). A listing is thus a
query per page, never one per checkpoint, and a value stored as a chain of deltas
(see ``tables.graph_blobs``) is read in one range scan of its chain.

Two constructs render differently per dialect, because SQLite and PostgreSQL spell
them differently: the rows of a JSON object (``json_each`` / ``json_each_text``) and
the containment of one JSON document in another (``@>`` on PostgreSQL; on SQLite,
every key of the filter found with its value among the document's).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    Boolean,
    ColumnElement,
    Float,
    Integer,
    LargeBinary,
    String,
    Text,
    and_,
    bindparam,
    cast,
    delete,
    false,
    literal,
    null,
    or_,
    select,
    true,
    union_all,
    update,
)
from sqlalchemy.dialects.postgresql import insert as upsert
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.functions import FunctionElement
from sqlalchemy.sql.selectable import Join

from meshpoint.integrations.langgraph.tables import graph_blobs, graph_checkpoints, graph_writes
from meshpoint.store.schema import JSONDoc, JSONText
from meshpoint.store.statement import Statement

C, B, W = graph_checkpoints, graph_blobs, graph_writes

tenant = bindparam("p_tenant", type_=String)
thread = bindparam("p_thread", type_=String)
ns = bindparam("p_ns", type_=String)
checkpoint_id = bindparam("p_checkpoint", type_=String)
limit = bindparam("p_limit", type_=Integer)


# -- what SQLite and PostgreSQL spell differently ------------------------------------------

class json_items(FunctionElement[Any]):
    """The ``(key, value)`` rows of a JSON object, values as text."""

    name = "json_items"
    inherit_cache = True


@compiles(json_items, "sqlite")
def _json_items_sqlite(element: json_items, compiler: SQLCompiler, **kw: Any) -> str:
    return f"json_each({compiler.process(element.clauses, **kw)})"


@compiles(json_items, "postgresql")
def _json_items_postgresql(element: json_items, compiler: SQLCompiler, **kw: Any) -> str:
    return f"json_each_text({compiler.process(element.clauses, **kw)})"


class json_contains(FunctionElement[bool]):
    """Whether the JSON document (first argument) has every top-level key of the
    filter (second, JSON text) with the same value."""

    name = "json_contains"
    type = Boolean()
    inherit_cache = True


@compiles(json_contains, "sqlite")
def _json_contains_sqlite(element: json_contains, compiler: SQLCompiler, **kw: Any) -> str:
    document, wanted = (compiler.process(c, **kw) for c in element.clauses)
    return (f"NOT EXISTS (SELECT 1 FROM json_each({wanted}) AS f WHERE NOT EXISTS "
            f"(SELECT 1 FROM json_each({document}) AS m WHERE m.key = f.key "
            f"AND m.type = f.type AND m.value IS f.value))")


@compiles(json_contains, "postgresql")
def _json_contains_postgresql(element: json_contains, compiler: SQLCompiler,
                              **kw: Any) -> str:
    document, wanted = (compiler.process(c, **kw) for c in element.clauses)
    return f"({document} @> CAST({wanted} AS JSONB))"


class ordered_join(Join):
    """A join whose left side is read first: on SQLite a ``CROSS JOIN`` (which its
    planner never reorders), because on tables never analyzed it took an equality on
    ``tenant_id`` for a selective index and scanned the tenant's rows of the right
    side for each row on the left (1.6 ms instead of 0.5 for a 500-step thread)."""

    inherit_cache = True


@compiles(ordered_join, "sqlite")
def _ordered_join_sqlite(element: ordered_join, compiler: SQLCompiler, **kw: Any) -> str:
    kw["asfrom"] = True
    assert element.onclause is not None
    return (f"{compiler.process(element.left, **kw)} CROSS JOIN "
            f"{compiler.process(element.right, **kw)} ON "
            f"{compiler.process(element.onclause, **kw)}")


@compiles(ordered_join)
def _ordered_join(element: ordered_join, compiler: SQLCompiler, **kw: Any) -> str:
    return str(compiler.visit_join(element, **kw))  # type: ignore[no-untyped-call]


# -- writes --------------------------------------------------------------------------------

_CHECKPOINT_VALUES: dict[str, Any] = {
    "tenant_id": tenant, "thread_id": thread, "checkpoint_ns": ns,
    "checkpoint_id": checkpoint_id,
    "parent_checkpoint_id": bindparam("p_parent", type_=String),
    "continues": bindparam("p_continues", type_=String),
    "run_id": bindparam("p_run", type_=String),
    "hidden": false(),
    "blobs": bindparam("p_blobs", type_=JSONText),
    "metadata": bindparam("p_metadata", type_=JSONDoc),
    "data": bindparam("p_data", type_=LargeBinary),
    "digest": bindparam("p_digest", type_=String),
    "created_at": bindparam("p_now", type_=Float)}
_put = upsert(C).values(_CHECKPOINT_VALUES)
PUT_CHECKPOINT = Statement(
    "lg_put_checkpoint", "Stores a LangGraph checkpoint (again, if its id is stored: "
    "LangGraph's savers overwrite); a second loop step continuing one parent fails the "
    "unique index on continues.",
    _put.on_conflict_do_update(
        index_elements=list(C.primary_key.columns),
        set_={name: _put.excluded[name] for name in (
            "parent_checkpoint_id", "continues", "run_id", "hidden", "blobs", "metadata",
            "data", "digest", "created_at")}))

_BLOB_VALUES: dict[str, Any] = {
    "tenant_id": tenant, "thread_id": thread, "checkpoint_ns": ns,
    "channel": bindparam("p_channel", type_=String),
    "version": bindparam("p_version", type_=String),
    "base_version": bindparam("p_base", type_=String),
    "root_version": bindparam("p_root", type_=String),
    "depth": bindparam("p_depth", type_=Integer),
    "items": bindparam("p_items", type_=Integer),
    "data": bindparam("p_data", type_=LargeBinary),
    "digest": bindparam("p_digest", type_=String)}
#: A delta's base, in this thread and namespace.
_BASE = (select(literal(1)).where(
    B.c.tenant_id == tenant, B.c.thread_id == thread, B.c.checkpoint_ns == ns,
    B.c.channel == _BLOB_VALUES["channel"], B.c.version == _BLOB_VALUES["base_version"])
    .exists())
PUT_BLOB = Statement(
    "lg_put_blob", "Stores a channel version's value, or the items a list gained since "
    "its base version if that is stored; nothing if the version is stored already.",
    upsert(B).from_select(list(_BLOB_VALUES), select(*_BLOB_VALUES.values()).where(
        or_(_BLOB_VALUES["base_version"].is_(None), _BASE)))
    .on_conflict_do_nothing())

_WRITE_VALUES: dict[str, Any] = {
    "tenant_id": tenant, "thread_id": thread, "checkpoint_ns": ns,
    "checkpoint_id": checkpoint_id, "task_id": bindparam("p_task", type_=String),
    "idx": bindparam("p_idx", type_=Integer),
    "channel": bindparam("p_channel", type_=String),
    "task_path": bindparam("p_task_path", type_=Text),
    "data": bindparam("p_data", type_=LargeBinary),
    "digest": bindparam("p_digest", type_=String)}
PUT_WRITE = Statement(
    "lg_put_write", "Stores a task's write on a checkpoint, unless that (task, index) is "
    "stored already (a task's writes are idempotent).",
    upsert(W).values(_WRITE_VALUES).on_conflict_do_nothing())
_upsert_write = upsert(W).values(_WRITE_VALUES)
UPSERT_WRITE = Statement(
    "lg_upsert_write", "Stores a task's special write (error, interrupt, resume, "
    "scheduled), replacing the one stored under its (task, index).",
    _upsert_write.on_conflict_do_update(
        index_elements=list(W.primary_key.columns),
        set_={name: _upsert_write.excluded[name]
              for name in ("channel", "task_path", "data", "digest")}))


# -- reads ---------------------------------------------------------------------------------

#: The columns of a read's rows; which each kind puts in a, b, c, d, n and m.
READ_COLUMNS = ("kind", "thread_id", "checkpoint_ns", "a", "b", "c", "d", "n", "m",
                "data", "digest")


def _text(value: Any) -> Any:
    """A column as text (a JSON column read as its text), keeping its name."""
    return cast(value, Text).label(value.key)


def _no_text() -> Any:
    return cast(null(), Text)


def _no_int() -> Any:
    return cast(null(), Integer)


def read(targets: Any) -> Any:
    """The rows of the checkpoints ``targets`` selects (kind 0: checkpoint id, parent,
    blobs JSON), every row of the value chains they name (kind 1: channel, version,
    base version, root version, depth, items) and their writes (kind 2: checkpoint
    id, task id, channel, task path, idx), in one ``UNION ALL``."""
    t = targets.cte("targets")
    items = json_items(t.c.blobs).table_valued("key", "value").alias("refs")
    refs = (select(t.c.thread_id, t.c.checkpoint_ns, items.c.key.label("channel"),
                   items.c.value.label("version"))
            .select_from(t).join(items, true()).cte("refs"))
    roots = (select(B.c.thread_id, B.c.checkpoint_ns, B.c.channel, B.c.root_version)
             .distinct()
             .select_from(ordered_join(refs, B, and_(
                 B.c.tenant_id == tenant, B.c.thread_id == refs.c.thread_id,
                 B.c.checkpoint_ns == refs.c.checkpoint_ns, B.c.channel == refs.c.channel,
                 B.c.version == refs.c.version)))
             .cte("roots"))
    chain = (select(literal(1), B.c.thread_id, B.c.checkpoint_ns, B.c.channel, B.c.version,
                    B.c.base_version, B.c.root_version, B.c.depth, B.c["items"], B.c.data,
                    B.c.digest)
             .select_from(ordered_join(roots, B, and_(
                 B.c.tenant_id == tenant, B.c.thread_id == roots.c.thread_id,
                 B.c.checkpoint_ns == roots.c.checkpoint_ns, B.c.channel == roots.c.channel,
                 B.c.root_version == roots.c.root_version))))
    writes = (select(literal(2), W.c.thread_id, W.c.checkpoint_ns, W.c.checkpoint_id,
                     W.c.task_id, W.c.channel, W.c.task_path, W.c.idx, _no_int(), W.c.data,
                     W.c.digest)
              .select_from(ordered_join(t, W, and_(
                  W.c.tenant_id == tenant, W.c.thread_id == t.c.thread_id,
                  W.c.checkpoint_ns == t.c.checkpoint_ns,
                  W.c.checkpoint_id == t.c.checkpoint_id))))
    own = select(*(column.label(name) for column, name in zip((
        literal(0), t.c.thread_id, t.c.checkpoint_ns, t.c.checkpoint_id,
        t.c.parent_checkpoint_id, _text(t.c.blobs), _no_text(), _no_int(), _no_int(),
        t.c.data, t.c.digest), READ_COLUMNS, strict=True)))
    rows = union_all(own, chain, writes).subquery("read_rows")
    return select(*(rows.c[name] for name in READ_COLUMNS))


_TARGET_COLUMNS = (C.c.thread_id, C.c.checkpoint_ns, C.c.checkpoint_id,
                   C.c.parent_checkpoint_id, C.c.blobs, C.c.data, C.c.digest)
_IN_NS = and_(C.c.tenant_id == tenant, C.c.thread_id == thread, C.c.checkpoint_ns == ns,
              C.c.hidden.is_(False))

GET_CHECKPOINT = Statement(
    "lg_get_checkpoint", "Reads a checkpoint by id with its values and pending writes.",
    read(select(*_TARGET_COLUMNS).where(_IN_NS, C.c.checkpoint_id == checkpoint_id)))
GET_LATEST = Statement(
    "lg_get_latest", "Reads the latest checkpoint of a thread's namespace with its values "
    "and pending writes.",
    read(select(*_TARGET_COLUMNS).where(_IN_NS)
         .order_by(C.c.checkpoint_id.desc()).limit(1)))

_filter = bindparam("p_filter", type_=String)  # JSON text, or NULL for no filter
_before = bindparam("p_before", type_=String)  # a checkpoint id, or NULL
# The last row of the previous page, after ``p_before`` (copied threads share ids).
_after_thread = bindparam("p_after_thread", type_=String)
_after_ns = bindparam("p_after_ns", type_=String)
_PAGE = and_(C.c.tenant_id == tenant, C.c.hidden.is_(False),
             or_(_before.is_(None), C.c.checkpoint_id < _before,
                 and_(C.c.checkpoint_id == _before, _after_thread.is_not(None),
                      or_(C.c.thread_id > _after_thread,
                          and_(C.c.thread_id == _after_thread,
                               C.c.checkpoint_ns > _after_ns)))),
             or_(_filter.is_(None), json_contains(C.c["metadata"], _filter)))


def _page(*where: ColumnElement[bool]) -> Any:
    """Newest first; after ``p_before`` (exclusive), or after the previous page's last
    row (``p_before`` with ``p_after_thread`` and ``p_after_ns``)."""
    return (select(*_TARGET_COLUMNS).where(_PAGE, *where)
            .order_by(C.c.checkpoint_id.desc(), C.c.thread_id, C.c.checkpoint_ns)
            .limit(limit))


LIST_NS = Statement(
    "lg_list_ns", "Reads a page of a thread namespace's checkpoints (newest first, before "
    "a cursor, matching a metadata filter) with their values and pending writes.",
    read(_page(C.c.thread_id == thread, C.c.checkpoint_ns == ns)))
LIST_THREAD = Statement(
    "lg_list_thread", "lg_list_ns over every namespace of a thread.",
    read(_page(C.c.thread_id == thread)))
LIST_ALL = Statement(
    "lg_list_all", "lg_list_ns over every thread of the tenant.", read(_page()))

# -- delta channel history -----------------------------------------------------------------

#: How many ancestors one walk statement returns at most.
max_depth = bindparam("p_max_depth", type_=Integer)


def _ancestors() -> Any:
    """The checkpoint ``p_checkpoint`` and its ancestors, nearest first, up to
    ``p_max_depth`` of them (hidden ones too: prune keeps them for this walk)."""
    start = (select(C.c.checkpoint_id, C.c.parent_checkpoint_id, C.c.blobs,
                    literal(1).label("depth"))
             .where(C.c.tenant_id == tenant, C.c.thread_id == thread,
                    C.c.checkpoint_ns == ns, C.c.checkpoint_id == checkpoint_id)
             .cte("ancestors", recursive=True))
    parent = (select(C.c.checkpoint_id, C.c.parent_checkpoint_id, C.c.blobs,
                     start.c.depth + 1)
              .join(start, C.c.checkpoint_id == start.c.parent_checkpoint_id)
              .where(C.c.tenant_id == tenant, C.c.thread_id == thread,
                     C.c.checkpoint_ns == ns, start.c.depth < max_depth))
    return start.union_all(parent)


_walk = _ancestors()
ANCESTORS = Statement(
    "lg_ancestors", "Walks a checkpoint's parent chain (itself first), up to a depth, "
    "returning each one's parent and the channel versions it holds values of.",
    select(_walk.c.checkpoint_id, _walk.c.parent_checkpoint_id, _text(_walk.c.blobs),
           _walk.c.depth).order_by(_walk.c.depth))
_walk = _ancestors()
ANCESTOR_WRITES = Statement(
    "lg_ancestor_writes", "The writes stored on a checkpoint's ancestors up to a depth "
    "(the checkpoint itself is depth 1), for a delta channel's history.",
    select(_walk.c.depth, W.c.checkpoint_id, W.c.task_id, W.c.channel, W.c.task_path,
           W.c.idx, W.c.data, W.c.digest)
    .join(_walk, W.c.checkpoint_id == _walk.c.checkpoint_id)
    .where(W.c.tenant_id == tenant, W.c.thread_id == thread, W.c.checkpoint_ns == ns))
_channel = bindparam("p_channel", type_=String)
_of_version = (select(B.c.root_version)
               .where(B.c.tenant_id == tenant, B.c.thread_id == thread,
                      B.c.checkpoint_ns == ns, B.c.channel == _channel,
                      B.c.version == bindparam("p_version", type_=String))
               .scalar_subquery())
BLOB_CHAIN = Statement(
    "lg_blob_chain", "Every row of the value chain a channel version belongs to.",
    select(B.c.version, B.c.base_version, B.c.root_version, B.c.depth, B.c["items"], B.c.data,
           B.c.digest)
    .where(B.c.tenant_id == tenant, B.c.thread_id == thread, B.c.checkpoint_ns == ns,
           B.c.channel == _channel, B.c.root_version == _of_version))

# -- maintenance (delete, copy, prune) -----------------------------------------------------

DELETE_THREAD = {table.name: Statement(
    f"lg_delete_thread_{table.name.removeprefix('agent_langgraph_')}",
    f"Deletes a thread's rows of {table.name}.",
    delete(table).where(table.c.tenant_id == tenant, table.c.thread_id == thread))
    for table in (W, B, C)}
RUN_CHECKPOINTS = Statement(
    "lg_run_checkpoints", "The checkpoints a run wrote, in every thread of the tenant.",
    select(C.c.thread_id, C.c.checkpoint_ns, C.c.checkpoint_id)
    .where(C.c.tenant_id == tenant, C.c.run_id == bindparam("p_run", type_=String)))
THREAD_CHECKPOINTS = Statement(
    "lg_thread_checkpoints", "A thread's checkpoints (namespace, id, parent, whether "
    "hidden, the versions it holds values of, its metadata), for prune and cleanup.",
    select(C.c.checkpoint_ns, C.c.checkpoint_id, C.c.parent_checkpoint_id, C.c.hidden,
           _text(C.c.blobs), C.c["metadata"])
    .where(C.c.tenant_id == tenant, C.c.thread_id == thread))
THREAD_BLOBS = Statement(
    "lg_thread_blobs", "A thread's channel versions and the version each extends.",
    select(B.c.checkpoint_ns, B.c.channel, B.c.version, B.c.base_version)
    .where(B.c.tenant_id == tenant, B.c.thread_id == thread))
_KEY = and_(C.c.tenant_id == tenant, C.c.thread_id == thread, C.c.checkpoint_ns == ns,
            C.c.checkpoint_id == checkpoint_id)
DELETE_CHECKPOINT = Statement(
    "lg_delete_checkpoint", "Deletes a checkpoint.", delete(C).where(_KEY))
DELETE_CHECKPOINT_WRITES = Statement(
    "lg_delete_checkpoint_writes", "Deletes the writes pending on a checkpoint.",
    delete(W).where(W.c.tenant_id == tenant, W.c.thread_id == thread,
                    W.c.checkpoint_ns == ns, W.c.checkpoint_id == checkpoint_id))
HIDE_CHECKPOINT = Statement(
    "lg_hide_checkpoint", "Hides a checkpoint that prune keeps for a delta channel's "
    "history only.", update(C).where(_KEY).values(hidden=True))
DELETE_BLOB = Statement(
    "lg_delete_blob", "Deletes a channel version no checkpoint needs any more.",
    delete(B).where(B.c.tenant_id == tenant, B.c.thread_id == thread,
                    B.c.checkpoint_ns == ns, B.c.channel == _channel,
                    B.c.version == bindparam("p_version", type_=String)))
_target = bindparam("p_target", type_=String)


def _copy(table: Any) -> Any:
    names = [column.name for column in table.c]
    return table.insert().from_select(names, select(*(
        _target if name == "thread_id" else table.c[name] for name in names))
        .where(table.c.tenant_id == tenant, table.c.thread_id == thread))


COPY_THREAD = {table.name: Statement(
    f"lg_copy_thread_{table.name.removeprefix('agent_langgraph_')}",
    f"Copies a thread's rows of {table.name} to another thread.", _copy(table))
    for table in (C, B, W)}
THREAD_EXISTS = Statement(
    "lg_thread_exists", "Whether a thread has a checkpoint.",
    select(literal(1)).where(C.c.tenant_id == tenant, C.c.thread_id == thread).limit(1))
#: copy_thread with encryption: each row read, sealed again for its new thread, and
#: inserted (store/sealing.py binds a row's ciphertext to its thread).
THREAD_ROWS = {table.name: Statement(
    f"lg_thread_rows_{table.name.removeprefix('agent_langgraph_')}",
    f"Reads every row of a thread in {table.name}, to copy it.",
    select(table).where(table.c.tenant_id == tenant, table.c.thread_id == thread))
    for table in (C, B, W)}
INSERT_ROW = {table.name: Statement(
    f"lg_insert_row_{table.name.removeprefix('agent_langgraph_')}",
    f"Inserts one whole row of {table.name} (a copied row).",
    table.insert().values({column.name: bindparam(f"p_col_{column.name}", type_=column.type)
                           for column in table.c}))
    for table in (C, B, W)}
