"""The calls a turn makes, by kind: where a new kind of pause plugs in.

A model's turn asks for tool calls. Each call is claimed by the first registered
:class:`CallKind` that handles it (the kinds an instance uses are listed in one
place, :func:`meshpoint.runtime.instance.call_kinds`):

* an *immediate* kind returns the call's result at once: :class:`LocalTools`;
* a *waiting* kind opens an outstanding item of the turn's join instead, a
  sub-task registered in the context: a peer's answer
  (:class:`~meshpoint.runtime.peers.PeerCalls`), and next a human's approval. The
  task then pauses: the boundary checkpoints it, then asks each item's kind to
  :meth:`~CallKind.announce` it (publish the request, tell the caller what it
  waits for), and any instance resolves the item exactly once, by its answer or
  its deadline, in the store. An item that ends without its answer (a timeout, a
  cancel) is :meth:`~CallKind.withdraw`-n from whoever was to answer it.

The store knows nothing of kinds: to it every outstanding item is a sub-task with
correlation data and a deadline. A kind recognises its own items by their
correlation data (:meth:`~CallKind.owns`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from meshpoint.context import TaskExecutionContext
from meshpoint.llm.base import ToolCall
from meshpoint.runtime.agent import Agent


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

    async def announce(self, ctx: TaskExecutionContext, sub_task_id: str,
                       correlation: dict[str, Any], *, inbox: str | None) -> None:
        """Send what makes the item answerable, once nothing can be lost: after the
        checkpoint that holds it committed, or (``inbox``) when the task waits in
        this instance's memory and the answer must come to that subject prefix."""
        ...

    async def withdraw(self, sub_task_id: str, correlation: dict[str, Any]) -> None:
        """The item ended without its answer (its deadline passed, or its task was
        canceled): tell whoever was to answer it that it need not."""
        ...


@dataclass(frozen=True)
class LocalTools:
    """The agent's local tools: run at once, their result (or error) is the call's.
    Registered last, it takes every call no other kind did: a tool the agent does
    not have gets an error result the model sees, not a failed task."""

    pause_status = "working"

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
        try:
            return Opened(result=await tool.call(call.arguments))
        except Exception as error:
            return Opened(result={"error": f"{type(error).__name__}: {error}"})

    async def announce(self, ctx: TaskExecutionContext, sub_task_id: str,
                       correlation: dict[str, Any], *, inbox: str | None) -> None:
        raise AssertionError("a local call is never outstanding")

    async def withdraw(self, sub_task_id: str, correlation: dict[str, Any]) -> None:
        raise AssertionError("a local call is never outstanding")


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

    async def announce(self, ctx: TaskExecutionContext, sub_task_id: str,
                       correlation: dict[str, Any], *, inbox: str | None = None) -> None:
        kind = self.of(correlation)
        if kind is not None:
            await kind.announce(ctx, sub_task_id, correlation, inbox=inbox)

    async def withdraw(self, sub_task_id: str, correlation: dict[str, Any]) -> None:
        kind = self.of(correlation)
        if kind is not None:
            await kind.withdraw(sub_task_id, correlation)
