"""Handoff (docs/handoff.md): a long task runs as a chain of fresh-context iterations.

Seed 001's idea: single-context loops degrade, fresh-context iterations keep their
quality. A task of an agent with a ``handoff:`` policy
(:class:`~meshpoint.runtime.options.HandoffPolicy`) ends an iteration when a trigger
fires before a model call (:class:`HandoffTriggers`: context utilization, token
budget, consecutive errors, an explicit request by the model's ``handoff`` tool or by
an operator), and the next iteration starts on any instance of the agent from a
continuation prompt, never from the old conversation. It is the third pause kind,
and it has the pause boundary's order and guarantees:

1. **pre-handoff** (:meth:`Handoffs.hand_off`, the instance running the task): the
   continuation prompt is built (what was asked, what was accomplished, what remains,
   blockers, next steps); one transaction checkpoints the task in status ``handoff``,
   its history record of phase ``handoff`` carrying the prompt in
   ``recovery.continuation_prompt``; then the handoff message is published on the
   agent's handoff subject and an ``agent_handoff`` event logged; then the inbound
   message is acknowledged and the task forgotten.
2. **take** (:class:`HandoffTaker`, any instance): the task's lease is taken in status
   ``handoff`` (exactly one taker), and the task is resumed as any stored task is
   (:meth:`~meshpoint.runtime.turns.TurnLoop.resume`): its restore verifies the chain
   (hash, and signatures where configured; a broken chain blocks the task, never
   continues it). A task that handed off and was lost between commit and publish is
   taken by the same instances' sweep of tasks left in ``handoff``.
3. **post-handoff** (:meth:`Handoffs.carry_on`): the restored context holds the pending
   handoff (``flags["handoff"]``), so the next iteration starts instead of the old
   conversation going on: a fresh context of the same task (same caller, same token
   count) whose conversation is the continuation prompt alone, written by
   :meth:`~meshpoint.store.base.Store.begin_iteration` (a record of phase
   ``iteration``, ``iteration`` + 1, whose ``extensions.handoff_received`` names the
   handoff record it read and the instance that read it, and an ``agent_handoff_received``
   event). Whatever path resumes the task (the message, the sweep, recovery after the
   taker died), this is what it does, so a SIGKILL anywhere gives one next iteration.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any

from meshpoint.context import TaskExecutionContext
from meshpoint.errors import (
    BadMessageError,
    CheckpointConflictError,
    LeaseNotHeldError,
    MeshpointError,
    StoreError,
    TaskBlockedError,
    TaskEndedError,
    UnknownTaskError,
)
from meshpoint.llm.base import (
    Model,
    ToolCall,
)
from meshpoint.runtime.agent import Agent
from meshpoint.runtime.calls import Item, Opened
from meshpoint.runtime.continuation import (
    ACCOMPLISHED,
    ERRORS,
    LAST_PROMPT,
    PENDING,
    PHASE,
    REQUEST,
    REQUESTED,
    accomplished_lines,
    continuation_prompt,
    is_error,
    iteration_of,
    phase_of,
    request_of,
    short,
    tokens_used,
)
from meshpoint.runtime.options import HandoffPolicy
from meshpoint.runtime.scope import Scope
from meshpoint.runtime.stats import InstanceStats
from meshpoint.runtime.tasks import DeadLetters, InHand, LeaseOwners, TaskRun
from meshpoint.runtime.turns import End, HandOff, conversation, count_tokens, model_calls
from meshpoint.store.results import SubTask

logger = logging.getLogger("meshpoint.runtime")


def _estimate_tokens(events: Sequence[dict[str, Any]], per_char: float = 0.25) -> int:
    """What ``events`` add to a prompt, ``per_char`` tokens a character of their JSON."""
    return int(sum(len(json.dumps(e, ensure_ascii=False, default=str)) for e in events)
               * per_char)


class HandoffTriggers:
    """Seed 001's triggers, looked at before each model call of an iteration (a
    :class:`~meshpoint.runtime.turns.TurnCheck`). The first that fires ends the
    iteration (:class:`~meshpoint.runtime.turns.HandOff`); a token budget spent
    whole blocks the task instead."""

    def __init__(self, policy: HandoffPolicy, model: Model) -> None:
        self.policy = policy
        self.model = model

    def context_window(self) -> int | None:
        window = getattr(self.model, "context_window", None)
        return window if type(window) is int and window > 0 else None

    def utilization(self, ctx: TaskExecutionContext) -> tuple[float, float] | None:
        """(the last model call's, the next one's estimated) share of the context
        window, or None if unknown (no call yet, or no window known)."""
        window, last = self.context_window(), ctx.flags.get(LAST_PROMPT)
        if window is None or not isinstance(last, dict):
            return None
        prompt, seen = int(last.get("tokens", 0)), int(last.get("events", 0))
        # At least a token per 4 characters; more where the last prompt had more (a
        # tokenizer that cuts JSON and numbers finer): the projection errs early.
        chars = int(last.get("chars", 0) or 0)
        per_char = max(0.25, prompt / chars) if chars > 0 else 0.25
        grown = _estimate_tokens(ctx.session_events[seen:], per_char)
        return prompt / window, (prompt + grown) / window

    def before_model_call(self, ctx: TaskExecutionContext) -> End | HandOff | None:
        verdict = self._fired(ctx)
        if verdict is None or "blocked" in verdict.detail:
            return verdict
        if iteration_of(ctx) >= self.policy.max_iterations:
            return HandOff(verdict.trigger, verdict.reason, {
                **verdict.detail, "blocked": f"{verdict.reason}, and the task ran "
                f"max_iterations ({self.policy.max_iterations}) iterations"})
        return verdict

    def _fired(self, ctx: TaskExecutionContext) -> HandOff | None:
        policy = self.policy
        requested = ctx.flags.get(REQUESTED)
        if isinstance(requested, dict):
            by = str(requested.get("by") or "model")
            reason = str(requested.get("reason") or "requested")
            if by == "phase":
                done = phase_of(ctx)
                following = policy.phases[done + 1]
                return HandOff("phase_complete", f"phase {policy.phases[done].name!r} is "
                               f"complete: {reason}", {
                                   "phase": policy.phases[done].name,
                                   "next_phase": following.name,
                                   "next_agent": following.agent})
            return HandOff("explicit" if by == "model" else by, reason, {"requested_by": by})
        errors = int(ctx.flags.get(ERRORS, 0) or 0)
        if policy.consecutive_errors is not None and errors > policy.consecutive_errors:
            return HandOff("consecutive_errors",
                           f"{errors} errors in a row (more than {policy.consecutive_errors})",
                           {"errors": errors, "last_error": ctx.flags.get("last_error")})
        if policy.budget_tokens is not None and model_calls(ctx) > 0:
            used = tokens_used(ctx)
            if used >= policy.budget_tokens:
                return HandOff("token_budget", f"the token budget is spent: {used} of "
                               f"{policy.budget_tokens} tokens", {
                                   "tokens_used": used, "budget_tokens": policy.budget_tokens,
                                   "blocked": f"the token budget is spent ({used} of "
                                   f"{policy.budget_tokens} tokens)"})
            warned = ctx.flags.get("budget_warned")
            if used > policy.budget_warning * policy.budget_tokens and not warned:
                return HandOff("token_budget", f"{used} of {policy.budget_tokens} tokens "
                               f"used (more than {policy.budget_warning:g} of the budget)",
                               {"tokens_used": used, "budget_tokens": policy.budget_tokens})
        # Only once this iteration got something done (a round of calls): a
        # continuation prompt that alone fills the window would hand off for ever.
        if policy.context_utilization is not None and any(
                e.get("role") == "tool" for e in ctx.session_events):
            use = self.utilization(ctx)
            if use is not None and use[1] > policy.context_utilization:
                return HandOff("context_utilization",
                               f"the next prompt would fill {use[1]:.2f} of the context "
                               f"window (more than {policy.context_utilization:g})",
                               {"utilization": round(use[0], 4),
                                "projected": round(use[1], 4),
                                "context_window": self.context_window()})
        return None


@dataclass(frozen=True)
class HandoffCalls:
    """The built-in ``handoff(reason)`` and ``complete_phase(summary)`` tools (a
    :class:`~meshpoint.runtime.calls.CallKind`): the model asks for a fresh context,
    or says a phase of the work is done; the result says the handoff comes, and the
    iteration ends before the next model call."""

    pause_status = "working"
    immediate = True
    runs_tools = False
    announce_check_s = None

    policy: HandoffPolicy

    def handles(self, call: ToolCall) -> bool:
        return (self.policy.explicit and call.name == self.policy.tool_name) or (
            bool(self.policy.phases) and call.name == self.policy.phase_tool_name)

    def owns(self, correlation: dict[str, Any]) -> bool:
        return False

    async def open(self, ctx: TaskExecutionContext, invocation_id: str,
                   call: ToolCall) -> Opened:
        if call.name == self.policy.phase_tool_name and self.policy.phases:
            current = phase_of(ctx)
            if current + 1 >= len(self.policy.phases):
                return Opened(result=f"{self.policy.phases[current].name!r} is the last "
                              "phase: answer the request now.")
            ctx.flags[REQUESTED] = {"by": "phase", "reason": str(
                call.arguments.get("summary") or "")[:4000] or "the phase is complete"}
            following = self.policy.phases[current + 1]
            return Opened(result=f"Phase {self.policy.phases[current].name!r} is complete: "
                          f"phase {following.name!r} starts in a fresh context.")
        reason = call.arguments.get("reason")
        ctx.flags[REQUESTED] = {"by": "model", "reason": str(reason or "")[:1000] or
                                "the model asked for a fresh context"}
        return Opened(result="Handing off: the next iteration starts in a fresh context.")

    async def announce(self, ctx: TaskExecutionContext, items: Sequence[Item], *,
                       inbox: str | None) -> None:
        raise AssertionError("a handoff call is never outstanding")

    async def announce_again(self, sub: SubTask) -> bool:
        raise AssertionError("a handoff call is never outstanding")

    async def withdraw(self, sub_task_id: str, correlation: dict[str, Any]) -> None:
        raise AssertionError("a handoff call is never outstanding")

    def refused(self, ctx: TaskExecutionContext, call: ToolCall, result: Any) -> str | None:
        return None

    async def settle(self, ctx: TaskExecutionContext, call: ToolCall, result: Any) -> Any:
        return result


Drive = Callable[[TaskRun], Awaitable[None]]


@dataclass(frozen=True)
class Handoffs:
    """Ends iterations and starts the next ones, for one instance (see the module
    docstring: pre-handoff and post-handoff). ``publish(task_id)`` sends the handoff
    message; ``annotate`` is the agent's history hook."""

    scope: Scope
    agent: Agent
    policy: HandoffPolicy
    in_hand: InHand
    stats: InstanceStats
    annotate: Callable[[TaskExecutionContext], None]
    publish: Callable[[str, dict[str, Any]], Awaitable[None]]
    #: A mid-turn checkpoint (a task blocked before it was ever stored is stored first).
    checkpoint: Callable[[TaskRun], Awaitable[bool]]
    tell_blocked: Callable[[TaskBlockedError], Awaitable[None]]

    def request(self, task_id: str, reason: str) -> bool:
        """An operator's request (``meshpoint tasks handoff``): if ``task_id`` is in
        this instance's memory, its iteration hands off before its next model call
        (trigger ``operator``), unless a request is already pending (the model's, a
        phase's, an earlier one: the first stands). False if the task is not here."""
        run = self.in_hand.get(task_id)
        if run is None:
            return False
        if not isinstance(run.ctx.flags.get(REQUESTED), dict):
            run.ctx.flags[REQUESTED] = {"by": "operator", "reason": reason[:1000] or
                                        "an operator asked for a fresh context"}
            logger.info("%s: task %s: an operator asked for a handoff (%s)",
                        self.scope.instance_id, task_id, reason or "no reason given")
            self.stats.note("handoff_requested", task_id, reason=reason)
        return True

    async def hand_off(self, run: TaskRun, verdict: HandOff) -> bool:
        """End ``run``'s iteration (pre-handoff). True once the task is handed off (or
        blocked, or another run of it is the live one); False if it could not be
        checkpointed: the iteration then goes on in its context (nothing was
        written)."""
        ctx = run.ctx
        iteration = iteration_of(ctx)
        if "blocked" in verdict.detail:
            return await self._block(run, str(verdict.detail["blocked"]), verdict)
        budget_left = None
        if self.policy.budget_tokens is not None:
            budget_left = max(0, self.policy.budget_tokens - tokens_used(ctx))
        accomplished = accomplished_lines(ctx)
        summary = None
        if self.policy.continuation == "model":
            summary = await self._summary(ctx)
        phase = phase_of(ctx)
        if verdict.trigger == "phase_complete":
            phase += 1
        instruction = self.policy.phases[phase].instruction if self.policy.phases else ""
        next_agent = str(verdict.detail.get("next_agent") or self.agent.name) \
            if verdict.trigger == "phase_complete" else self.agent.name
        prompt = continuation_prompt(
            ctx, verdict, accomplished=accomplished, summary=summary,
            budget_left=budget_left if verdict.trigger == "token_budget" else None,
            instruction=instruction if verdict.trigger == "phase_complete" else "")
        pending = {"trigger": verdict.trigger, "reason": verdict.reason,
                   "detail": verdict.detail, "iteration": iteration, "prompt": prompt,
                   "accomplished": accomplished, "by": self.scope.instance_id,
                   "at": self.scope.clock(), "next_agent": next_agent, "phase": phase}
        before_flags, before_history = dict(ctx.flags), ctx.history
        ctx.flags.pop(REQUESTED, None)
        ctx.flags[PENDING] = pending
        ctx.flags.setdefault(REQUEST, request_of(ctx))
        self.annotate(ctx)
        ctx.history = _with_record(ctx.history, {
            "execution_state": {"phase": "handoff"},
            "recovery": {"continuation_prompt": prompt},
            "extensions": {"handoff": {k: v for k, v in pending.items()
                                       if k not in ("prompt", "accomplished")}}})
        try:
            await self.scope.store.checkpoint_task(ctx, self.scope.agent_name,
                                                   status="handoff",
                                                   lease_owner=run.lease_owner)
        except (CheckpointConflictError, LeaseNotHeldError, UnknownTaskError,
                TaskEndedError) as error:
            logger.info("%s: dropping task %s at its handoff: %s", self.scope.instance_id,
                        ctx.task_id, error)
            self.stats.note("dropped", ctx.task_id)
            run.lost = True
            self.in_hand.forget(run)
            if run.delivery is not None and run.lease_owner is None:
                await run.delivery.ack()  # the live run is another copy of this request
            return True
        except StoreError as error:
            logger.warning("%s: the handoff of %s could not be checkpointed (%s); its "
                           "iteration goes on", self.scope.instance_id, ctx.task_id, error)
            ctx.flags.clear()
            ctx.flags.update(before_flags)
            ctx.flags.pop(REQUESTED, None)
            ctx.flags["budget_warned"] = True  # not again at every model call
            ctx.history = before_history
            return False
        self.stats.note("handed_off", ctx.task_id, trigger=verdict.trigger,
                        iteration=iteration)
        self.stats.log("agent_handoff", ctx.task_id, step=verdict.trigger,
                       output={k: v for k, v in pending.items() if k != "accomplished"})
        try:
            await self.publish(next_agent, {"task_id": ctx.task_id, "iteration": iteration})
        except Exception as error:  # the sweep takes it (after a lease's time)
            logger.warning("%s: the handoff message of %s was not published (%s); the "
                           "sweep of handed-off tasks takes it", self.scope.instance_id,
                           ctx.task_id, error)
        if run.delivery is not None:
            await run.delivery.ack()
        self.in_hand.forget(run)
        return True

    def failed(self, ctx: TaskExecutionContext, error: Exception) -> bool:
        """Count a model call's error (seed 004's OnError); True to retry it: the
        policy counts consecutive errors. Past its limit the next check hands off."""
        if self.policy.consecutive_errors is None:
            return False
        ctx.flags[ERRORS] = int(ctx.flags.get(ERRORS, 0) or 0) + 1
        ctx.flags["last_error"] = short(f"{type(error).__name__}: {error}", 500)
        logger.warning("%s: task %s: model error %d in a row (%s); retried",
                       self.scope.instance_id, ctx.task_id, ctx.flags[ERRORS],
                       ctx.flags["last_error"])
        self.stats.log("error", ctx.task_id, step="model",
                       output={"error": ctx.flags["last_error"], "in_a_row": ctx.flags[ERRORS]})
        return True

    def round_ended(self, ctx: TaskExecutionContext) -> None:
        """A round of calls ended (its results are the conversation's tail): one whose
        every result is an error counts as one more error in a row; any other ends the
        run of errors (a model call that succeeds does not: a model that keeps calling
        failing tools is stuck too)."""
        tail = []
        for event in reversed(ctx.session_events):
            if event.get("role") != "tool":
                break
            tail.append(event)
        if tail and all(is_error(e.get("content")) for e in tail):
            ctx.flags[ERRORS] = int(ctx.flags.get(ERRORS, 0) or 0) + 1
            ctx.flags["last_error"] = short(tail[-1].get("content"), 500)
        else:
            ctx.flags.pop(ERRORS, None)

    async def _summary(self, ctx: TaskExecutionContext) -> str | None:
        """The agent's model's summary of the iteration (``continuation: model``), or
        None (the deterministic list is used) if it fails."""
        messages = conversation(self.agent, ctx)
        messages.append({"role": "user", "content": (
            "Your context is handed to a fresh one. Summarise for it, briefly: what "
            "was accomplished (with the results that matter), what remains, current "
            "blockers, recommended next steps. Do not call tools.")})
        try:
            response = await self.agent.model.complete(messages, [])
        except Exception as error:
            logger.warning("agent %s: the summary of task %s failed (%s); the continuation "
                           "prompt is built from the checkpoint", self.agent.name,
                           ctx.task_id, error)
            return None
        count_tokens(self.agent, ctx, response)
        return (response.text or "").strip() or None

    async def carry_on(self, old: TaskExecutionContext, owner: str, drive: Drive) -> None:
        """Start the next iteration of a task restored under ``owner``'s lease whose
        context holds a pending handoff (post-handoff), then ``drive`` it."""
        pending = old.flags[PENDING]
        iteration = int(pending.get("iteration", iteration_of(old)))
        next_agent = str(pending.get("next_agent") or self.agent.name)
        if next_agent != self.agent.name:
            await self._pass_on(old, owner, next_agent, iteration)
            return
        head = old.history_head
        received = {"record": getattr(head, "checkpoint_id", None),
                    "seq": getattr(head, "seq", None), "iteration": iteration,
                    "trigger": pending.get("trigger"), "by": self.scope.instance_id}
        ctx = TaskExecutionContext(old.task_id, old.a2a_context)
        ctx.token_usage = old.token_usage
        ctx.flags[REQUEST] = old.flags.get(REQUEST) or request_of(old)
        ctx.flags[ACCOMPLISHED] = list(pending.get("accomplished") or ())
        ctx.flags[PHASE] = int(pending.get("phase", phase_of(old)) or 0)
        if pending.get("trigger") == "token_budget" or old.flags.get("budget_warned"):
            ctx.flags["budget_warned"] = True
        if "model_calls_total" in old.flags or "model_calls" in old.flags:
            ctx.flags["model_calls_total"] = int(old.flags.get("model_calls_total", 0)) + \
                model_calls(old)
        ctx.history = {**self.agent.history_annotations(),
                       **{k: v for k, v in old.history.items() if k != "record"},
                       "iteration": iteration + 1}
        ctx.append_session_event({"role": "user", "content": str(pending["prompt"])})
        try:
            await self.scope.store.begin_iteration(ctx, self.scope.agent_name,
                                                   lease_owner=owner, handoff=received)
        except (LeaseNotHeldError, UnknownTaskError):
            return  # taken over or ended meanwhile
        self.stats.note("iteration_started", ctx.task_id, iteration=iteration + 1)
        # Its agent_handoff_received event is the store's, in begin_iteration's transaction.
        run = TaskRun(ctx, lease_owner=owner)
        self.in_hand.add(run)
        await drive(run)

    async def _pass_on(self, old: TaskExecutionContext, owner: str, next_agent: str,
                       iteration: int) -> None:
        """A handoff to another agent's phase that this agent's instance took (recovery
        after that agent's taker died): stored in ``handoff`` again, unleased, and sent
        to that agent's instances."""
        try:
            await self.scope.store.checkpoint_task(old, self.scope.agent_name,
                                                   status="handoff", lease_owner=owner)
        except StoreError as error:
            logger.warning("%s: cannot pass task %s on to agent %r: %s",
                           self.scope.instance_id, old.task_id, next_agent, error)
            return
        await self.publish(next_agent, {"task_id": old.task_id, "iteration": iteration})

    async def _block(self, run: TaskRun, reason: str, verdict: HandOff) -> bool:
        """Stop a task that may not go on (its token budget spent, its iterations
        used up): checkpointed if it was not, then blocked for an operator, its caller
        told, an alert raised (by the ``blocked`` the stats count: Alerts.watch). True
        (the run is over) unless the checkpoint failed."""
        ctx = run.ctx
        if run.lease_owner is None and not await self.checkpoint(run):
            return run.lost
        if run.lost or run.lease_owner is None:
            return True
        try:
            await self.scope.store.block_task(ctx.task_id, lease_owner=run.lease_owner,
                                              reason=reason)
        except (LeaseNotHeldError, UnknownTaskError):
            self.in_hand.forget(run)
            return True
        except StoreError as error:
            logger.warning("%s: task %s could not be blocked (%s); the lease expires and "
                           "recovery tries again", self.scope.instance_id, ctx.task_id, error)
            self.in_hand.forget(run)
            return True
        logger.error("%s: task %s is blocked: %s", self.scope.instance_id, ctx.task_id, reason)
        self.stats.note("blocked", ctx.task_id, reason=reason, trigger=verdict.trigger)
        self.in_hand.forget(run)
        await self.tell_blocked(TaskBlockedError(ctx.task_id, reason,
                                                 a2a_context=ctx.a2a_context))
        return True


def _with_record(history: dict[str, Any], parts: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """``history`` with ``parts`` merged into its record, section by section (the
    agent's own fields kept beside them)."""
    record = dict(history.get("record") or {})
    for section, values in parts.items():
        record[section] = {**(record.get(section) or {}), **values}
    return {**history, "record": record}


@dataclass(frozen=True)
class HandoffTaker:
    """Takes handed-off tasks, exactly once, on any instance: from the handoff
    message, and by a sweep of tasks left in ``handoff`` for longer than a lease
    (``lease_ttl_s``: their message was lost, the instance died between commit and
    publish). ``resume(task_id, owner)`` continues a task whose lease was taken
    (:meth:`~meshpoint.runtime.turns.TurnLoop.resume`, which starts the next
    iteration)."""

    scope: Scope
    owners: LeaseOwners
    in_hand: InHand
    stats: InstanceStats
    dead_letters: DeadLetters
    resume: Callable[[str, str], Coroutine[Any, Any, None]]
    spawn: Callable[[Coroutine[Any, Any, None]], Any]
    #: Sends a handoff message to an agent's instances.
    publish: Callable[[str, dict[str, Any]], Awaitable[None]]
    #: When each orphaned handoff for another agent was last sent again.
    resent: dict[str, float] = field(default_factory=dict)

    async def on_handoff(self, delivery: Any) -> None:
        try:
            task_id = parse_handoff(delivery.message.data)
        except BadMessageError as error:
            await self.dead_letters.reject(delivery, error)
            return
        owner = await self.take(task_id)
        await delivery.ack()  # the task is in the store: the sweep takes it otherwise
        if owner is not None:
            await self.resume(task_id, owner)

    async def take(self, task_id: str) -> str | None:
        """The lease owner that took ``task_id``'s handoff, or None (taken by another,
        ended, or not in ``handoff``)."""
        owner = self.owners.next()
        try:
            # Any agent's: at a phase change the task is still its last agent's until
            # the next iteration starts (the resume checks that it is handed to us).
            lease = await self.scope.store.take_resume_lease(
                task_id, owner, self.scope.lease_ttl_s, statuses=("handoff",))
        except UnknownTaskError:
            return None
        except MeshpointError as error:
            logger.warning("%s: cannot take the handoff of %s: %s", self.scope.instance_id,
                           task_id, error)
            return None
        if lease is None:
            return None
        self.stats.note("handoff_taken", task_id)
        return owner

    async def sweep(self) -> None:
        """Take the tasks left in ``handoff`` (their message lost)."""
        waiting = await self.scope.store.list_paused_tasks(
            agent_name=self.scope.agent_name, status="handoff", limit=100)
        now = self.scope.clock()
        for summary in waiting:
            free = summary.owner is None or (summary.lease_expires_at or 0) <= now
            if not free or now - summary.checkpointed_at < self.scope.lease_ttl_s or \
                    self.in_hand.get(summary.task_id) is not None:
                continue
            heading = await self._heading(summary.task_id)
            if heading is not None and heading != self.scope.agent_name:
                # Another agent's phase: its instances take it (sent again, at most
                # once a lease's time).
                if now - self.resent.get(summary.task_id, 0.0) >= self.scope.lease_ttl_s:
                    self.resent[summary.task_id] = now
                    await self.publish(heading, {"task_id": summary.task_id})
                continue
            owner = await self.take(summary.task_id)
            if owner is not None:
                self.stats.note("handoff_swept", summary.task_id)
                self.spawn(self.resume(summary.task_id, owner))

    async def _heading(self, task_id: str) -> str | None:
        """The agent a stored handoff is for (None if it cannot be read)."""
        try:
            ctx = (await self.scope.store.restore_task(task_id)).context
        except (StoreError, MeshpointError):
            return None
        pending = ctx.flags.get(PENDING)
        return str(pending.get("next_agent") or self.scope.agent_name) \
            if isinstance(pending, dict) else None


def parse_handoff(data: bytes, max_bytes: int = 4096) -> str:
    """The task id a handoff message names; BadMessageError for anything else."""
    if len(data) > max_bytes:
        raise BadMessageError(f"a handoff message is at most {max_bytes} bytes, got "
                              f"{len(data)}")
    try:
        body = json.loads(data)
    except ValueError as error:
        raise BadMessageError(f"a handoff message is JSON: {error}") from None
    task_id = body.get("task_id") if isinstance(body, dict) else None
    if type(task_id) is not str or not 0 < len(task_id) <= 255:
        raise BadMessageError("a handoff message names its task: {\"task_id\": <1-255 "
                              f"characters>}}, got {str(body)[:80]!r}")
    return task_id
