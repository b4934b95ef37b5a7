"""The demo's verdict (:func:`meshpoint.demo.scripted.shortfalls`): ``meshpoint demo``
exits non-zero unless its figures prove what its table shows."""

from __future__ import annotations

from typing import Any

import pytest

from meshpoint.demo.handoffs import long_task_count
from meshpoint.demo.scripted import shortfalls


def figures(**changed: Any) -> dict[str, Any]:
    good = {"submitted": 40, "completed": 40, "rows_left": 0, "chains_failed": 0,
            "long_tasks": 2, "fewest_handoffs_per_long_task": 3,
            "max_utilization_at_handoff": 0.56, "utilization_threshold": 0.70}
    return {**good, **changed}


def test_a_run_that_proves_its_claims_has_no_shortfall() -> None:
    assert shortfalls(figures()) == []
    # No handoff of the utilization trigger: nothing to hold against the threshold.
    assert shortfalls(figures(max_utilization_at_handoff=None)) == []
    # No long task: the handoff figures are not looked at.
    assert shortfalls(figures(long_tasks=0, fewest_handoffs_per_long_task=None)) == []


@pytest.mark.parametrize(("changed", "said"), [
    ({"completed": 39}, "1 task(s) not completed"),
    ({"rows_left": 2}, "2 live row(s) left behind"),
    ({"chains_failed": 1}, "1 history chain(s) fail verification"),
    ({"stages_run_again": 2}, "2 workflow stage(s) ran twice"),
    ({"fewest_handoffs_per_long_task": 1}, "a long task handed off 1 time(s), not at least"),
    ({"fewest_handoffs_per_long_task": None}, "a long task handed off 0 time(s)"),
    ({"max_utilization_at_handoff": 0.70}, "a handoff came at 0.70 of the context window"),
])
def test_each_shortfall_is_named(changed: dict[str, Any], said: str) -> None:
    found = shortfalls(figures(**changed))
    assert len(found) == 1 and found[0].startswith(said), found


@pytest.mark.parametrize(("tasks", "share", "long"), [
    (200, 0.05, 10), (12, 0.05, 0), (20, 0.05, 1), (40, 0.2, 8), (5, 1.0, 5), (7, 0.0, 0)])
def test_the_long_tasks_are_a_share_of_the_tasks_rounded_down(
        tasks: int, share: float, long: int) -> None:
    assert long_task_count(tasks, share) == long
