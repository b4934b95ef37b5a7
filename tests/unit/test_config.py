"""The mesh config: the example loads; every mistake names its key and what was expected."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from meshpoint.config import load_config
from meshpoint.errors import ConfigurationError
from meshpoint.llm.scripted import ScriptedModel

EXAMPLE = Path(__file__).parents[2] / "examples" / "mesh.yaml"
MINIMAL = """
namespace: travel
store: sqlite:///mesh.db
broker: memory://
agents:
  coordinator:
    peers: [{agent: flights, timeout_s: 5}]
  flights: {}
"""


def lookup_tool(arguments: dict[str, Any]) -> str:
    """Looks things up."""
    return f"found {arguments.get('query')}"


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "mesh.yaml"
    path.write_text(text)
    return path


def test_the_example_loads_and_builds_every_agent(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MESHPOINT_STORE_URL", raising=False)
    monkeypatch.setenv("MESHPOINT_NAMESPACE", "demo1")
    config = load_config(EXAMPLE)
    assert config.namespace == "demo1"  # ${VAR:-default}: the environment wins
    assert config.store.url.startswith("postgresql+asyncpg://")  # the default
    assert config.broker.url == "nats://127.0.0.1:4222"
    coordinator = config.build_agent("coordinator")
    assert [p.agent for p in coordinator.peers] == ["flights", "hotels", "weather"]
    assert isinstance(coordinator.model, ScriptedModel)
    options = config.runtime_options()
    assert (options.namespace, options.lease_ttl_s) == ("demo1", 10)


def test_shorthands_defaults_and_local_tools(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, MINIMAL + """
  researcher:
    tools: [{name: lookup, function: "tests.unit.test_config:lookup_tool"}]
"""))
    assert config.store.url == "sqlite:///mesh.db" and config.broker.url == "memory://"
    assert config.runtime.drain_timeout_s == 20.0
    researcher = config.build_agent("researcher")
    assert researcher.tools[0].name == "lookup"
    assert researcher.tools[0].description == "Looks things up."


def test_a_sync_section_without_signing_keys_loads_when_unsigned(tmp_path: Path) -> None:
    loaded = load_config(write(tmp_path, MINIMAL + "sync: {to: 'postgresql://c/db', "
                                              "unsigned: true}\n"))
    assert loaded.sync is not None and loaded.sync.unsigned


@pytest.mark.parametrize(("text", "expected"), [
    (MINIMAL.replace("timeout_s: 5", "timeout_s: -1"),
     "agents.coordinator.peers.0.timeout_s: Input should be greater than 0 (got -1)"),
    (MINIMAL.replace("timeout_s: 5", "timeout: 5"),
     "agents.coordinator.peers.0.timeout: unknown key; expected one of: agent, description, "
     "timeout_s, tool_name"),
    (MINIMAL + "runtime: {lease_ttl: 3}\n",
     "runtime.lease_ttl: unknown key; expected one of: announce_check_s, drain_timeout_s, "
     "lease_ttl_s"),
    (MINIMAL.replace("agent: flights", "agent: hotels"),
     "agents.coordinator.peers.0.agent: 'hotels' is not an agent of this file "
     "(expected one of ['coordinator', 'flights'])"),
    (MINIMAL.replace("store: sqlite:///mesh.db\n", ""), "store: required key is missing"),
    (MINIMAL.replace("flights: {}", "flights: {model: {kind: gpt}}"),
     "agents.flights.model: Input tag 'gpt' found using 'kind' does not match any of the "
     "expected tags: 'scripted', 'openai'"),
    (MINIMAL.replace("flights: {}", "flights: {model: {kind: scripted, rounds: zero}}"),
     "agents.flights.model.rounds: Input should be a valid integer"),
    (MINIMAL.replace("namespace: travel", "namespace: trav el"),
     "namespace: must be 1-64 letters, digits, '_' or '-' (got 'trav el')"),
    (MINIMAL.replace("sqlite:///mesh.db", "${NOT_SET_ANYWHERE}"),
     "store: environment variable NOT_SET_ANYWHERE is not set"),
    (MINIMAL.replace("flights: {}", "openai: {model: {kind: scripted, roundz: 1}}")
     .replace("agent: flights", "agent: openai"),
     "agents.openai.model.roundz: unknown key; expected one of: context_window, delay_s, "
     "handoff_after, kind, name"),
    (MINIMAL.replace("broker: memory://", "broker: {url: memory://, max_age_s: 60}"),
     "broker: dedupe_window_s (120) must not exceed max_age_s (60)"),
    (MINIMAL + "history: {retention: 'weeks:3'}\n",
     "history.retention: retention policy 'weeks:3': use days:N"),
    (MINIMAL.replace("flights: {}", "flights: {retention: bogus}"),
     "agents.flights.retention: retention policy 'bogus': use days:N"),
    (MINIMAL + "history: {encryption: {keyring: k.json, exclude: [events, logs]}}\n",
     "history.encryption.exclude: encryption exclude: 'logs' is not a family "
     "of columns (they are context, conversation, calls, snapshots, events, langgraph)"),
    (MINIMAL + "sync: {to: 'postgresql://h/db', every_s: 5}\n",
     "sync.every_s: unknown key; expected one of: batch, interval_s, max_backoff_s, "
     "schema, to, unsigned"),
    (MINIMAL + "sync: {to: 'postgresql://c/db'}\n",
     "sync: checks the history chains' signatures on arrival with the keys of "
     "history.signing, and this file has none: add them, or sync: {unsigned: true}"),
    (MINIMAL.replace("sqlite:///mesh.db", "postgresql://h/db")
     + "sync: {to: 'postgresql://c/db', unsigned: true}\n",
     "sync: pushes a local SQLite store to the cloud; this store is not SQLite"),
    ("agents: [1, 2\n", "not valid YAML"),
    ("- just\n- a list\n", "expected a mapping of keys"),
    (MINIMAL + "  tooly:\n    tools: [{name: t, function: 'no_such_module:f'}]\n", None),
])
def test_mistakes_name_the_key_and_what_was_expected(
        tmp_path: Path, text: str, expected: str | None) -> None:
    path = write(tmp_path, text)
    if expected is None:  # valid as a file; the tool fails when the agent is built
        with pytest.raises(ConfigurationError, match=re.escape(
                "agents.tooly.tools (t): cannot import 'no_such_module:f'")):
            load_config(path).build_agent("tooly")
        return
    with pytest.raises(ConfigurationError) as caught:
        load_config(path)
    assert str(path) in str(caught.value)
    assert expected in str(caught.value)


def test_several_mistakes_are_listed_together(tmp_path: Path) -> None:
    text = MINIMAL.replace("timeout_s: 5", "timeout_s: 0") + "runtime: {max_deliver: 0}\n"
    with pytest.raises(ConfigurationError, match=r"2 problems:\n  - ") as caught:
        load_config(write(tmp_path, text))
    assert "runtime.max_deliver" in str(caught.value)


def test_a_missing_file_and_an_unknown_agent(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="cannot read the config"):
        load_config(tmp_path / "nope.yaml")
    config = load_config(write(tmp_path, MINIMAL))
    with pytest.raises(ConfigurationError, match=re.escape(
            "no agent 'hotel' in the config (it defines: coordinator, flights)")):
        config.build_agent("hotel")


def test_an_openai_model_needs_its_key_variable(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MY_KEY", raising=False)
    config = load_config(write(tmp_path, MINIMAL.replace(
        "flights: {}", "flights: {model: {kind: openai, name: gpt-4o-mini, "
                       "api_key_env: MY_KEY}}")))
    with pytest.raises(ConfigurationError, match="MY_KEY is not set"):
        config.build_agent("flights")
    monkeypatch.setenv("MY_KEY", "sk-test")
    assert config.build_agent("flights").model.name == "gpt-4o-mini"


def big_amount(arguments: dict[str, Any]) -> bool:
    return int(arguments.get("amount", 0)) > 100


def test_tools_can_need_approval_always_or_by_a_predicate(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, MINIMAL + """
  payer:
    tools:
      - {name: pay, function: "tests.unit.test_config:lookup_tool",
         needs_approval: "tests.unit.test_config:big_amount", approval_timeout_s: 60,
         parameters: {type: object, properties: {amount: {type: integer}}}}
      - {name: send, function: "tests.unit.test_config:lookup_tool", needs_approval: true}
"""))
    pay, send = config.build_agent("payer").tools
    assert pay.requires_approval({"amount": 500}) and not pay.requires_approval({"amount": 5})
    assert pay.approval_timeout_s == 60 and pay.parameters["properties"]["amount"]
    assert send.needs_approval is True


@pytest.mark.parametrize(("tool", "expected"), [
    ("needs_approval: 'not a path'", "needs_approval"),
    ("needs_approval: true, approval_timeout_s: 0", "approval_timeout_s: Input should be "
                                                     "greater than 0"),
])
def test_approval_mistakes_name_their_key(tmp_path: Path, tool: str, expected: str) -> None:
    path = write(tmp_path, MINIMAL + f"""
  payer:
    tools: [{{name: pay, function: "tests.unit.test_config:lookup_tool", {tool}}}]
""")
    with pytest.raises(ConfigurationError, match=expected):
        load_config(path)


def test_approval_tools_without_checkpointing_fail_when_built(tmp_path: Path) -> None:
    path = write(tmp_path, MINIMAL + """
  payer:
    stateless_checkpointing: false
    tools: [{name: pay, function: "tests.unit.test_config:lookup_tool", needs_approval: true}]
""")
    with pytest.raises(ConfigurationError, match=r"agents\.payer: .*needs stateless_checkpointing"):
        load_config(path).build_agent("payer")


def test_an_agents_checkpoint_strategy(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, MINIMAL + """
  worker:
    checkpoint: {strategy: hybrid, interval: 5, after_tools: true,
                 recovery: {auto_resume_hitl: true, timeout_s: 0}}
""")).build_agent("worker")
    assert config.recovery.auto_resume and config.recovery.auto_resume_hitl
    assert config.recovery.timeout_s == 0
    assert config.checkpoint.strategy == "hybrid" and config.checkpoint.interval == 5
    assert config.checkpoint.after_tools and not config.checkpoint.before_llm
    assert not load_config(write(tmp_path, MINIMAL)).build_agent("flights").checkpoint.mid_turn
    for text, reason in (("{strategy: sometimes}", "checkpoint.strategy: Input should be"),
                         ("{after_tool: true}", "checkpoint.after_tool: unknown key")):
        with pytest.raises(ConfigurationError, match=reason):
            load_config(write(tmp_path, MINIMAL + f"  worker:\n    checkpoint: {text}\n"))
    with pytest.raises(ConfigurationError, match="needs an interval > 0"):
        load_config(write(tmp_path, MINIMAL + "  worker:\n    checkpoint: {strategy: interval}\n"
                          )).build_agent("worker")


def test_an_agents_event_log_and_reconstruction(tmp_path: Path) -> None:
    agent = load_config(write(tmp_path, MINIMAL + """
  worker:
    events: true
    checkpoint: {recovery: {reconstruct: true}}
""")).build_agent("worker")
    assert agent.events and agent.recovery.reconstruct
    plain = load_config(write(tmp_path, MINIMAL)).build_agent("flights")
    assert not plain.events and not plain.recovery.reconstruct
    with pytest.raises(ConfigurationError, match=r"events: Input should be a valid boolean"):
        load_config(write(tmp_path, MINIMAL + "  worker:\n    events: sometimes\n"))


def test_an_agents_handoff_section(tmp_path: Path) -> None:
    """``handoff:`` is the agent's HandoffPolicy: ``{}`` gives the defaults, absent is
    off, each key is checked (a threshold in (0, 1], a known key) and a mistake is told
    with its key's path; a model's ``context_window`` reaches the model object."""
    from meshpoint.runtime.options import HandoffPolicy

    config = load_config(write(tmp_path, MINIMAL + """
  worker:
    model: {kind: scripted, context_window: 4096, handoff_after: 2}
    handoff: {}
  careful:
    handoff: {context_utilization: 0.5, budget_tokens: 20000, budget_warning: 0.9,
              consecutive_errors: null, explicit: false, max_iterations: 4,
              continuation: model}
"""))
    worker = config.build_agent("worker")
    assert worker.handoff == HandoffPolicy()
    assert worker.model.context_window == 4096  # type: ignore[attr-defined]
    assert worker.model.handoff_after == 2  # type: ignore[attr-defined]
    careful = config.build_agent("careful").handoff
    assert careful == HandoffPolicy(context_utilization=0.5, budget_tokens=20000,
                                    budget_warning=0.9, consecutive_errors=None,
                                    explicit=False, max_iterations=4, continuation="model")
    assert config.build_agent("flights").handoff is None  # absent: off
    assert config.build_agent("flights").model.context_window is None  # type: ignore[attr-defined]
    for text, reason in (
            ("handoff: {context_utilization: 1.5}",
             r"agents\.worker\.handoff\.context_utilization: .*less than or equal to 1"),
            ("handoff: {context_utilization: 0}",
             r"agents\.worker\.handoff\.context_utilization: .*greater than 0"),
            ("handoff: {budget_warning: -0.1}", r"agents\.worker\.handoff\.budget_warning"),
            ("handoff: {budget_tokens: 0}", r"agents\.worker\.handoff\.budget_tokens"),
            ("handoff: {max_iterations: 0}", r"agents\.worker\.handoff\.max_iterations"),
            ("handoff: {continuation: poem}", r"agents\.worker\.handoff\.continuation"),
            ("handoff: {treshold: 0.5}", r"agents\.worker\.handoff\.treshold: unknown key"),
            ("handoff: 0.7", r"agents\.worker\.handoff"),
            ("model: {kind: scripted, context_window: 0}",
             r"agents\.worker\.model\.context_window: .*greater than or equal to 1"),
            ("model: {kind: openai, name: m, base_url: 'http://127.0.0.1:9/v1', "
             "context_window: -1}", r"agents\.worker\.model\..*context_window")):
        with pytest.raises(ConfigurationError, match=reason):
            load_config(write(tmp_path, MINIMAL + f"  worker:\n    {text}\n"))
    # What the agent checks when it is built is told with the agent's name.
    with pytest.raises(ConfigurationError, match=r"agents\.worker: .*handoff needs "
                       r"stateless_checkpointing"):
        load_config(write(tmp_path, MINIMAL + "  worker:\n    handoff: {}\n"
                          "    stateless_checkpointing: false\n")).build_agent("worker")
    with pytest.raises(ConfigurationError, match=r"agents\.worker: .*the built-in tool "
                       r"'handoff' of its handoff has the name of one of its tools"):
        load_config(write(tmp_path, MINIMAL + """
  worker:
    handoff: {}
    tools: [{name: handoff, function: "tests.unit.test_config:lookup_tool"}]
""")).build_agent("worker")
    # Phases: each names an agent of the file that takes handoffs.
    phased = load_config(write(tmp_path, MINIMAL + """
  writer:
    handoff: {phases: [{name: draft}, {name: review, agent: reviewer,
                                      instruction: Check it.}]}
  reviewer: {handoff: {}}
""")).build_agent("writer").handoff
    assert phased is not None and [(p.name, p.agent) for p in phased.phases] == [
        ("draft", None), ("review", "reviewer")]
    for extra, reason in (
            ("", r"agents\.writer\.handoff\.phases\.1\.agent: 'nobody' is not an agent"),
            ("  nobody: {}\n", r"agents\.writer\.handoff\.phases\.1\.agent: agent 'nobody' "
                               r"has no handoff: section")):
        with pytest.raises(ConfigurationError, match=reason):
            load_config(write(tmp_path, MINIMAL + extra + """
  writer:
    handoff: {phases: [{name: draft}, {name: review, agent: nobody}]}
"""))


async def test_the_store_sections_limits_reach_the_store(tmp_path: Path) -> None:
    """``store: max_decompressed_bytes`` bounds what the opened store inflates (a
    context past it is refused when written, naming the key), and
    ``migration_lock_timeout_s`` is checked as a positive time."""
    from meshpoint import TaskExecutionContext
    from meshpoint.errors import InvalidArgumentError

    config = load_config(write(tmp_path, MINIMAL.replace(
        "store: sqlite:///mesh.db", f"store:\n  url: sqlite:///{tmp_path}/m.db\n"
        "  max_decompressed_bytes: 4096\n  migration_lock_timeout_s: 5")))
    assert (config.store.max_decompressed_bytes, config.store.migration_lock_timeout_s) == (
        4096, 5.0)
    defaults = load_config(write(tmp_path, MINIMAL)).store
    assert (defaults.max_decompressed_bytes, defaults.migration_lock_timeout_s) == (
        64 << 20, 60.0)
    store = await config.open_store()
    try:
        ctx = TaskExecutionContext("t1", {"notes": "x" * 20_000})
        ctx.current_invocation_id = "inv"
        ctx.register_peer_sub_task("t1/a", {"peer_agent_name": "p"})
        with pytest.raises(InvalidArgumentError, match=r"max_decompressed_bytes \(4096"):
            await store.checkpoint_task(ctx, "coordinator")
    finally:
        await store.close()
    with pytest.raises(ConfigurationError, match="migration_lock_timeout_s"):
        load_config(write(tmp_path, MINIMAL.replace(
            "store: sqlite:///mesh.db", "store:\n  url: sqlite:///m.db\n"
            "  migration_lock_timeout_s: 0")))


def test_encryption_leaves_the_families_it_is_told_in_clear(tmp_path: Path) -> None:
    from meshpoint.history.encryption import EncryptionKeys, save_keyring

    save_keyring(EncryptionKeys.generate("default"), tmp_path / "keys.json")
    text = MINIMAL + (f"history: {{encryption: {{keyring: {tmp_path / 'keys.json'}, "
                      "exclude: [events, langgraph]}}\n")
    options = load_config(write(tmp_path, text)).history.options()
    assert options.encrypt_exclude == {"events", "langgraph"}
    assert options.seals("conversation") and not options.seals("events")
def test_approvers_clients_and_broker_users(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """``approvers:`` and ``clients:`` name agents and tools of the file; the broker's
    user and password come from the environment, the password never in a repr; a
    client's or approver's process uses the client id its NATS user may."""
    from meshpoint.runtime.approvers import ApproverKey
    from meshpoint.runtime.subjects import tenant_token

    key = ApproverKey.generate("cfo@example.com")
    (tmp_path / "cfo.pub.pem").write_text(key.public_pem())
    monkeypatch.setenv("PW", "s3cret-password")
    broker = "{url: 'nats://127.0.0.1:4222', user: travel.client.web, password: '${PW}'}"
    text = MINIMAL.replace("broker: memory://", f"broker: {broker}") + f"""
clients:
  web: {{agents: [coordinator]}}
approvers:
  cfo@example.com: {{key: "file:{tmp_path / 'cfo.pub.pem'}", agents: {{flights: ["*"]}}}}
"""
    config = load_config(write(tmp_path, text))
    assert "s3cret" not in repr(config) and "s3cret" not in repr(config.broker)
    assert config.broker.password is not None
    assert config.broker.password.get_secret_value() == "s3cret-password"
    assert len(config.build_approvers()) == 1
    assert config.client(object()).client_id == "web"  # type: ignore[arg-type]
    approver = config.model_copy(update={"broker": config.broker.model_copy(
        update={"user": "travel.approver." + tenant_token("cfo@example.com")})})
    assert approver.client(object()).client_id == tenant_token(  # type: ignore[arg-type]
        "cfo@example.com")
    for bad, expected in (
            ("clients: {web: {agents: [nobody]}}", "clients.web.agents: 'nobody' is not an "
                                                   "agent"),
            ("approvers: {x: {key: k, agents: {nobody: ['*']}}}",
             "approvers.x.agents: 'nobody' is not an agent"),
            ("approvers: {x: {key: k, agents: {flights: [refund]}}}",
             "approvers.x.agents.flights: 'refund' is not a tool of agent 'flights'"),
            ("approvers: {x: {key: k, agents: {}}}", "approvers.x.agents")):
        with pytest.raises(ConfigurationError, match=re.escape(expected)):
            load_config(write(tmp_path, MINIMAL + bad + "\n"))
    broken = load_config(write(tmp_path, MINIMAL + "approvers: {x: {key: 'env:NOPE', "
                                                   "agents: {flights: ['*']}}}\n"))
    with pytest.raises(ConfigurationError, match="NOPE is not set"):
        broken.build_approvers()


def test_an_empty_schema_is_none_so_one_file_serves_sqlite_and_postgresql(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "mesh.yaml"
    path.write_text("store: {url: 'sqlite:///m.db', schema: '${MY_SCHEMA:-}'}\n")
    monkeypatch.delenv("MY_SCHEMA", raising=False)
    assert load_config(path).store.options()["schema"] is None
    monkeypatch.setenv("MY_SCHEMA", "support")
    assert load_config(path).store.options()["schema"] == "support"
