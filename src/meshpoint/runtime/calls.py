"""The calls a turn makes, by kind: where a new kind of pause plugs in.

A model's turn asks for tool calls. Each call is claimed by the first registered
:class:`CallKind` that handles it (the kinds an instance uses are listed in one
place, :func:`meshpoint.runtime.instance.call_kinds`):

* an *immediate* kind returns the call's result at once: :class:`LocalTools`;
* a *waiting* kind opens an outstanding item of the turn's join instead, a
  sub-task registered in the context: a peer's answer
  (:class:`~meshpoint.runtime.peers.PeerCalls`), a human's approval
  (:class:`~meshpoint.runtime.approvals.ApprovalCalls`). The task then pauses: the
  boundary checkpoints it, then asks each kind to :meth:`~CallKind.announce` its
  items (publish the request, tell the caller what it waits for), and any instance
  resolves each item exactly once, by its answer or its deadline, in the store. An
  item that ends without its answer (a timeout, a cancel) is
  :meth:`~CallKind.withdraw`-n from whoever was to answer it.

When every call of the turn has its result, each kind may refuse one
(:meth:`~CallKind.refused`: the call is then made again), and :meth:`~CallKind.settle` s
its calls' results into what the model is shown (a peer's answer becomes its text
and its artifacts are kept; an approved call runs its tool now), and the turn goes
on. A kind whose settling runs a tool (``runs_tools``) has each of its calls
checkpointed once settled when the agent's policy says ``after_tools``: the calls
settled so far are kept in the context (``flags["settled"]``), so a task taken over
after a crash settles only the others, and an approved tool runs once.

The store knows nothing of kinds: to it every outstanding item is a sub-task with
correlation data and a deadline. A kind recognises its own items by their
correlation data (:meth:`~CallKind.owns`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from meshpoint._json import json_copy
from meshpoint.context import TaskExecutionContext
from meshpoint.llm.base import ToolCall
from meshpoint.runtime.agent import Agent, LocalTool, ToolCallInfo
from meshpoint.store.results import SubTask

#: An outstanding item: its sub-task id and correlation data.
Item = tuple[str, dict[str, Any]]
#: The key of ``ctx.flags`` listing the current join's calls already settled.
SETTLED = "settled"


@dataclass(frozen=True)
class Opened:
    """What opening a call gave: its ``result`` now, or the ``sub_task_id`` of the
    outstanding item it waits on (registered in the context's join)."""

    result: Any = None
    sub_task_id: str | None = None


class CallKind(Protocol):
    """One kind of tool call (see the module docstring)."""

    #: The status a task waiting on items of this kind is checkpointed in; the
    #: first registered kind with an item outstanding names the pause.
    pause_status: str
    #: True for a kind whose result is known at once (it never opens an item). A
    #: turn makes its immediate calls first, then opens the items it waits on.
    immediate: bool
    #: True for a kind whose :meth:`settle` may run a tool (an approved call): with
    #: ``after_tools``, the task is checkpointed after each of its calls is settled.
    runs_tools: bool

    @property
    def announce_check_s(self) -> float | None:
        """Seconds after the pause when an item is checked for having been announced
        (:meth:`announce_again` is asked if it is still pending), or None: never."""
        ...

    def handles(self, call: ToolCall) -> bool:
        """Whether this kind makes ``call``."""
        ...

    def owns(self, correlation: dict[str, Any]) -> bool:
        """Whether an outstanding item, by its correlation data, is of this kind."""
        ...

    async def open(self, ctx: TaskExecutionContext, invocation_id: str,
                   call: ToolCall) -> Opened:
        """Make ``call``, the turn ``invocation_id``'s: run it, or register the item
        it waits on with ``ctx.register_peer_sub_task``."""
        ...

    async def announce(self, ctx: TaskExecutionContext, items: Sequence[Item], *,
                       inbox: str | None) -> None:
        """Send what makes ``items`` (this kind's, as ``(sub_task_id, correlation)``)
        answerable, once nothing can be lost: after the checkpoint that holds them
        committed, or (``inbox``) when the task waits in this instance's memory and
        the answers must come to that subject prefix."""
        ...

    async def announce_again(self, sub: SubTask) -> bool:
        """Announce a stored item again: its announcement check is due and nothing
        came for it since its pause (its announcer may have died before announcing).
        ``sub`` is as :meth:`~meshpoint.store.base.Store.check_announcements` returns
        it, its deadline now its timeout's. True if it was announced again."""
        ...

    async def withdraw(self, sub_task_id: str, correlation: dict[str, Any]) -> None:
        """The item ended without its answer (its deadline passed, or its task was
        canceled): tell whoever was to answer it that it need not."""
        ...

    def refused(self, ctx: TaskExecutionContext, call: ToolCall, result: Any) -> str | None:
        """Why ``call``'s item cannot be settled with the result it was resolved with
        (an approval whose signature does not verify, say), or None. Runs before
        :meth:`settle`; a refused result is dropped and the call made again (a new
        item: the task waits again)."""
        ...

    async def settle(self, ctx: TaskExecutionContext, call: ToolCall, result: Any) -> Any:
        """What the model is shown for ``call``, one of this kind's, given the result
        its item was resolved with (any JSON value). Runs when the turn's join is
        complete, on the instance that continues the task."""
        ...


@dataclass(frozen=True)
class LocalTools:
    """The agent's local tools: run at once, their result (or error) is the call's.
    Registered last, it takes every call no other kind did: a tool the agent does
    not have gets an error result the model sees, not a failed task."""

    pause_status = "working"
    immediate = True
    runs_tools = False  # its tools ran when the calls were made (checkpointed then)
    announce_check_s = None

    agent: Agent

    def handles(self, call: ToolCall) -> bool:
        return True

    def owns(self, correlation: dict[str, Any]) -> bool:
        return False

    async def open(self, ctx: TaskExecutionContext, invocation_id: str,
                   call: ToolCall) -> Opened:
        tool = self.agent.local_tool(call.name)
        if tool is None:
            return Opened(result={"error": f"unknown tool {call.name!r}"})
        return Opened(result=await run_tool(tool, ctx, call, call.arguments))

    async def announce(self, ctx: TaskExecutionContext, items: Sequence[Item], *,
                       inbox: str | None) -> None:
        raise AssertionError("a local call is never outstanding")

    async def announce_again(self, sub: SubTask) -> bool:
        raise AssertionError("a local call is never outstanding")

    async def withdraw(self, sub_task_id: str, correlation: dict[str, Any]) -> None:
        raise AssertionError("a local call is never outstanding")

    def refused(self, ctx: TaskExecutionContext, call: ToolCall, result: Any) -> str | None:
        return None

    async def settle(self, ctx: TaskExecutionContext, call: ToolCall, result: Any) -> Any:
        return result


async def run_tool(tool: LocalTool, ctx: TaskExecutionContext, call: ToolCall,
                   arguments: dict[str, Any]) -> Any:
    """Run a local tool for ``call``: its result, or its error as a result."""
    try:
        return await tool.call(arguments, ToolCallInfo(task_id=ctx.task_id, call_id=call.id))
    except Exception as error:
        return {"error": f"{type(error).__name__}: {error}"}


class CallKinds:
    """The kinds an instance makes calls with, in the order they claim calls."""

    def __init__(self, kinds: Sequence[CallKind]) -> None:
        self._kinds = tuple(kinds)

    def for_call(self, call: ToolCall) -> CallKind:
        return next(kind for kind in self._kinds if kind.handles(call))

    def of(self, correlation: dict[str, Any]) -> CallKind | None:
        """The kind of an outstanding item (None for data no kind recognises)."""
        return next((kind for kind in self._kinds if kind.owns(correlation)), None)

    def pause_status(self, correlations: Sequence[dict[str, Any]]) -> str:
        """The checkpoint status of a task waiting on these items."""
        for kind in self._kinds:
            if any(kind.owns(corr) for corr in correlations):
                return kind.pause_status
        raise AssertionError("a pause waits on at least one item of a known kind")

    async def announce(self, ctx: TaskExecutionContext, sub_task_ids: Sequence[str], *,
                       inbox: str | None = None) -> None:
        """Announce the items ``sub_task_ids`` of ``ctx``, each kind its own at once."""
        by_kind: dict[int, tuple[CallKind, list[Item]]] = {}
        for sub_task_id in sub_task_ids:
            corr = ctx.active_peer_sub_tasks[sub_task_id]
            kind = self.of(corr)
            if kind is not None:
                by_kind.setdefault(id(kind), (kind, []))[1].append((sub_task_id, corr))
        for kind, items in by_kind.values():
            await kind.announce(ctx, items, inbox=inbox)

    async def withdraw(self, sub_task_id: str, correlation: dict[str, Any]) -> None:
        kind = self.of(correlation)
        if kind is not None:
            await kind.withdraw(sub_task_id, correlation)

    @property
    def checks_announcements(self) -> bool:
        """Whether a kind gives its calls an announcement check (else the sweeper
        need not look for due checks)."""
        return any(kind.announce_check_s is not None for kind in self._kinds)

    async def announce_again(self, sub: SubTask) -> bool:
        """Announce a stored item again, by its kind (:meth:`CallKind.announce_again`);
        True if it was."""
        kind = self.of(sub.correlation_data)
        return kind is not None and await kind.announce_again(sub)

    def review(self, ctx: TaskExecutionContext) -> list[tuple[ToolCall, str]]:
        """Drop each result of the current turn that its call's kind refuses
        (:meth:`CallKind.refused`): those calls are then made again. Returns each
        refused call with the reason."""
        invocation = ctx.current_invocation_id
        calls = ctx.parallel_tool_calls.get(invocation) if invocation else None
        if calls is None:
            return []
        made = turn_calls(ctx)
        refused = []
        for call_id, result in calls.ordered_results():
            call = made.get(call_id)
            if call is not None:
                reason = self.for_call(call).refused(ctx, call, result)
                if reason is not None:
                    del calls.results[call_id]
                    refused.append((call, reason))
        return refused

    async def settle(self, ctx: TaskExecutionContext, *,
                     after_tools: Callable[[], Awaitable[bool]] | None = None) -> bool:
        """Settle the results of the turn whose join is complete, each by the kind of
        its call, in the model's call order, skipping those settled before (a task
        taken over after a checkpoint made while it settled). ``after_tools`` is
        awaited after each call of a kind that runs tools (a mid-turn checkpoint);
        False from it stops here and is returned (the run must stop)."""
        invocation = ctx.current_invocation_id
        calls = ctx.parallel_tool_calls.get(invocation) if invocation else None
        if calls is None:
            return True
        made = turn_calls(ctx)
        settled: list[str] = ctx.flags.setdefault(SETTLED, [])
        for call_id, result in calls.ordered_results():
            if call_id in settled:
                continue
            call = made.get(call_id) or ToolCall(id=call_id, name="", arguments={})
            kind = self.for_call(call)
            value = await kind.settle(ctx, call, result)
            if value is not result:
                calls.results[call_id] = json_copy(value, f"result of {call_id!r}")
            settled.append(call_id)
            if kind.runs_tools and after_tools is not None and not await after_tools():
                return False
        # The results go to the conversation next (no await in between), which ends
        # the join: nothing is left to settle twice.
        del ctx.flags[SETTLED]
        return True


def turn_calls(ctx: TaskExecutionContext) -> dict[str, ToolCall]:
    """The calls of the task's latest turn that made any, by the model's call id."""
    for event in reversed(ctx.session_events):
        if event.get("role") == "assistant" and event.get("tool_calls"):
            return {c["id"]: ToolCall(id=c["id"], name=c["name"],
                                      arguments=c.get("arguments") or {})
                    for c in event["tool_calls"]}
    return {}
