"""How a task ends: its caller is answered, then its rows are deleted, then its
request acknowledged.

In that order: a crash after the answer and before the cleanup re-runs the turn and
answers twice (the broker drops the copy within its dedupe window, and the caller
ignores any other), never zero times. A task resumed from the store ends only
while its instance still holds the lease: one that stalled past it has been
replaced, and the replacement answers.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from meshpoint import a2a
from meshpoint.context import TaskExecutionContext
from meshpoint.errors import LeaseNotHeldError, StoreError, TaskBlockedError, UnknownTaskError
from meshpoint.ops.tracing import with_traceparent
from meshpoint.runtime import wire
from meshpoint.runtime.calls import CallKinds
from meshpoint.runtime.scope import Scope
from meshpoint.runtime.stages import ANSWER_STATE_FLAG, ANSWER_STATE_KEY
from meshpoint.runtime.stats import InstanceStats
from meshpoint.runtime.tasks import InHand, TaskRun

logger = logging.getLogger("meshpoint.runtime")

#: The outcome a task's checkpoint history records when it ends in each state.
OUTCOMES = {a2a.TaskState.COMPLETED: "completed", a2a.TaskState.FAILED: "failed",
            a2a.TaskState.CANCELED: "canceled", a2a.TaskState.REJECTED: "failed"}
#: How much of a task's answer (or failure reason) its last history record keeps: enough
#: to tell an operator what it said, not a copy of a long answer.
ENDING_CHARS = 2000


def record_ending(ctx: TaskExecutionContext | None, outcome: str, text: str) -> None:
    """Put how the task ended (``outcome``) and its answer, or its failure reason, into
    its last history record (``extensions.ending``), so that ``meshpoint tasks list
    --all`` and ``tasks show`` can say it once the live rows are gone."""
    if ctx is None:
        return
    record = ctx.history.get("record")
    if record is None or not isinstance(record, dict):
        record = ctx.history["record"] = {}
    extensions = record.get("extensions")
    if not isinstance(extensions, dict):
        extensions = record["extensions"] = {}
    key = "answer" if outcome == "completed" else "reason"
    extensions["ending"] = {"outcome": outcome, key: text[:ENDING_CHARS],
                            "cut": len(text) > ENDING_CHARS}


#: The states of a task that failed: their reason is an ``error`` event and a field of
#: the answer (``meshpoint_error``), beside the answer's text.
FAILURES = (a2a.TaskState.FAILED, a2a.TaskState.REJECTED)


@dataclass(frozen=True)
class Endings:
    """Ends the tasks of one instance of agent ``agent_name``."""

    scope: Scope
    kinds: CallKinds
    in_hand: InHand
    stats: InstanceStats

    async def finish(self, run: TaskRun, state: a2a.TaskState, text: str) -> None:
        """Answer the caller, then delete the task's rows, then ack its request."""
        ctx = run.ctx
        if run.lease_owner is not None and not run.lost:
            # Fence: answer only while still holding the lease.
            try:
                lease = await self.scope.store.renew_resume_lease(ctx.task_id, run.lease_owner,
                                                                  self.scope.lease_ttl_s)
            except UnknownTaskError:
                lease = None
            run.lost = lease is None
        if run.lost:
            self.stats.note("dropped", ctx.task_id)
            self.in_hand.forget(run)
            return
        if state is a2a.TaskState.COMPLETED:
            ctx.produced_artifacts.append(wire.answer_artifact(ctx.task_id, self.scope.agent_name,
                                                               text))
        await self.answer(ctx, state, text)
        self.note_end(ctx.task_id, state, text)
        try:
            if run.lease_owner is not None or run.maybe_stored:
                record_ending(ctx, OUTCOMES[state], text)
                await self.scope.store.cleanup_task(ctx.task_id, lease_owner=run.lease_owner,
                                                    outcome=OUTCOMES[state], ctx=ctx,
                                                    agent_name=self.scope.agent_name)
        except (LeaseNotHeldError, UnknownTaskError):
            pass
        except StoreError as error:
            # The lease expires and another instance re-runs the turn: it answers
            # again (a duplicate the caller ignores) and removes the rows.
            logger.warning("%s: cleanup of %s failed: %s", self.scope.instance_id, ctx.task_id,
                           error)
        finally:
            self.in_hand.forget(run)
        if run.delivery is not None:
            await run.delivery.ack()

    def note_end(self, task_id: str, state: a2a.TaskState, text: str) -> None:
        """Count and log how the task ended; a failure's reason goes with it, as an
        ``error`` event (step ``failed``) and in the ``answer`` event, so that the log
        (``meshpoint events --type error``) says why, not only the server's log."""
        if state in FAILURES:
            self.stats.log("error", task_id, step="failed",
                           output={"reason": text, "state": state.value})
            self.stats.note(state.value, task_id, reason=text)
        else:
            self.stats.note(state.value, task_id)

    async def tell_blocked(self, error: TaskBlockedError) -> None:
        """Tell the caller of a task the store blocked (its history failed
        verification) that it waits for an operator: a status update in state
        ``unknown``, not final, the reason in its text and metadata."""
        status_to = error.a2a_context.get("status_to")
        if not status_to:
            return
        await self.scope.broker.publish(status_to, wire.status_update(
            error.a2a_context.get("request_id") or error.task_id, error.task_id,
            error.a2a_context.get("context_id") or error.task_id, a2a.TaskState.UNKNOWN,
            f"blocked: {error.reason}. An operator must act: meshpoint tasks show "
            f"{error.task_id}; meshpoint verify --task {error.task_id}",
            {"meshpoint_blocked": error.reason}))

    async def tell_restarted(self, ctx: TaskExecutionContext, reason: str) -> None:
        """Tell the caller of a blocked task that it was restarted from its
        reconstruction: a status update in state ``working``, saying why."""
        status_to = ctx.a2a_context.get("status_to")
        if not status_to:
            return
        await self.scope.broker.publish(status_to, wire.status_update(
            ctx.a2a_context.get("request_id") or ctx.task_id, ctx.task_id,
            ctx.a2a_context.get("context_id") or ctx.task_id, a2a.TaskState.WORKING,
            f"restarted from a reconstruction of its records: {reason}",
            {"meshpoint_restarted": reason}))

    async def finish_canceled(self, run: TaskRun) -> None:
        """End a canceled task: its outstanding items are withdrawn first."""
        for sub_task_id, corr in list(run.ctx.active_peer_sub_tasks.items()):
            await self.kinds.withdraw(sub_task_id, corr)
        await self.finish(run, a2a.TaskState.CANCELED, "canceled")

    async def answer(self, ctx: TaskExecutionContext, state: a2a.TaskState, text: str) -> None:
        """Publish the task's final state to its caller, if it named a reply subject."""
        reply_to = ctx.a2a_context.get("reply_to")
        if not reply_to:
            return
        # One final answer per task: a turn re-run after a take-over (the first run
        # answered, then died before its cleanup) publishes the same msg_id, which the
        # broker drops within its dedupe window.
        # Sent by the task's last turn, or outside any turn (a cancel of a stored task,
        # the sweeper's end): then the task's trace parent, so the claim stays in its trace.
        metadata = with_traceparent({"token_usage": ctx.token_usage.to_dict(),
                                     "agent": self.scope.agent_name,
                                     "instance": self.scope.instance_id},
                                    otherwise=ctx.a2a_context)
        if state in FAILURES:  # the reason, as a field (the status message has it too)
            metadata["meshpoint_error"] = text
        answered_state = ctx.flags.get(ANSWER_STATE_FLAG)
        if isinstance(answered_state, dict):  # a workflow's: its stages' answers
            metadata[ANSWER_STATE_KEY] = answered_state
        await self.scope.broker.publish(reply_to, wire.final_task(
            ctx.a2a_context.get("request_id") or ctx.task_id, ctx.task_id,
            ctx.a2a_context.get("context_id") or ctx.task_id, state, text,
            ctx.produced_artifacts, metadata), msg_id=wire.answer_msg_id(ctx.task_id))
