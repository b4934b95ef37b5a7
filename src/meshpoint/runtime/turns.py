"""Running a task's turns, and its pause boundary (DESIGN §5).

A turn calls the model; local tools run at once, peer calls are registered as
sub-tasks of the turn's invocation. When a turn calls peers the task pauses:

1. the turn ends with its sub-tasks registered in the context;
2. one transaction checkpoints the task, its sub-tasks and the invocation;
3. only then are the peer requests published (no answer can arrive for a
   sub-task that no instance can find), 4. then the inbound message is
   acknowledged, 5. then the task leaves memory.

If the checkpoint fails (or checkpointing is off), the task waits in memory
instead: its peers answer to this instance's inbox, in-memory timers enforce the
deadlines, and its inbound message stays un-acknowledged (kept alive by
``in_progress``) so that a crash of this instance has it redelivered.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from meshpoint import a2a
from meshpoint.broker.base import Broker, Delivery
from meshpoint.context import TaskExecutionContext
from meshpoint.errors import (
    CheckpointConflictError,
    LeaseNotHeldError,
    MeshpointError,
    StoreError,
    StoreUnavailableError,
    UnknownTaskError,
)
from meshpoint.llm.base import ModelResponse
from meshpoint.runtime import wire
from meshpoint.runtime.agent import Agent, RuntimeOptions
from meshpoint.runtime.stats import InstanceStats
from meshpoint.store.base import TIMEOUT_RESULT
from meshpoint.store.sql import SqlStore

if TYPE_CHECKING:
    from meshpoint.runtime.instance import AgentInstance

logger = logging.getLogger("meshpoint.runtime")


@dataclass(eq=False)
class TaskRun:
    """A task in one instance's memory."""

    ctx: TaskExecutionContext
    #: The un-acknowledged inbound request (first run, or the in-memory path).
    delivery: Delivery | None = None
    #: The resume lease this run holds, if it was restored from the store.
    lease_owner: str | None = None
    #: True while the task waits in memory for its peers (the in-memory path).
    waiting: bool = False
    #: Set when another instance took the lease over: this run must stop quietly.
    lost: bool = False
    #: A first checkpoint failed with the database unreachable: it may have been
    #: committed all the same (the connection dropped after the commit), so the
    #: in-memory path removes whatever rows it left when the task ends.
    maybe_stored: bool = False
    timers: dict[str, asyncio.TimerHandle] = field(default_factory=dict)

    def cancel_timers(self) -> None:
        for handle in self.timers.values():
            handle.cancel()
        self.timers.clear()

    def refresh_timer(self, sub_task_id: str, peer_task_id: str | None,
                      instance: AgentInstance) -> None:
        """A status update on the in-memory path: restart the deadline."""
        corr = self.ctx.active_peer_sub_tasks.get(sub_task_id)
        if corr is None:
            return
        if peer_task_id:
            corr["peer_task_id"] = peer_task_id
        instance.schedule_timeout(self, sub_task_id, corr["timeout_s"])


class TurnRunner:
    """The turn and pause logic of :class:`~meshpoint.runtime.instance.AgentInstance`."""

    agent: Agent
    store: SqlStore
    broker: Broker
    options: RuntimeOptions
    instance_id: str
    stats: InstanceStats
    active: dict[str, TaskRun]
    memory_subs: dict[str, str]

    # Provided by AgentInstance.
    def spawn(self, coro: Any) -> None:
        raise NotImplementedError

    async def cancel_peer(self, sub_task_id: str, corr: dict[str, Any]) -> None:
        raise NotImplementedError

    async def cancel_stored(self, task_id: str) -> str:
        raise NotImplementedError

    # -- the turn loop ---------------------------------------------------------------------

    async def drive(self, run: TaskRun) -> None:
        """Run turns until the task ends or pauses. Failures end the task as ``failed``."""
        ctx = run.ctx
        try:
            while True:
                if ctx.cancellation_event.is_set():
                    await self.finish_canceled(run)
                    return
                if self._turns(ctx) >= self.agent.max_turns:
                    await self.finish(run, a2a.TaskState.FAILED,
                                      f"gave up after {self.agent.max_turns} model calls")
                    return
                response = await self._call_model(ctx)
                if run.lost:
                    self._forget(run)
                    return
                if ctx.cancellation_event.is_set():
                    await self.finish_canceled(run)
                    return
                if not response.tool_calls:
                    await self.finish(run, a2a.TaskState.COMPLETED, response.text or "")
                    return
                peer_calls = await self._start_calls(ctx, response)
                if peer_calls:
                    await self.pause(run, peer_calls)
                    return
                inject_results(ctx)
        except asyncio.CancelledError:
            raise
        except MeshpointError as error:
            logger.warning("%s: task %s failed: %s", self.instance_id, ctx.task_id, error)
            await self.finish(run, a2a.TaskState.FAILED, f"{type(error).__name__}: {error}")
        except Exception as error:
            logger.exception("%s: task %s failed", self.instance_id, ctx.task_id)
            await self.finish(run, a2a.TaskState.FAILED, f"{type(error).__name__}: {error}")

    @staticmethod
    def _turns(ctx: TaskExecutionContext) -> int:
        return int(ctx.flags.get("model_calls", 0))

    async def _call_model(self, ctx: TaskExecutionContext) -> ModelResponse:
        messages = list(ctx.session_events)
        if self.agent.system_prompt:
            messages.insert(0, {"role": "system", "content": self.agent.system_prompt})
        response = await self.agent.model.complete(messages, self.agent.tool_specs)
        ctx.flags["model_calls"] = self._turns(ctx) + 1
        usage = response.usage
        ctx.record_token_usage(model=response.model or self.agent.model.name,
                               source=self.agent.name,
                               prompt_tokens=usage.prompt_tokens,
                               completion_tokens=usage.completion_tokens,
                               cached_tokens=usage.cached_tokens)
        return response

    async def _start_calls(self, ctx: TaskExecutionContext, response: ModelResponse
                           ) -> list[str]:
        """Open a new invocation: run local tools, register peer calls as sub-tasks.
        Returns the new sub-task ids; their correlation data holds all a request needs."""
        invocation = wire.new_id()
        ctx.current_invocation_id = invocation
        # Only the current join is kept: earlier ones were injected into the conversation.
        ctx.parallel_tool_calls.clear()
        ctx.append_session_event({
            "role": "assistant", "content": response.text,
            "tool_calls": [{"id": c.id, "name": c.name, "arguments": c.arguments}
                           for c in response.tool_calls]})
        ctx.begin_parallel_calls(invocation, [c.id for c in response.tool_calls])
        peer_calls: list[str] = []
        ns = self.options.namespace
        for call in response.tool_calls:
            peer = self.agent.peer_for_tool(call.name)
            if peer is not None:
                sub_task_id = wire.new_id()
                query = call.arguments.get("query")
                text = query if isinstance(query, str) else json.dumps(call.arguments)
                ctx.register_peer_sub_task(sub_task_id, {
                    "function_call_id": call.id, "peer_agent_name": peer.agent,
                    "peer_tool_name": call.name, "timeout_s": peer.timeout_s, "query": text,
                    "reply_to": wire.response_subject(ns, self.agent.name, sub_task_id),
                    "status_to": wire.status_subject(ns, self.agent.name, sub_task_id)})
                peer_calls.append(sub_task_id)
                continue
            tool = self.agent.local_tool(call.name)
            if tool is None:
                result: Any = {"error": f"unknown tool {call.name!r}"}
            else:
                try:
                    result = await tool.call(call.arguments)
                except Exception as error:
                    result = {"error": f"{type(error).__name__}: {error}"}
            ctx.record_parallel_result(invocation, call.id, result)
        return peer_calls

    # -- the pause boundary ----------------------------------------------------------------

    async def pause(self, run: TaskRun, peer_calls: list[str]) -> None:
        ctx = run.ctx
        ctx.flags["paused_at"] = time.time()
        ctx.flags["paused_by"] = self.instance_id
        if self.agent.stateless_checkpointing:
            started = time.perf_counter()
            # Shielded so that a write still in flight when this instance is killed is
            # counted once it commits (it commits either way: it runs in the database).
            write = asyncio.ensure_future(self.store.checkpoint_task(
                ctx, self.agent.name, lease_owner=run.lease_owner))
            write.add_done_callback(self._count_checkpoint)
            try:
                await asyncio.shield(write)
            except (CheckpointConflictError, LeaseNotHeldError, UnknownTaskError) as error:
                # Another instance has this task: a redelivered request ran twice, or
                # our lease expired and was taken over. Theirs is the live copy.
                logger.info("%s: dropping task %s: %s", self.instance_id, ctx.task_id, error)
                self.stats.note("dropped", ctx.task_id)
                self._forget(run)
                if run.lease_owner is not None and isinstance(error, CheckpointConflictError):
                    # Refused (e.g. calls still open after a cancel): let it go.
                    with contextlib.suppress(StoreError):
                        await self.store.release_resume_lease(ctx.task_id, run.lease_owner)
                if run.lease_owner is None and isinstance(error, CheckpointConflictError):
                    # Our request was redelivered: its first run checkpointed but may
                    # have died before publishing. Publish the stored calls again
                    # (a peer that has them already ignores or re-answers them).
                    await self._republish(ctx.task_id)
                if run.delivery is not None:
                    await run.delivery.ack()
                return
            except StoreError as error:
                logger.warning("%s: checkpoint of %s failed (%s); it waits in memory",
                               self.instance_id, ctx.task_id, error)
                run.maybe_stored = run.lease_owner is None and isinstance(
                    error, StoreUnavailableError)
            else:
                self.stats.checkpoint_ms.append((time.perf_counter() - started) * 1000)
                self.stats.note("paused", ctx.task_id)
                for sub_task_id in peer_calls:
                    corr = ctx.active_peer_sub_tasks[sub_task_id]
                    try:
                        await self._publish_call(ctx.task_id, sub_task_id, corr)
                    except Exception as error:
                        # The checkpoint holds the call: it times out and the task goes on.
                        logger.error("%s: request %s to %s not published (%s); it will time "
                                     "out", self.instance_id, sub_task_id,
                                     corr["peer_agent_name"], error)
                if run.delivery is not None:
                    await run.delivery.ack()
                self._forget(run)
                if ctx.cancellation_event.is_set():
                    # A cancel reached us during the boundary: apply it to the stored task.
                    self.spawn(self._cancel_after_boundary(ctx.task_id))
                return
        # The in-memory path (seed 002): wait here, answers come to our inbox.
        run.waiting = True
        self.stats.note("paused_in_memory", ctx.task_id)
        inbox = wire.inbox_prefix(self.options.namespace, self.instance_id)
        for sub_task_id in peer_calls:
            corr = ctx.active_peer_sub_tasks[sub_task_id]
            corr["reply_to"] = f"{inbox}.response.{sub_task_id}"
            corr["status_to"] = f"{inbox}.status.{sub_task_id}"
            self.memory_subs[sub_task_id] = ctx.task_id
            self.schedule_timeout(run, sub_task_id, corr["timeout_s"])
            await self._publish_call(ctx.task_id, sub_task_id, corr)

    async def _republish(self, task_id: str) -> None:
        try:
            stored = await self.store.get_peer_sub_tasks_for_task(task_id)
        except StoreError:
            return  # the calls still time out
        for sub in stored:
            if sub.status == "pending" and sub.peer_agent_name:
                await self._publish_call(task_id, sub.sub_task_id, sub.correlation_data)

    async def _cancel_after_boundary(self, task_id: str) -> None:
        try:
            await self.cancel_stored(task_id)
        except StoreError as error:
            logger.warning("%s: cancel of %s failed: %s", self.instance_id, task_id, error)

    async def _publish_call(self, task_id: str, sub_task_id: str, corr: dict[str, Any]) -> None:
        """Send one peer call, as its correlation data describes it."""
        await self.broker.publish(
            wire.request_subject(self.options.namespace, corr["peer_agent_name"]),
            wire.send_request(sub_task_id, corr["query"], metadata={
                "meshpoint_caller": {"agent": self.agent.name, "task_id": task_id}}),
            wire.reply_headers(corr["reply_to"], corr["status_to"]))

    def _count_checkpoint(self, write: asyncio.Future[Any]) -> None:
        if not write.cancelled() and write.exception() is None:
            self.stats.counts["checkpoints"] += 1

    # -- the in-memory path ---------------------------------------------------------------

    def schedule_timeout(self, run: TaskRun, sub_task_id: str, timeout_s: float) -> None:
        old = run.timers.pop(sub_task_id, None)
        if old is not None:
            old.cancel()
        loop = asyncio.get_running_loop()
        run.timers[sub_task_id] = loop.call_later(
            timeout_s, lambda: self.spawn(self._memory_timeout(run, sub_task_id)))

    async def _memory_timeout(self, run: TaskRun, sub_task_id: str) -> None:
        corr = run.ctx.active_peer_sub_tasks.get(sub_task_id)
        if self.resolve_in_memory(run, sub_task_id, dict(TIMEOUT_RESULT)) and corr:
            self.stats.note("timeout", run.ctx.task_id)
            await self.cancel_peer(sub_task_id, corr)

    def resolve_in_memory(self, run: TaskRun, sub_task_id: str, result: dict[str, Any]) -> bool:
        """Claim under the context's lock, record, and resume when the join is done.
        Returns False for a duplicate or late resolution."""
        ctx = run.ctx
        corr = ctx.claim_sub_task_completion(sub_task_id)
        if corr is None:
            self.stats.note("ignored_answer", sub_task_id)
            return False
        self.memory_subs.pop(sub_task_id, None)
        handle = run.timers.pop(sub_task_id, None)
        if handle is not None:
            handle.cancel()
        completed, total = ctx.record_parallel_result(corr["invocation_id"],
                                                      corr["function_call_id"], result)
        if completed == total and run.waiting:
            run.waiting = False
            self._note_resumed(ctx)
            inject_results(ctx)
            self.spawn(self.drive(run))
        return True

    # -- resuming from the store ----------------------------------------------------------

    async def resume(self, task_id: str, owner: str) -> None:
        """Continue a stored task whose join completed, under ``owner``'s lease."""
        try:
            restored = await self.store.restore_task(task_id, lease_owner=owner)
        except (LeaseNotHeldError, UnknownTaskError):
            return  # taken over or canceled meanwhile
        except StoreError as error:
            logger.error("%s: cannot restore task %s: %s", self.instance_id, task_id, error)
            return
        ctx = restored.context
        run = TaskRun(ctx, lease_owner=owner)
        self.active[task_id] = run
        self._note_resumed(ctx)
        inject_results(ctx)
        await self.drive(run)

    def _note_resumed(self, ctx: TaskExecutionContext) -> None:
        """Count a resume, how long the task was paused, and whether elsewhere."""
        paused_at = ctx.flags.get("paused_at")
        if isinstance(paused_at, float | int):
            self.stats.pause_resume_ms.append(max(0.0, (time.time() - paused_at) * 1000))
        if ctx.flags.get("paused_by") != self.instance_id:
            self.stats.resumed_elsewhere += 1
        self.stats.note("resumed", ctx.task_id)

    # -- ending a task ----------------------------------------------------------------------

    async def finish(self, run: TaskRun, state: a2a.TaskState, text: str) -> None:
        """Answer the caller, then delete the task's rows, then ack its request.

        In that order: a crash after the answer and before the cleanup re-runs the
        turn and answers twice (the caller ignores the second), never zero times.
        """
        ctx = run.ctx
        if run.lease_owner is not None and not run.lost:
            # Fence: answer only while still holding the lease. An instance that
            # stalled past its lease has been replaced; the replacement answers.
            try:
                lease = await self.store.renew_resume_lease(ctx.task_id, run.lease_owner,
                                                            self.options.lease_ttl_s)
            except UnknownTaskError:
                lease = None
            run.lost = lease is None
        if run.lost:
            self.stats.note("dropped", ctx.task_id)
            self._forget(run)
            return
        if state is a2a.TaskState.COMPLETED:
            ctx.produced_artifacts.append(wire.answer_artifact(ctx.task_id, self.agent.name,
                                                               text))
        await self.answer(ctx, state, text)
        self.stats.note(state.value, ctx.task_id)
        try:
            if run.lease_owner is not None:
                await self.store.cleanup_task(ctx.task_id, lease_owner=run.lease_owner)
            elif run.maybe_stored:
                await self.store.cleanup_task(ctx.task_id)
        except (LeaseNotHeldError, UnknownTaskError):
            pass
        except StoreError as error:
            # The lease expires and another instance re-runs the turn: it answers
            # again (a duplicate the caller ignores) and removes the rows.
            logger.warning("%s: cleanup of %s failed: %s", self.instance_id, ctx.task_id,
                           error)
        finally:
            self._forget(run)
        if run.delivery is not None:
            await run.delivery.ack()

    async def finish_canceled(self, run: TaskRun) -> None:
        for sub_task_id, corr in list(run.ctx.active_peer_sub_tasks.items()):
            await self.cancel_peer(sub_task_id, corr)
        await self.finish(run, a2a.TaskState.CANCELED, "canceled")

    def _forget(self, run: TaskRun) -> None:
        run.cancel_timers()
        for sub_task_id in list(run.ctx.active_peer_sub_tasks):
            self.memory_subs.pop(sub_task_id, None)
        if self.active.get(run.ctx.task_id) is run:  # never another run of the same task
            del self.active[run.ctx.task_id]

    async def cancel_local(self, run: TaskRun) -> None:
        """Cancel a task in this instance's memory. A turn in progress stops at its
        next step; a task waiting in memory ends now."""
        run.ctx.cancellation_event.set()
        if run.waiting:
            run.waiting = False
            await self.finish_canceled(run)

    async def answer(self, ctx: TaskExecutionContext, state: a2a.TaskState, text: str) -> None:
        """Publish the task's final state to its caller, if it named a reply subject."""
        reply_to = ctx.a2a_context.get("reply_to")
        if not reply_to:
            return
        # One final answer per task: a turn re-run after a take-over (the first run
        # answered, then died before its cleanup) publishes the same msg_id, which the
        # broker drops within its dedupe window.
        await self.broker.publish(reply_to, wire.final_task(
            ctx.a2a_context.get("request_id") or ctx.task_id, ctx.task_id,
            ctx.a2a_context.get("context_id") or ctx.task_id, state, text,
            ctx.produced_artifacts, {"token_usage": ctx.token_usage.to_dict(),
                                     "agent": self.agent.name,
                                     "instance": self.instance_id}),
            msg_id=wire.answer_msg_id(ctx.task_id))


def inject_results(ctx: TaskExecutionContext) -> None:
    """Give the finished join's results to the conversation, in the model's call
    order, and keep every peer answer's artifacts and token usage."""
    invocation = ctx.current_invocation_id
    calls = ctx.parallel_tool_calls.get(invocation) if invocation else None
    if calls is None:
        return
    names = {}
    for event in reversed(ctx.session_events):
        if event.get("role") == "assistant" and event.get("tool_calls"):
            names = {c["id"]: c["name"] for c in event["tool_calls"]}
            break
    for call_id, result in calls.ordered_results():
        if isinstance(result, dict) and "status" in result:  # a peer's answer or timeout
            content = result.get("text") or json.dumps(
                {k: v for k, v in result.items() if k != "artifacts"})
            ctx.produced_artifacts.extend(result.get("artifacts") or [])
            usage = result.get("token_usage")
            if isinstance(usage, dict):
                _record_peer_usage(ctx, str(result.get("peer_agent") or names.get(call_id)),
                                   usage)
        else:
            content = result if isinstance(result, str) else json.dumps(result)
        ctx.append_session_event({"role": "tool", "tool_call_id": call_id,
                                  "name": names.get(call_id, ""), "content": content})
    ctx.parallel_tool_calls.clear()
    ctx.active_peer_sub_tasks.clear()


def _record_peer_usage(ctx: TaskExecutionContext, source: str, usage: dict[str, Any]) -> None:
    """A peer's tokens count towards this task, attributed to the peer's tool."""
    for model, counts in (usage.get("by_model") or {}).items():
        if isinstance(counts, dict):
            try:
                ctx.record_token_usage(
                    model=str(model), source=source,
                    prompt_tokens=int(counts.get("prompt_tokens", 0)),
                    completion_tokens=int(counts.get("completion_tokens", 0)),
                    cached_tokens=int(counts.get("cached_tokens", 0)))
            except (MeshpointError, TypeError, ValueError):
                logger.warning("ignoring malformed token usage from %s", source)
