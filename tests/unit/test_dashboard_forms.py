"""The approval form of the dashboard: a field per argument of the tool's schema,
filled with the proposed arguments, and the merge patch a submitted form makes (what
``decide`` then checks against the schema, as ``tasks approve --arguments``)."""

from __future__ import annotations

from meshpoint.ops.dashboard.forms import edit, fields
from meshpoint.runtime.decisions import merge_patch

SCHEMA = {"type": "object", "required": ["to", "amount"], "properties": {
    "to": {"type": "string", "description": "Who is paid."},
    "amount": {"type": "integer"}, "urgent": {"type": "boolean"},
    "tags": {"type": "array", "items": {"type": "string"}}, "note": {"type": "string"}}}
PROPOSED = {"to": "acme", "amount": 120, "urgent": False, "tags": ["q3"]}


def form(**values: str) -> dict[str, str]:
    base = {"arg.to": "acme", "arg.amount": "120", "arg.urgent": "false",
            "arg.tags": '["q3"]', "arg.note": ""}
    return {**base, **{f"arg.{k}": v for k, v in values.items()}}


def test_a_field_per_property_filled_with_the_proposed_arguments() -> None:
    shown = {f.name: f for f in fields(SCHEMA, {**PROPOSED, "extra": {"a": 1}})}
    assert list(shown) == ["to", "amount", "urgent", "tags", "note", "extra"]
    assert (shown["to"].widget, shown["to"].value, shown["to"].required) == ("text", "acme", True)
    assert shown["to"].description == "Who is paid."
    assert (shown["amount"].kind, shown["amount"].value) == ("integer", "120")
    assert (shown["urgent"].widget, shown["urgent"].value) == ("select", "false")
    assert (shown["tags"].widget, shown["tags"].value) == ("textarea", '["q3"]')
    assert shown["note"].value == "" and not shown["note"].required
    assert shown["extra"].kind == "json"


def test_an_unchanged_form_is_no_edit_and_a_changed_one_is_its_patch() -> None:
    assert edit(SCHEMA, PROPOSED, form()) is None
    patch = edit(SCHEMA, PROPOSED, form(amount="80", urgent="true", tags='["q3", "x"]',
                                        note="by Friday"))
    assert patch == {"amount": 80, "urgent": True, "tags": ["q3", "x"], "note": "by Friday"}
    assert merge_patch(PROPOSED, patch) == {"to": "acme", "amount": 80, "urgent": True,
                                            "tags": ["q3", "x"], "note": "by Friday"}


def test_a_cleared_field_removes_its_argument_and_a_bad_number_stays_as_typed() -> None:
    # Left to the schema check, which names the field: never guessed into a value.
    assert edit(SCHEMA, PROPOSED, form(to="")) == {"to": None}
    assert edit(SCHEMA, PROPOSED, form(amount="lots")) == {"amount": "lots"}
    assert edit(SCHEMA, PROPOSED, form(amount="80.0")) == {"amount": 80}
