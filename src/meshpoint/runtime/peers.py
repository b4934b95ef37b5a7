"""Peer calls: a tool call answered by another agent (see :mod:`meshpoint.runtime.calls`).

Each peer of an agent is offered to the model as a tool (``ask_<agent>``). A call
becomes a sub-task of the turn's join whose correlation data holds all a request
needs (the peer, the query, the subjects its answer and progress go to), so that
any instance can publish it again, cancel it, or resolve it. Answers are addressed
to the calling *agent*, never to an instance, unless the task waits in one
instance's memory.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from meshpoint.broker.base import Broker
from meshpoint.context import TaskExecutionContext
from meshpoint.errors import MeshpointError
from meshpoint.llm.base import ToolCall
from meshpoint.runtime import wire
from meshpoint.runtime.agent import Agent
from meshpoint.runtime.calls import Item, Opened
from meshpoint.runtime.subjects import Subjects

logger = logging.getLogger("meshpoint.runtime")


@dataclass(frozen=True)
class PeerCalls:
    """The :class:`~meshpoint.runtime.calls.CallKind` of calls to peer agents."""

    pause_status = "waiting_peers"
    immediate = False
    runs_tools = False

    agent: Agent
    broker: Broker
    subjects: Subjects

    def handles(self, call: ToolCall) -> bool:
        return self.agent.peer_for_tool(call.name) is not None

    def owns(self, correlation: dict[str, Any]) -> bool:
        return bool(correlation.get("peer_agent_name"))

    async def open(self, ctx: TaskExecutionContext, invocation_id: str,
                   call: ToolCall) -> Opened:
        peer = self.agent.peer_for_tool(call.name)
        assert peer is not None, "handles() said this call is a peer's"
        sub_task_id = wire.new_id()
        query = call.arguments.get("query")
        name = self.agent.name
        ctx.register_peer_sub_task(sub_task_id, {
            "invocation_id": invocation_id, "function_call_id": call.id,
            "peer_agent_name": peer.agent, "peer_tool_name": call.name,
            "timeout_s": peer.timeout_s,
            "query": query if isinstance(query, str) else json.dumps(call.arguments),
            "reply_to": self.subjects.response(name, sub_task_id),
            "status_to": self.subjects.status(name, sub_task_id)})
        return Opened(sub_task_id=sub_task_id)

    async def announce(self, ctx: TaskExecutionContext, items: Sequence[Item], *,
                       inbox: str | None) -> None:
        """Publish each request; with ``inbox``, their answers and progress go to this
        instance (the correlation data is changed to say so)."""
        for sub_task_id, correlation in items:
            if inbox is not None:
                correlation["reply_to"] = f"{inbox}.response.{sub_task_id}"
                correlation["status_to"] = f"{inbox}.status.{sub_task_id}"
            await self.broker.publish(
                self.subjects.request(correlation["peer_agent_name"]),
                wire.send_request(sub_task_id, correlation["query"], metadata={
                    **(correlation.get("metadata") or {}),
                    "meshpoint_caller": {"agent": self.agent.name, "task_id": ctx.task_id}},
                    context_id=ctx.task_id),
                wire.reply_headers(correlation["reply_to"], correlation["status_to"]),
                # Announced again (a redelivered request's run), it is dropped by the
                # broker; addressed to an inbox, it is another message.
                msg_id=wire.request_msg_id(sub_task_id) if inbox is None else None)

    async def withdraw(self, sub_task_id: str, correlation: dict[str, Any]) -> None:
        """Send ``tasks/cancel`` to the peer, naming the peer's own task: the id it
        reported in a status update, or else the one it derived from our request."""
        peer = correlation["peer_agent_name"]
        peer_task_id = correlation.get("peer_task_id") or wire.derive_task_id(
            peer, correlation.get("reply_to"), sub_task_id)
        await self.broker.publish(self.subjects.request(peer),
                                   wire.cancel_request(peer_task_id))

    def refused(self, ctx: TaskExecutionContext, call: ToolCall, result: Any) -> str | None:
        return None

    async def settle(self, ctx: TaskExecutionContext, call: ToolCall, result: Any) -> Any:
        """The peer's answer (or its timeout) as the model sees it: the answer's text,
        or the result as JSON when it has none. Its artifacts and token usage become
        the task's."""
        if not (isinstance(result, dict) and "status" in result):
            return result
        ctx.produced_artifacts.extend(result.get("artifacts") or [])
        usage = result.get("token_usage")
        if isinstance(usage, dict):
            _record_usage(ctx, str(result.get("peer_agent") or call.name), usage)
        return result.get("text") or json.dumps(
            {k: v for k, v in result.items() if k != "artifacts"})


def _record_usage(ctx: TaskExecutionContext, source: str, usage: dict[str, Any]) -> None:
    """A peer's tokens count towards this task, attributed to the peer."""
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
