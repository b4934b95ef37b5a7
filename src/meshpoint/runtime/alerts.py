"""Alerts: what an operator must hear of at once (docs/runtime.md, "Recovery limits, the
circuit breaker and alerts").

An alert is one of :data:`KINDS`: a task ``blocked`` (it waits for an operator), a task
``expired``, the agent's breaker ``breaker_opened`` or ``breaker_closed``, a message
``dead_lettered``. :meth:`Alerts.raise_` sends it three ways, each on its own, so that
one that fails does not keep the others from happening:

* recorded in the event log as an event of type ``alert`` (``meshpoint alerts`` shows
  them), whether or not the agent keeps an event log of its steps;
* published to the agent's alert subject, ``{root}.alerts.{agent}``
  (:meth:`~meshpoint.runtime.subjects.Subjects.alerts`);
* POSTed as JSON to the mesh's webhook (``alerts: {webhook: URL}``), if it has one, in
  the background, tried with exponential back-off (tenacity): a webhook that is slow
  or away never holds a task up.

:meth:`Alerts.watch` raises the alerts of what the instance counts (its stats note a
task ``blocked``, ``expired``, a message ``dead_lettered``), so that the parts that
notice them need no reference to this one. A part that raises its own (the breaker)
calls :meth:`Alerts.raise_`.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

import httpx
from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_attempt, wait_exponential

from meshpoint import _json
from meshpoint.broker.base import Broker
from meshpoint.events.log import EventStore
from meshpoint.runtime.options import AlertOptions
from meshpoint.runtime.tasks import Background

logger = logging.getLogger("meshpoint.runtime")

#: The kinds of alert.
KINDS = ("blocked", "expired", "breaker_opened", "breaker_closed", "dead_lettered")
#: The event type an alert is recorded as in the event log.
ALERT_EVENT = "alert"
#: Dead letters on one subject are alerted at most once in this many seconds.
DEAD_LETTER_EVERY_S = 60.0
#: What the stats count -> the alert it raises (see :meth:`Alerts.watch`).
WATCHED = {"blocked": "blocked", "expired": "expired", "dead_lettered": "dead_lettered"}


@dataclass
class Alerts:
    """The alerts of one instance of agent ``agent_name`` (see the module docstring).
    ``events`` records them (the agent's event log, or one of the alerts' own)."""

    agent_name: str
    instance_id: str
    broker: Broker
    #: The agent's alert subject (Subjects.alerts).
    subject: str
    events: EventStore
    background: Background
    options: AlertOptions = field(default_factory=AlertOptions)
    #: Alerts raised by this instance, for tests and the demo (the latest only).
    raised: list[dict[str, Any]] = field(default_factory=list)
    #: Per subject: when its last dead letter was alerted, and how many came since.
    _dead_letters: dict[str, tuple[float, int]] = field(default_factory=dict)

    async def raise_(self, kind: str, *, task_id: str | None = None, text: str,
                     **detail: Any) -> dict[str, Any]:
        """Record, publish and (in the background) POST one alert of ``kind`` (those
        raised here: :data:`KINDS`) about ``task_id`` (if it is about a task), saying ``text``, with
        ``detail`` (JSON values). Returns the alert as sent. Never raises for a
        recipient that fails: each failure is logged."""
        if not kind or not isinstance(kind, str):
            raise ValueError(f"an alert's kind must be a name ({KINDS} are raised here), "
                             f"not {kind!r}")
        alert = {"kind": kind, "agent": self.agent_name, "instance": self.instance_id,
                 "task_id": task_id, "text": text, "detail": detail, "at": time.time()}
        self.raised = [*self.raised[-99:], alert]
        logger.warning("%s: alert %s%s: %s", self.instance_id, kind,
                       f" (task {task_id})" if task_id else "", text)
        try:
            self.events.log_event(self.agent_name, task_id, ALERT_EVENT, step_name=kind,
                                  output_data=alert)
            await self.events.flush()
        except Exception as error:  # the other recipients still hear of it
            logger.warning("%s: could not record alert %s: %s", self.instance_id, kind, error)
        try:
            await self.broker.publish(self.subject, _json.dump_bytes(alert))
        except Exception as error:
            logger.warning("%s: could not publish alert %s: %s", self.instance_id, kind,
                           error)
        if self.options.webhook is not None:
            self.background.spawn(self._post(alert))
        return alert

    async def _post(self, alert: dict[str, Any]) -> None:
        url, options = self.options.webhook, self.options
        assert url is not None
        try:
            async with httpx.AsyncClient(timeout=options.webhook_timeout_s) as client:
                async for attempt in AsyncRetrying(
                        stop=stop_after_attempt(options.webhook_attempts),
                        wait=wait_exponential(multiplier=0.2, max=10),
                        retry=retry_if_exception_type(httpx.HTTPError), reraise=True):
                    with attempt:
                        response = await client.post(url, json=alert)
                        response.raise_for_status()
        except httpx.HTTPError as error:
            logger.warning("%s: the alert webhook refused alert %s after %d attempt(s): %s",
                           self.instance_id, alert["kind"], options.webhook_attempts, error)

    def watch(self, what: str, task_id: str, detail: dict[str, Any]) -> None:
        """A stats watcher (InstanceStats.watchers): raise the alert of what was
        counted, in the background."""
        kind = WATCHED.get(what)
        if kind is None:
            return
        if kind == "dead_lettered":  # its "task" is the subject the message came on
            # Anyone who may publish can send bad messages: at most one alert per
            # subject a minute, saying how many more came since the last.
            now = time.monotonic()
            last, more = self._dead_letters.get(task_id, (-DEAD_LETTER_EVERY_S, 0))
            if now - last < DEAD_LETTER_EVERY_S:
                self._dead_letters[task_id] = (last, more + 1)
                return
            self._dead_letters[task_id] = (now, 0)
            text = f"a message on {task_id} was dead-lettered" + (
                f" ({more} more since the last alert)" if more else "")
            self.background.spawn(self.raise_(kind, text=text, subject=task_id,
                                              since_last=more))
            return
        reason = str(detail.get("reason") or kind)
        text = (f"task {task_id} is blocked and waits for an operator: {reason}"
                if kind == "blocked" else f"task {task_id} expired")
        self.background.spawn(self.raise_(kind, task_id=task_id, text=text, reason=reason))


__all__ = ["ALERT_EVENT", "KINDS", "WATCHED", "Alerts"]
