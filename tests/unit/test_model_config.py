"""The ``model:`` section of the mesh config: every key reaches the model, a local
endpoint needs no key, a model class of one's own is named by import path, and
mistakes list the keys that exist."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from meshpoint.config import OpenAIModelConfig, load_config
from meshpoint.errors import ConfigurationError, InvalidArgumentError
from meshpoint.llm import ModelResponse, ScriptedModel, ToolSpec
from meshpoint.llm.openai import OpenAIModel

BASE = """\
store: sqlite:///mesh.db
broker: memory://
agents:
  coordinator:
    model: {model}
"""


def config_with(tmp_path: Path, model: str) -> Any:
    path = tmp_path / "mesh.yaml"
    path.write_text(BASE.format(model=model))
    return load_config(path)


async def test_every_openai_key_reaches_the_adapter(tmp_path: Path) -> None:
    config = config_with(tmp_path, (
        "{kind: openai, name: smol, base_url: 'http://127.0.0.1:9/v1', timeout_s: 30, "
        "max_retries: 1, retry_timeouts: true, max_tokens: 64, temperature: 0.2, top_p: 0.9, "
        "seed: 7, stop: ['END'], tool_choice: required, parallel_tool_calls: true, "
        "tool_mode: json, json_format: json_object, json_calls_per_tool: 2, "
        "max_tool_rounds: 1, repair_attempts: 3, extra_body: {cache_prompt: true}, "
        "max_reply_bytes: 65536}"))
    model = config.build_agent("coordinator").model
    assert isinstance(model, OpenAIModel)
    assert (model.name, model.tool_mode, model.json_format, model.max_tokens,
            model.tool_choice) == ("smol", "json", "json_object", 64, "required")
    assert model.json_calls_per_tool == 2
    assert (model.parallel_tool_calls, model.max_tool_rounds, model.repair_attempts,
            model.max_retries, model.retry_timeouts) == (True, 1, 3, 1, True)
    request = model._request([{"role": "user", "content": "hi"}], [], [], None, [])
    assert {k: request[k] for k in ("max_tokens", "temperature", "top_p", "seed", "stop",
                                    "extra_body")} == {
        "max_tokens": 64, "temperature": 0.2, "top_p": 0.9, "seed": 7, "stop": ["END"],
        "extra_body": {"cache_prompt": True}}
    assert model._client.timeout == 30 and model._client.max_retries == 0
    assert (model.timeout_s, model.max_reply_bytes) == (30, 65536)
    assert str(model._client.base_url) == "http://127.0.0.1:9/v1/"
    await model.close()


def test_every_config_key_is_documented() -> None:
    """docs/models.md has a row for each key of the openai model section."""
    docs = (Path(__file__).parents[2] / "docs" / "models.md").read_text()
    missing = [key for key in OpenAIModelConfig.model_fields
               if f"| `{key}` |" not in docs]
    assert missing == []


async def test_defaults_bound_a_generation(tmp_path: Path) -> None:
    model = config_with(tmp_path, "{kind: openai, name: smol, base_url: 'http://x/v1'}") \
        .build_agent("coordinator").model
    request = model._request([{"role": "user", "content": "hi"}], [], [], None, [])
    assert request["max_tokens"] == 1024
    assert "temperature" not in request and "tools" not in request
    assert model.retry_timeouts is False
    await model.close()
    unbounded = config_with(tmp_path, "{kind: openai, name: s, base_url: 'http://x/v1', "
                                      "max_tokens: null}").build_agent("coordinator").model
    assert "max_tokens" not in unbounded._request([], [], [], None, [])
    await unbounded.close()


async def test_a_local_endpoint_needs_no_key_and_gets_none(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-meant-for-openai")
    model = config_with(tmp_path, "{kind: openai, name: smol, base_url: "
                                  "'http://127.0.0.1:8080/v1'}").build_agent("coordinator").model
    # OpenAI's key is not sent to another endpoint unless api_key_env names it.
    assert model._client.api_key == "unused"
    await model.close()
    monkeypatch.setenv("VLLM_KEY", "k-1")
    model = config_with(tmp_path, "{kind: openai, name: smol, base_url: 'http://h/v1', "
                                  "api_key_env: VLLM_KEY}").build_agent("coordinator").model
    assert model._client.api_key == "k-1"
    await model.close()


def test_openai_itself_needs_its_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    config = config_with(tmp_path, "{kind: openai, name: gpt-4o-mini}")
    with pytest.raises(ConfigurationError, match=re.escape(
            "agents.coordinator.model: the API key variable OPENAI_API_KEY is not set "
            "(OpenAI's endpoint; set base_url for another)")):
        config.build_agent("coordinator")
    monkeypatch.delenv("MY_KEY", raising=False)
    named = config_with(tmp_path, "{kind: openai, name: m, base_url: 'http://h/v1', "
                                  "api_key_env: MY_KEY}")
    with pytest.raises(ConfigurationError, match=r"MY_KEY is not set$"):
        named.build_agent("coordinator")


@pytest.mark.parametrize(("model", "expected"), [
    ("{kind: openai, name: m, max_tokenz: 5}",
     "agents.coordinator.model.max_tokenz: unknown key; expected one of: api_key_env, "
     "base_url, context_window, extra_body, json_calls_per_tool, json_format, kind, "
     "max_reply_bytes, "
     "max_retries, max_tokens, max_tool_rounds, name, parallel_tool_calls, repair_attempts, "
     "response_format, retry_timeouts, seed, stop, temperature, timeout_s, tool_choice, "
     "tool_mode, top_p"),
    ("{kind: openai, name: m, tool_mode: grammar}",
     "agents.coordinator.model.tool_mode: Input should be 'native' or 'json'"),
    ("{kind: openai, name: m, tool_choice: any}",
     "agents.coordinator.model.tool_choice: Input should be 'auto', 'required' or 'none'"),
    ("{kind: openai, name: m, max_tokens: 0}",
     "agents.coordinator.model.max_tokens: Input should be greater than or equal to 1"),
    ("{kind: openai, name: m, tool_mode: json, response_format: {type: json_object}}",
     "response_format cannot be set with tool_mode json"),
    ("{kind: python}", "agents.coordinator.model.factory: required key is missing"),
    ("{kind: python, factory: 'not a path'}",
     "agents.coordinator.model.factory: String should match pattern"),
    ("{kind: python, factory: 'x:y', option: {}}",
     "agents.coordinator.model.option: unknown key; expected one of: factory, kind, options"),
])
def test_model_mistakes_name_the_key_and_the_keys_that_exist(
        tmp_path: Path, model: str, expected: str) -> None:
    with pytest.raises(ConfigurationError) as caught:
        config_with(tmp_path, model)
    assert expected in str(caught.value)


class EchoModel:
    """A model of one's own, named in the YAML by import path."""

    def __init__(self, name: str = "echo", prefix: str = "") -> None:
        self.name = name
        self.prefix = prefix

    async def complete(self, messages: list[dict[str, Any]],
                       tools: list[ToolSpec]) -> ModelResponse:
        return ModelResponse(text=self.prefix + str(messages[-1]["content"]))


def not_a_model(**options: Any) -> object:
    return object()


def failing_model(**options: Any) -> object:
    raise InvalidArgumentError("temperature must be >= 0")


async def test_a_model_class_of_ones_own_is_named_by_import_path(tmp_path: Path) -> None:
    here = __name__
    config = config_with(tmp_path, f"{{kind: python, factory: '{here}:EchoModel', "
                                   "options: {name: mine, prefix: '> '}}")
    model = config.build_agent("coordinator").model
    assert isinstance(model, EchoModel) and model.name == "mine"
    assert (await model.complete([{"role": "user", "content": "hi"}], [])).text == "> hi"
    for factory, message in [
            ("no_such_module:M", "cannot import 'no_such_module:M'"),
            (f"{here}:not_a_model", f"{here}:not_a_model returned object, which is not a "
                                    "meshpoint.llm.Model"),
            (f"{here}:failing_model",
             f"{here}:failing_model(**options) failed: temperature must be >= 0"),
            (f"{here}:EchoModel", f"{here}:EchoModel(**options) failed: ")]:
        options = "{colour: red}" if factory.endswith("EchoModel") else "{}"
        bad = config_with(tmp_path, f"{{kind: python, factory: '{factory}', "
                                    f"options: {options}}}")
        with pytest.raises(ConfigurationError, match=re.escape(
                f"agents.coordinator.model: {message}")):
            bad.build_agent("coordinator")


@pytest.mark.parametrize(("options", "expected"), [
    ({"max_tokens": 0}, "max_tokens must be >= 1, got 0"),
    ({"tool_mode": "grammar"}, "tool_mode must be one of ('native', 'json'), got 'grammar'"),
    ({"tool_choice": "any"}, "tool_choice must be one of ('auto', 'required', 'none')"),
    ({"json_calls_per_tool": 0}, "json_calls_per_tool must be >= 1"),
    ({"json_format": "grammar"}, "json_format must be one of ('json_schema', 'json_object')"),
    ({"timeout_s": 0}, "timeout_s must be > 0"),
    ({"repair_attempts": -1}, "repair_attempts must be >= 0"),
    ({"max_tool_rounds": -1}, "max_tool_rounds must be >= 0"),
    ({"tool_mode": "json", "response_format": {"type": "json_object"}},
     "response_format cannot be set with tool_mode json"),
])
def test_bad_adapter_options_fail_when_it_is_made(options: dict[str, Any],
                                                  expected: str) -> None:
    with pytest.raises(InvalidArgumentError, match=re.escape(f"OpenAIModel: {expected}")):
        OpenAIModel("m", base_url="http://127.0.0.1:9/v1", **options)


def test_agents_share_a_model_named_under_models_and_a_variable_picks_one(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "mesh.yaml"
    path.write_text("""\
store: sqlite:///mesh.db
models:
  local: {kind: openai, name: smol, base_url: 'http://127.0.0.1:9/v1'}
  offline: {kind: scripted, persona: offline}
agents:
  support: {model: '${MY_MODEL:-local}'}
  policy: {model: '${MY_MODEL:-local}'}
""")
    config = load_config(path)
    for name in ("support", "policy"):
        model = config.build_agent(name).model
        assert isinstance(model, OpenAIModel) and model.name == "smol"
    monkeypatch.setenv("MY_MODEL", "offline")
    offline = load_config(path).build_agent("policy").model
    assert isinstance(offline, ScriptedModel) and offline.persona == "offline"
    monkeypatch.setenv("MY_MODEL", "remote")
    with pytest.raises(ConfigurationError, match=re.escape(
            "agents.support.model: 'remote' is not a model of this file (models: defines "
            "local, offline; or give the model itself")):
        load_config(path)
    path.write_text("store: sqlite:///m.db\nmodels: {local: {kind: openai}}\n")
    with pytest.raises(ConfigurationError, match=re.escape(
            "models.local.name: required key is missing")):
        load_config(path)
