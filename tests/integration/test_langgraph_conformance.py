"""LangGraph's own conformance suite on meshpoint's saver, on SQLite and PostgreSQL
(and PostgreSQL's portable bodies): level FULL with every capability the suite knows
implemented and detected, run twice: the release the ``test`` extra pins
(``langgraph-checkpoint-conformance`` 0.0.2, the newest on PyPI: three extended
capabilities, prune, copy_thread and delete_for_runs, 81 tests) and LangGraph's source
(``tests/vendor/langgraph_conformance``, see its README: a fourth, delta channel
history, 89 tests). Each runs with the tenant's encryption off and on.

A FULL over no detected extended capability would be a pass of nothing, so the test
also asserts how many of the suite's tests ran and that each extended capability was
detected and passed.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from importlib.metadata import version
from typing import Any

import pytest

pytest.importorskip("langgraph.checkpoint.conformance")

import importlib

from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.conformance.capabilities import DetectedCapabilities

from meshpoint.history.encryption import EncryptionKeys
from meshpoint.history.planning import HistoryOptions
from meshpoint.integrations.langgraph import MeshpointSaver
from meshpoint.store import open_store
from tests.conftest import BACKEND_OPTIONS, fresh_pg_schema, pg_execute_async

pytestmark = pytest.mark.portable_too

#: The suites: the released package, and LangGraph's source; the tests each runs at FULL.
SUITES = {"release": ("langgraph.checkpoint.conformance", 81),
          "source": ("tests.vendor.langgraph_conformance", 89)}


@pytest.fixture(params=["clear", "encrypted"])
async def open_saver(backend: str, request: pytest.FixtureRequest,
                     tmp_path: Any) -> AsyncIterator[Any]:
    """A factory of savers, each on a fresh database (a SQLite file, or a PostgreSQL
    schema dropped afterwards), as the suite wants one per capability; ``encrypted``:
    with the tenant's encryption on, every row of the saver sealed."""
    schemas: list[str] = []
    counter = iter(range(1000))
    history = HistoryOptions(encryption=EncryptionKeys.generate("default")) \
        if request.param == "encrypted" else None

    async def factory() -> MeshpointSaver:
        if backend == "sqlite":
            return await MeshpointSaver.open(f"sqlite:///{tmp_path}/c{next(counter)}.db",
                                             history=history)
        url = request.getfixturevalue("postgres_url")
        schema = await fresh_pg_schema()
        schemas.append(schema)
        store = await open_store(url, schema=schema, history=history,
                                 **BACKEND_OPTIONS[backend])
        return MeshpointSaver(store, owns_store=True)

    yield factory
    for schema in schemas:
        await pg_execute_async(f"DROP SCHEMA {schema} CASCADE")


@pytest.mark.parametrize("suite", SUITES)
async def test_langgraph_conformance_at_full_with_every_extended_capability(
        open_saver: Any, suite: str) -> None:
    package, expected = SUITES[suite]
    conformance = importlib.import_module(package)
    capabilities = importlib.import_module(f"{package}.capabilities")
    checkpointer_test, validate = conformance.checkpointer_test, conformance.validate

    @checkpointer_test(name=f"MeshpointSaver-{uuid.uuid4().hex[:6]}")
    async def saver() -> AsyncIterator[BaseCheckpointSaver[str]]:
        created = await open_saver()
        try:
            yield created
        finally:
            await created.aclose()

    report = await validate(saver)
    failures = {name: r.failures for name, r in report.results.items() if r.failures}
    assert failures == {}, failures
    assert report.conformance_level() == "FULL"
    known = {c.value for c in capabilities.Capability}
    assert {name for name, r in report.results.items() if r.detected} == known, \
        "every capability the suite knows is detected"
    extended = {c.value for c in capabilities.EXTENDED_CAPABILITIES}
    assert extended <= {name for name, r in report.results.items() if r.passed}
    if suite == "source":
        assert extended == {"prune", "copy_thread", "delete_for_runs",
                            "delta_channel_history"}
    ran = sum(r.tests_passed for r in report.results.values())
    assert ran == expected, (
        f"the {suite} suite (langgraph-checkpoint-conformance "
        f"{version('langgraph-checkpoint-conformance')} installed) ran {ran} tests")


def test_the_delta_channel_history_capability_is_detected_as_langgraph_detects_it() -> None:
    """The suite's unreleased fourth extended capability is detected by an override of
    ``aget_delta_channel_history``, as the three released ones are of their methods."""
    for method in ("aget_delta_channel_history", "get_delta_channel_history", "aprune",
                   "acopy_thread", "adelete_for_runs"):
        assert getattr(MeshpointSaver, method) is not getattr(BaseCheckpointSaver, method)
    detected = DetectedCapabilities.from_instance(object.__new__(MeshpointSaver))
    assert detected.missing == frozenset()
