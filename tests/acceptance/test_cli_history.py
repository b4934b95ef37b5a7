"""The checkpoint history's and the event log's commands as a user runs them,
subprocesses on the demo's database (issue 15: ``meshpoint verify`` and ``tasks cost``
work on it; issue 16: ``meshpoint events`` and ``tasks reconstruct``), and the key
ring's."""

from __future__ import annotations

import json
import re
import signal
import sqlite3
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import replace
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from meshpoint import a2a
from meshpoint.events import log as event_log
from meshpoint.events.log import EventStore
from meshpoint.history.costs import Prices
from meshpoint.llm import ScriptedModel
from meshpoint.runtime import Agent, LocalTool, Peer
from meshpoint.runtime.agent import RecoveryPolicy
from meshpoint.store import SqlStore
from tests.acceptance.test_cli_tasks import ok_json, tasks
from tests.integration.mesh import ManualPeer, Mesh, eventually
from tests.integration.test_event_times import BASE_US, FrozenClock
from tests.integration.test_store import AGENT, fan_out


def meshpoint(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "meshpoint.cli", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=300, check=False)


@pytest.fixture(scope="module")
def demo_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    where = tmp_path_factory.mktemp("demo")
    done = meshpoint("demo", "--tasks", "12", "--kill-rate", "1", "--json", cwd=where)
    assert done.returncode == 0, done.stderr
    figures = json.loads(done.stdout)
    assert figures["chains_verified"] == 12 and figures["chains_failed"] == 0
    assert figures["history_records"] >= 24 and figures["cost_usd"] > 0
    return where / "meshpoint-demo.db"


def test_verify_and_cost_work_on_the_demos_database(demo_db: Path) -> None:
    url = f"sqlite:///{demo_db}"
    done = meshpoint("verify", "--all", "--url", url, "--json", cwd=demo_db.parent)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert (report["chains"], report["ok"], report["failed"]) == (12, 12, 0)
    task_id = report["reports"][0]["task_id"]
    done = meshpoint("tasks", "cost", task_id, "--url", url, "--json", cwd=demo_db.parent)
    assert done.returncode == 0, done.stderr
    cost = json.loads(done.stdout)
    assert cost["currency"] == "USD" and float(cost["total"]["cost"]["total"]) > 0
    assert [c["phase"] for c in cost["checkpoints"]][-1] == "completed"
    assert sum(c["tokens"]["completion_tokens"] for c in cost["checkpoints"]) == \
        cost["total"]["tokens"]["totals"]["completion_tokens"]
    done = meshpoint("tasks", "cost", task_id, "--url", url, cwd=demo_db.parent)
    assert done.returncode == 0 and "by source" in done.stdout and "USD" in done.stdout
    done = meshpoint("tasks", "cost", "nope", "--url", url, cwd=demo_db.parent)
    assert done.returncode == 1 and "no checkpoint history" in " ".join(done.stderr.split())
    done = meshpoint("purge", "--dry-run", "--url", url, "--json", cwd=demo_db.parent)
    assert done.returncode == 0
    assert (json.loads(done.stdout)["records_removed"], json.loads(done.stdout)["examined"],
            json.loads(done.stdout)["chains"]) == (0, 12, 0)  # all read, none to cut
    done = meshpoint("verify", "--url", url, cwd=demo_db.parent)
    assert done.returncode == 2 and "--task ID or --all" in " ".join(done.stderr.split())


#: Prices whose costs a float cannot hold and that fall below a nano-unit at each
#: checkpoint (0.0000000022 of m-1 a checkpoint; 0.1 and 0.2 of m-2).
ODD_PRICES = Prices({"m-1": {"prompt_tokens": 0.0015, "completion_tokens": 0.0007},
                     "m-2": {"prompt_tokens": 0.1, "completion_tokens": 0.2}})


async def test_tasks_cost_rows_add_up_to_the_total_it_prints(
        store: SqlStore, store_url: str, store_options: dict[str, object]) -> None:
    """A task checkpointed eight times, each spending a little on two models: the
    costs ``tasks cost`` prints per checkpoint add up, exactly, to the total it prints,
    in the table and in ``--json``, and that total is the last record's."""
    priced = store.with_history(replace(store.history.options, prices=ODD_PRICES))
    ctx = fan_out("t-cost", peers=1, local=False)
    await priced.checkpoint_task(ctx, AGENT)
    for turn in range(1, 8):
        sub = "t-cost/sub-0" if turn == 1 else f"t-cost/again-{turn - 1}"
        await priced.resolve_peer_sub_task(sub, {"text": "ok"}, lease_owner="i-1")
        ctx = (await priced.restore_task("t-cost", lease_owner="i-1")).context
        ctx.record_token_usage(model="m-1", source=AGENT, prompt_tokens=1,
                               completion_tokens=1)
        ctx.record_token_usage(model="m-2", source="peer-0", prompt_tokens=1,
                               completion_tokens=1)
        ctx.current_invocation_id = f"inv-{turn + 1}"
        ctx.register_peer_sub_task(f"t-cost/again-{turn}", {"peer_agent_name": "peer-0"})
        await priced.checkpoint_task(ctx, AGENT, lease_owner="i-1")
    await priced.cleanup_task("t-cost", outcome="completed", ctx=ctx)
    last = await store.history.get_latest_checkpoint("t-cost")
    assert last is not None
    schema = store_options.get("schema")
    where = ["--url", store_url, *(["--schema", str(schema)] if schema else [])]

    shown = await ok_json(where, "cost", "t-cost")
    rows = [Decimal(row["cost"]) for row in shown["checkpoints"]]
    total = Decimal(shown["total"]["cost"]["total"])
    assert len(rows) == 9 and sum(rows) == total == Decimal(last.metrics.cost["total"])
    assert total == 7 * (Decimal("0.0022") + Decimal("0.3")) / 1_000_000  # exact
    by_model = shown["total"]["cost"]["by_model"]
    assert sum(Decimal(m["total"]) for m in by_model.values()) == total

    code, out, err = await tasks(where, "cost", "t-cost")
    assert code == 0, err
    table = out.split("in total, by model")[0]
    printed = [Decimal(line.split("│")[-2].strip()) for line in table.splitlines()
               if re.match(r"^│\s*\d+\s*│", line)]
    said = re.search(r"total: ([0-9.]+) USD", out)
    assert said is not None and len(printed) == 9
    assert sum(printed) == Decimal(said.group(1)) == total

    # A purge keeps the last 3 records: what the others cost is one row, and the rows
    # still add up to the same total.
    keeping = store.with_history(replace(store.history.options, retention="last:3"))
    assert [p.removed for p in await keeping.history.purge()] == [6]
    shown = await ok_json(where, "cost", "t-cost")
    assert [row["seq"] for row in shown["checkpoints"]] == [None, 7, 8, 9]
    assert shown["checkpoints"][0]["purged_through"] == 6
    assert sum(Decimal(row["cost"]) for row in shown["checkpoints"]) == total
    assert Decimal(shown["total"]["cost"]["total"]) == total


def test_purge_follows_an_agents_retention_from_the_config(demo_db: Path,
                                                           tmp_path: Path) -> None:
    """The demo wrote its records without a policy; a retention given to its agent in
    the config afterwards is what ``purge`` applies to that agent's ended tasks."""
    config = tmp_path / "mesh.yaml"
    config.write_text(f"store: sqlite:///{demo_db}\n"
                      "agents:\n  coordinator: {retention: 'last:1'}\n")
    done = meshpoint("purge", "--dry-run", "--config", str(config), "--json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    plan = json.loads(done.stdout)
    assert plan["chains"] == 12 and plan["records_removed"] >= 12
    assert {p["policy"] for p in plan["purges"]} == {"last:1"}
    done = meshpoint("purge", "--dry-run", "--url", f"sqlite:///{demo_db}", cwd=tmp_path)
    assert done.returncode == 0 and done.stdout.strip() == "nothing to purge in 12 chain(s)"


def test_verify_names_the_record_someone_changed(demo_db: Path, tmp_path: Path) -> None:
    copy = tmp_path / "tampered.db"
    with sqlite3.connect(demo_db) as source, sqlite3.connect(copy) as target:
        source.backup(target)
    with sqlite3.connect(copy) as conn:
        task_id, seq, data = conn.execute(
            "SELECT logical_task_id, seq, data FROM agent_checkpoints WHERE seq = 1 "
            "ORDER BY logical_task_id LIMIT 1").fetchone()
        conn.execute("UPDATE agent_checkpoints SET data = ? WHERE logical_task_id = ? AND "
                     "seq = 1", (data.replace('"agent_type":"general"', '"agent_type":"generaI"'),
                                   task_id))
        # Another task's last record no longer even parses: that chain is reported,
        # and the others are still walked.
        other, last = conn.execute(
            "SELECT logical_task_id, max(seq) FROM agent_checkpoints WHERE logical_task_id "
            "> ? GROUP BY logical_task_id ORDER BY logical_task_id LIMIT 1",
            (task_id,)).fetchone()
        conn.execute("UPDATE agent_checkpoints SET data = 'X' || substr(data, 2) WHERE "
                     "logical_task_id = ? AND seq = ?", (other, last))
    url = f"sqlite:///{copy}"
    done = meshpoint("verify", "--all", "--url", url, "--json", cwd=tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    report = json.loads(done.stdout)
    assert report["failed"] == 2 and report["chains"] > 2
    bad = {r["task_id"]: r for r in report["reports"] if not r["ok"]}
    assert (bad[task_id]["first_bad_seq"], bad[task_id]["kind"]) == (seq, "corrupt")
    assert (bad[other]["first_bad_seq"], bad[other]["kind"]) == (last, "corrupt")
    assert bad[other]["reason"].startswith("its document is not JSON")
    done = meshpoint("verify", "--task", task_id, "--url", url, cwd=tmp_path)
    assert done.returncode == 1 and "corrupt" in done.stdout
    assert "0 of 1 chain(s) verify" in done.stdout
    # A mistyped path is an error, and creates nothing.
    done = meshpoint("verify", "--all", "--url", "sqlite:///typo/x.db", "--json",
                     cwd=tmp_path)
    assert done.returncode == 1 and not (tmp_path / "typo").exists()
    assert "no SQLite database at typo/x.db" in json.loads(done.stdout)["error"]


def _one_paused_task(where: Path, *, signed: bool = False) -> str:
    """A SQLite file in ``where`` holding task t1, paused on one peer call (its
    history signed with a key the CLI is not given, if ``signed``); its URL."""
    writer = ("import asyncio\nfrom meshpoint import TaskExecutionContext, open_store\n"
              "from meshpoint.history.planning import HistoryOptions\n"
              "from meshpoint.history.integrity import SigningKeys\n"
              "async def main():\n"
              f"    keys = SigningKeys.generate('k1') if {signed} else SigningKeys()\n"
              "    history = HistoryOptions(signing=keys)\n"
              "    async with open_store('sqlite:///one.db', history=history) as store:\n"
              "        ctx = TaskExecutionContext('t1', {})\n"
              "        ctx.current_invocation_id = 'inv'\n"
              "        ctx.register_peer_sub_task('t1/s', {'invocation_id': 'inv', "
              "'function_call_id': 'c', 'peer_agent_name': 'p', 'timeout_s': 600})\n"
              "        await store.checkpoint_task(ctx, 'agent')\n"
              "asyncio.run(main())\n")
    subprocess.run([sys.executable, "-c", writer], cwd=where, check=True, timeout=60)
    return f"sqlite:///{where / 'one.db'}"


def test_tasks_show_shows_a_task_whose_history_fails_marked_unverified(
        tmp_path: Path) -> None:
    """What an operator inspects a blocked task with: its live row, marked as not
    checked against its history, with why."""
    url = _one_paused_task(tmp_path)
    shown = json.loads(meshpoint("tasks", "show", "t1", "--url", url, "--json",
                                 cwd=tmp_path).stdout)
    assert (shown["verified"], shown["integrity_error"]) == (True, None)
    with sqlite3.connect(tmp_path / "one.db") as conn:
        conn.execute("DELETE FROM agent_checkpoints")  # the tail cut off
    done = meshpoint("tasks", "show", "t1", "--url", url, "--json", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    shown = json.loads(done.stdout)
    assert shown["verified"] is False and "tail was cut off" in shown["integrity_error"]
    assert [w["call_id"] for w in shown["waiting_on"]] == ["t1/s"]
    done = meshpoint("tasks", "show", "t1", "--url", url, cwd=tmp_path)
    assert done.returncode == 0 and "unverified:" in done.stdout


def test_verify_without_signing_keys_checks_the_hashes_of_signed_chains(
        tmp_path: Path) -> None:
    """A URL alone gives no key to check a signature with: the hashes, links and
    heads are checked, and the report says the signatures were not."""
    url = _one_paused_task(tmp_path, signed=True)
    done = meshpoint("verify", "--all", "--url", url, "--json", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(done.stdout)
    assert (report["ok"], report["failed"], report["signatures_checked"]) == (1, 0, False)
    done = meshpoint("verify", "--task", "t1", "--url", url, cwd=tmp_path)
    assert done.returncode == 0 and "signatures, if any, were not checked" in " ".join(
        done.stdout.split())
    # A changed byte is still found without the keys.
    with sqlite3.connect(tmp_path / "one.db") as conn:
        conn.execute("UPDATE agent_checkpoints SET data = replace(data, "
                     "'\"agent_type\":\"general\"', '\"agent_type\":\"generaI\"')")
    done = meshpoint("verify", "--all", "--url", url, "--json", cwd=tmp_path)
    assert done.returncode == 1 and json.loads(done.stdout)["reports"][0]["kind"] == "corrupt"


def test_the_key_ring_commands(tmp_path: Path) -> None:
    ring = tmp_path / "keys.json"
    done = meshpoint("keys", "rotate", "--tenant", "acme", "--keyring", str(ring), "--json",
                     cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    first = json.loads(done.stdout)["active"]
    meshpoint("keys", "rotate", "--tenant", "acme", "--keyring", str(ring), cwd=tmp_path)
    done = meshpoint("keys", "list", "--keyring", str(ring), "--json", cwd=tmp_path)
    [listed] = json.loads(done.stdout)["tenants"]
    assert first.startswith("k1-") and listed["active"].startswith("k2-")
    assert listed == {"tenant": "acme", "active": listed["active"],
                      "keys": sorted([first, listed["active"]])}
    assert ring.stat().st_mode & 0o777 == 0o600
    done = meshpoint("keys", "shred", "--tenant", "acme", "--keyring", str(ring), cwd=tmp_path)
    assert done.returncode == 2 and "--yes" in " ".join(done.stderr.split())
    done = meshpoint("keys", "shred", "--tenant", "acme", "--keyring", str(ring), "--yes",
                     cwd=tmp_path)
    assert done.returncode == 0
    assert json.loads(meshpoint("keys", "list", "--keyring", str(ring), "--json",
                                cwd=tmp_path).stdout)["tenants"] == []
    done = meshpoint("keys", "list", "--keyring", str(tmp_path / "none.json"), cwd=tmp_path)
    assert done.returncode == 1 and "does not exist" in " ".join(done.stderr.split())


def test_events_and_reconstruct_work_on_the_demos_database(demo_db: Path) -> None:
    url, here = f"sqlite:///{demo_db}", demo_db.parent
    done = meshpoint("events", "--url", url, "--limit", "100000", "--json", cwd=here)
    assert done.returncode == 0, done.stderr
    every = json.loads(done.stdout)["events"]
    kinds = {e["event_type"] for e in every}
    assert {"protocol_receive", "step_start", "step_complete", "pause", "protocol_handoff",
            "resume", "answer", "approval"} <= kinds, kinds
    # a task whose request was logged (a killed instance loses what it had not written)
    task_id = next(e["thread_id"] for e in every if e["event_type"] == "protocol_receive"
                   and e["step_name"] == "request")
    done = meshpoint("events", "--task", task_id, "--type", "pause", "--since", "1h",
                     "--url", url, "--json", cwd=here)
    paused = json.loads(done.stdout)["events"]
    assert paused and {(e["thread_id"], e["event_type"]) for e in paused} == {
        (task_id, "pause")}
    done = meshpoint("events", "--task", task_id, "--url", url, cwd=here)
    assert done.returncode == 0 and "protocol_handoff" in done.stdout
    for bad, reason in ((("--since", "yesterday"), "is not a time"),
                        (("--since", "nan"), "is not a time"),
                        (("--until", "inf"), "is not a time"),
                        (("--limit", "0"), "--limit")):
        done = meshpoint("events", *bad, "--url", url, cwd=here)
        assert done.returncode == 2 and reason in " ".join(done.stderr.split()), done.stderr

    done = meshpoint("tasks", "reconstruct", task_id, "--url", url, "--json", cwd=here)
    assert done.returncode == 0, done.stderr
    rebuilt = json.loads(done.stdout)
    assert rebuilt["request"].startswith("Plan trip")
    assert rebuilt["checkpoint"]["phase"] == "completed" and rebuilt["history_problem"] is None
    # the request the log holds is the one the records name by hash
    assert rebuilt["request_verified"] is True and rebuilt["restart_refusal"] is None
    assert rebuilt["trusts"][0].startswith("request: the event log's, checked against")
    assert f"The request: {rebuilt['request']}" in rebuilt["prompt"]
    assert "The task has ended: completed." in rebuilt["prompt"]
    # an ended task is summarised, not resumed "after a failure"
    assert "resuming" not in rebuilt["prompt"] and "failure" not in rebuilt["prompt"]
    done = meshpoint("tasks", "reconstruct", task_id, "--url", url, cwd=here)
    assert done.returncode == 0 and f"known of task {task_id}" in done.stdout
    assert "trusting request: the event log's, checked against" in done.stdout
    done = meshpoint("tasks", "reconstruct", "nope", "--url", url, cwd=here)
    assert done.returncode == 1 and "nope" in done.stderr


def _follow(*args: str, cwd: Path) -> subprocess.Popen[str]:
    """``meshpoint events --follow --json`` as a terminal starts it: Ctrl-C (SIGINT)
    interrupts it even when this run's own shell ignores SIGINT (a job started in the
    background by a shell without job control does, and its children inherit that)."""
    return subprocess.Popen(
        [sys.executable, "-m", "meshpoint.cli", "events", "--follow", "--json", *args],
        cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def _line(process: subprocess.Popen[str], timeout: float = 60.0) -> str:
    """The next line ``process`` prints, failing the test (not hanging it until the
    suite's timeout) if none comes within ``timeout`` seconds."""
    assert process.stdout is not None
    reader = ThreadPoolExecutor(1)
    try:
        return reader.submit(process.stdout.readline).result(timeout)
    except FutureTimeout:
        pytest.fail(f"process {process.pid} printed no line within {timeout:.0f} s")
    finally:
        reader.shutdown(wait=False)  # a blocked read ends when the process is stopped


def _interrupt(follower: subprocess.Popen[str]) -> str:
    """Ctrl-C, then what the follower wrote to stderr; killed if it does not stop."""
    follower.send_signal(signal.SIGINT)
    try:
        return follower.communicate(timeout=30)[1]
    except subprocess.TimeoutExpired:
        follower.kill()
        follower.communicate()
        raise


def test_events_follow_prints_new_events_as_they_are_written(demo_db: Path) -> None:
    url, here = f"sqlite:///{demo_db}", demo_db.parent
    follower = _follow("--task", "followed", "--url", url, cwd=here)
    try:
        writer = ("import asyncio\nfrom meshpoint import open_store\n"
                  "from meshpoint.events.log import EventStore\n"
                  "async def main():\n"
                  f"    async with open_store({url!r}, migrate=False) as store:\n"
                  "        async with EventStore(store) as log:\n"
                  "            log.log_event('writer', 'followed', 'step_complete', "
                  "step_name='late')\n"
                  "asyncio.run(main())\n")
        subprocess.run([sys.executable, "-c", writer], cwd=here, check=True, timeout=60)
        assert follower.stdout is not None
        line = _line(follower)  # waits for the follower to see it
        event = json.loads(line)
        assert (event["thread_id"], event["step_name"]) == ("followed", "late")
    finally:
        errors = _interrupt(follower)
    assert follower.returncode == 0, errors


def test_events_follow_prints_an_event_that_commits_behind_a_newer_one(
        demo_db: Path) -> None:
    """An event's time is when it was logged; a writer may commit it after another
    writer's newer event, and after the follower printed that one. It is printed then."""
    url, here = f"sqlite:///{demo_db}", demo_db.parent
    writer = subprocess.Popen(
        [sys.executable, "-c", "import asyncio, sys\nfrom meshpoint import open_store\n"
         "from meshpoint.events.log import EventStore\n"
         "async def main():\n"
         f"    async with open_store({url!r}, migrate=False) as store:\n"
         "        slow = EventStore(store, flush_interval_s=3600)\n"
         "        slow.log_event('slow', 'behind', 'step_complete', step_name='older')\n"
         "        async with EventStore(store) as quick:\n"
         "            quick.log_event('quick', 'behind', 'step_complete', step_name='newer')\n"
         "        print('committed the newer', flush=True)\n"
         "        sys.stdin.readline()\n"
         "        await slow.close()\n"
         "asyncio.run(main())\n"],
        cwd=here, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert writer.stdin is not None and writer.stdout is not None
    follower = None
    try:
        assert _line(writer).strip() == "committed the newer"
        follower = _follow("--task", "behind", "--limit", "1", "--url", url, cwd=here)
        assert follower.stdout is not None
        assert json.loads(_line(follower))["step_name"] == "newer"
        writer.stdin.write("go\n")
        writer.stdin.flush()
        assert writer.wait(timeout=60) == 0
        assert json.loads(_line(follower))["step_name"] == "older"
    finally:
        writer.kill()
        writer.communicate()  # closes its pipes
        errors = _interrupt(follower) if follower is not None else ""
    assert follower.returncode == 0, errors


def test_events_follow_starts_from_the_newest_as_tail_does(demo_db: Path) -> None:
    url, here = f"sqlite:///{demo_db}", demo_db.parent
    every = json.loads(meshpoint("events", "--url", url, "--limit", "100000", "--json",
                                 cwd=here).stdout)["events"]
    assert len(every) > 2
    follower = _follow("--limit", "2", "--url", url, cwd=here)
    try:
        assert follower.stdout is not None
        first = [json.loads(_line(follower))["event_id"] for _ in range(2)]
    finally:
        errors = _interrupt(follower)
    assert follower.returncode == 0, errors
    assert first == [e["event_id"] for e in every[-2:]]


async def test_events_says_when_more_match_and_follow_prints_every_tie_once(
        live_store: SqlStore, store_url: str, store_options: dict[str, object],
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """1,500 events logged in one microsecond: ``meshpoint events`` prints the first
    ``--limit`` and says that more match (table and ``"more"`` in JSON); ``--follow``
    pages through them by the log's order (time, then id) and prints each exactly
    once (a pager by time alone stopped at the first full page of one time)."""
    frozen = FrozenClock()
    monkeypatch.setattr(event_log, "time", frozen.module())
    log = EventStore(live_store)
    for n in range(1500):
        log.log_event("writer", "tied", "step_complete", step_name=f"s{n}")
    await log.flush()
    schema = store_options.get("schema")
    where = ["--url", store_url, *(["--schema", str(schema)] if schema else [])]

    shown = await ok_json_of(where, "events", "--task", "tied", "--limit", "10")
    assert len(shown["events"]) == 10 and shown["more"] is True
    shown = await ok_json_of(where, "events", "--task", "tied", "--limit", "1500")
    assert len(shown["events"]) == 1500 and shown["more"] is False
    code, out, err = await tasks(where, "events", "--task", "tied", "--limit", "10")
    assert code == 0 and "the first 10 events; more match" in " ".join(out.split()), err

    since = str((BASE_US - 1_000_000) / 1e6)  # a second before them
    follower = _follow("--task", "tied", "--since", since, *where, cwd=tmp_path)
    try:
        printed = [json.loads(_line(follower))["step_name"] for _ in range(1500)]
    finally:
        errors = _interrupt(follower)
    assert follower.returncode == 0, errors
    assert sorted(printed) == sorted(f"s{n}" for n in range(1500))  # each once


async def ok_json_of(where: list[str], *args: str) -> Any:
    """``meshpoint ARGS --json`` on the store ``where`` names, parsed."""
    code, out, err = await tasks(where, *args, "--json")
    assert code == 0, err
    return json.loads(out)


class BrokenModel:
    """A model whose endpoint is down."""

    name = "broken"

    async def complete(self, messages: list[dict[str, Any]], tools: list[Any]) -> Any:
        raise ConnectionError("the model server went away")


async def test_every_failure_is_an_error_event_and_a_field_of_the_failed_answer(
        mesh: Mesh, live_store: SqlStore, store_url: str,
        store_options: dict[str, object]) -> None:
    """Three ways a task fails (its model fails; it reaches max_turns; recovery
    expires it, waiting on a peer): each answer is ``failed`` with the reason in its
    status message and in its metadata (``meshpoint_error``), and each failure is an
    ``error`` event with the reason (and the ``answer``/``failed`` event carries it),
    which ``meshpoint events --type error`` finds."""
    peer = await ManualPeer(mesh, "researcher").start()
    await mesh.run(Agent("broken", BrokenModel(), events=True))
    await mesh.run(Agent("looping", ScriptedModel(rounds=5), events=True, max_turns=2,
                         tools=[LocalTool("clock", "The time.", lambda args: "noon")]))
    await mesh.run(Agent("waiting", ScriptedModel(), events=True,
                         peers=[Peer("researcher", timeout_s=60)],
                         recovery=RecoveryPolicy(timeout_s=0.3)))
    reasons = {"broken": "ConnectionError: the model server went away",
               "looping": "gave up after 2 model calls",
               "waiting": "expired: not checkpointed for more than 0.3 s"}
    failed: dict[str, str] = {}
    for agent in reasons:
        task = await mesh.client.ask(agent, "Look into it", 20)
        assert task.status.state is a2a.TaskState.FAILED
        assert task.status.message is not None
        assert reasons[agent] in task.status.message.text
        assert reasons[agent] in (task.metadata or {})["meshpoint_error"]
        failed[agent] = task.id
    assert peer.requests  # the waiting task did ask

    log = EventStore(live_store)

    async def logged() -> bool:
        errors = await log.get_events(event_type="error")
        return {e.thread_id for e in errors if e.step_name == "failed"} == set(
            failed.values())

    await eventually(logged, what="an error event of each failure")
    schema = store_options.get("schema")
    where = ["--url", store_url, *(["--schema", str(schema)] if schema else [])]
    shown = await ok_json_of(where, "events", "--type", "error")
    by_task = {e["thread_id"]: e for e in shown["events"] if e["step_name"] == "failed"}
    for agent, task_id in failed.items():
        assert reasons[agent] in by_task[task_id]["output_data"]["reason"]
        (answer,) = await log.get_events(thread_id=task_id, event_type="answer")
        assert answer.step_name == "failed"
        assert reasons[agent] in answer.output_data["reason"]
