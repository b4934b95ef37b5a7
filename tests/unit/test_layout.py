"""The source tree shows the features: ``ls src/meshpoint`` names them, each package says
what it owns, and no module grows past a readable size (see the README's layout and
the house style)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).parents[2] / "src" / "meshpoint"
#: The packages a newcomer finds the features by.
FEATURES = ("store", "runtime", "broker", "llm", "history", "events", "integrations", "cli")
MAX_LINES = 600


def _packages() -> list[Path]:
    return sorted(p for p in SRC.rglob("__init__.py") if "versions" not in p.parts)


def test_the_top_level_listing_names_the_features() -> None:
    listed = {p.name for p in SRC.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    missing = [name for name in FEATURES if name not in listed]
    assert not missing, f"src/meshpoint has no package {missing}"


@pytest.mark.parametrize("init", _packages(), ids=lambda p: str(p.parent.relative_to(SRC.parent)))
def test_each_package_says_what_it_owns(init: Path) -> None:
    docstring = ast.get_docstring(ast.parse(init.read_text()))
    assert docstring and len(docstring.split()) >= 8, \
        f"{init.relative_to(SRC.parent)} has no docstring saying what the package owns"


def test_no_module_is_over_600_lines() -> None:
    long = {str(p.relative_to(SRC)): n for p in SRC.rglob("*.py")
            if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, f"modules over {MAX_LINES} lines: {long}"


def test_the_store_names_integrations_only_at_its_registration_point() -> None:
    """The core store knows nothing of LangGraph (or any integration) beyond
    ``store/integrations.py``, which names their modules: no module of the store
    imports an integration or its framework, and only that one names their modules."""
    found = []
    for path in sorted((SRC / "store").rglob("*.py")):
        where = str(path.relative_to(SRC))
        for node in ast.walk(ast.parse(path.read_text())):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
            elif isinstance(node, ast.Constant) and isinstance(node.value, str) \
                    and node.value.startswith("meshpoint.integrations") \
                    and where != "store/integrations.py":
                names = [node.value]
            found += [f"{where}: {name}" for name in names
                      if name.split(".")[0] in ("langgraph", "langchain_core")
                      or name.startswith("meshpoint.integrations")]
    assert not found, f"the store names an integration outside store/integrations.py: {found}"
