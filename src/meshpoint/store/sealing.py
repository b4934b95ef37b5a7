"""Encryption at rest of the store's columns that carry user content.

With an encryption key ring (``HistoryOptions.encryption``; the config's
``history.encryption``), every value of these columns is sealed under its tenant's
active AES-256-GCM key (:mod:`meshpoint.history.encryption`) where its row is encoded, and
opened where its row is decoded; the statements never see the difference. The
columns, by family (a family may be left in clear by name,
``history.encryption.exclude``):

============  ==========================================================================
family        columns (what they hold)
============  ==========================================================================
context       ``agent_paused_tasks.context`` (the task's context: a2a addressing, flags
              with the approvals' decisions, mid-turn state, history annotations)
conversation  ``agent_session_events.data`` (requests, model replies with their tool
              calls, tool results)
calls         ``agent_peer_sub_tasks.correlation_data`` and ``result`` (a peer's request
              and answer, an approval's tool arguments and the human's decision, edited
              arguments and reply), ``agent_parallel_invocations.results`` (results of a
              turn's calls known at its checkpoint)
snapshots     ``agent_checkpoints.snapshot`` (the task as checkpointed, for repairs)
events        ``agent_events.input_data``, ``output_data``, ``state_snapshot``
langgraph     the LangGraph saver's ``data`` columns and its checkpoints' ``metadata``
              (named, and sealed through a Sealer, by its own modules:
              ``integrations/langgraph/tables.py``)
============  ==========================================================================

Each ciphertext's associated data is its tenant, its column and its row's key (the
task, with the event index, invocation or sub-task; the event id; the LangGraph
thread, namespace and checkpoint, channel version or write), so a ciphertext moved
to another row, task, thread, tenant or column does not decrypt. Everything else
stays in clear because queries need it or it is not content: ids, agent and peer
names, statuses, counts, times, leases, hashes and signatures, LangGraph's call
order and channel versions (docs/security.md lists every column).

Opening is strict where the value is used (a restore, a LangGraph read): a value
whose key is not held raises :class:`~meshpoint.errors.UnreadableValueError`, one
that does not decrypt a :class:`~meshpoint.errors.CorruptCheckpointError`, and the
row is handled as any corrupt row. Listings (sub-tasks, deadlines, the event log)
are lenient: such a value reads as ``{"$unreadable": reason}``. A value stored in
clear (written before encryption was on, or by a family left out) reads as it is.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from meshpoint.errors import (
    CorruptCheckpointError,
    HistoryIntegrityError,
    KeyMissingError,
    UnreadableValueError,
)
from meshpoint.history.encryption import EncryptionKeys, is_envelope, is_sealed
from meshpoint.history.planning import SEALED_CONTEXT_FIELDS

#: The key of what a lenient read gives for a value it cannot open.
UNREADABLE = "$unreadable"

# The columns, as their associated data names them.
CONTEXT = "agent_paused_tasks.context"
CONVERSATION = "agent_session_events.data"
CORRELATION = "agent_peer_sub_tasks.correlation_data"
RESULT = "agent_peer_sub_tasks.result"
RESULTS = "agent_parallel_invocations.results"
EVENT_COLUMNS = {"p_input": "agent_events.input_data",
                 "p_output": "agent_events.output_data",
                 "p_state": "agent_events.state_snapshot"}
# The ``langgraph`` family's columns are named by the saver's tables module
# (meshpoint.integrations.langgraph.tables), which seals them through a Sealer.


@dataclass(frozen=True)
class Sealer:
    """Seals and opens one tenant's column values (see the module docstring). Without
    ``keys`` nothing is sealed, and a sealed value read raises or reads as
    unreadable (the store was opened without the key ring)."""

    tenant_id: str
    keys: EncryptionKeys | None = None
    exclude: frozenset[str] = frozenset()

    def seals(self, family: str) -> bool:
        """Whether values of ``family`` are sealed when written."""
        return self.keys is not None and family not in self.exclude

    def _aad(self, column: str, row: Mapping[str, str]) -> dict[str, str]:
        return {"column": column, **row}

    # -- JSON values -----------------------------------------------------------------

    def seal(self, family: str, value: Any, column: str, **row: str) -> Any:
        """``value`` (JSON) as stored in ``column`` of the row keyed by ``row``: its
        envelope if ``family`` is sealed, else itself. KeyMissingError (nothing is
        written) if the tenant has no active key."""
        if value is None or self.keys is None or family in self.exclude:
            return value  # None: SQL NULL, which says nothing a row's kind does not
        return self.keys.encrypt(value, tenant=self.tenant_id, aad=self._aad(column, row))

    def open(self, value: Any, column: str, *, strict: bool = True, **row: str) -> Any:
        """The value :meth:`seal` stored (a value in clear as it is); see the module
        docstring for ``strict``."""
        if not is_envelope(value):
            return value
        try:
            if self.keys is None:
                raise KeyMissingError(_NO_RING)
            return self.keys.decrypt(value, tenant=self.tenant_id,
                                     aad=self._aad(column, row))
        except (KeyMissingError, HistoryIntegrityError) as error:
            refusal = _refusal(error, column, row)
            if strict:
                raise refusal from None
            return {UNREADABLE: str(refusal)}

    def open_context_fields(self, context: dict[str, Any], task_id: str) -> None:
        """Open, in place, the fields of a stored context the history seals on their
        own whatever the families (its security context and history annotations:
        :func:`meshpoint.history.planning.seal_context`, bound to their task and field);
        strict, as :meth:`open`."""
        for name in SEALED_CONTEXT_FIELDS:
            value = context.get(name)
            if not is_envelope(value):
                continue
            try:
                if self.keys is None:
                    raise KeyMissingError(_NO_RING)
                context[name] = self.keys.decrypt(value, tenant=self.tenant_id,
                                                  aad={"task": task_id, "field": name})
            except (KeyMissingError, HistoryIntegrityError) as error:
                raise _refusal(error, f"{CONTEXT} ({name})", {"task": task_id}) from None

    # -- bytes -------------------------------------------------------------------------

    def seal_bytes(self, family: str, data: bytes, column: str, **row: str) -> bytes:
        """:meth:`seal` for bytes (a blob column)."""
        if self.keys is None or family in self.exclude:
            return data
        return self.keys.encrypt_bytes(data, tenant=self.tenant_id,
                                       aad=self._aad(column, row))

    def open_bytes(self, data: bytes, column: str, **row: str) -> bytes:
        """:meth:`open` for bytes, always strict (bytes are read to be used)."""
        data = bytes(data)
        if not is_sealed(data):
            return data
        try:
            if self.keys is None:
                raise KeyMissingError(_NO_RING)
            return self.keys.decrypt_bytes(data, tenant=self.tenant_id,
                                           aad=self._aad(column, row))
        except (KeyMissingError, HistoryIntegrityError) as error:
            raise _refusal(error, column, row) from None


_NO_RING = "this store has no encryption key ring (history.encryption)"


def _refusal(error: Exception, column: str, row: Mapping[str, str]
             ) -> CorruptCheckpointError:
    """Why a sealed value of ``column`` cannot be read, as the error a strict read
    raises."""
    where = ", ".join(f"{key} {value!r}" for key, value in row.items())
    task_id = row.get("task") or row.get("thread")
    if isinstance(error, HistoryIntegrityError):
        return CorruptCheckpointError(
            f"{column} of the row of {where} does not decrypt (tampered with, or moved "
            "there from another row or column); it was not used", task_id=task_id)
    return UnreadableValueError(f"{column} of the row of {where} cannot be read: {error}",
                                task_id=task_id)


#: A store without encryption (and the default of parts built without one).
CLEAR = Sealer("default")


def seal_event_row(sealer: Sealer, row: dict[str, Any]) -> dict[str, Any]:
    """An event-log row's parameters (``eq.INSERT_EVENT``) with its payloads sealed,
    each bound to its event id and column."""
    if not sealer.seals("events"):
        return row
    event_id = str(row["p_event_id"])
    return {**row, **{param: sealer.seal("events", row[param], column, event=event_id)
                      for param, column in EVENT_COLUMNS.items()}}


def open_event_payload(sealer: Sealer, value: Any, param: str, event_id: str) -> Any:
    """A payload column of an event read back (lenient: see the module docstring)."""
    return sealer.open(value, EVENT_COLUMNS[param], strict=False, event=event_id)
