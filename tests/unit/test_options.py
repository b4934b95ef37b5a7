"""The option groups: one type each, for the Python API and the config file alike.

Built from Python a group validates strictly and a mistake is an InvalidArgumentError
naming the class, the argument and what was expected; read from the file it is the
file's section, told with the key's path (tests/unit/test_config.py has the rest).
"""

from __future__ import annotations

import dataclasses
import math
import re
from pathlib import Path
from typing import Any

import pytest

from meshpoint.broker import ConsumerOptions
from meshpoint.config import CheckpointConfig, MeshConfig, RuntimeConfig, load_config
from meshpoint.errors import ConfigurationError, InvalidArgumentError
from meshpoint.llm.scripted import ScriptedModel
from meshpoint.runtime import Agent, LocalTool, Peer, RuntimeOptions
from meshpoint.runtime.agent import CheckpointPolicy, HandoffPolicy, Phase, RecoveryPolicy


@pytest.mark.parametrize(("build", "expected"), [
    (lambda: RuntimeOptions(lease_ttl_s=0), "RuntimeOptions.lease_ttl_s must be greater "
                                            "than 0, got 0"),
    (lambda: RuntimeOptions(sweep_interval_s="1"), "RuntimeOptions.sweep_interval_s must "
                                                   "be a valid number, got '1'"),
    (lambda: RuntimeOptions(recovery_interval_s=True), "recovery_interval_s must be a "
                                                       "valid number, got True"),
    (lambda: RuntimeOptions(max_deliver=0), "RuntimeOptions.max_deliver must be greater "
                                            "than or equal to 1, got 0"),
    (lambda: RuntimeOptions(max_message_bytes=100), "max_message_bytes must be greater "
                                                    "than or equal to 1024, got 100"),
    (lambda: RuntimeOptions(namespace="a.b"), "RuntimeOptions.namespace must be 1-64 "
                                              "letters, digits, '_' or '-', got 'a.b'"),
    (lambda: RuntimeOptions(lease_ttl=3), "RuntimeOptions.lease_ttl: unknown argument; "
                                          "expected one of: announce_check_s, lease_ttl_s, "
                                          "max_deliver"),
    (lambda: CheckpointPolicy(strategy="often"), "CheckpointPolicy.strategy must be "
                                                 "'event', 'interval' or 'hybrid'"),
    (lambda: CheckpointPolicy(interval=-1), "CheckpointPolicy.interval must be greater "
                                            "than or equal to 0, got -1"),
    (lambda: CheckpointPolicy(strategy="hybrid"), "CheckpointPolicy: checkpoint strategy "
                                                  "'hybrid' needs an interval > 0"),
    (lambda: CheckpointPolicy(after_tools=1), "CheckpointPolicy.after_tools must be a "
                                              "valid boolean, got 1"),
    (lambda: RecoveryPolicy(timeout_s=-1), "RecoveryPolicy.timeout_s must be greater than "
                                           "or equal to 0, got -1"),
    (lambda: RecoveryPolicy(timeout_s=math.inf), "RecoveryPolicy.timeout_s must be a "
                                                 "finite number, got inf"),
    (lambda: Peer("a b"), "Peer.agent must be 1-64 letters, digits, '_' or '-', got 'a b'"),
    (lambda: Peer("a", "", 0), "Peer.timeout_s must be greater than 0, got 0"),
    (lambda: Peer("a", tool_name="ask a"), "Peer.tool_name must be 1-64 letters"),
    (lambda: Peer(), "Peer.agent: required argument is missing"),
    (lambda: ConsumerOptions(ack_wait_s=-1), "ConsumerOptions.ack_wait_s must be greater "
                                             "than 0, got -1"),
    (lambda: ConsumerOptions(max_in_flight=0), "ConsumerOptions.max_in_flight must be "
                                               "greater than or equal to 1, got 0"),
    (lambda: dataclasses.replace(RuntimeOptions(), lease_ttl_s=-2), "lease_ttl_s must be "
                                                                     "greater than 0"),
    (lambda: Agent("a", ScriptedModel(), max_turns=0), "agent 'a': max_turns must be "
                                                       "greater than or equal to 1, got 0"),
    (lambda: Agent("a", ScriptedModel(), agent_type="x" * 65), "agent 'a': agent_type must "
                                                               "have at most 64 characters"),
    (lambda: LocalTool("t", "", print, approval_timeout_s=math.inf),
     "tool 't': approval_timeout_s must be a finite number, got inf"),
    (lambda: HandoffPolicy(context_utilization=1.5), "HandoffPolicy.context_utilization "
                                                     "must be less than or equal to 1"),
    (lambda: HandoffPolicy(budget_warning=0), "HandoffPolicy.budget_warning must be "
                                              "greater than 0, got 0"),
    (lambda: HandoffPolicy(budget_tokens=0), "HandoffPolicy.budget_tokens must be greater "
                                             "than or equal to 1, got 0"),
    (lambda: HandoffPolicy(consecutive_errors=0), "consecutive_errors must be greater "
                                                  "than or equal to 1, got 0"),
    (lambda: HandoffPolicy(continuation="llm"), "HandoffPolicy.continuation must be "
                                                "'deterministic' or 'model'"),
    (lambda: HandoffPolicy(phases=(Phase("a"), Phase("a"))), "phase names ['a'] are used "
                                                             "twice"),
    (lambda: Agent("a", ScriptedModel(), tools=[LocalTool("handoff", "", print)],
                   handoff=HandoffPolicy()),
     "agent 'a': the built-in tool 'handoff' of its handoff has the name of one of its tools"),
    (lambda: Agent("a", ScriptedModel(), stateless_checkpointing=False,
                   handoff=HandoffPolicy()), "agent 'a': handoff needs stateless_checkpointing"),
])
def test_a_bad_option_is_named_with_what_was_expected(build: Any, expected: str) -> None:
    with pytest.raises(InvalidArgumentError, match=re.escape(expected)):
        build()


def test_good_options_keep_what_they_were_given() -> None:
    options = RuntimeOptions(namespace="ns", lease_ttl_s=1, max_deliver=3)
    assert (options.lease_ttl_s, options.max_deliver, options.namespace) == (1.0, 3, "ns")
    assert options.ended_task_memory_s == 2 * 60.0 * 3
    assert dataclasses.replace(options, lease_ttl_s=2).lease_ttl_s == 2.0
    assert Peer("flights", "Books flights.", 60).tool == "ask_flights"
    assert CheckpointPolicy("interval", 2).before_model_call(4)
    assert {CheckpointPolicy(after_tools=True): 1}[CheckpointPolicy(after_tools=True)] == 1
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.lease_ttl_s = 5  # type: ignore[misc]


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "mesh.yaml"
    path.write_text(text)
    return path


BASE = """
namespace: travel
store: sqlite:///mesh.db
broker: memory://
agents:
  flights: {}
  coordinator:
    peers: [{agent: flights, timeout_s: 5}]
    checkpoint: {strategy: interval, interval: 2, recovery: {timeout_s: 0}}
"""


def test_the_file_reads_the_python_apis_types(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LEASE", "7")
    config = load_config(write(tmp_path, BASE + "runtime: {lease_ttl_s: '${LEASE}', "
                                                "drain_timeout_s: 3}\n"))
    assert isinstance(config.runtime, RuntimeOptions) and config.runtime.lease_ttl_s == 7.0
    options = config.runtime_options()
    assert type(options) is RuntimeOptions and options.namespace == "travel"
    assert options.lease_ttl_s == 7.0 and config.runtime.drain_timeout_s == 3.0
    coordinator = config.build_agent("coordinator")
    assert coordinator.peers == (Peer("flights", timeout_s=5),)
    assert type(coordinator.checkpoint) is CheckpointPolicy
    assert coordinator.checkpoint == CheckpointPolicy("interval", 2)
    assert coordinator.recovery == RecoveryPolicy(timeout_s=0)
    assert issubclass(RuntimeConfig, RuntimeOptions)
    assert issubclass(CheckpointConfig, CheckpointPolicy)
    assert MeshConfig.model_fields["runtime"].annotation is RuntimeConfig


@pytest.mark.parametrize(("text", "expected"), [
    ("runtime: {namespace: other}\n",
     "runtime: namespace is set at the top level of the file, not under runtime:"),
    ("runtime: {lease_ttl: 3}\n",
     "runtime.lease_ttl: unknown key; expected one of: announce_check_s, drain_timeout_s, "
     "lease_ttl_s, max_deliver, max_in_flight, max_message_bytes, recovery_interval_s"),
    ("runtime: {lease_ttl_s: 0}\n", "runtime.lease_ttl_s: Input should be greater than 0 "
                                    "(got 0)"),
    ("  worker: {checkpoint: {strategy: hybrid}}\n",
     "agents.worker.checkpoint: checkpoint strategy 'hybrid' needs an interval > 0"),
    ("  worker: {checkpoint: {recovery: {timeout_s: .inf}}}\n",
     "agents.worker.checkpoint.recovery.timeout_s: Input should be a finite number"),
    ("  worker: {peers: [{agent: flights, timeout_s: 1, retries: 2}]}\n",
     "agents.worker.peers.0.retries: unknown key; expected one of: agent, description, "
     "timeout_s, tool_name"),
    ("  worker: {peers: [{agent: flights, tool_name: 'ask them'}]}\n",
     "agents.worker.peers.0.tool_name: must be 1-64 letters, digits, '_' or '-' "
     "(got 'ask them')"),
])
def test_the_files_mistakes_in_those_types_name_the_key(tmp_path: Path, text: str,
                                                       expected: str) -> None:
    if text.startswith("runtime"):
        text = BASE + text
    else:
        text = BASE.replace("agents:\n", "agents:\n" + text)
    with pytest.raises(ConfigurationError) as caught:
        load_config(write(tmp_path, text))
    assert expected in str(caught.value)


@pytest.mark.parametrize(("old", "new"), [("PeerConfig", Peer),
                                          ("RecoveryConfig", RecoveryPolicy)])
def test_the_config_sections_that_went_are_the_python_types(old: str, new: type) -> None:
    import meshpoint.config

    with pytest.warns(DeprecationWarning, match=f"meshpoint.config.{old} is"):
        assert getattr(meshpoint.config, old) is new
    with pytest.raises(AttributeError):
        meshpoint.config.NoSuchConfig  # noqa: B018
