"""Edited arguments are a JSON merge patch (RFC 7396) of the proposed ones: the
RFC's own examples (its Appendix A), and that neither value is changed in place."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from meshpoint.runtime.decisions import merge_patch

#: RFC 7396, Appendix A: (original, patch, result).
RFC_7396_EXAMPLES: list[tuple[Any, Any, Any]] = [
    ({"a": "b"}, {"a": "c"}, {"a": "c"}),
    ({"a": "b"}, {"b": "c"}, {"a": "b", "b": "c"}),
    ({"a": "b"}, {"a": None}, {}),
    ({"a": "b", "b": "c"}, {"a": None}, {"b": "c"}),
    ({"a": ["b"]}, {"a": "c"}, {"a": "c"}),
    ({"a": "c"}, {"a": ["b"]}, {"a": ["b"]}),
    ({"a": {"b": "c"}}, {"a": {"b": "d", "c": None}}, {"a": {"b": "d"}}),
    ({"a": [{"b": "c"}]}, {"a": [1]}, {"a": [1]}),
    (["a", "b"], ["c", "d"], ["c", "d"]),
    ({"a": "b"}, ["c"], ["c"]),
    ({"a": "foo"}, None, None),
    ({"a": "foo"}, "bar", "bar"),
    ({"e": None}, {"a": 1}, {"e": None, "a": 1}),
    ([1, 2], {"a": "b", "c": None}, {"a": "b"}),
    ({}, {"a": {"bb": {"ccc": None}}}, {"a": {"bb": {}}}),
]


@pytest.mark.parametrize(("original", "patch", "result"), RFC_7396_EXAMPLES)
def test_the_rfc_s_examples(original: Any, patch: Any, result: Any) -> None:
    before = copy.deepcopy((original, patch))
    assert merge_patch(original, patch) == result
    assert (original, patch) == before, "merge_patch changed its arguments"


def test_a_partial_edit_keeps_what_it_does_not_name() -> None:
    proposed = {"order": "7", "amount": 500, "note": "late", "to": {"iban": "X", "bic": "Y"}}
    patch = {"amount": 50, "note": None, "to": {"bic": "Z"}}
    assert merge_patch(proposed, patch) == {"order": "7", "amount": 50,
                                            "to": {"iban": "X", "bic": "Z"}}
    assert proposed["to"] == {"iban": "X", "bic": "Y"}, "a nested object was changed in place"
