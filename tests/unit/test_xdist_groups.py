"""The suite's own set-up: ``make test`` runs it with ``--dist loadgroup``, and the tests
that must not run at once (the real model's, the chaos runs, the role tests) rely on
``xdist_group`` keeping each group on one worker. A pytest that drops the group from a
test's id (9.2 with pytest-xdist 3.8) would let them run side by side, silently."""

from __future__ import annotations

import pytest


@pytest.mark.xdist_group("suite_guard")
def test_an_xdist_group_keeps_its_tests_on_one_worker(request: pytest.FixtureRequest) -> None:
    if not getattr(request.config.option, "loadgroup", False):
        pytest.skip("not run by pytest-xdist with --dist loadgroup")
    assert request.node.nodeid.endswith("@suite_guard"), (
        f"pytest {pytest.__version__} dropped the xdist_group from {request.node.nodeid!r}: "
        "groups would run on several workers at once (see the pin in pyproject.toml)")
