"""The approval form: one field per argument of a tool's JSON schema, filled with
the arguments the model proposed, and the edit a submitted form makes of them.

A field is shown for each of the schema's ``properties`` (and for each proposed
argument the schema does not name); its value is read back by the property's type:
a string as typed, a number or integer parsed (left as typed when it is not one, so
that the schema check names the field), a boolean from its select, anything else
as JSON; a field left empty removes its argument. The edit is the JSON merge patch
of the changed arguments: :func:`meshpoint.runtime.approvals.decide` merges it into the
call's arguments and checks the result against the tool's schema before anything is
written, as ``meshpoint tasks approve --arguments`` does.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

#: Form fields of arguments are named ``arg.<name>``.
PREFIX = "arg."


@dataclass(frozen=True, slots=True)
class Field:
    """One argument's input: its name, JSON type, widget, text shown, and whether the
    schema requires it."""

    name: str
    kind: str  # string, number, integer, boolean, json
    widget: str  # text, select, textarea
    value: str
    required: bool
    description: str


def fields(schema: dict[str, Any], arguments: dict[str, Any]) -> list[Field]:
    """The fields of the form for a call of a tool with ``schema``, filled with
    ``arguments``."""
    properties = schema.get("properties") if isinstance(schema, dict) else None
    properties = properties if isinstance(properties, dict) else {}
    required = set(schema.get("required") or []) if isinstance(schema, dict) else set()
    names = list(properties) + [n for n in arguments if n not in properties]
    out = []
    for name in names:
        given = properties.get(name)
        spec: dict[str, Any] = given if isinstance(given, dict) else {}
        kind = _kind(spec, arguments.get(name))
        value = arguments.get(name)
        text = "" if value is None and name not in arguments else (
            value if isinstance(value, str) and kind == "string" else
            ("true" if value else "false") if kind == "boolean" else json.dumps(value))
        out.append(Field(name, kind, {"boolean": "select", "json": "textarea"}.get(kind, "text"),
                         text, name in required, str(spec.get("description") or "")))
    return out


def _kind(spec: dict[str, Any], value: Any) -> str:
    kind = spec.get("type")
    if kind in ("string", "number", "integer", "boolean"):
        return str(kind)
    if kind is None and isinstance(value, str):
        return "string"
    return "json"


def edit(schema: dict[str, Any], proposed: dict[str, Any],
         form: dict[str, str]) -> dict[str, Any] | None:
    """The merge patch a submitted form makes of the ``proposed`` arguments (None: no
    change)."""
    patch: dict[str, Any] = {}
    for field in fields(schema, proposed):
        if PREFIX + field.name not in form:
            continue
        text = form[PREFIX + field.name]
        if text == "":
            value: Any = None  # cleared: removed (the schema check says if it is required)
        else:
            value = parse(field.kind, text)
        if value is None and field.name not in proposed:
            continue
        if field.name not in proposed or proposed[field.name] != value:
            patch[field.name] = value
    return patch or None


def parse(kind: str, text: str) -> Any:
    """A field's text as its JSON type; as typed when it is not one (the schema check
    then names the field)."""
    if kind == "string":
        return text
    if kind == "boolean":
        return {"true": True, "false": False}.get(text, text)
    try:
        value = json.loads(text)
    except ValueError:
        return text
    if kind == "integer" and isinstance(value, float) and value.is_integer():
        return int(value)
    return value
