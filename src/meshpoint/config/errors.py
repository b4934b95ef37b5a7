"""How a mistake in the mesh config file is told: each of pydantic's errors as
``key.path: what was expected (got ...)``, the path spelled as the file spells it
(:func:`meshpoint._validation.explain`, which also tells the mistakes of the
option groups built from Python), all of them at once."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import ValidationError

from meshpoint._validation import explain
from meshpoint.errors import ConfigurationError


def invalid_file(path: Path, error: ValidationError, root: type[Any]) -> ConfigurationError:
    """The error that says what is wrong with the file at ``path`` (read as ``root``):
    its one problem, or the list of them."""
    problems = [explain(e, root) for e in error.errors(include_url=False)]
    return ConfigurationError(f"{path}: " + (problems[0] if len(problems) == 1 else (
        f"{len(problems)} problems:\n  - " + "\n  - ".join(problems))))


__all__ = ["explain", "invalid_file"]
