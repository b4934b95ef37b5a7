"""The turn loop: model calls and tool calls until a task ends or pauses.

A turn calls the model. Each tool call it asks for is made by its kind
(:mod:`meshpoint.runtime.calls`): a local tool's result is known at once, a peer's
call opens an outstanding item of the turn's join. A turn with items outstanding
hands the task to the pause boundary; one without goes on with the results in the
conversation, in the model's call order. Before each model call the registered
:class:`TurnCheck` s may end the task instead (the loop guard of ``max_turns`` is
one). A task continues here when it is resumed from the store (under a lease) or
when its join completes in memory.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from operator import attrgetter
from typing import Any, Protocol

from meshpoint import a2a
from meshpoint._json import dump_bytes
from meshpoint.context import TaskExecutionContext
from meshpoint.errors import (
    InvalidArgumentError,
    KeyMissingError,
    LeaseNotHeldError,
    MeshpointError,
    ModelError,
    StoreError,
    TaskBlockedError,
    UnknownTaskError,
)
from meshpoint.events.log import EventStore
from meshpoint.history.planning import request_digest
from meshpoint.llm.base import ModelResponse, ask_again, shown, unusable
from meshpoint.ops.tracing import model_usage, task_failed
from meshpoint.runtime import wire
from meshpoint.runtime.agent import Agent
from meshpoint.runtime.calls import CallKinds, turn_calls
from meshpoint.runtime.midturn import MidTurn
from meshpoint.runtime.scope import Scope
from meshpoint.runtime.stages import ANSWER_STATE_FLAG, STATE_KEY, fill_placeholders
from meshpoint.runtime.stats import InstanceStats, ms_since
from meshpoint.runtime.tasks import Background, InHand, KeyMissing, LeaseOwners, TaskRun

logger = logging.getLogger("meshpoint.runtime")
#: ``ctx.flags`` keys read here and written by :mod:`meshpoint.runtime.handoff`: a
#: handoff this task's iteration wrote (pending until the next iteration starts), and
#: the last model call's prompt tokens (with the conversation's length then).
HANDOFF_PENDING = "handoff"
LAST_PROMPT_TOKENS = "last_prompt_tokens"
#: How often a reply the task cannot store is handed back to the model before the task
#: fails (OpenAIModel repairs what it reads first, with its own ``repair_attempts``).
REPAIR_ATTEMPTS = 2


@dataclass(frozen=True)
class End:
    """A :class:`TurnCheck`'s verdict: end the task now, in ``state``, with ``text``."""

    state: a2a.TaskState
    text: str


@dataclass(frozen=True)
class HandOff:
    """A :class:`TurnCheck`'s verdict: end this iteration, and let a fresh-context one
    carry the task on (:mod:`meshpoint.runtime.handoff`); ``trigger`` names why,
    ``reason`` says it, ``detail`` measures it (``detail["blocked"]``: the task may
    not go on at all, and is blocked instead)."""

    trigger: str
    reason: str
    detail: dict[str, Any]


class TurnCheck(Protocol):
    """Looked at before each model call of a task."""

    def before_model_call(self, ctx: TaskExecutionContext) -> End | HandOff | None:
        """None to go on, how the task ends instead, or that it hands off."""
        ...


class HandsOff(Protocol):
    """What the turn loop needs of the handoffs (:mod:`meshpoint.runtime.handoff`)."""

    async def hand_off(self, run: TaskRun, verdict: HandOff) -> bool:
        """End the run's iteration; False if it could not (it goes on)."""
        ...

    async def carry_on(self, old: TaskExecutionContext, owner: str,
                       drive: Callable[[TaskRun], Awaitable[None]]) -> None:
        """Start the next iteration of a task restored with a pending handoff."""
        ...

    def failed(self, ctx: TaskExecutionContext, error: Exception) -> bool:
        """Count a model call's error; True to retry it (checkpointed) instead of
        failing the task."""
        ...

    def round_ended(self, ctx: TaskExecutionContext) -> None:
        """A round of calls ended: one whose calls all failed counts as an error, any
        other ends a run of errors."""
        ...


class TurnLimit:
    """The loop guard: a task fails once it has made ``max_turns`` model calls."""

    def __init__(self, max_turns: int) -> None:
        self._max_turns = max_turns

    def before_model_call(self, ctx: TaskExecutionContext) -> End | None:
        if model_calls(ctx) >= self._max_turns:
            return End(a2a.TaskState.FAILED, f"gave up after {self._max_turns} model calls")
        return None


class Pauses(Protocol):
    """What the turn loop needs of the pause boundary."""

    async def pause(self, run: TaskRun, sub_task_ids: list[str],
                    go_on: Callable[[TaskRun], None]) -> None: ...


class Ends(Protocol):
    """What the turn loop needs of the endings."""

    async def finish(self, run: TaskRun, state: a2a.TaskState, text: str) -> None: ...

    async def finish_canceled(self, run: TaskRun) -> None: ...

    async def tell_blocked(self, error: TaskBlockedError) -> None: ...

    async def tell_restarted(self, ctx: TaskExecutionContext, reason: str) -> None: ...


@dataclass(frozen=True)
class TurnLoop:
    """Runs the turns of one instance's tasks."""

    agent: Agent
    scope: Scope
    kinds: CallKinds
    checks: Sequence[TurnCheck]
    pauses: Pauses
    ends: Ends
    in_hand: InHand
    stats: InstanceStats
    background: Background
    mid_turn: MidTurn
    owners: LeaseOwners
    #: The stored tasks this instance cannot continue without a key it lacks.
    key_missing: KeyMissing
    #: The agent's event log, if it keeps one: flushed before a reconstruction reads it.
    events: EventStore | None = None
    #: The agent's handoffs, if it has a ``handoff:`` policy.
    handoffs: HandsOff | None = None

    async def start(self, run: TaskRun) -> None:
        """A new task, from its request."""
        self.in_hand.add(run)
        self.stats.note("started", run.ctx.task_id)
        await self.drive(run)

    async def resume(self, task_id: str, owner: str) -> None:
        """Continue a stored task under ``owner``'s lease: its join completed, or it was
        checkpointed mid-turn and its instance died."""
        started = time.perf_counter()
        try:
            restored = await self.scope.store.restore_task(task_id, lease_owner=owner)
        except (LeaseNotHeldError, UnknownTaskError):
            return  # taken over or canceled meanwhile
        except TaskBlockedError as error:
            logger.error("%s: %s", self.scope.instance_id, error)
            self.stats.note("blocked", task_id, reason=error.reason, cause="history")
            untold = await self._restart(error) if self.agent.recovery.reconstruct else error
            if untold is not None:
                await self.ends.tell_blocked(untold)
            return
        except KeyMissingError as error:
            await self.leave(task_id, owner, error)
            return
        except StoreError as error:
            logger.error("%s: cannot restore task %s: %s", self.scope.instance_id, task_id, error)
            return
        restore_s = time.perf_counter() - started
        pending = restored.context.flags.get(HANDOFF_PENDING)
        handed_to_us = isinstance(pending, dict) and pending.get("next_agent") == self.agent.name
        if restored.agent_name != self.agent.name and not handed_to_us:
            # Never run another agent's task with this agent's model, tools and prompt
            # (its answers and decisions are refused before anything is written: this
            # guards whatever else could lead here). Its own agent's recovery takes it.
            logger.error("%s: task %s belongs to agent %r, not %r: left to its agent",
                         self.scope.instance_id, task_id, restored.agent_name, self.agent.name)
            self.stats.note("refused_foreign_task", task_id)
            with contextlib.suppress(StoreError):
                await self.scope.store.release_resume_lease(task_id, owner)
            return
        if self.handoffs is not None and HANDOFF_PENDING in restored.context.flags:
            # It handed off: the next iteration starts, whatever path took it here.
            await self.handoffs.carry_on(restored.context, owner, self.drive)
            return
        run = TaskRun(restored.context, lease_owner=owner)
        self.in_hand.add(run)
        self._note_resumed(run.ctx, restore_s=restore_s)
        await self.drive(run, in_round=True)

    async def leave(self, task_id: str, owner: str, error: KeyMissingError) -> None:
        """This instance lacks a key the task's history needs (a configuration error,
        not the task's): the restore wrote nothing, so give the lease up at once for
        an instance that holds the key, and pass the task by from now on."""
        logger.error("%s: leaving task %s to an instance with the key: %s",
                     self.scope.instance_id, task_id, error)
        self.key_missing.add(task_id)
        try:
            await self.scope.store.release_resume_lease(task_id, owner)
        except (StoreError, UnknownTaskError) as failed:  # then the lease expires
            logger.warning("%s: could not give up the lease of %s: %s", self.scope.instance_id,
                           task_id, failed)
        self.stats.note("key_missing", task_id, reason=str(error))

    async def _restart(self, blocked: TaskBlockedError) -> TaskBlockedError | None:
        """Restart a blocked task in a fresh context from its reconstruction
        (docs/events.md). None if it was restarted (here, or by another instance first); else the
        block to tell its caller about, saying why it was not restarted."""
        from meshpoint.events.reconstruction import reconstruct

        task_id = blocked.task_id
        try:
            if self.events is not None:
                await self.events.flush()  # this instance's latest steps count too
            rebuilt = await reconstruct(self.scope.store, task_id, events=self.events)
        except MeshpointError as error:
            logger.error("%s: cannot reconstruct blocked task %s: %s", self.scope.instance_id,
                         task_id, error)
            return blocked
        if rebuilt.restart_refusal is not None:
            # The request it would restart with is not the one the signed history
            # names: the task waits for an operator (`meshpoint tasks reconstruct`).
            logger.error("%s: not restarting blocked task %s: %s", self.scope.instance_id,
                         task_id, rebuilt.restart_refusal)
            self.stats.note("restart_refused", task_id, reason=rebuilt.restart_refusal)
            return TaskBlockedError(task_id, f"{blocked.reason}; not restarted from its "
                                    f"reconstruction: {rebuilt.restart_refusal}",
                                    a2a_context=blocked.a2a_context)
        owner = self.owners.next()
        try:
            if await self.scope.store.take_resume_lease(task_id, owner, self.scope.lease_ttl_s,
                                                        statuses=("blocked",),
                                                        agent_name=self.agent.name) is None:
                return None  # another instance took it first
            ctx = TaskExecutionContext(task_id, blocked.a2a_context)
            # The request's hash goes on only as the reconstruction checked it (the
            # live row it was read from is not verified).
            ctx.a2a_context.pop("request_sha256", None)
            if rebuilt.request_verified and rebuilt.request is not None:
                ctx.a2a_context["request_sha256"] = request_digest(rebuilt.request)
            ctx.history = self.agent.history_annotations()
            ctx.append_session_event({"role": "user", "content": rebuilt.prompt})
            await self.scope.store.restart_task(ctx, self.agent.name, lease_owner=owner,
                                                reason=f"reconstructed: {blocked.reason}")
        except MeshpointError as error:
            logger.error("%s: cannot restart blocked task %s: %s", self.scope.instance_id,
                         task_id, error)
            return blocked
        self.stats.note("reconstructed", task_id)
        await self.ends.tell_restarted(ctx, blocked.reason)
        run = TaskRun(ctx, lease_owner=owner)
        self.in_hand.add(run)
        await self.drive(run)
        return None

    def go_on(self, run: TaskRun) -> None:
        """Continue a task whose join completed in this instance's memory."""
        self._note_resumed(run.ctx)
        self.background.spawn(self.drive(run, in_round=True))

    async def drive(self, run: TaskRun, *, in_round: bool = False) -> None:
        """Run turns until the task ends or pauses (one span: ops/tracing.py). Failures
        end the task as ``failed``. ``in_round``: the task continues the round of calls
        it was in (its join completed, or it was checkpointed mid-turn): the calls not
        yet made are made, then the results are settled and given to the conversation."""
        ctx = run.ctx
        with self.scope.tracing.turn(ctx.a2a_context, ctx.flags, ctx.task_id,
                                     resumed=in_round):
            await self._drive(run, in_round=in_round)

    async def _drive(self, run: TaskRun, *, in_round: bool) -> None:
        ctx = run.ctx
        policy = self.agent.checkpoint
        try:
            if in_round and not await self._finish_round(run):
                return
            while True:
                if ctx.cancellation_event.is_set():
                    await self.ends.finish_canceled(run)
                    return
                verdict = next((v for check in self.checks
                                if (v := check.before_model_call(ctx)) is not None), None)
                if isinstance(verdict, HandOff) and self.handoffs is not None:
                    with self.scope.tracing.handoff(ctx.task_id, verdict.trigger):
                        if await self.handoffs.hand_off(run, verdict):
                            return
                elif isinstance(verdict, End):
                    await self.ends.finish(run, verdict.state, verdict.text)
                    return
                if policy.before_model_call(model_calls(ctx)) and \
                        not await self.mid_turn.checkpoint(run):
                    return
                if self.agent.workflow is not None:
                    planned = self._plan(ctx)
                    if isinstance(planned, End):
                        await self.ends.finish(run, planned.state, planned.text)
                        return
                    response = planned
                else:
                    try:
                        response = await self._call_model(ctx)
                    except asyncio.CancelledError:
                        raise
                    except Exception as error:
                        if self.handoffs is None or not self.handoffs.failed(ctx, error):
                            raise
                        # Checkpointed (phase ``error``) and retried; past the agent's
                        # limit the next check hands the task off with the errors.
                        if not await self.mid_turn.checkpoint(run, phase="error"):
                            return
                        continue
                if run.lost:
                    self.in_hand.forget(run)
                    return
                if ctx.cancellation_event.is_set():
                    await self.ends.finish_canceled(run)
                    return
                if not response.tool_calls:
                    await self.ends.finish(run, a2a.TaskState.COMPLETED, response.text or "")
                    return
                self._begin_round(ctx, response)
                if policy.after_tools and not await self.mid_turn.checkpoint(run):
                    return  # the model's plan is kept, so that it is not asked again
                if not await self._finish_round(run):
                    return
                if self.handoffs is not None:
                    self.handoffs.round_ended(ctx)
        except asyncio.CancelledError:
            raise
        except MeshpointError as error:
            logger.warning("%s: task %s failed: %s", self.scope.instance_id, ctx.task_id, error)
            task_failed(error)
            await self.ends.finish(run, a2a.TaskState.FAILED, f"{type(error).__name__}: {error}")
        except Exception as error:
            logger.exception("%s: task %s failed", self.scope.instance_id, ctx.task_id)
            task_failed(error)
            await self.ends.finish(run, a2a.TaskState.FAILED, f"{type(error).__name__}: {error}")

    async def _call_model(self, ctx: TaskExecutionContext) -> ModelResponse:
        """One model call (one step of the log), and its repairs: a reply the task
        cannot store (a tool call's arguments holding NaN or an infinity, say) is
        handed back to the model, told why, up to :data:`REPAIR_ATTEMPTS` times, as
        OpenAIModel does with the replies it reads; ModelError if none is usable. The
        tokens of every attempt are counted."""
        agent = self.agent
        messages = conversation(agent, ctx)
        self.stats.log("step_start", ctx.task_id, step="model",
                       input={"messages": len(messages), "model": agent.model.name})
        started = time.perf_counter()
        feedback: list[dict[str, Any]] = []
        problems: list[str] = []
        try:
            for _ in range(1 + REPAIR_ATTEMPTS):
                with self.scope.tracing.model_call(ctx.task_id, agent.model.name) as span:
                    response = await agent.model.complete(messages + feedback, agent.tool_specs)
                    model_usage(span, response.model, response.usage.prompt_tokens,
                                response.usage.completion_tokens)
                self._count_tokens(ctx, response, sent=None if feedback else messages)
                problems = unusable(response)
                if not problems:
                    break
                feedback += [{"role": "assistant", "content": shown(response)},
                             {"role": "user", "content": ask_again(problems)}]
            else:
                raise ModelError(
                    f"model {agent.model.name!r} gave no usable reply in "
                    f"{1 + REPAIR_ATTEMPTS} attempts: {'; '.join(problems)}")
        except Exception as error:
            self.stats.log("error", ctx.task_id, step="model", output=error,
                           state={"duration_ms": ms_since(started)})
            raise
        self.stats.log("step_complete", ctx.task_id, step="model", output={
            "text": response.text, "tool_calls": [
                {"id": c.id, "name": c.name, "arguments": c.arguments}
                for c in response.tool_calls]},
                       state={"duration_ms": ms_since(started), "usage": response.usage,
                              "repaired": len(feedback) // 2})
        ctx.flags["model_calls"] = model_calls(ctx) + 1
        return response

    def _plan(self, ctx: TaskExecutionContext) -> ModelResponse | End:
        """A workflow agent's next step, planned from its conversation
        (:mod:`meshpoint.runtime.workflows`): its stages' calls, or how it ends. The
        workflow's progress goes into the task's history records, and each stage's
        start and end into its event log (steps ``stage:<output_key>``)."""
        workflow = self.agent.workflow
        assert workflow is not None
        planned, progress = workflow.plan(ctx)
        for answer in progress.last_round:
            self.stats.log("step_complete", ctx.task_id, step=f"stage:{answer.stage.output_key}",
                           output={"state": answer.state, "text": answer.text},
                           state={"agent": answer.stage.agent, "iteration": answer.iteration})
        started = workflow.started(planned) if isinstance(planned, ModelResponse) else ()
        record = ctx.history.get("record")
        if not isinstance(record, dict):
            record = ctx.history["record"] = {}
        record["execution_state"] = {**(record.get("execution_state") or {}),
                                     **workflow.describe(progress, started)}
        for stage, iteration in started:
            self.stats.log("step_start", ctx.task_id, step=f"stage:{stage.output_key}",
                           input={"agent": stage.agent, "iteration": iteration})
        if isinstance(planned, ModelResponse):
            return planned
        if planned.state is a2a.TaskState.COMPLETED:
            ctx.flags[ANSWER_STATE_FLAG] = progress.shared_state()  # for its caller
        return End(planned.state, planned.text)

    def _count_tokens(self, ctx: TaskExecutionContext, response: ModelResponse, *,
                      sent: list[dict[str, Any]] | None = None) -> None:
        usage = response.usage
        if sent is not None:
            # What the context-utilization trigger measures from (docs/handoff.md): the
            # conversation's own prompt (not a repair's, whose feedback is not kept), and
            # the characters it had, from which the trigger learns the model's tokens a
            # character.
            ctx.flags[LAST_PROMPT_TOKENS] = {
                "tokens": usage.context, "events": len(ctx.session_events),
                "chars": sum(len(dump_bytes(m)) for m in sent)}
        count_tokens(self.agent, ctx, response)

    def _begin_round(self, ctx: TaskExecutionContext, response: ModelResponse) -> None:
        """Open a new invocation with the response's calls, in the model's order."""
        invocation = wire.new_id()
        ctx.current_invocation_id = invocation
        # Only the current join is kept: earlier ones were injected into the conversation.
        ctx.parallel_tool_calls.clear()
        ctx.append_session_event({
            "role": "assistant", "content": response.text,
            "tool_calls": [{"id": c.id, "name": c.name, "arguments": c.arguments}
                           for c in response.tool_calls]})
        ctx.begin_parallel_calls(invocation, [c.id for c in response.tool_calls])

    async def _finish_round(self, run: TaskRun) -> bool:
        """Make the current round's calls not made yet, each by its kind: the immediate
        ones first (each followed by a mid-turn checkpoint with ``after_tools``), then
        those that open items to wait on. With items outstanding the task pauses;
        otherwise the round's results are settled (each approved tool that runs then
        checkpointed, with ``after_tools``) and given to the conversation. True to go on
        with the next model call; False once the task paused or this run stopped."""
        ctx = run.ctx
        invocation = ctx.current_invocation_id
        calls = ctx.parallel_tool_calls.get(invocation) if invocation else None
        if invocation is None or calls is None:
            return True  # no round in flight (checkpointed before a model call)
        for call, reason in self.kinds.review(ctx):
            # Its result is dropped: the call is made again below (an approval waits
            # for a decision again), never settled with what its kind refused.
            logger.warning("%s: task %s: the result of call %s (%s) is refused: %s; the "
                           "call is made again", self.scope.instance_id, ctx.task_id, call.id,
                           call.name, reason)
            self.stats.log("result_refused", ctx.task_id, step=call.name,
                           input={"function_call_id": call.id}, output={"reason": reason})
        if calls.completed < calls.total:
            todo = [(call, self.kinds.for_call(call)) for call in turn_calls(ctx).values()
                    if call.id in calls.call_order and call.id not in calls.results]
            after_tools = self.agent.checkpoint.after_tools
            for call, kind in todo:
                if kind.immediate:
                    opened = await self.stats.tool_step(
                        ctx.task_id, call.id, call.name, call.arguments,
                        functools.partial(kind.open, ctx, invocation, call),
                        output=attrgetter("result"))
                    ctx.record_parallel_result(invocation, call.id, opened.result)
                    if after_tools and not await self.mid_turn.checkpoint(run):
                        return False
            outstanding = []
            for call, kind in todo:
                if not kind.immediate:
                    opened = await kind.open(ctx, invocation, call)
                    assert opened.sub_task_id is not None, "a waiting kind opens an item"
                    outstanding.append(opened.sub_task_id)
            if outstanding:
                await self.pauses.pause(run, outstanding, self.go_on)
                return False
        # An approved call's tool runs as it is settled: with after_tools, each is
        # checkpointed (its result and that it was settled) before the next one and
        # before the next model call, so a crash in either does not run it again.
        after_tools = self.agent.checkpoint.after_tools
        if not await self.kinds.settle(ctx, after_tools=functools.partial(
                self.mid_turn.checkpoint, run) if after_tools else None):
            return False
        inject_results(ctx)
        return True

    def _note_resumed(self, ctx: TaskExecutionContext, *,
                      restore_s: float | None = None) -> None:
        """Count a resume, how long the task was paused, whether elsewhere, and how
        long its restore took (a stored task's)."""
        paused_at = ctx.flags.pop("paused_at", None)
        detail: dict[str, Any] = {}
        if isinstance(paused_at, float | int):
            detail["paused_s"] = max(0.0, self.scope.clock() - float(paused_at))
            self.stats.pause_resume_ms.append(detail["paused_s"] * 1000)
        if ctx.flags.get("paused_by") != self.scope.instance_id:
            self.stats.resumed_elsewhere += 1
            detail["elsewhere"] = True
        if restore_s is not None:
            detail["restore_s"] = restore_s
        self.stats.note("resumed", ctx.task_id, **detail)


def conversation(agent: Agent, ctx: TaskExecutionContext) -> list[dict[str, Any]]:
    """What the agent's model is shown of a task: its system prompt, then the
    conversation."""
    messages = list(ctx.session_events)
    if agent.system_prompt:
        prompt = agent.system_prompt
        state = ctx.a2a_context.get(STATE_KEY)
        if state is not None:  # a workflow's stage: ADK's {output_key} placeholders
            prompt = fill_placeholders(prompt, state)
        messages.insert(0, {"role": "system", "content": prompt})
    return messages


def count_tokens(agent: Agent, ctx: TaskExecutionContext, response: ModelResponse) -> None:
    """Count a model call's tokens on the task, by model and as the agent's; a report
    the count refuses is logged (the model's report, not the task, is wrong)."""
    usage = response.usage
    try:
        ctx.record_token_usage(model=response.model or agent.model.name,
                               source=agent.name, prompt_tokens=usage.prompt_tokens,
                               completion_tokens=usage.completion_tokens,
                               cached_tokens=usage.cached_tokens)
    except InvalidArgumentError as error:
        logger.warning("agent %s: task %s: the model's token usage is not counted: %s",
                       agent.name, ctx.task_id, error)


def model_calls(ctx: TaskExecutionContext) -> int:
    """How many model calls a task has made."""
    return int(ctx.flags.get("model_calls", 0))


def inject_results(ctx: TaskExecutionContext) -> None:
    """Give the finished join's results (settled by their kinds) to the conversation,
    in the model's call order."""
    invocation = ctx.current_invocation_id
    calls = ctx.parallel_tool_calls.get(invocation) if invocation else None
    if calls is None:
        return
    names = {call_id: call.name for call_id, call in turn_calls(ctx).items()}
    for call_id, result in calls.ordered_results():
        content = result if isinstance(result, str) else json.dumps(result)
        ctx.append_session_event({"role": "tool", "tool_call_id": call_id,
                                  "name": names.get(call_id, ""), "content": content})
    ctx.parallel_tool_calls.clear()
    ctx.active_peer_sub_tasks.clear()
