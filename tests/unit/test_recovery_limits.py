"""The recovery limits' options and the breaker's transitions, without I/O (the store's
transactions around them: tests/integration/test_recovery_limits.py)."""

from __future__ import annotations

import pytest

from meshpoint.config import MeshConfig
from meshpoint.errors import InvalidArgumentError
from meshpoint.runtime.options import AlertOptions, RecoveryPolicy
from meshpoint.store.breakers import admit, noted
from meshpoint.store.results import BreakerState

CLOSED = BreakerState("closed", 0, None, None, None, None)
LIMITS = {"failures": 3, "window_s": 10.0, "cooldown_s": 5.0}


@pytest.mark.parametrize("bad", [{"max_recoveries": -1}, {"breaker_failures": -1},
                                 {"breaker_window_s": 0}, {"breaker_cooldown_s": 0},
                                 {"breaker_cooldown_s": float("inf")}])
def test_bad_recovery_limits_are_refused_naming_the_option(bad: dict[str, float]) -> None:
    with pytest.raises(InvalidArgumentError, match=next(iter(bad))):
        RecoveryPolicy(**bad)  # type: ignore[arg-type]


def test_the_defaults_and_the_yaml_keys() -> None:
    policy = RecoveryPolicy()
    assert (policy.max_recoveries, policy.breaker_failures, policy.breaker_window_s,
            policy.breaker_cooldown_s) == (3, 5, 60.0, 30.0)
    config = MeshConfig.model_validate({
        "store": "sqlite:///x.db", "alerts": {"webhook": "https://ops.example/hook"},
        "agents": {"a": {"model": {"kind": "scripted"}, "checkpoint": {"recovery": {
            "max_recoveries": 1, "breaker_failures": 0}}}}})
    assert config.alerts.webhook == "https://ops.example/hook"
    assert config.agents["a"].checkpoint.recovery.max_recoveries == 1
    with pytest.raises(InvalidArgumentError, match="webhook"):
        AlertOptions(webhook="ftp://ops.example/hook")


def test_failures_open_the_breaker_within_the_window_only() -> None:
    state = noted(CLOSED, "failure", "a", 100.0, **LIMITS)
    state = noted(state, "failure", "b", 105.0, **LIMITS)
    assert (state.state, state.failures) == ("closed", 2)
    assert noted(state, "failure", "c", 111.0, **LIMITS).failures == 1, "a new window"
    assert noted(state, "success", "c", 106.0, **LIMITS) == state, "a success counts nothing"
    opened = noted(state, "failure", "c", 106.0, **LIMITS)
    assert (opened.state, opened.opened_until) == ("open", 111.0)


def test_one_trial_after_the_cool_down_decides() -> None:
    opened = BreakerState("open", 0, None, 111.0, None, None)
    assert admit(opened, "a", 110.0, 3.0) == (False, opened)
    allowed, trial = admit(opened, "a", 111.0, 3.0)
    assert allowed and (trial.state, trial.trial_owner, trial.trial_until) == (
        "half_open", "a", 114.0)
    assert admit(trial, "b", 112.0, 3.0)[0] is False
    assert admit(trial, "b", 114.0, 3.0)[1].trial_owner == "b", "a lapsed trial goes on"
    assert noted(trial, "failure", "b", 112.0, **LIMITS) == trial, "not the trial's"
    assert noted(trial, "failure", "a", 112.0, **LIMITS).state == "open"
    assert noted(trial, "success", "a", 112.0, **LIMITS) == CLOSED
