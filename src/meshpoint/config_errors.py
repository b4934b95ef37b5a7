"""How a mistake in the mesh config is told: each pydantic error as
``key.path: what was expected (got ...)``, the path spelled as the file spells it."""

from __future__ import annotations

from types import UnionType
from typing import Annotated, Any, Union, get_args, get_origin

from pydantic import BaseModel


def explain(error: Any, root: type[BaseModel]) -> str:
    """One pydantic error as ``key.path: what was expected (got ...)``."""
    path, _ = _walk(error["loc"], root)
    where = ".".join(path) or "(top level)"
    if error["type"] == "extra_forbidden":
        _, model = _walk(error["loc"][:-1], root)
        allowed = sorted(f.alias or name for name, f in model.model_fields.items()) if (
            model is not None) else []
        hint = f"; expected one of: {', '.join(allowed)}" if allowed else ""
        return f"{where}: unknown key{hint}"
    if error["type"] == "missing":
        return f"{where}: required key is missing"
    message = str(error["msg"])
    if error["type"] == "value_error":
        message = message.removeprefix("Value error, ")
        if message.startswith(f"{where}."):  # it names a deeper key itself
            return message
    got = error.get("input")
    shown = "" if isinstance(got, dict | list) or got is None else f" (got {got!r})"
    return f"{where}: {message}{shown}"


def _walk(loc: tuple[Any, ...], root: type[BaseModel]
          ) -> tuple[list[str], type[BaseModel] | None]:
    """Follow a pydantic error location through the config's types: the key path as
    the file spells it (without the tag pydantic inserts for a ``kind:`` union), and
    the model found at its end, if any."""
    node: Any = root
    path: list[str] = []
    for part in loc:
        node = _unwrap(node)
        if isinstance(node, type) and issubclass(node, BaseModel):
            field = next((f for name, f in node.model_fields.items()
                          if part in (name, f.alias)), None)
            node = field.annotation if field is not None else None
        elif get_origin(node) in (dict, list):
            node = get_args(node)[-1]
        elif get_origin(node) in (Union, UnionType):  # tagged: this part is the tag
            node = next((m for m in get_args(node) if _kind(m) == part), None)
            continue
        else:
            node = None
        path.append(str(part))
    node = _unwrap(node)
    return path, node if isinstance(node, type) and issubclass(node, BaseModel) else None


def _unwrap(node: Any) -> Any:
    """``Annotated[X, ...]`` and ``X | None`` as ``X``."""
    while get_origin(node) is Annotated:
        node = get_args(node)[0]
    if get_origin(node) in (Union, UnionType):
        members = [m for m in get_args(node) if m is not type(None)]
        if len(members) == 1:
            return members[0]
    return node


def _kind(model: Any) -> Any:
    fields = getattr(model, "model_fields", {})
    return fields["kind"].default if "kind" in fields else None
