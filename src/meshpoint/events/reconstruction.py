"""Reconstruction (docs/events.md): a task's state rebuilt, as a prompt, from its
history and its event log, for when it cannot be resumed from its checkpoint.

:func:`reconstruct` reads the task's newest checkpoint record that verifies with the
chain before it (:meth:`~meshpoint.store.history_store.HistoryStore.last_verified`) and the
task's events after it (and, for a task still stored, which of its calls its live rows
say are resolved), and builds a recovery prompt that tells a fresh context what the
task was asked, what is done (completed calls, model calls, tools that ran since,
calls answered, timed out or decided since), what remains (the calls it waited on that
are still open: a call is in exactly one of the two), the last error, and the agent's
own continuation prompt, if it left one. Either source may be missing (a task that
never paused has no history; an agent that keeps no event log has no events): the
prompt says what it could not know.

``meshpoint tasks reconstruct ID`` prints it, with what each part of it rests on
(:attr:`Reconstruction.trusts`). With ``RecoveryPolicy(reconstruct=True)`` an instance
that finds a task blocked (its history fails verification and no verified record can
be resumed) restarts the task from this prompt, in a fresh context, and records that
it did (:meth:`~meshpoint.store.sqlstore.SqlStore.restart_task`).

The event log is not signed: anyone who can write the database can change it. The
request is the one thing a restart cannot do without, so it is checked against
signed content: every history record carries the hash of the task's request
(``recovery.request_sha256``), and the request read from the log must hash to what
the newest verified record says. An automatic restart is refused
(:attr:`Reconstruction.restart_refusal`) when the request contradicts that record,
and, where signatures are required (a store holding a signing or verification key),
whenever it cannot be checked at all (no verified record is left, or the record
carries no hash): the task stays blocked for an operator, whose ``meshpoint tasks
reconstruct`` says what it rests on.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

from pydantic import ValidationError

from meshpoint import a2a
from meshpoint.errors import StoreError, UnknownHistoryError
from meshpoint.events.log import EventStore
from meshpoint.history.integrity import hashes_equal
from meshpoint.history.planning import request_digest
from meshpoint.history.record import CheckpointRecord
from meshpoint.store.base import Transactional, VerifiedHistory
from meshpoint.store.results import SubTask


class Reconstructable(Transactional, Protocol):
    """What :func:`reconstruct` reads of a store (every
    :class:`~meshpoint.store.base.Store` is one): its history, its event log (through
    :class:`Transactional`) and a task's live sub-tasks."""

    @property
    def history(self) -> VerifiedHistory:
        """The tenant's checkpoint history."""
        ...

    async def get_peer_sub_tasks_for_task(self, task_id: str) -> list[SubTask]:
        """Every sub-task of a stored task; UnknownTaskError if it has none stored."""
        ...


#: A record of a task that ended: the work is told by the whole log, not what follows.
_ENDED = ("completed", "failed", "canceled", "expired")


@dataclass(frozen=True)
class Reconstruction:
    """What :func:`reconstruct` found, and the prompt it built from it."""

    task_id: str
    agent_id: str | None
    #: The newest verified record (None if the task has no usable history).
    checkpoint: CheckpointRecord | None
    #: Why the history could not be used whole (None if it verifies).
    history_problem: str | None
    request: str | None
    done: list[str] = field(default_factory=list)
    remaining: list[str] = field(default_factory=list)
    pending_calls: list[dict[str, Any]] = field(default_factory=list)
    last_error: str | None = None
    events_after: int = 0
    prompt: str = ""
    #: Whether ``request`` hashes to what the newest verified record says it was.
    request_verified: bool = False
    #: What each part of the reconstruction rests on, one line each.
    trusts: list[str] = field(default_factory=list)
    #: Why an automatic restart must not use this reconstruction (None: it may).
    restart_refusal: str | None = None

    @property
    def ended(self) -> dict[str, Any] | None:
        """How the task ended (``status``, ``answer``, ``reason``: the two last None
        when its last record does not say), or None while it has not."""
        if self.checkpoint is None or self.checkpoint.recovery.status not in _ENDED:
            return None
        said = self.checkpoint.extensions.get("ending")
        said = said if isinstance(said, dict) else {}
        return {"status": self.checkpoint.recovery.status, "answer": said.get("answer"),
                "reason": said.get("reason")}

    def to_dict(self) -> dict[str, Any]:
        return {"task_id": self.task_id, "agent_id": self.agent_id, "ended": self.ended,
                "checkpoint": None if self.checkpoint is None else {
                    "checkpoint_id": self.checkpoint.metadata.checkpoint_id,
                    "seq": self.checkpoint.metadata.seq,
                    "phase": self.checkpoint.execution_state.phase,
                    "timestamp": self.checkpoint.metadata.timestamp},
                "history_problem": self.history_problem, "request": self.request,
                "done": self.done, "remaining": self.remaining,
                "pending_calls": self.pending_calls, "last_error": self.last_error,
                "events_after": self.events_after, "prompt": self.prompt,
                "request_verified": self.request_verified, "trusts": self.trusts,
                "restart_refusal": self.restart_refusal}


async def reconstruct(store: Reconstructable, task_id: str, *, events: EventStore | None = None
                      ) -> Reconstruction:
    """Rebuild task ``task_id``'s state from ``store``'s history and event log (see
    the module docstring). Reads only; UnknownHistoryError if neither knows the
    task."""
    log = events or EventStore(store)
    checkpoint: CheckpointRecord | None = None
    problem: str | None = None
    try:
        report, checkpoint = await store.history.last_verified(task_id)
        if not report.ok:
            problem = (f"record {report.first_bad_seq or 'head'}: {report.reason}"
                       if report.reason else report.kind)
    except UnknownHistoryError:
        problem = "the task has no checkpoint history"
    since = None
    if checkpoint is not None and checkpoint.recovery.status not in _ENDED:
        since = datetime.fromisoformat(checkpoint.metadata.timestamp)
    after = await log.get_events(thread_id=task_id, since=since)  # all: read page by page
    first = await log.get_events(thread_id=task_id, event_type="protocol_receive", limit=1)
    if checkpoint is None and not after:
        raise UnknownHistoryError(task_id)
    request = _request(first)
    done: list[str] = []
    remaining: list[str] = []
    pending: list[dict[str, Any]] = []
    agent = checkpoint.metadata.agent_id if checkpoint is not None else (
        after[0].agent_id if after else None)
    if checkpoint is not None:
        done += [f"call {item.get('id')} completed" if isinstance(item, dict) else str(item)
                 for item in checkpoint.execution_state.completed_items]
        done.append(f"{checkpoint.metrics.model_calls} model call(s) made")
    last_error = await _last_error(log, task_id)
    # The calls resolved since the record (which still lists them as pending: an
    # answer writes no record), by the log and by the task's live rows.
    resolved: set[str] = set()
    for event in after:
        if event.event_type == "step_complete" and event.step_name and \
                event.step_name.startswith("tool:"):
            done.append(f"{event.step_name[5:]} ran: {_short(event.output_data)}")
        elif event.event_type in ("protocol_receive", "timeout") and \
                event.step_name in ("answer", "timeout"):
            data = (event.input_data if event.event_type == "protocol_receive"
                    else event.output_data)
            data = data if isinstance(data, dict) else {}
            call = data.get("sub_task_id")
            if isinstance(call, str) and call in resolved:
                continue
            how = "answered" if event.event_type == "protocol_receive" else "timed out"
            done.append(f"{data.get('peer') or 'a peer'} {how}"
                        + (f" (call {call})" if isinstance(call, str) else ""))
            if isinstance(call, str):
                resolved.add(call)
    live = await _resolved_now(store, task_id)
    if checkpoint is not None:
        for item in checkpoint.execution_state.pending_items:
            if not isinstance(item, dict):
                remaining.append(str(item))
                continue
            call, name = item.get("id"), item.get("name")
            if call in resolved:
                continue  # under done already
            if call in live:
                done.append(f"{name} {live[call]} (call {call})")
                continue
            pending.append(item)
            what = "approval of" if item.get("kind") == "approval" else "an answer from"
            remaining.append(f"{what} {name} (call {call})")
    prompt = _prompt(task_id, agent, request, checkpoint, problem, done, remaining,
                     last_error)
    required = store.history.options.signatures_required
    signed = required and checkpoint is not None and checkpoint.compliance.signature is not None
    unchecked, contradicted = _request_check(request, checkpoint)
    trusts = [_request_trust(checkpoint, unchecked, signed),
              "history: " + ("no verified record" if checkpoint is None else
                             f"record {checkpoint.metadata.seq}, verified (its hash chain"
                             + (" and signatures)" if signed else ")")),
              f"{len(after)} event(s) after it, and the last error: the event log, which "
              "is not signed"]
    refusal = None
    if contradicted or (required and unchecked is not None):
        refusal = (f"the request {unchecked}" + ("" if contradicted else
                   ", and this store requires signatures: an automatic restart needs a "
                   "request it can check against a signed record"))
    return Reconstruction(task_id=task_id, agent_id=agent, checkpoint=checkpoint,
                          history_problem=problem, request=request, done=done,
                          remaining=remaining, pending_calls=pending, last_error=last_error,
                          events_after=len(after), prompt=prompt,
                          request_verified=unchecked is None, trusts=trusts,
                          restart_refusal=refusal)


def _request_check(request: str | None, checkpoint: CheckpointRecord | None
                   ) -> tuple[str | None, bool]:
    """``(why the request is not checked, whether it contradicts the record)``:
    ``(None, False)`` if it hashes to what the newest verified record says."""
    expected = None if checkpoint is None else checkpoint.recovery.request_sha256
    if request is None:
        return "was not found in the event log", False
    if checkpoint is None:
        return "is read from the event log, and no verified record is left to check it " \
               "against", False
    if expected is None:
        return (f"is read from the event log, and record {checkpoint.metadata.seq} holds "
                "no hash of it to check it against"), False
    if not hashes_equal(request_digest(request), expected):
        return (f"read from the event log does not hash to what record "
                f"{checkpoint.metadata.seq} says the request was: the log was changed"), True
    return None, False


def _request_trust(checkpoint: CheckpointRecord | None, unchecked: str | None,
                   signed: bool) -> str:
    if unchecked is not None:
        return f"request: NOT checked: the request {unchecked}"
    assert checkpoint is not None
    return (f"request: the event log's, checked against the hash in record "
            f"{checkpoint.metadata.seq}" + (" (signed)" if signed else " (hashed, unsigned)"))


#: How a live sub-task row was resolved, in words, by its ``resolved_by``.
_RESOLVED_BY = {"answer": "answered", "timeout": "timed out", "human": "decided by a human"}


async def _resolved_now(store: Reconstructable, task_id: str) -> dict[str, str]:
    """The task's calls its live rows say are resolved (an answer, a timeout, a
    human's decision, which the log may not have: an approval decided in the store
    is logged only when the task settles it), in words, by sub-task id; empty for a
    task without live rows (it ended) or whose rows cannot be read."""
    try:
        subs = await store.get_peer_sub_tasks_for_task(task_id)
    except StoreError:
        return {}
    return {sub.sub_task_id: _RESOLVED_BY.get(sub.resolved_by or "", "resolved")
            for sub in subs if sub.status == "resolved"}


def _request(events: list[Any]) -> str | None:
    """The task's request, from the first ``protocol_receive`` of it: its message's
    text as the agent was given it (:attr:`meshpoint.a2a.Message.text`)."""
    for event in events:
        if event.event_type == "protocol_receive" and event.step_name == "request":
            message = ((event.input_data or {}).get("_protocol_message") or {})
            params = message.get("params") if isinstance(message, dict) else None
            try:
                text = a2a.Message.model_validate((params or {}).get("message")).text
            except ValidationError:
                return None
            return text or None
    return None


async def _last_error(log: EventStore, task_id: str) -> str | None:
    """The task's last error, whenever it was: a step's, or its history's. The error
    a task's failure logs (step ``failed``) names the step that caused it when one
    did: that step's error, logged just before with the same reason, is the one."""
    errors = await log.get_events(thread_id=task_id, event_type="error", limit=2,
                                  newest_first=True)
    found = [e for kind in ("integrity_rewound", "integrity_blocked")
             if (e := await log.get_latest_event(thread_id=task_id, event_type=kind))]
    if errors:
        last = errors[0]
        if last.step_name == "failed" and len(errors) > 1 and \
                _short(errors[1].output_data) in _reason(last.output_data):
            last = errors[1]  # the failure's cause
        found.append(last)
    if not found:
        return None
    last = max(found, key=lambda e: (e.timestamp_us, e.event_id))
    if last.event_type == "error":
        return f"{last.step_name or 'a step'}: {_reason(last.output_data)}"
    return f"{last.event_type}: {_short(last.output_data)}"


def _reason(value: Any) -> str:
    """An error event's output in words: a failure's reason, or the error itself."""
    if isinstance(value, dict) and isinstance(value.get("reason"), str):
        return _short(value["reason"])
    return _short(value)


def _short(value: Any, limit: int = 200) -> str:
    if isinstance(value, dict) and "$error" in value:
        text = f"{value['$error']}: {value.get('message', '')}"
    else:
        text = value if isinstance(value, str) else repr(value)
    return text if len(text) <= limit else text[:limit] + "…"


def _prompt(task_id: str, agent: str | None, request: str | None,
            checkpoint: CheckpointRecord | None, problem: str | None, done: list[str],
            remaining: list[str], last_error: str | None) -> str:
    of = f"task {task_id}" + (f" of agent {agent}" if agent else "")
    ended = checkpoint is not None and checkpoint.recovery.status in _ENDED
    if ended:
        assert checkpoint is not None
        # Nothing is resumed: the summary is for whoever reviews or continues the work.
        first = (f"This is what is known of {of}, rebuilt from the task's records. The "
                 f"task has ended: {checkpoint.recovery.status}.")
        said = checkpoint.extensions.get("ending")
        said = said if isinstance(said, dict) else {}
        for key, what in (("answer", "Its answer"), ("reason", "Why")):
            if isinstance(said.get(key), str):
                first += f"\n{what}: {said[key]}"
    else:
        first = (f"You are resuming {of} after a failure; the context you had is gone "
                 "and was rebuilt from the task's records.")
    lines = [first,
             f"The request: {request}" if request else "The request was not recorded."]
    if checkpoint is not None:
        meta = checkpoint.metadata
        lines.append(f"Last verified checkpoint: record {meta.seq} "
                     f"({checkpoint.execution_state.phase}, {meta.timestamp}).")
    if problem:
        lines.append(f"What could not be trusted: {problem}.")
    lines.append("Done so far:" if done else "Nothing is known to be done.")
    lines += [f"- {item}" for item in done]
    if remaining:
        lines.append("It was waiting for (those answers are lost; ask again if still "
                     "needed):")
        lines += [f"- {item}" for item in remaining]
    if last_error:
        lines.append(f"Last error: {last_error}")
    if checkpoint is not None and checkpoint.recovery.continuation_prompt:
        lines.append(f"Your own note for continuing: "
                     f"{checkpoint.recovery.continuation_prompt}")
    lines.append("Nothing is left to resume: it ended." if ended else
                 "Continue from here; do not repeat what is done.")
    return "\n".join(lines)
