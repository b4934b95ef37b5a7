"""The checkpoint store's tables, one definition for SQLite and PostgreSQL.

Names follow the original design (docs/store.md, "Tables"); every table
carries ``tenant_id`` as the first column of its primary key. Times are epoch
seconds as floats (``*_at``, ``timeout_deadline``), computed by the store's
clock rather than the database's, so SQLite and PostgreSQL behave alike.

The Alembic migrations in ``migrations/versions`` must produce exactly these
definitions; ``tests/integration/test_migrations.py`` checks that they do. The tables
of registered integrations (LangGraph's saver) join ``metadata`` when this module is
imported (:mod:`meshpoint.store.integrations`), and are held to the same checks.

No foreign keys tie a task's child rows to ``agent_paused_tasks``, on purpose.
Children are written with their task and deleted with it in one transaction
(``cleanup_task``), which the race test proves leaves no row behind. A foreign
key would add an index probe per child row, and PostgreSQL caches the plan of
that probe per connection: planned while the parent table was still empty, it
scans the table, and on a fresh database every checkpoint slowed as the table grew
(docs/store.md, *Performance*).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Column,
    Dialect,
    Float,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    Text,
    TypeDecorator,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB

from meshpoint import _json
from meshpoint.store import integrations

metadata = MetaData()


class SqliteJSON(TypeDecorator[Any]):
    """A JSON value kept as its text in a TEXT column, on SQLite.

    A column declared ``JSON`` has NUMERIC affinity in SQLite: the text of a bare
    number is stored as a number (``1.0`` as the integer 1, ``18446744073709551615``
    as a float that lost digits), which then reads back as neither JSON nor the
    value written. TEXT affinity stores the text as written. SQL ``NULL`` stands for
    ``None``, as with ``JSON(none_as_null=True)`` (migration 0005)."""

    impl = Text
    cache_ok = True

    def process_bind_param(self, value: Any, dialect: Dialect) -> str | None:
        return None if value is None else _json.dumps(value)

    def process_result_value(self, value: Any, dialect: Dialect) -> Any:
        return None if value is None else _json.loads(value)


class SqliteJSONDoc(SqliteJSON):
    """:class:`SqliteJSON` for documents that are verified before use: text that no
    longer parses reads back as :class:`~meshpoint._json.Undecodable` (which fails
    verification, naming its row) instead of failing the whole read. PostgreSQL's
    JSONB refuses such text on write."""

    cache_ok = True

    def process_result_value(self, value: Any, dialect: Dialect) -> Any:
        return None if value is None else _json.loads_or_undecodable(value)


#: The caller's JSON (results, correlation data, conversation events), kept as the
#: text written: TEXT on SQLite (see SqliteJSON), ``json`` on PostgreSQL. JSONB would
#: rewrite it: it turns ``1e16`` into an integer and ``1e300`` into 301 digits that no
#: 64-bit JSON reader takes back, and it reorders object keys (migration 0005).
JSONText = JSON(none_as_null=True).with_variant(SqliteJSON(), "sqlite")
#: Documents meshpoint writes and queries by content: JSONB on PostgreSQL (indexable,
#: compared by value), TEXT on SQLite.
def _document(on_sqlite: SqliteJSON) -> JSON:
    return (JSON(none_as_null=True).with_variant(JSONB(none_as_null=True), "postgresql")
            .with_variant(on_sqlite, "sqlite"))


JSONDoc = _document(SqliteJSON())
#: :data:`JSONDoc` for the history's records, which are verified before use: on
#: SQLite, text that no longer parses reads back as ``Undecodable`` (see
#: :class:`SqliteJSONDoc`).
HistoryDoc = _document(SqliteJSONDoc())

ID = String(255)
TENANT = String(64)

#: Statuses of a paused task (docs/store.md, "Tables"). ``resuming`` is set by the store only, and
#: ``blocked`` too: a task whose history failed verification waits for an operator.
TASK_STATUSES = ("waiting_peers", "input_required", "handoff", "resuming", "working",
                 "blocked")
#: Statuses a caller may checkpoint a task in.
CHECKPOINT_STATUSES = ("waiting_peers", "input_required", "handoff", "working")

#: Sub-tasks that are still open, i.e. can still expire: ``pending`` (waiting for the
#: answer) and ``claimed`` (the two-step path, result not yet recorded).
#: The other statuses are ``resolved`` (answer or timeout) and ``quarantined`` (its
#: task's rows are corrupt). SQL text, so that the partial index and the queries that
#: must use it carry the predicate word for word.
OPEN_SUB_TASK_PREDICATE = "status IN ('pending', 'claimed')"
#: Paused tasks whose join completed, for recovery (SQL text, as above).
RESUMING_PREDICATE = "status IN ('resuming', 'working')"

paused_tasks = Table(
    "agent_paused_tasks",
    metadata,
    Column("tenant_id", TENANT, primary_key=True),
    Column("logical_task_id", ID, primary_key=True),
    Column("agent_name", ID, nullable=False),
    Column("status", String(32), nullable=False),
    Column("current_invocation_id", ID),
    # The context minus its sub-tasks, parallel calls and conversation, which have
    # tables of their own. JSON bytes, zlib-compressed past a size threshold.
    Column("context", LargeBinary, nullable=False),
    Column("context_encoding", String(16), nullable=False),
    Column("context_sha256", String(64), nullable=False),
    # Events in agent_session_events this task has; restore checks it to detect loss.
    Column("session_event_count", Integer, nullable=False),
    # The resume lease: who may run the task now, and until when.
    Column("owner", ID),
    Column("lease_expires_at", Float),
    # Bumped by every write to the row, for optimistic checks and operators.
    Column("version", Integer, nullable=False),
    Column("created_at", Float, nullable=False),
    Column("checkpointed_at", Float, nullable=False),
    Column("expires_at", Float),
    # Take-overs in a row: recovery's take of a lease whose holder died counts one; a
    # checkpoint of progress by the holder resets it (0014, RecoveryPolicy.max_recoveries).
    Column("recoveries", Integer, nullable=False, server_default=text("0")),
    # Secondary indexes lead with a column that statements by key never test, so
    # that on a never-analyzed table only the primary key matches those (0004).
    # This one finds the tasks of an agent that recovery may resume. It holds only
    # tasks whose join completed (a handful at any time), so a checkpoint, which
    # writes a task waiting on peers, has no secondary index to update on its task
    # row (0004). The recovery query repeats the predicate word for word. It leaves
    # out tenant_id: PostgreSQL, guessing that a tenant is 0.5 % of the rows, would
    # otherwise read the whole index for a statement by key on a resuming task.
    Index("ix_agent_paused_tasks_resuming", "agent_name", "lease_expires_at",
          postgresql_where=text(RESUMING_PREDICATE), sqlite_where=text(RESUMING_PREDICATE)),
)

peer_sub_tasks = Table(
    "agent_peer_sub_tasks",
    metadata,
    Column("tenant_id", TENANT, primary_key=True),
    Column("sub_task_id", ID, primary_key=True),
    Column("logical_task_id", ID, nullable=False),
    # The calling agent, denormalised so the sweeper's index covers its query.
    Column("agent_name", ID, nullable=False),
    Column("invocation_id", ID, nullable=False),
    Column("function_call_id", ID, nullable=False),
    Column("peer_agent_name", ID),
    Column("peer_task_id", ID),
    Column("correlation_data", JSONText, nullable=False),
    Column("timeout_s", Float, nullable=False),
    Column("timeout_deadline", Float, nullable=False),
    Column("status", String(16), nullable=False),
    Column("resolved_by", String(32)),
    Column("result", JSONText),
    Column("resolved_at", Float),
    Column("created_at", Float, nullable=False),
    # Led by the task or the agent, never by tenant_id: see agent_paused_tasks.
    Index("ix_agent_peer_sub_tasks_task", "logical_task_id", "tenant_id", "invocation_id"),
    # Only open sub-tasks can expire; the partial index stays small. The sweeper's
    # query repeats this predicate word for word so both databases use the index.
    Index("ix_agent_peer_sub_tasks_deadline", "agent_name", "tenant_id", "timeout_deadline",
          postgresql_where=text(OPEN_SUB_TASK_PREDICATE),
          sqlite_where=text(OPEN_SUB_TASK_PREDICATE)),
)

parallel_invocations = Table(
    "agent_parallel_invocations",
    metadata,
    Column("tenant_id", TENANT, primary_key=True),
    Column("logical_task_id", ID, primary_key=True),
    Column("invocation_id", ID, primary_key=True),
    Column("total_expected", Integer, nullable=False),
    Column("completed_count", Integer, nullable=False),
    # Function-call ids in the model's order; results are handed back in this order.
    Column("call_order", JSONText, nullable=False),
    # Results known at checkpoint time (local tools, early answers), keyed by call id.
    # Peer results arriving later are stored on their sub-task rows, so recording one
    # is a counter increment, never a read-modify-write of this document.
    Column("results", JSONText, nullable=False),
    Column("created_at", Float, nullable=False),
)

#: The conversation, append-only: one row per checkpoint that appended events.
session_events = Table(
    "agent_session_events",
    metadata,
    Column("tenant_id", TENANT, primary_key=True),
    Column("logical_task_id", ID, primary_key=True),
    # The index of the row's first event in the conversation: rows are contiguous
    # runs, so a row's seq is the previous row's seq plus its number of events.
    Column("seq", Integer, primary_key=True),
    # The JSON array of the events this checkpoint appended (migration 0002: before
    # it, each row held one event).
    Column("data", JSONText, nullable=False),
    Column("created_at", Float, nullable=False),
)

#: The checkpoint history (:mod:`meshpoint.history`): one immutable record per
#: checkpoint and end of a task, hash-chained per task (migration 0008). Not live
#: state: it outlives the task's live rows until its retention lets a purge remove it.
checkpoints = Table(
    "agent_checkpoints",
    metadata,
    Column("tenant_id", TENANT, primary_key=True),
    Column("checkpoint_id", String(36), primary_key=True),  # UUIDv7: sorts by time
    Column("logical_task_id", ID, nullable=False),
    Column("seq", Integer, nullable=False),  # position in the task's chain, from 1
    Column("agent_name", ID, nullable=False),
    Column("agent_type", String(64), nullable=False),
    Column("iteration", Integer, nullable=False),
    Column("phase", String(32), nullable=False),
    Column("parent_id", String(36)),
    # The record document (schema 1.0) without its hash and signature: what is hashed.
    Column("data", HistoryDoc, nullable=False),
    # The task as checkpointed, to restore from (JSON, zlib past the threshold).
    Column("snapshot", LargeBinary),
    Column("snapshot_encoding", String(8)),
    Column("hash", String(64), nullable=False),
    Column("signature", Text),
    Column("key_id", String(64)),
    Column("retention_policy", String(64)),
    Column("created_at", Float, nullable=False),
    # A task's chain in order; unique, so two writers cannot both append record n.
    Index("ix_agent_checkpoints_task", "logical_task_id", "tenant_id", "seq", unique=True),
    Index("ix_agent_checkpoints_agent", "agent_name", "tenant_id", "created_at"),
    # PostgreSQL only: a GIN index answers JSONB containment queries on the documents
    # (jsonb_path_ops: a hash per path to a value, not an entry per key; 0011).
    Index("ix_agent_checkpoints_data", "data", postgresql_using="gin",
          postgresql_ops={"data": "jsonb_path_ops"}).ddl_if(
        dialect="postgresql"),
)

#: The head of each task's chain: how many records it has and the last one's hash,
#: signed, so that a cut-off tail is detected (a chain alone cannot tell). A purge
#: that removes the oldest records moves ``pruned_through``/``pruned_hash`` (the last
#: removed record) so the rest still verifies. Written with every record.
checkpoint_heads = Table(
    "agent_checkpoint_heads",
    metadata,
    Column("tenant_id", TENANT, primary_key=True),
    Column("logical_task_id", ID, primary_key=True),
    Column("agent_name", ID, nullable=False),
    Column("records", Integer, nullable=False),
    Column("head_id", String(36), nullable=False),
    Column("head_hash", String(64), nullable=False),
    Column("signature", Text),
    Column("key_id", String(64)),
    Column("pruned_through", Integer, nullable=False, server_default=text("0")),
    Column("pruned_hash", String(64), nullable=False, server_default=text("''")),
    # How the task ended (completed, failed, canceled, expired); None while it lives.
    Column("outcome", String(32)),
    Column("retention_policy", String(64)),
    Column("updated_at", Float, nullable=False),
    # No secondary index: heads are read by task (and paged by task for a purge);
    # one by agent and updated_at moved with every record (dropped by 0011).
)

events = Table(
    "agent_events",
    metadata,
    Column("tenant_id", TENANT, primary_key=True),
    Column("event_id", String(36), primary_key=True),  # UUIDv7
    Column("agent_name", ID, nullable=False),
    Column("logical_task_id", ID),
    Column("event_type", String(64), nullable=False),
    Column("step_name", ID),
    Column("input_data", JSONDoc),
    Column("output_data", JSONDoc),
    Column("state_snapshot", JSONDoc),
    # When it was logged, in integer microseconds since the epoch: one exact value,
    # stored and returned as it is (0013; seconds as a float were returned rounded,
    # so an event's own timestamp was not a bound it fell on).
    Column("created_at_us", BigInteger, nullable=False),
    Index("ix_agent_events_task", "tenant_id", "logical_task_id", "created_at_us"),
    Index("ix_agent_events_agent", "tenant_id", "agent_name", "created_at_us"),
)

#: Tasks that ended after a checkpoint, remembered for a while (see
#: ``SqlStore.forget_ended_tasks``): a request the broker delivers again after its
#: task ended (an instance died between the task's first checkpoint and its ack of
#: the request) then cannot store the task anew, so its peers are not asked twice.
#: Not live state: a task's end leaves this row and no other.
ended_tasks = Table(
    "agent_ended_tasks",
    metadata,
    Column("tenant_id", TENANT, primary_key=True),
    Column("logical_task_id", ID, primary_key=True),
    Column("agent_name", ID, nullable=False),
    Column("ended_at", Float, nullable=False),
    # Led by the agent, as the others (0004): each agent's instances prune their own.
    Index("ix_agent_ended_tasks_agent", "agent_name", "tenant_id", "ended_at"),
)

#: Each agent's circuit breaker (0014; :mod:`meshpoint.store.breakers`): shared by every
#: instance of the agent, so that all of them stop resuming its tasks together, and
#: kept across restarts. ``state`` is ``closed`` (resumes go on; ``failures`` failed
#: resumes counted since ``window_started_at``), ``open`` (no resume until
#: ``opened_until``) or ``half_open`` (one trial resume, ``trial_owner``'s, until
#: ``trial_until``). A row is written at an agent's first failed resume.
breakers = Table(
    "agent_breakers",
    metadata,
    Column("tenant_id", TENANT, primary_key=True),
    Column("agent_name", ID, primary_key=True),
    Column("state", String(16), nullable=False),
    Column("failures", Integer, nullable=False),
    Column("window_started_at", Float),
    Column("opened_until", Float),
    Column("trial_owner", ID),
    Column("trial_until", Float),
    Column("updated_at", Float, nullable=False),
)

#: PostgreSQL only (migration 0012): which database role is which tenant's, for a
#: deployment that isolates tenants by role (``meshpoint migrate --tenant-role``).
#: Not tenant data: it has no row-level security and no grant to any runtime role;
#: the policies read it through ``meshpoint_tenant(current_user)``, which runs as
#: its owner. Kept apart from ``metadata`` (every table there is a tenant's, created
#: on both databases and granted to the runtime role).
roles_metadata = MetaData()
tenant_roles = Table(
    "meshpoint_tenant_roles",
    roles_metadata,
    Column("role_name", String(63), primary_key=True),
    Column("tenant_id", String(64), nullable=False),
)

#: Tables holding a paused task's live state, children first (the delete order).
LIVE_TABLES = (peer_sub_tasks, parallel_invocations, session_events, paused_tasks)

# Last, once the store's tables are defined: the tables of registered integrations
# (LangGraph's saver) join ``metadata`` (see meshpoint.store.integrations).
integrations.load_tables()
