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
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from meshpoint.broker.base import Broker
from meshpoint.context import TaskExecutionContext
from meshpoint.errors import MeshpointError
from meshpoint.llm.base import ToolCall
from meshpoint.ops.tracing import Tracing, with_traceparent
from meshpoint.runtime import wire
from meshpoint.runtime.agent import Agent
from meshpoint.runtime.calls import Item, Opened
from meshpoint.runtime.subjects import Subjects
from meshpoint.store.results import SubTask

logger = logging.getLogger("meshpoint.runtime")
#: The share of the broker's dedupe window within which a request is published again
#: (the rest is a margin for clocks and for the publish itself).
DEDUPE_MARGIN = 0.8


def announce_check(broker: Broker, check_s: float) -> float | None:
    """The announcement check of requests published on ``broker`` (None: never, when
    the broker drops no copies or the check would leave no time inside its window)."""
    window = broker.dedupe_window_s
    return check_s if window is not None and check_s < DEDUPE_MARGIN * window / 2 else None


@dataclass(frozen=True)
class PeerCalls:
    """The :class:`~meshpoint.runtime.calls.CallKind` of calls to peer agents."""

    pause_status = "waiting_peers"
    immediate = False
    runs_tools = False

    agent: Agent
    broker: Broker
    subjects: Subjects
    #: Seconds after the pause at which a request that got no word back is published
    #: again (the sweeper's announcement check); None: never (a broker without a
    #: dedupe window, or a check that would fall outside it).
    announce_check_s: float | None = None
    #: The instance's spans: each request sent is one (``invoke_agent <peer>``).
    tracing: Tracing = field(default_factory=Tracing)

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
            "status_to": self.subjects.status(name, sub_task_id),
            **({} if self.announce_check_s is None else
               {"announce_check_s": self.announce_check_s}),
            **with_traceparent({})})  # the turn's: the request's span is its child
        return Opened(sub_task_id=sub_task_id)

    async def announce(self, ctx: TaskExecutionContext, items: Sequence[Item], *,
                       inbox: str | None) -> None:
        """Publish each request; with ``inbox``, their answers and progress go to this
        instance (the correlation data is changed to say so)."""
        for sub_task_id, correlation in items:
            if inbox is not None:
                correlation["reply_to"] = f"{inbox}.response.{sub_task_id}"
                correlation["status_to"] = f"{inbox}.status.{sub_task_id}"
            await self._publish(ctx.task_id, sub_task_id, correlation, inbox=inbox)

    async def announce_again(self, sub: SubTask) -> bool:
        """Publish a stored request again (its announcement check is due: the peer has
        said nothing since the pause), if the broker still holds the first copy's id
        to drop this one by: a copy it would deliver could run the peer twice. True
        if published."""
        task_id, sub_task_id = sub.task_id, sub.sub_task_id
        # The check moved its deadline to its timeout's: created_at + timeout_s.
        created_at = sub.timeout_deadline - float(sub.correlation_data.get("timeout_s") or 0)
        window = self.broker.dedupe_window_s
        if window is None or time.time() - created_at > DEDUPE_MARGIN * window:
            logger.warning("%s: task %s: the request of %s is not published again: the "
                           "broker %s; it waits for its answer or its timeout",
                           self.agent.name, task_id, sub_task_id,
                           "drops no copies" if window is None else
                           "may no longer drop a copy (past its dedupe window)")
            return False
        await self._publish(task_id, sub_task_id, sub.correlation_data, inbox=None)
        return True

    async def _publish(self, task_id: str, sub_task_id: str, correlation: dict[str, Any], *,
                       inbox: str | None) -> None:
        peer = correlation["peer_agent_name"]
        with self.tracing.peer_call(task_id, peer, sub_task_id, correlation) as span:
            await self.broker.publish(
                self.subjects.request(peer),
                wire.send_request(sub_task_id, correlation["query"], metadata=with_traceparent({
                    **(correlation.get("metadata") or {}),
                    "meshpoint_caller": {"agent": self.agent.name, "task_id": task_id}},
                    span), context_id=task_id),
                wire.reply_headers(correlation["reply_to"], correlation["status_to"]),
                # Announced again (a redelivered request's run, an announcement check), it
                # is dropped by the broker; addressed to an inbox, it is another message.
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
