"""The Prometheus metrics of an instance (meshpoint.ops.metrics), fed by its stats on a
real store: what a pause, a resume elsewhere and the answers it took count, what the
store is read for at scrape time, and what a scrape does when that read fails."""

from __future__ import annotations

import asyncio

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from meshpoint.errors import ConfigurationError
from meshpoint.ops.metrics import Metrics, MetricsServer
from meshpoint.runtime import wire
from meshpoint.store.schema import TASK_STATUSES
from tests.integration.mesh import Mesh, eventually
from tests.integration.test_approvals import SideEffects, approving, paused
from tests.integration.test_runtime import TRIP2, GatedModel, coordinator, kill_mid_turn, simple

#: The labels every metric of an instance carries; only these, and a closed set more.
LABELS = {"agent", "backend", "outcome", "kind", "trigger", "cause", "status", "le"}


def samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """``(sample name, labels) -> value`` of a scrape, as Prometheus parses it."""
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


async def scrape(metrics: Metrics) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Scrape from another thread, as the HTTP server does (the store read runs on
    this loop)."""
    return samples((await asyncio.to_thread(generate_latest, metrics.registry)).decode())


def value(scraped: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str,
          **labels: str) -> float:
    return sum(v for (n, ls), v in scraped.items()
               if n == name and set(labels.items()) <= set(ls))


async def test_a_pause_and_a_resume_elsewhere_are_counted_once_each(mesh: Mesh) -> None:
    agent = coordinator("flights", "hotels")
    (first,) = await mesh.run(agent)
    before = Metrics(first)
    backend = mesh.store.dialect
    rids = [await mesh.client.submit("coordinator", f"{TRIP2} #{i}") for i in range(3)]
    await eventually(lambda: len(first.stats.tasks("paused")) == 3, what="three pauses")
    paused = await scrape(before)
    own = {"agent": "coordinator", "backend": backend}
    assert value(paused, "meshpoint_checkpoint_write_seconds_count", **own) == 3
    assert value(paused, "meshpoint_tasks_started_total", **own) == 3
    assert value(paused, "meshpoint_tasks", status="waiting_peers", **own) == 3
    # Every known status has a sample, 0 included (a series that vanished at 0 would
    # break a rate or an alert on it).
    statuses = {dict(labels)["status"]: v for (name, labels), v in paused.items()
                if name == "meshpoint_tasks" and dict(labels)["agent"] == "coordinator"}
    assert statuses == {status: 3 if status == "waiting_peers" else 0
                        for status in TASK_STATUSES}
    assert value(paused, "meshpoint_approvals_pending", **own) == 0
    assert value(paused, "meshpoint_scrape_errors_total") == 0

    # The instance that paused leaves; another takes the answers and resumes the tasks.
    await first.stop()
    (second,) = await mesh.run(agent)
    after = Metrics(second)
    for name in ("flights", "hotels"):
        await mesh.run(simple(name))
    for rid in rids:
        await mesh.client.wait(rid, 15)
    scraped: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}

    async def rows_gone() -> bool:  # a task's rows are deleted just after its answer
        scraped.clear()
        scraped.update(await scrape(after))
        return value(scraped, "meshpoint_tasks") == 0

    await eventually(rows_gone, what="the ended tasks gone from the store")
    assert value(scraped, "meshpoint_claims_total", outcome="won", **own) == 6
    assert value(scraped, "meshpoint_resolutions_total", outcome="answered", **own) == 6
    assert value(scraped, "meshpoint_resumes_total", kind="other_instance", **own) == 3
    assert value(scraped, "meshpoint_resumes_total", kind="same_instance", **own) == 0
    assert value(scraped, "meshpoint_checkpoint_restore_seconds_count", **own) == 3
    assert value(scraped, "meshpoint_pause_resume_seconds_count", **own) == 3
    assert value(scraped, "meshpoint_tasks_ended_total", outcome="completed", **own) == 3
    assert value(scraped, "meshpoint_checkpoint_write_seconds_count", **own) == 0
    assert value(scraped, "meshpoint_breaker_open", **own) == 0
    task_ids = {mesh.client.task_id("coordinator", rid) for rid in rids} | set(rids)
    for (_, labels) in scraped | paused:
        assert {k for k, _ in labels} <= LABELS
        assert not {v for _, v in labels} & task_ids


async def test_a_real_take_over_and_a_redelivery_are_counted_where_they_happen(
        mesh: Mesh) -> None:
    """An instance dies mid-turn after its resume: the instance that takes the task over
    counts a recovery attempted and succeeded and a resume of kind takeover; an
    instance dies before its first checkpoint: the request is delivered again."""
    model = GatedModel(block="compose")
    coordinators = await mesh.run(coordinator("flights", "hotels", model=model), 3)
    metrics = [Metrics(i) for i in coordinators]
    await mesh.run(simple("flights"))
    await mesh.run(simple("hotels"))
    rid = await mesh.client.submit("coordinator", TRIP2)
    dying, _ = await kill_mid_turn(mesh, model, coordinators, rid)
    alive = [m for m in metrics if m.instance is not dying]
    total: dict[str, float] = {}
    for name, labels in (("meshpoint_recoveries_attempted_total", {}),
                         ("meshpoint_recoveries_succeeded_total", {}),
                         ("meshpoint_resumes_total", {"kind": "takeover"}),
                         ("meshpoint_tasks_ended_total", {"outcome": "completed"})):
        total[name] = sum([value(await scrape(m), name, **labels) for m in alive])
    assert total == {"meshpoint_recoveries_attempted_total": 1,
                     "meshpoint_recoveries_succeeded_total": 1,
                     "meshpoint_resumes_total": 1, "meshpoint_tasks_ended_total": 1}

    plan = GatedModel(block="plan")
    again = await mesh.run(coordinator("flights", model=plan), 2)
    watched = [Metrics(i) for i in again]
    for instance in coordinators:
        if instance is not dying:
            await instance.stop()
    rid = await mesh.client.submit("coordinator", TRIP2)
    dying, _ = await kill_mid_turn(mesh, plan, again, rid)
    (survivor,) = [m for m in watched if m.instance is not dying]
    scraped = await scrape(survivor)
    assert value(scraped, "meshpoint_redeliveries_total") == 1
    assert value(scraped, "meshpoint_tasks_started_total") == 1


async def test_a_task_waiting_for_approval_is_pending_until_approved(mesh: Mesh) -> None:
    """The approvals-pending gauge is read from the store; the decision is a
    resolution by outcome."""
    (instance,) = await mesh.run(approving(SideEffects()))
    metrics = Metrics(instance)
    request_id, task_id, pending = await paused(mesh, "Send the report")
    waiting = await scrape(metrics)
    assert value(waiting, "meshpoint_approvals_pending", agent="coordinator") == 1
    assert value(waiting, "meshpoint_tasks", agent="coordinator",
                 status="input_required") == 1
    await mesh.client.approve(task_id, pending[0]["call_id"], by="alice")
    await mesh.client.wait(request_id, timeout_s=10)
    scraped: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}

    async def none_pending() -> bool:
        scraped.clear()
        scraped.update(await scrape(metrics))
        return value(scraped, "meshpoint_approvals_pending", agent="coordinator") == 0

    await eventually(none_pending, what="no approval pending")
    assert value(scraped, "meshpoint_resolutions_total", outcome="approved") == 1
    assert value(scraped, "meshpoint_tasks_ended_total", outcome="completed") == 1


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
async def test_a_take_over_is_a_recovery_that_succeeded_once_its_task_resumes(
        mesh: Mesh) -> None:
    """The mapping of the notes recovery and blocking make: a task taken over and
    resumed counts as both; a block says its cause."""
    (instance,) = await mesh.run(simple("flights"))
    metrics = Metrics(instance)
    instance.stats.note("recovered", "t-1", journal=False, attempt=1)
    instance.stats.note("recovered", "t-2", journal=False, attempt=1)
    instance.stats.note("resumed", "t-1", journal=False, elsewhere=True, restore_s=0.004)
    instance.stats.note("handed_off", "t-1", journal=False, trigger="context_full")
    instance.stats.note("blocked", "t-3", journal=False, reason="tampered", cause="history")
    instance.stats.note("blocked", "t-4", journal=False, reason="taken over 4 times")
    instance.stats.note("announced_again", "t-5", journal=False, sub_task_id="s", peer="p")
    instance.stats.note("breaker_opened", "flights", journal=False)
    assert value(await scrape(metrics), "meshpoint_breaker_open") == 1
    instance.stats.note("breaker_closed", "flights", journal=False)
    scraped = await scrape(metrics)
    assert value(scraped, "meshpoint_recoveries_attempted_total") == 2
    assert value(scraped, "meshpoint_recoveries_succeeded_total") == 1
    assert value(scraped, "meshpoint_resumes_total", kind="takeover") == 1
    assert value(scraped, "meshpoint_resumes_total", kind="other_instance") == 0
    assert value(scraped, "meshpoint_checkpoint_restore_seconds_bucket", le="0.005") == 1
    assert value(scraped, "meshpoint_handoffs_total", trigger="context_full") == 1
    assert value(scraped, "meshpoint_history_verification_failures_total") == 1
    assert value(scraped, "meshpoint_tasks_blocked_total", cause="history") == 1
    assert value(scraped, "meshpoint_tasks_blocked_total", cause="max_recoveries") == 1
    assert value(scraped, "meshpoint_announcements_published_again_total") == 1
    assert value(scraped, "meshpoint_breaker_open") == 0


async def test_the_event_log_and_dead_letters_are_counted(mesh: Mesh) -> None:
    """An agent that keeps an event log: what it wrote, and nothing dropped; a message
    that is not a request is dead-lettered and counted."""
    (instance,) = await mesh.run(simple("flights", events=True))
    metrics = Metrics(instance)
    await mesh.client.wait(await mesh.client.submit("flights", "hi"), 10)
    await mesh.broker.publish(wire.request_subject(mesh.options.namespace, "flights"),
                              b"not a request")
    scraped: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}

    async def flushed() -> bool:
        scraped.clear()
        scraped.update(await scrape(metrics))
        return value(scraped, "meshpoint_event_log_written_total") > 0 and \
            value(scraped, "meshpoint_event_log_buffered") == 0 and \
            value(scraped, "meshpoint_dead_letters_total") == 1

    await eventually(flushed, what="the events written and the dead letter counted")
    assert value(scraped, "meshpoint_event_log_dropped_total") == 0
    assert value(scraped, "meshpoint_event_log_refused_total") == 0
    assert value(scraped, "meshpoint_tasks_ended_total", outcome="completed") == 1


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
async def test_a_store_read_that_does_not_answer_in_time_is_a_scrape_error(
        mesh: Mesh) -> None:
    (instance,) = await mesh.run(simple("flights"))
    metrics = Metrics(instance, scrape_timeout_s=0.05)
    # Scraped from the loop's own thread: the read it schedules cannot run in time.
    scraped = samples(generate_latest(metrics.registry).decode())
    assert value(scraped, "meshpoint_scrape_errors_total") == 1
    assert value(scraped, "meshpoint_tasks_started_total") == 0  # the rest is served
    assert not [name for name, _ in scraped if name == "meshpoint_tasks"]
    assert value(await scrape(metrics), "meshpoint_scrape_errors_total") == 1


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
@pytest.mark.parametrize(("host", "in_use", "hint"), [
    ("127.0.0.1", True, "is another process using that port? Give another with "
                        "--metrics-port"),
    ("192.0.2.1", False, "'192.0.2.1' is not an address of this host. Give one with "
                         "--metrics-host"),  # TEST-NET-1: never this host's
    ("no-such-host.invalid", False, "'no-such-host.invalid' is not an address of this "
                                    "host. Give one with --metrics-host")],
    ids=["port-in-use", "not-this-host", "no-such-name"])
async def test_an_address_that_cannot_be_listened_on_says_why(
        mesh: Mesh, host: str, in_use: bool, hint: str) -> None:
    """The error names the address and gives the hint its cause calls for: a port in
    use is not a host that is not this one's."""
    (instance,) = await mesh.run(simple("flights"))
    metrics = Metrics(instance)
    taken = MetricsServer.start(metrics, "127.0.0.1", 0) if in_use else None
    try:
        port = int(taken.url.split(":")[2].split("/")[0]) if taken is not None else 9464
        with pytest.raises(ConfigurationError) as raised:
            MetricsServer.start(metrics, host, port)
        assert f"metrics: cannot listen on {host}:{port} (" in str(raised.value)
        assert hint in str(raised.value)
        other = "another process" if not in_use else "not an address of this host"
        assert other not in str(raised.value)
    finally:
        if taken is not None:
            taken.close()
