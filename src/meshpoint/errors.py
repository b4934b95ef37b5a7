"""The one error hierarchy of meshpoint.

Every error a user can meet is a subclass of :class:`MeshpointError`, says what
happened and what to do about it. Backends translate driver errors (asyncpg,
sqlite3) into these at the boundary, so callers never catch a driver's type::

    MeshpointError
    ├── InvalidArgumentError        (also a ValueError) an argument is malformed
    │   ├── ContextSerializationError  a context holds a value that is not JSON
    │   └── UnserializableValueError   a LangGraph value the saver cannot store safely
    ├── ConfigurationError          a store URL or option cannot be used
    │   ├── KeyMissingError         a signing or encryption key is not in the key ring
    │   └── TlsError                TLS to the database or broker failed as configured
    │   └── TenantRoleError         the database role may not act as the store's tenant
    ├── StoreError                  the checkpoint store refused or failed an operation
    │   ├── StoreUnavailableError   the database cannot be reached, or stayed locked
    │   │   └── MigrationLockError  another session held the migration lock too long
    │   ├── SchemaError             the database schema is missing or out of date
    │   ├── NotFoundError           an id is unknown (or belongs to another tenant)
    │   │   ├── UnknownTaskError
    │   │   ├── UnknownSubTaskError
    │   │   ├── UnknownInvocationError
    │   │   ├── UnknownCallError
    │   │   ├── UnknownCheckpointError  no history record has that id
    │   │   └── UnknownHistoryError     the task has no checkpoint history
    │   ├── ConflictError           the write would break an invariant
    │   │   ├── CheckpointConflictError   the task or a sub-task id is already stored
    │   │   │   └── TaskEndedError        the task already ended (a late copy of its request)
    │   │   ├── LeaseNotHeldError         the caller does not hold the task's resume lease
    │   │   ├── WrongAgentError           the task (or sub-task) is another agent's
    │   │   ├── ThreadSupersededError     another writer continued the LangGraph thread first
    │   │   └── SubTaskMovingError        its task is leaving for the cloud (sync --move-paused)
    │   ├── CorruptCheckpointError  a stored row does not decode; it was not used
    │   │   ├── HistoryIntegrityError  a history record or its chain fails verification
    │   │   ├── DecompressionLimitError  a stored blob inflates past the store's limit
    │   │   └── UnreadableValueError  a stored value is sealed under a key not held
    │   │                             (also a KeyMissingError)
    │   └── TaskBlockedError        a task whose history cannot be trusted is blocked
    ├── BrokerError                 the message broker refused or failed an operation
    │   ├── BrokerClosedError       the broker was closed
    │   ├── BrokerPermissionError   the broker's user may not publish or read that
    │   └── NamespaceNotServedError a client's namespace has no stream: nothing serves it
    ├── WaitTimeoutError            (also a TimeoutError) a client waited in vain for a
    │                               task's answer or its input-required pause
    ├── AnswerRefusedError          a human's answer to a waiting task was refused
    │   ├── AlreadyAnsweredError    the call was answered first (its ``decision``)
    │   ├── NotPendingError         the task does not wait on that call, or on any input
    │   ├── MisdirectedAnswerError  the answer went to another agent than the task's
    │   ├── DecisionRefusedError    not signed by an approver who may decide that call
    │   └── ArgumentsRejectedError  edited arguments fail the tool's JSON schema
    ├── BadMessageError             a message is malformed, unknown or too large
    └── ModelError                  a model endpoint failed or answered nonsense
        ├── ModelTimeoutError       a call did not end within its timeout_s
        └── ModelReplyTooLargeError a reply was larger than max_reply_bytes

A failed operation changes nothing: every store operation is one transaction,
rolled back before any of these is raised. One case cannot know: if the
connection is lost while COMMIT is in flight (``StoreUnavailableError``), the
transaction may have committed. Operations are safe to retry: a retried resolve
returns None if the first attempt won, and a lease it was granted then expires
and is taken over like any lease of a crashed owner.
"""

from __future__ import annotations

import warnings
from typing import Any


class MeshpointError(Exception):
    """Base class of every error meshpoint raises on purpose."""


class InvalidArgumentError(MeshpointError, ValueError):
    """An argument has the wrong type, shape or range; the message names it."""


class ContextSerializationError(InvalidArgumentError):
    """A task execution context holds a value that cannot be stored as JSON.

    ``path`` locates the offending value, for example ``flags['client'].socket``.
    """

    def __init__(self, message: str, *, path: str) -> None:
        super().__init__(message)
        self.path = path


class UnserializableValueError(InvalidArgumentError):
    """A value of a LangGraph thread that meshpoint's saver cannot store without pickle
    (an unregistered class, say); the message says how to register it. Raised when the
    value is written, never when it is read."""


class ConfigurationError(MeshpointError):
    """A store URL, driver or option cannot be used as given."""


class TlsError(ConfigurationError):
    """TLS to the database or the broker is configured, and the server could not be
    reached over it: it offers no TLS, or its certificate does not verify (or it
    refused this client's). Nothing was sent to it. Not retried: the settings, or
    the server, must change."""


class StoreError(MeshpointError):
    """The checkpoint store refused or failed an operation."""


class StoreUnavailableError(StoreError):
    """The database could not be reached, or stayed locked past the busy timeout."""


class MigrationLockError(StoreUnavailableError):
    """A migration waited ``migration_lock_timeout_s`` for the lock that serialises
    migrations, and another session still held it; the message names that session
    (its role and process id) when the server shows it. Nothing was migrated."""


class SchemaError(StoreError):
    """The database schema is missing or older than this version of meshpoint."""


class NotFoundError(StoreError):
    """An id is not stored for this tenant (it never was, or it was cleaned up)."""


class UnknownTaskError(NotFoundError):
    """No paused task with this id exists for this tenant."""

    def __init__(self, task_id: str) -> None:
        super().__init__(
            f"no paused task {task_id!r} in this tenant: it was never checkpointed, "
            "was already cleaned up, or belongs to another tenant"
        )
        self.task_id = task_id


class UnknownSubTaskError(NotFoundError):
    """No peer sub-task with this id exists for this tenant."""

    def __init__(self, sub_task_id: str) -> None:
        super().__init__(
            f"no peer sub-task {sub_task_id!r} in this tenant: it was never checkpointed, "
            "its task was already cleaned up, or it belongs to another tenant"
        )
        self.sub_task_id = sub_task_id


class UnknownInvocationError(NotFoundError):
    """A stored task has no parallel invocation with this id."""

    def __init__(self, task_id: str, invocation_id: str) -> None:
        super().__init__(
            f"task {task_id!r} has no parallel invocation {invocation_id!r}: only the "
            "invocation a task is paused in is stored"
        )
        self.task_id = task_id
        self.invocation_id = invocation_id


class UnknownCallError(NotFoundError):
    """A stored invocation has no peer call with this function-call id."""

    def __init__(self, task_id: str, invocation_id: str, function_call_id: str) -> None:
        super().__init__(
            f"task {task_id!r} has no peer call {function_call_id!r} in invocation "
            f"{invocation_id!r}"
        )
        self.task_id = task_id
        self.invocation_id = invocation_id
        self.function_call_id = function_call_id


class UnknownCheckpointError(NotFoundError):
    """No record of the checkpoint history has this id, for this tenant."""

    def __init__(self, checkpoint_id: str) -> None:
        super().__init__(f"no checkpoint {checkpoint_id!r} in this tenant's history: the "
                         "id is wrong, it was purged, or it belongs to another tenant")
        self.checkpoint_id = checkpoint_id


class UnknownHistoryError(NotFoundError):
    """The task has no checkpoint history, for this tenant."""

    def __init__(self, task_id: str) -> None:
        super().__init__(f"task {task_id!r} has no checkpoint history in this tenant: it "
                         "never paused, its history was purged, or it belongs to another "
                         "tenant")
        self.task_id = task_id


class ConflictError(StoreError):
    """The write would break a store invariant; nothing was written."""


class CheckpointConflictError(ConflictError):
    """The task or one of its sub-task ids is already stored and not leased to the caller."""


class TaskEndedError(CheckpointConflictError):
    """A first checkpoint of a task that already ended: its request was delivered
    again after the task finished (the instance that paused it died before
    acknowledging it). Nothing was written; the late copy is to be dropped."""

    def __init__(self, task_id: str) -> None:
        super().__init__(
            f"task {task_id!r} has already ended (cleanup_task) and is remembered until "
            "forget_ended_tasks: a late copy of its request, or a reused task id; nothing "
            "was written"
        )
        self.task_id = task_id


class LeaseNotHeldError(ConflictError):
    """The caller does not hold the task's resume lease (it expired and another took it)."""

    def __init__(self, task_id: str, owner: str | None, status: str | None = None) -> None:
        why = ("it is blocked: its checkpoint history failed verification, and it waits "
               "for an operator (meshpoint tasks show, then cancel)" if status == "blocked"
               else "it was never taken, was released, or expired and was taken by "
               "another owner")
        super().__init__(
            f"the resume lease of task {task_id!r} is not held by {owner!r}: {why}")
        self.task_id = task_id
        self.owner = owner


class WrongAgentError(ConflictError):
    """The task (or the task of the sub-task) named belongs to another agent than the
    one the operation is for: an answer, decision or cancel that reached the wrong
    agent's subject, or a re-checkpoint by another agent. A task never changes agent;
    nothing was written."""

    def __init__(self, what: str, owner: str, other: str) -> None:
        super().__init__(f"{what} belongs to agent {owner!r}, not {other!r}: nothing was "
                         "written")
        self.owner = owner
        self.other = other


class SubTaskMovingError(ConflictError):
    """The sub-task's task is leaving for the cloud (``meshpoint sync --move-paused``,
    docs/sync.md): no local claim takes it meanwhile. Nothing was written; an answer
    is handed back for redelivery, and once the move is done the cloud asks again."""

    def __init__(self, sub_task_id: str) -> None:
        super().__init__(
            f"sub-task {sub_task_id!r} is not claimed here: its task is being moved to the "
            "cloud (meshpoint sync --move-paused); nothing was written")
        self.sub_task_id = sub_task_id


class ThreadSupersededError(ConflictError):
    """A LangGraph loop step continues a checkpoint that another loop step already
    continued: two workers ran the same thread from the same checkpoint, and this one
    lost. Its checkpoint was not written, so the thread's chain does not fork; the
    writer should stop and let the thread be resumed from its latest checkpoint."""

    def __init__(self, thread_id: str, checkpoint_ns: str, parent_id: str) -> None:
        super().__init__(
            f"thread {thread_id!r} (namespace {checkpoint_ns!r}) was already continued "
            f"from checkpoint {parent_id!r} by another writer: this writer is superseded "
            "and its checkpoint was not written. Stop this run; resume the thread from "
            "its latest checkpoint"
        )
        self.thread_id = thread_id
        self.checkpoint_ns = checkpoint_ns
        self.parent_id = parent_id


class CorruptCheckpointError(StoreError):
    """A stored row failed to decode or its checksum does not match; it was not used."""

    def __init__(self, message: str, *, task_id: str | None = None) -> None:
        super().__init__(message)
        self.task_id = task_id


class DecompressionLimitError(CorruptCheckpointError):
    """A stored compressed blob (a task's context, a history snapshot) would inflate
    past the store's ``max_decompressed_bytes``: it was refused after inflating at
    most that much, and not used, like any other corrupt row. The message names the
    row and the limit."""


class HistoryIntegrityError(CorruptCheckpointError):
    """A record of a task's checkpoint history, or the chain that links them, failed
    verification: a hash or signature does not match, a record is missing or out of
    place, or the chain is shorter than its signed head says. ``checkpoint_id`` and
    ``seq`` name the first bad record (None when the head or the whole chain is at
    fault); ``reason`` says what did not match. Nothing unverified was used."""

    def __init__(self, reason: str, *, task_id: str | None = None,
                 checkpoint_id: str | None = None, seq: int | None = None) -> None:
        where = f"task {task_id!r}" if task_id else "a task"
        if seq is not None:
            where += f", record {seq}"
        if checkpoint_id:
            where += f" ({checkpoint_id})"
        super().__init__(f"the checkpoint history of {where} fails verification: {reason}",
                         task_id=task_id)
        self.reason = reason
        self.checkpoint_id = checkpoint_id
        self.seq = seq


class TaskBlockedError(StoreError):
    """The task's checkpoint history could not be verified back to a state it can
    resume from: it was marked ``blocked`` for an operator (``meshpoint tasks show``
    says why; ``meshpoint verify`` names the bad record), never resumed silently."""

    def __init__(self, task_id: str, reason: str, *,
                 a2a_context: dict[str, Any] | None = None) -> None:
        super().__init__(f"task {task_id!r} is blocked: {reason}")
        self.task_id = task_id
        self.reason = reason
        #: The task's A2A addressing, if its live row still decoded (to tell its caller).
        self.a2a_context = a2a_context or {}


class KeyMissingError(ConfigurationError):
    """A signing, verification or encryption key that an operation needs is not in
    the key ring (it was never configured, or was deleted on purpose: crypto-
    shredding). Nothing was written, and nothing is ever stored or shown in plain
    text instead."""


class TenantRoleError(ConfigurationError):
    """The store's database role may not act as the store's tenant: the database
    isolates tenants by role (``meshpoint migrate --tenant-role ROLE=TENANT``) and this
    role is mapped to another tenant, or to none. The message says which."""


class UnreadableValueError(CorruptCheckpointError, KeyMissingError):
    """A stored value is encrypted under a key this process does not hold: its
    tenant's keys were shredded, or never given to this process. The row is handled
    as any corrupt row (a task whose state cannot be read is not resumed; a listing
    shows the value as ``{"$unreadable": reason}``); nothing is shown in clear."""


class BrokerError(MeshpointError):
    """The message broker refused or failed an operation."""


class BrokerClosedError(BrokerError):
    """The broker was closed; open a new one."""


class BrokerPermissionError(BrokerError):
    """The broker refused this connection's user an operation its permissions do not
    allow (NATS: a permissions violation): publishing to a subject that is not its
    role's, or reading another user's queue. Not retried; the message names the
    subject the server refused."""


class NamespaceNotServedError(BrokerError):
    """A client (``open_client``, ``meshpoint submit``) found no stream for its
    namespace on NATS: no ``meshpoint serve`` has ever run there (a typo in the
    namespace, or the deployment is not started). A client does not create the
    stream, so a request is never left in a namespace nobody serves."""

    def __init__(self, namespace: str, stream: str, url: str) -> None:
        super().__init__(
            f"namespace {namespace!r} has no stream ({stream}) on NATS at {url}: no "
            f"`meshpoint serve` has run in it. Start one (meshpoint serve --config ... "
            f"--agent ...) with this namespace, or check the config's namespace; a client "
            "does not create the stream")
        self.namespace = namespace


class WaitTimeoutError(MeshpointError, TimeoutError):
    """A client waited ``timeout_s`` for a task's ``answer``, its ``input`` (a pause
    for a human) or either, and neither came. The message names the task, its agent
    and namespace; the task may still run (waiting again is safe)."""

    def __init__(self, *, task_id: str, request_id: str, agent: str, namespace: str,
                 waited_for: str, timeout_s: float) -> None:
        super().__init__(
            f"task {task_id} (request {request_id}, sent to agent {agent!r} in namespace "
            f"{namespace!r}): no {waited_for} within {timeout_s:g}s. If no instance took "
            f"it, start one (meshpoint serve --agent {agent}, with namespace "
            f"{namespace}); if one did, the task is still running or paused "
            f"(meshpoint tasks show {task_id})")
        self.task_id = task_id
        self.request_id = request_id
        self.agent = agent
        self.namespace = namespace
        #: What was waited for: ``"answer"``, ``"input"`` or ``"answer or input"``.
        self.waited_for = waited_for
        self.timeout_s = timeout_s


class AnswerRefusedError(MeshpointError):
    """An answer to a task waiting for a human (approve, deny, reply) was refused;
    nothing was written. ``code`` is its JSON-RPC error code on the wire; ``decision``
    the answer that stands, if there is one."""

    code = -32050

    def __init__(self, message: str, *, decision: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.decision = decision


class AlreadyAnsweredError(AnswerRefusedError):
    """The call was answered first, by someone else or by its deadline: the first
    answer wins. ``decision`` is the winning one."""

    code = -32051


class NotPendingError(AnswerRefusedError):
    """The task is not waiting for that call (or for any input): the call id is
    wrong, names a peer's call, or the task has moved on."""

    code = -32052


class MisdirectedAnswerError(AnswerRefusedError):
    """The answer was sent to another agent than the one whose task waits for it (its
    subject names one agent, the task is another's). Nothing was written; send it to
    the task's own agent."""

    code = -32053


class DecisionRefusedError(AnswerRefusedError):
    """A decision the runtime will not take. With approvers configured, a decision
    must be signed by one of them who may decide the call's tool: this one is
    unsigned, names an unknown approver, does not verify with that approver's key
    (forged, or changed since it was signed), or decides a tool its approver may not.
    With or without approvers, an approval whose ``proposed`` tool or arguments are not
    the pending call's (the call was changed after the approver saw it) is refused.
    Nothing was written; the task keeps waiting."""

    code = -32054


class ArgumentsRejectedError(AnswerRefusedError, InvalidArgumentError):
    """Edited arguments do not satisfy the tool's JSON schema; the message says where."""

    code = -32602


class BadMessageError(MeshpointError):
    """A message on the wire is malformed, of an unknown kind, or too large.

    The runtime dead-letters such a message with this error's text as the reason;
    it never crashes an instance or changes a task.
    """


class ModelError(MeshpointError):
    """A model call failed, or its answer cannot be used (e.g. tool-call arguments
    that are not a JSON object). The task fails with this error's text."""


class ModelTimeoutError(ModelError):
    """A model call did not end within its ``timeout_s``: connecting, sending and
    the whole reply, however slowly the server sent it."""


class ModelReplyTooLargeError(ModelError):
    """A model's reply was larger than ``max_reply_bytes``; none of it was used."""


def __getattr__(name: str) -> Any:
    """``IntegrityError``, this hierarchy's name for a history that fails verification
    before it was :class:`HistoryIntegrityError` (SQLAlchemy's ``IntegrityError`` is
    another thing, caught in the same modules): still importable, with a warning."""
    if name == "IntegrityError":
        warnings.warn("meshpoint.errors.IntegrityError was renamed HistoryIntegrityError; "
                      "import that", DeprecationWarning, stacklevel=2)
        return HistoryIntegrityError
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
