"""``meshpoint serve`` with metrics on (SQLite and NATS): Prometheus scrapes what the
instance did, counted exactly, and the tasks the store holds; a port in use is a clear
error naming it."""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from meshpoint import a2a
from meshpoint.broker.nats import NatsBroker
from meshpoint.runtime import Client
from tests.acceptance.test_serve import meshpoint
from tests.cluster import Cluster, Proc, mesh_config
from tests.integration.mesh import eventually

pytestmark = [pytest.mark.nats, pytest.mark.timeout(120)]

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def metrics_url(proc: Proc) -> str:
    found = re.search(r"metrics at (http://\S+)", proc.log.read_text())
    assert found, proc.log.read_text()
    return found.group(1)


def scrape(url: str) -> Samples:
    text = httpx.get(url, timeout=10).text
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(scraped: Samples, name: str, **labels: str) -> float:
    return sum(v for (n, ls), v in scraped.items()
               if n == name and set(labels.items()) <= set(ls))


async def test_serve_counts_pauses_resumes_and_stored_tasks_exactly(
        tmp_path: Path, namespace: str, nats_url: str) -> None:
    """Three tasks pause; the two whose peer runs resume and end, the third waits on
    a second peer that does not run (its first call is answered): each pause, resume,
    claim and end is counted once, and the store's figures are read at the scrape. The
    config's ``metrics:`` gives every process a free port."""
    config = mesh_config(namespace, {"url": f"sqlite:///{tmp_path / 'mesh.db'}"}, nats_url)
    config["metrics"] = {"port": 0}
    cluster = Cluster.write(tmp_path / "cluster", config)
    coordinator = cluster.spawn("coordinator", "--log-level", "info")
    flights = cluster.spawn("flights", "--log-level", "info")
    cluster.wait_ready([coordinator, flights])
    url = metrics_url(coordinator)
    assert url.startswith("http://127.0.0.1:") and url != metrics_url(flights)
    broker = await NatsBroker.connect(nats_url)
    try:
        async with Client(broker, namespace=namespace) as client:
            ids = [await client.submit("coordinator", f"Trip {n}: flights") for n in range(2)]
            # the scripted coordinator asks flights the first topic, hotels the second
            waiting = await client.submit("coordinator", "Trip 3: flights, hotels")
            answers = [await client.wait(i, 30) for i in ids]
            assert all(a.status.state == a2a.TaskState.COMPLETED for a in answers)
            task_ids = {client.task_id("coordinator", i) for i in [*ids, waiting]}
        own = {"agent": "coordinator", "backend": "sqlite"}
        scraped: Samples = {}

        def settled() -> bool:  # the third task's flights answer claimed, ended rows gone
            scraped.clear()
            scraped.update(scrape(url))
            return value(scraped, "meshpoint_claims_total", **own) == 3 and \
                value(scraped, "meshpoint_tasks", **own) == 1

        await eventually(settled, timeout_s=15, what="three claims and one stored task")
        assert value(scraped, "meshpoint_checkpoint_write_seconds_count", **own) == 3
        assert value(scraped, "meshpoint_tasks_started_total", **own) == 3
        assert value(scraped, "meshpoint_resumes_total", kind="same_instance", **own) == 2
        assert value(scraped, "meshpoint_resumes_total", **own) == 2
        assert value(scraped, "meshpoint_checkpoint_restore_seconds_count", **own) == 2
        assert value(scraped, "meshpoint_pause_resume_seconds_count", **own) == 2
        assert value(scraped, "meshpoint_claims_total", outcome="won", **own) == 3
        assert value(scraped, "meshpoint_resolutions_total", outcome="answered", **own) == 3
        assert value(scraped, "meshpoint_tasks_ended_total", outcome="completed", **own) == 2
        assert value(scraped, "meshpoint_tasks", status="waiting_peers", **own) == 1
        assert value(scraped, "meshpoint_tasks", **own) == 1
        assert value(scraped, "meshpoint_approvals_pending", **own) == 0
        assert value(scraped, "meshpoint_scrape_errors_total", **own) == 0
        assert value(scraped, "meshpoint_dead_letters_total", **own) == 0
        for name, labels in scraped:
            assert not {v for _, v in labels} & task_ids, (name, labels)
        # the peer serves its own figures: the answers it gave, its store's view
        peer = scrape(metrics_url(flights))
        assert value(peer, "meshpoint_tasks_ended_total", agent="flights",
                     outcome="completed") == 3
        assert value(peer, "meshpoint_tasks", agent="coordinator") == 1

        # A second serve asked for the coordinator's port says which, and exits 1.
        port = url.split(":")[2].split("/")[0]
        taken = meshpoint("serve", "--config", str(cluster.config_path), "--agent", "flights",
                          "--metrics-port", port, timeout_s=60)
        assert taken.returncode == 1, taken.stderr
        assert f"cannot listen on 127.0.0.1:{port}" in " ".join(taken.stderr.split())
    finally:
        await broker.close()
        codes = cluster.stop()
    assert set(codes.values()) == {0}, cluster.logs()


def test_the_config_refuses_a_metrics_port_out_of_range(tmp_path: Path) -> None:
    config = {"store": {"url": f"sqlite:///{tmp_path / 'm.db'}"}, "metrics": {"port": 70000}}
    path = tmp_path / "mesh.yaml"
    path.write_text(yaml.safe_dump(config))
    done = meshpoint("serve", "--config", str(path), "--agent", "a", timeout_s=60)
    assert done.returncode == 1 and "metrics.port" in done.stderr, done.stderr
