"""Prometheus metrics of one agent instance (docs/operations.md lists them).

:class:`Metrics` keeps its own :class:`~prometheus_client.CollectorRegistry` (never the
process-wide one: two instances in a process, or a test, never share a figure). It is
fed by the instance's :class:`~meshpoint.runtime.stats.InstanceStats` as one more
watcher: each counted happening the instance notes anyway increments a counter or
observes a histogram, through label children bound once, so the hot path pays a
dictionary lookup and an increment, and keeps no second account.

What the store knows (tasks by status, tasks waiting for a human) is read when
Prometheus scrapes: one :meth:`~meshpoint.store.SqlStore.stats` query, run on the
instance's event loop from the scrape's thread, given ``scrape_timeout_s``; a read that
fails or times out is counted in ``meshpoint_scrape_errors_total`` and its figures are
left out of that scrape, never raised into ``serve``.

No label ever holds a task id: ``agent``, ``backend`` (``sqlite`` or ``postgresql``) and
a small closed set of ``outcome``, ``kind``, ``trigger`` or ``status`` values.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import errno
import logging
import socket
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from meshpoint.errors import ConfigurationError
from meshpoint.store.schema import TASK_STATUSES

if TYPE_CHECKING:
    from meshpoint.runtime import AgentInstance

logger = logging.getLogger("meshpoint.ops.metrics")

#: Seconds of a checkpoint write or a restore (seed targets at 0.1 and 0.01 s).
STORE_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
#: Seconds a task waited between its pause and its resume.
WAIT_BUCKETS = (0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0,
                14400.0, 86400.0)
#: Take-overs remembered until their task resumes (a take-over whose resume never
#: comes is forgotten past this many).
TAKEOVERS_KEPT = 10_000

#: The claim of an answer, by the note that tells its outcome.
_CLAIMS = {"answer_claimed": "won", "ignored_answer": "late",
           "unplaced_answer": "unplaced", "answer_refused": "refused"}
#: How a peer call or an approval was resolved, by the note that tells it.
_RESOLUTIONS = {"answer_claimed": "answered", "timeout": "timeout",
                "approved": "approved", "denied": "denied", "replied": "replied"}
#: How a task ended here.
_ENDINGS = ("completed", "failed", "canceled", "rejected", "expired")
#: Plain counters, by the note they count.
_COUNTERS = {
    "started": ("meshpoint_tasks_started_total", "Tasks started from their request."),
    "timeout": ("meshpoint_timeouts_total", "Peer calls resolved by their deadline."),
    "recovered": ("meshpoint_recoveries_attempted_total",
                  "Stored tasks taken up again by recovery (a dead holder's, or a "
                  "lease given up)."),
    "dead_lettered": ("meshpoint_dead_letters_total",
                      "Messages dead-lettered as malformed or unplaceable."),
    "redelivered": ("meshpoint_redeliveries_total",
                    "Requests the broker delivered again (their first delivery was not "
                    "acknowledged in time)."),
    "announced_again": ("meshpoint_announcements_published_again_total",
                        "Peer requests published again by their announcement check."),
}


class Metrics:
    """The metrics of ``instance``; :meth:`watch` is added to its stats' watchers.

    ``loop`` is the loop the instance runs on (the running one by default): the
    scrape's store read is run there."""

    def __init__(self, instance: AgentInstance, *, scrape_timeout_s: float = 2.0,
                 loop: asyncio.AbstractEventLoop | None = None) -> None:
        self.instance = instance
        self.registry = CollectorRegistry(auto_describe=True)
        self.agent = instance.agent.name
        self.backend = str(getattr(instance.store, "dialect", "unknown"))
        self.scrape_timeout_s = scrape_timeout_s
        self.loop = loop or asyncio.get_running_loop()
        base = ("agent", "backend")
        own = (self.agent, self.backend)
        reg = self.registry

        def counter(name: str, doc: str, *extra: str) -> Counter:
            return Counter(name.removesuffix("_total"), doc, base + extra, registry=reg)

        self.checkpoint_write = Histogram(
            "meshpoint_checkpoint_write_seconds", "Checkpoint writes at a pause, from the "
            "start of the write to its commit.", base, buckets=STORE_BUCKETS,
            registry=reg).labels(*own)
        self.restore = Histogram(
            "meshpoint_checkpoint_restore_seconds", "Restores of a stored task to resume "
            "it (the checkpoint read).", base, buckets=STORE_BUCKETS,
            registry=reg).labels(*own)
        self.pause_resume = Histogram(
            "meshpoint_pause_resume_seconds", "From the end of the turn that paused to the "
            "start of the resumed turn.", base, buckets=WAIT_BUCKETS,
            registry=reg).labels(*own)
        resumes = counter("meshpoint_resumes_total", "Tasks resumed, by kind: same_instance "
                          "(it paused here), other_instance (another paused it), takeover "
                          "(recovery took it from a holder).", "kind")
        self.resumes = {kind: resumes.labels(*own, kind)
                        for kind in ("same_instance", "other_instance", "takeover")}
        self.recovered = counter("meshpoint_recoveries_succeeded_total",
                                 "Recoveries whose task resumed.").labels(*own)
        claims = counter("meshpoint_claims_total", "Answers claimed for their call, by "
                         "outcome: won, late (the call was resolved already), unplaced "
                         "(no task of this tenant waits for it), refused.", "outcome")
        resolutions = counter("meshpoint_resolutions_total", "Calls resolved, by outcome: "
                              "answered, timeout, approved, denied, replied.", "outcome")
        ends = counter("meshpoint_tasks_ended_total", "Tasks ended here, by outcome.",
                       "outcome")
        handoffs = counter("meshpoint_handoffs_total", "Handoffs to a fresh context, by "
                           "trigger.", "trigger")
        self._handoffs = handoffs
        blocked = counter("meshpoint_tasks_blocked_total", "Tasks blocked for an operator, "
                          "by cause: history (its restore failed the history's "
                          "verification), max_recoveries, handoff (a handoff that could not "
                          "be made).", "cause")
        self._blocked = {cause: blocked.labels(*own, cause)
                         for cause in ("history", "max_recoveries", "handoff")}
        self.verification_failures = counter(
            "meshpoint_history_verification_failures_total", "Restores refused because the "
            "task's history failed verification (the task is blocked).").labels(*own)
        self.breaker = Gauge("meshpoint_breaker_open", "1 while this instance last saw its "
                             "agent's breaker open, else 0.", base,
                             registry=reg).labels(*own)
        #: Scrapes whose store read failed or timed out (served by the scrape itself,
        #: so that the scrape that failed already counts itself).
        self.scrape_errors = 0
        #: What each note increments, bound once.
        self._counts: dict[str, list[Any]] = {}
        for what, (name, doc) in _COUNTERS.items():
            self._counts.setdefault(what, []).append(counter(name, doc).labels(*own))
        for what, outcome in _CLAIMS.items():
            self._counts.setdefault(what, []).append(claims.labels(*own, outcome))
        for what, outcome in _RESOLUTIONS.items():
            self._counts.setdefault(what, []).append(resolutions.labels(*own, outcome))
        for outcome in _ENDINGS:
            self._counts.setdefault(outcome, []).append(ends.labels(*own, outcome))
        self._handlers: dict[str, Callable[[str, dict[str, Any]], None]] = {
            "paused": self._paused, "resumed": self._resumed, "recovered": self._recovering,
            "handed_off": self._handed_off, "blocked": self._blocked_task,
            "breaker_opened": lambda _t, _d: self.breaker.set(1),
            "breaker_closed": lambda _t, _d: self.breaker.set(0)}
        #: Tasks taken over and not resumed yet (bounded: see TAKEOVERS_KEPT).
        self._takeovers: OrderedDict[str, None] = OrderedDict()
        reg.register(_ScrapeTime(self))
        instance.stats.watchers.append(self.watch)

    # -- the watcher (the instance's hot path) -----------------------------------------

    def watch(self, what: str, task_id: str, detail: dict[str, Any]) -> None:
        """A stats watcher: count ``what``."""
        for child in self._counts.get(what, ()):
            child.inc()
        handler = self._handlers.get(what)
        if handler is not None:
            handler(task_id, detail)

    def _paused(self, _task_id: str, detail: dict[str, Any]) -> None:
        seconds = detail.get("write_s")
        if isinstance(seconds, float):
            self.checkpoint_write.observe(seconds)

    def _resumed(self, task_id: str, detail: dict[str, Any]) -> None:
        for name, histogram in (("paused_s", self.pause_resume), ("restore_s", self.restore)):
            seconds = detail.get(name)
            if isinstance(seconds, float):
                histogram.observe(seconds)
        if task_id in self._takeovers:
            del self._takeovers[task_id]
            self.resumes["takeover"].inc()
            self.recovered.inc()
        elif detail.get("elsewhere"):
            self.resumes["other_instance"].inc()
        else:
            self.resumes["same_instance"].inc()

    def _recovering(self, task_id: str, _detail: dict[str, Any]) -> None:
        self._takeovers[task_id] = None
        self._takeovers.move_to_end(task_id)
        if len(self._takeovers) > TAKEOVERS_KEPT:
            self._takeovers.popitem(last=False)

    def _handed_off(self, _task_id: str, detail: dict[str, Any]) -> None:
        trigger = detail.get("trigger")
        self._handoffs.labels(self.agent, self.backend,
                              trigger if isinstance(trigger, str) else "unknown").inc()

    def _blocked_task(self, _task_id: str, detail: dict[str, Any]) -> None:
        if detail.get("cause") == "history":
            self.verification_failures.inc()
            self._blocked["history"].inc()
        else:
            self._blocked["handoff" if "trigger" in detail else "max_recoveries"].inc()

    # -- at scrape time ----------------------------------------------------------------

    def read_store(self) -> Any:
        """The store's stats, read on the instance's loop (from the scrape thread)."""
        future = asyncio.run_coroutine_threadsafe(self.instance.store.stats(), self.loop)
        try:
            return future.result(self.scrape_timeout_s)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise


class _ScrapeTime(Collector):
    """What is read when Prometheus scrapes: the store's tasks by status, and the
    event log's own counts."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics

    def describe(self) -> Iterator[Metric]:
        return iter(())  # read at each scrape: never while registering

    def collect(self) -> Iterator[Metric]:
        m = self.metrics
        yield from self._event_log()
        try:
            stats = m.read_store()
        except Exception as error:  # a scrape never raises into serve
            logger.warning("metrics: cannot read the store's stats: %r", error)
            m.scrape_errors += 1
            stats = None
        errors = CounterMetricFamily("meshpoint_scrape_errors", "Scrapes whose store read "
                                     "failed or timed out (their store figures are left "
                                     "out).", labels=["agent", "backend"])
        errors.add_metric([m.agent, m.backend], m.scrape_errors)
        yield errors
        if stats is None:
            return
        tasks = GaugeMetricFamily("meshpoint_tasks", "Stored (paused) tasks of the tenant, "
                                  "by agent and status, read from the store at scrape.",
                                  labels=["agent", "backend", "status"])
        waiting = GaugeMetricFamily("meshpoint_approvals_pending", "Stored tasks waiting "
                                    "for a human (status input_required), by agent.",
                                    labels=["agent", "backend"])
        humans: dict[str, int] = {}
        counted = dict(stats.paused_tasks)
        # Every known status of every agent seen, 0 included: a status with no task
        # is a sample of 0, not a series that vanishes (and a rate that breaks).
        agents = sorted({m.agent} | {agent for agent, _ in counted})
        statuses = [*TASK_STATUSES, *sorted({s for _, s in counted} - set(TASK_STATUSES))]
        for agent in agents:
            for status in statuses:
                n = counted.get((agent, status), 0)
                tasks.add_metric([agent, m.backend, status], n)
                if status == "input_required":
                    humans[agent] = humans.get(agent, 0) + n
        for agent, n in sorted(humans.items()):
            waiting.add_metric([agent, m.backend], n)
        yield tasks
        yield waiting

    def _event_log(self) -> Iterator[Metric]:
        events = self.metrics.instance.events
        if events is None:
            return
        labels = [self.metrics.agent, self.metrics.backend]
        buffered = GaugeMetricFamily("meshpoint_event_log_buffered", "Events logged and not "
                                     "written yet.", labels=["agent", "backend"])
        buffered.add_metric(labels, events.buffered)
        yield buffered
        for name, value, doc in (
                ("written", events.written, "Events written to the event log."),
                ("dropped", events.dropped, "Events dropped: the buffer was full (the "
                 "database was away too long), or the instance stopped with them buffered."),
                ("refused", events.refused, "Events the database refused (logged with "
                 "the reason).")):
            family = CounterMetricFamily(f"meshpoint_event_log_{name}", doc,
                                         labels=["agent", "backend"])
            family.add_metric(labels, value)
            yield family


class MetricsServer:
    """``/metrics`` of one :class:`Metrics`, served over HTTP from a thread of its own
    (prometheus-client's server)."""

    def __init__(self, server: Any, thread: threading.Thread, url: str) -> None:
        self._server = server
        self._thread = thread
        #: Where the metrics are (the port a 0 asked for picked).
        self.url = url

    @classmethod
    def start(cls, metrics: Metrics, host: str, port: int) -> MetricsServer:
        """Serve ``metrics`` on ``host:port`` (0: a free port); ConfigurationError if
        the address cannot be listened on (a port in use, say)."""
        try:
            server, thread = start_http_server(port, addr=host, registry=metrics.registry)
        except OSError as error:
            raise ConfigurationError(
                f"metrics: cannot listen on {host}:{port} ({error.strerror or error}); "
                f"{listen_hint(error, host)}") from None
        shown = f"[{host}]" if ":" in host else host
        url = f"http://{shown}:{server.server_port}/metrics"
        logger.info("%s: metrics at %s", metrics.instance.instance_id, url)
        return cls(server, thread, url)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5.0)


def listen_hint(error: OSError, host: str) -> str:
    """What to do about an address the metrics server could not listen on, by why."""
    port_hint = "Give another with --metrics-port or the config's metrics: port"
    if error.errno == errno.EADDRINUSE:
        return f"is another process using that port? {port_hint}"
    if error.errno == errno.EACCES:
        return f"a port below 1024 needs privileges this process lacks. {port_hint}"
    if isinstance(error, socket.gaierror) or error.errno == errno.EADDRNOTAVAIL:
        return (f"{host!r} is not an address of this host. Give one with --metrics-host "
                "or the config's metrics: host (127.0.0.1, the default, or 0.0.0.0 for "
                "every interface)")
    return "check --metrics-host and --metrics-port (or the config's metrics:)"
