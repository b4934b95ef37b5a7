"""``meshpoint serve`` and ``meshpoint submit``: one instance process, one caller.

``serve`` runs one instance of one agent of a mesh config until SIGTERM or SIGINT,
then drains: it takes no new work, lets what is in hand reach its pause boundary
(checkpointed) or its end, and exits 0. Run as many ``serve`` processes per agent,
on as many hosts, as the load needs; they share the store and the broker. A
process that dies instead (SIGKILL, a lost host) loses nothing either: its
un-acked messages are redelivered and its leases expire.

``submit`` sends one task to an agent and waits for the answer, telling its caller
the task's id at once and each pause for a human on the way.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import signal
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from tenacity import AsyncRetrying, RetryCallState, retry_if_exception_type, wait_exponential

from meshpoint import a2a
from meshpoint._redact import redact_url
from meshpoint._retry import retried
from meshpoint.config import MeshConfig, MetricsConfig
from meshpoint.errors import BrokerError, MeshpointError, StoreUnavailableError
from meshpoint.ops.metrics import Metrics, MetricsServer
from meshpoint.ops.otel import install_tracing, trace_exporters
from meshpoint.runtime import AgentInstance
from meshpoint.store import SqlStore

logger = logging.getLogger("meshpoint.serve")

T = TypeVar("T")

#: Printed (and flushed) on stdout once the instance takes work; scripts wait for it.
READY = "meshpoint: ready"


async def serve(config: MeshConfig, agent_name: str, *, instance_id: str | None = None,
                on_ready: Callable[[AgentInstance], None] | None = None,
                stats_path: Path | None = None,
                metrics: MetricsConfig | None = None) -> None:
    """Serve ``agent_name`` until SIGTERM/SIGINT, then drain and return.

    A store or broker that is unreachable at start is retried for up to
    ``runtime.startup_timeout_s`` (hosts restart in any order); a signal meanwhile ends the
    process cleanly. ``metrics`` (else the config's ``metrics:``) serves Prometheus's
    ``/metrics`` there from before the instance takes work (a port in use is a
    ConfigurationError naming it) until it has drained. ``OTEL_TRACES_EXPORTER`` exports
    its spans (:mod:`meshpoint.ops.otel`)."""
    metrics = metrics or config.metrics
    agent = config.build_agent(agent_name)
    exporters = trace_exporters()  # a wrong OTEL_TRACES_EXPORTER stops serve at once
    approvers = config.build_approvers()
    startup_timeout_s = config.runtime.startup_timeout_s
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    store = await _until_up("the store", config.open_store, stop, startup_timeout_s)
    if store is None:
        return
    try:
        broker = await _until_up("the broker", config.open_broker, stop, startup_timeout_s)
        if broker is None:
            return
        try:
            instance = config.instance(agent, store, broker, approvers=approvers,
                                       instance_id=instance_id)
            tracing = install_tracing(exporters, agent_name, instance.instance_id)
            exporter = None if metrics is None else MetricsServer.start(
                Metrics(instance), metrics.host, metrics.port)
            try:
                await _serve_instance(config, instance, store, agent_name, stop,
                                      on_ready, stats_path)
            finally:
                if exporter is not None:
                    exporter.close()
                if tracing is not None:
                    tracing.shutdown()  # the spans still batched are exported
        finally:
            await broker.close()
    finally:
        await store.close()


async def _serve_instance(config: MeshConfig, instance: AgentInstance, store: SqlStore,
                          agent_name: str, stop: asyncio.Event,
                          on_ready: Callable[[AgentInstance], None] | None,
                          stats_path: Path | None) -> None:
    """Start ``instance``, run it until ``stop``, then drain it."""
    await instance.start()
    logger.info("%s serving agent %s (namespace %s, broker %s, store %s%s, "
                "tenant %s)", instance.instance_id, agent_name, config.namespace,
                redact_url(config.broker.url), redact_url(config.store.url),
                f" schema {config.store.schema_name}" if config.store.schema_name
                else "", config.store.tenant)
    if on_ready is not None:
        on_ready(instance)
    purging = asyncio.create_task(_purge_every(
        store, config.history.purge_interval_s, stop))
    syncing = None if config.sync is None else asyncio.create_task(
        _sync_every(config, store, stop))
    await stop.wait()
    for task in (purging, syncing):
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    logger.info("%s: signal received, draining (up to %gs)", instance.instance_id,
                config.runtime.drain_timeout_s)
    await instance.drain(config.runtime.drain_timeout_s)
    if stats_path is not None:
        stats_path.write_text(json.dumps(instance.stats.summary(samples=True)))


async def _purge_every(store: SqlStore, interval_s: float, stop: asyncio.Event) -> None:
    """Apply the history's retention every ``interval_s`` (0: never), from the first
    interval on; a failing pass is logged and tried again next time. Every ``serve``
    process runs it: a purge changes a chain only if it is as the purge read it, so
    two at once remove each record once."""
    while interval_s > 0:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), interval_s)
        if stop.is_set():
            return
        try:
            purged = await store.history.purge()
        except MeshpointError as error:
            logger.warning("history purge failed (%s); trying again in %gs", error,
                           interval_s)
            continue
        removed = sum(p.removed for p in purged if p.skipped is None)
        if removed:
            logger.info("history purge: %d record(s) of %d chain(s) removed", removed,
                        len(purged))


async def _sync_every(config: MeshConfig, store: SqlStore, stop: asyncio.Event) -> None:
    """Push the (SQLite) store to the ``sync:`` section's cloud store every
    ``interval_s`` (docs/sync.md), waiting out an unreachable cloud with backoff; a
    pass that fails otherwise is logged and tried again next interval. Every ``serve``
    process on the file runs it: the cloud's cursor lock makes them take turns, and
    each row is applied once."""
    from meshpoint.store import open_store
    from meshpoint.sync.follow import follow

    sync = config.sync
    assert sync is not None
    history = config.history_options()

    def passed(_source: str | None, reports: list[Any]) -> None:
        applied = sum(r.applied for r in reports)
        kept = sum(len(r.conflicts) + len(r.quarantined) for r in reports)
        if applied or kept:
            logger.info("sync: %d row(s) applied%s", applied,
                        f", {kept} kept aside (meshpoint sync conflicts)" if kept else "")

    while not stop.is_set():
        try:
            await follow(store, lambda: open_store(
                sync.to, tenant_id=store.tenant_id, schema=sync.schema_name, migrate=False,
                history=history), interval_s=sync.interval_s, batch=sync.batch,
                max_backoff_s=sync.max_backoff_s, stop=stop, on_pass=passed,
                unsigned=sync.unsigned)
        except MeshpointError as error:
            logger.warning("sync failed (%s); trying again in %gs", error, sync.interval_s)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), sync.interval_s)


class _Stopped(Exception):
    """A signal came while ``serve`` waited for its services (internal)."""


async def _until_up(what: str, opener: Callable[[], Awaitable[T]], stop: asyncio.Event,
                    timeout_s: float) -> T | None:
    """``opener()``, retried every 0.5 s, doubling up to 5 s, while it fails with a
    store or broker error (hosts restart in any order); None if a signal came first.
    The last error is raised once the next attempt would start past ``timeout_s``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    unavailable = (StoreUnavailableError, BrokerError)

    async def sleep(seconds: float) -> None:  # a signal ends the wait, and the retries
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), seconds)
        if stop.is_set():
            raise _Stopped

    def log(state: RetryCallState) -> None:
        error = state.outcome.exception() if state.outcome else None
        logger.warning("cannot open %s yet (%s); retrying in %.1fs", what, error,
                       state.upcoming_sleep)

    def policy() -> AsyncRetrying:
        return AsyncRetrying(
            retry=retry_if_exception_type(unavailable), wait=wait_exponential(0.5, max=5.0),
            stop=lambda state: loop.time() + state.upcoming_sleep > deadline,
            before_sleep=log, sleep=sleep, reraise=True)

    try:
        return await retried(opener, policy, lambda error: isinstance(error, unavailable))
    except _Stopped:
        return None


@dataclass(frozen=True)
class Submitted:
    """The task ``submit`` sent: what its caller prints at once."""

    task_id: str
    request_id: str
    agent: str
    namespace: str


async def submit(config: MeshConfig, agent_name: str, text: str, *, timeout_s: float,
                 wait: bool = True, on_submitted: Callable[[Submitted], None] | None = None,
                 on_input: Callable[[Submitted, list[dict[str, Any]]], None] | None = None
                 ) -> a2a.Task | None:
    """Send ``text`` to ``agent_name`` and return its final answer, waiting up to
    ``timeout_s`` in all. ``on_submitted`` is called once the request is published
    (with ``wait=False``, submit returns None then); ``on_input`` each time the task
    pauses for a human, with its pending calls, and the wait goes on for the answer.
    The config's namespace must be served (NamespaceNotServedError otherwise: a
    client never creates its stream)."""
    config.agent_config(agent_name)  # a clear error for a typo, before any I/O
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    async with config.open_client() as client:
        request_id = await client.submit(agent_name, text)
        sent = Submitted(client.task_id(agent_name, request_id), request_id, agent_name,
                         config.namespace)
        if on_submitted is not None:
            on_submitted(sent)
        if not wait:
            return None
        try:
            while True:
                step = await client.wait_next(request_id, max(0.0, deadline - loop.time()))
                if step.answer is not None:
                    return step.answer
                if on_input is not None:
                    on_input(sent, step.pending)
        except TimeoutError:
            waited = (f"no answer from {agent_name} (namespace {config.namespace}) within "
                      f"{timeout_s:g}s")
            try:  # what the store knows, if it says so at once
                why = await asyncio.wait_for(_why_no_answer(config, sent.task_id), 10.0)
            except TimeoutError:
                why = None
            raise NoAnswerError(
                f"{waited}: {why}" if why else
                f"{waited}; is a `meshpoint serve --agent {agent_name}` running on "
                f"this config? (task {sent.task_id})") from None


class NoAnswerError(TimeoutError):
    """``submit`` had no answer in time; the message says where the task stands."""


async def _why_no_answer(config: MeshConfig, task_id: str) -> str | None:
    """Where the store says a task that gave no answer in time stands, or None: not
    checkpointed (no instance of the agent took it, or it has run since), or the
    store cannot say."""
    try:
        store = await config.open_store()
        try:
            subs = await store.get_peer_sub_tasks_for_task(task_id)
        finally:
            await store.close()
    except MeshpointError:
        return None
    peers = sorted({s.peer_agent_name or "?" for s in subs if s.status == "pending"})
    if not peers:
        return (f"task {task_id} is checkpointed with no peer call pending: it waits "
                "for a human, or is being resumed")
    return (f"task {task_id} is paused, waiting on {', '.join(peers)}; is a "
            "`meshpoint serve --agent` running for each? It goes on when they answer")


def print_ready(instance: AgentInstance) -> None:
    print(f"{READY} {instance.instance_id}", flush=True)
