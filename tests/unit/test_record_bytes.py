"""A history record's canonical bytes and hash for fixed inputs, pinned: however
:func:`meshpoint.history.planning.plan_record` builds the document, records written before a
change must still verify after it (their hashes cover these exact bytes)."""

from __future__ import annotations

import hashlib
from typing import Any

import pytest
from pydantic import BaseModel

from meshpoint.history import planning
from meshpoint.history.costs import Prices
from meshpoint.history.integrity import canonical
from meshpoint.history.planning import HistoryHead, HistoryOptions, plan_record
from meshpoint.history.record import (
    FILLED_ON_READ,
    CheckpointRecord,
    Compliance,
    ContextSummary,
    document_builder,
)

NOW = 1_700_000_000.25


def _doc() -> dict[str, Any]:
    """A checkpoint document that fills every part of a record: a peer and an
    approval pending, a completed call, tokens by model and source, the request's
    hash, and an agent's record part with fields of the schema and its own."""
    return {
        "current_invocation_id": "inv-2",
        "active_peer_sub_tasks": {
            "s1": {"peer_agent_name": "researcher", "function_call_id": "fc1"},
            "s2": {"approval": {"tool": "wire_money"}, "function_call_id": "fc2"},
            "s3": {"peer_agent_name": "writer", "function_call_id": "fc3"}},
        "parallel_tool_calls": {
            "inv-1": {"results": {"fa": {"x": 1}}},
            "inv-2": {"results": {"fc0": {"ok": True}, "fc9": "done"}}},
        "flags": {"model_calls": 3},
        "a2a_context": {"request_sha256": "ab" * 32},
        "token_usage": {
            "totals": {"prompt_tokens": 1500, "completion_tokens": 250,
                       "cached_tokens": 100},
            "by_model": {"m1": {"prompt_tokens": 1000, "completion_tokens": 200,
                                "cached_tokens": 100},
                         "m2": {"prompt_tokens": 500, "completion_tokens": 50}},
            "by_source": {"self": {"prompt_tokens": 1200, "completion_tokens": 220},
                          "peer:researcher": {"prompt_tokens": 300,
                                              "completion_tokens": 30}}},
        "history": {
            "agent_type": "implementation", "iteration": 2,
            "retention_policy": "days:30",
            "record": {
                "execution_state": {"phase": "implementing", "blocked_items": ["b"],
                                    "own_state": {"k": [1, 2.5, None]}},
                "context_summary": {"key_decisions": ["use A"], "assumptions": [],
                                    "notes": "é ünïcode \u2028"},
                "metrics": {"files_modified": ["a.py"], "tests_status": {"passed": 3},
                            "lines": 12},
                "recovery": {"continuation_prompt": "go on", "extra": True},
                "extensions": {"vendor": {"n": 1}}}},
    }


HEAD = HistoryHead(
    checkpoint_id="0190a000-0000-7000-8000-000000000001", hash="cd" * 32, seq=4,
    tokens={"totals": {"prompt_tokens": 1000, "completion_tokens": 100},
            "by_model": {"m1": {"prompt_tokens": 1000, "completion_tokens": 100}},
            "by_source": {"self": {"prompt_tokens": 1000, "completion_tokens": 100}}},
    pruned_through=1, pruned_hash="ef" * 32)

OPTIONS = HistoryOptions(prices=Prices({"m1": {"prompt_tokens": 3, "completion_tokens": 15,
                                               "cached_tokens": 0.3}}))

CASES = {
    # status, phase, doc, head, snapshot context: sha256 of the canonical bytes, hash.
    # (The two with tokens changed once, on purpose: metrics.cost gained its cost by
    # source, here all "unattributed"; records written before still verify, their
    # hashes covering the bytes they were written with.)
    "first, empty": (
        "waiting_peers", None, {}, None, {"a": 1},
        "fc755638f30733d17bfb274b489e029b334fa6561bcdaa215c391d8d3a88731f",
        "fc755638f30733d17bfb274b489e029b334fa6561bcdaa215c391d8d3a88731f"),
    "later, full": (
        "input_required", "input_required", "FULL", HEAD, {"ctx": "x" * 50},
        "d7ab0b172ba6216d92f7211d6f16a6d5025c732673fe37f3b4cef4070292792d",
        "d3279949d567acc4ffaedfc18150aaab68b4cb6d50d727b634fea243916faa23"),
    "end": (
        "completed", None, "FULL", HEAD, None,
        "1a5243d9e13ff85c43e418de8ffc13ff310cbbf89f1c92ffca11de486b62f7eb",
        "3c2efd6b0ca9b4b4ca6ebf4cb3b8b91fe0c17cb1ab111858e6771a588581c64a"),
}


def _planned(name: str, monkeypatch: pytest.MonkeyPatch) -> planning.PlannedRecord:
    status, phase, doc, head, snapshot, *_ = CASES[name]
    monkeypatch.setattr(planning, "new_checkpoint_id",
                        lambda: "0190a000-0000-7000-8000-0000000000ff")
    return plan_record(
        tenant_id="acme", task_id="t-42", agent_name="coder", status=status, phase=phase,
        doc=_doc() if doc == "FULL" else doc, context_sha256="12" * 32,
        session_event_count=17, head=head, now=NOW, options=OPTIONS,
        compress_threshold=1 << 20, snapshot_context=snapshot)


@pytest.mark.parametrize("name", list(CASES))
def test_a_records_canonical_bytes_and_hash_are_pinned(
        name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    planned = _planned(name, monkeypatch)
    *_, bytes_sha, record_hash = CASES[name]
    assert hashlib.sha256(canonical(planned.document)).hexdigest() == bytes_sha
    assert planned.hash == record_hash


def test_a_records_document_has_its_models_fields_and_validates(
        monkeypatch: pytest.MonkeyPatch) -> None:
    document = _planned("first, empty", monkeypatch).document
    assert list(document) == list(CheckpointRecord.model_fields)
    for name, spec in CheckpointRecord.model_fields.items():
        model = spec.annotation
        if isinstance(model, type) and issubclass(model, BaseModel):
            assert list(document[name]) == [
                field for field in model.model_fields
                if field not in FILLED_ON_READ.get(model, ())], name
    assert CheckpointRecord.model_validate(document, strict=True).compliance.hash is None
    full = _planned("later, full", monkeypatch).document
    assert full["recovery"]["extra"] is True  # an agent's own field, merged
    assert CheckpointRecord.model_validate(full).execution_state.phase == "implementing"


def test_a_document_builder_refuses_what_its_model_does_not_define() -> None:
    build = document_builder(ContextSummary)
    with pytest.raises(TypeError, match="key_decision"):
        build(key_decision=[])
    with pytest.raises(TypeError, match="parent_hash"):
        document_builder(Compliance)()
    first, second = build(), build()
    assert first == second == {"key_decisions": [], "assumptions": [], "constraints": [],
                               "external_dependencies": []}
    assert first["assumptions"] is not second["assumptions"]  # made anew, not shared
