"""Retention of the checkpoint history: what a purge may remove from a task's chain.

A purge decides only from what the chain's records say, which is hashed (and, with a
signing key, signed):

* whether the task ended: its last record's ``recovery.status`` is an end
  (``completed``, ``failed``, ``canceled``, ``expired``; a field only meshpoint fills);
* its policy: the last record's ``compliance.retention_policy``, else the policy the
  options give the agent that record names (``metadata.agent_id``), else the store's,
  a legal hold at any of these winning (:meth:`HistoryOptions.retention_of`);
* for ``days:N``, when each record was written: its ``metadata.timestamp``.

The columns that copy these (the head's ``retention_policy``, ``outcome`` and
``agent_name``, each record's ``created_at``) are never read here: anyone who can
write the tables can change them, and a chain walk names them when they disagree
with the records (:func:`meshpoint.history.verification.column_problem`).

A chain is cut only if it verifies whole (hashes, signatures, links, head, snapshots
and columns), and only by a process that can sign where it then starts: a signed
chain is left alone by a purge without the signing key, even one that would remove
it whole, and the purge says so (:data:`NO_SIGNING_KEY`).

Pure: :class:`~meshpoint.store.history_store.HistoryStore` reads the chains, asks
:func:`plan_purge` and writes what it planned.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from meshpoint.history.planning import HistoryOptions, parse_retention
from meshpoint.history.verification import (
    StoredHead,
    StoredRecord,
    said_agent,
    said_outcome,
    said_policy,
    verify_chain,
    written_at,
)

__all__ = ["NO_SIGNING_KEY", "Purge", "candidate", "plan_purge"]

#: Why a purge without the signing key leaves a signed chain as it is.
NO_SIGNING_KEY = ("its chain is signed and this process has no signing key "
                  "(history.signing.active) to sign where it would start: a purge "
                  "without the key leaves signed chains alone")


@dataclass(frozen=True, slots=True)
class Purge:
    """What a purge removed (or would remove) from one task's chain: ``removed`` of its
    ``records`` records, through record ``through``; ``whole``: all of them, and its
    head; ``skipped``: why nothing was removed after all (the chain does not verify,
    it is signed and the purge cannot sign, or it changed meanwhile)."""

    task_id: str
    policy: str
    records: int
    removed: int
    through: int
    through_hash: str
    whole: bool
    skipped: str | None = None


def candidate(last_document: Any, options: HistoryOptions) -> str | None:
    """The policy a purge applies to a chain whose last record says ``last_document``,
    if it may cut anything: None if the task has not ended, has no policy, or is on
    hold. (What a purge reads of every chain before it reads one whole.)"""
    if said_outcome(last_document) is None:
        return None  # a live task's chain is never cut: its restore may need it
    policy = options.retention_of(said_policy(last_document), said_agent(last_document) or "")
    if policy is None or parse_retention(policy)[0] == "hold":
        return None
    return policy


def plan_purge(task_id: str, records: Sequence[StoredRecord], head: StoredHead,
               options: HistoryOptions, now: float) -> Purge | None:
    """What a purge removes from task ``task_id``'s chain, read whole (``records``
    oldest first, with their snapshots and columns, and its ``head``): None if
    nothing; a :class:`Purge` whose ``skipped`` says why if it must not cut it."""
    if not records:
        return None
    policy = candidate(records[-1].document, options)
    if policy is None:
        return None
    kind, amount = parse_retention(policy)
    kept = [r for r in records if r.seq > head.pruned_through]
    if kind == "last":
        gone = kept[:max(0, len(kept) - amount)]
    else:
        cutoff = now - amount * 86_400.0
        gone = []
        for record in kept:  # oldest first: the prefix written before the cutoff
            when = written_at(record.document)
            if when is None or when >= cutoff:
                break
            gone.append(record)
    if not gone:
        return None
    plan = Purge(task_id=task_id, policy=policy, records=len(kept), removed=len(gone),
                 through=gone[-1].seq, through_hash=gone[-1].hash,
                 whole=len(gone) == len(kept))
    signed = head.signature is not None or any(r.signature is not None for r in records)
    if signed and not options.signing.signs:
        return replace(plan, skipped=NO_SIGNING_KEY)
    report = verify_chain(task_id, records, head, options, snapshots=True)
    if not report.ok:
        where = "its head" if report.first_bad_seq is None else f"record {report.first_bad_seq}"
        return replace(plan, skipped=(
            f"its chain does not verify ({where}: {report.reason}); a purge never cuts "
            f"such a chain (`meshpoint verify --task {task_id}` names the problem)"))
    return plan
