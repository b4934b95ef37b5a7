"""Importing the user's code a config names (``module:attribute``: tools, their
approval predicates, model factories), from the directories the config says.

A config's ``python_path:`` (directories, relative to the config file), or else the
config file's own directory, is put at the front of ``sys.path`` before the first
import, as ``python script.py`` puts the script's directory there: ``tools.py``
next to ``mesh.yaml`` loads without ``PYTHONPATH``. When an import fails, the
ConfigurationError says which of three things went wrong, and what to do: the module
is not found (the directories searched; add one under ``python_path:`` or to
``PYTHONPATH``), it has no such attribute (what it does define), or importing it
raised (the user's own error, with its file and line).
"""

from __future__ import annotations

import importlib
import sys
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from meshpoint.errors import ConfigurationError


def extend_import_path(directories: Sequence[Path]) -> None:
    """Put ``directories`` at the front of ``sys.path`` (in their order), each once."""
    for directory in reversed(directories):
        entry = str(directory)
        if entry not in sys.path:
            sys.path.insert(0, entry)


def import_object(where: str, path: str, directories: Sequence[Path]) -> Any:
    """The object ``path`` (``package.module:attribute``) names, imported after
    ``directories`` are put on the import path; ConfigurationError (starting with
    ``where``, the config key) saying what failed and how to fix it."""
    module_name, _, attribute = path.partition(":")
    extend_import_path(directories)
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        if error.name is not None and (module_name == error.name
                                       or module_name.startswith(error.name + ".")):
            raise ConfigurationError(_not_found(where, path, module_name, error.name,
                                                directories)) from None
        raise ConfigurationError(_failed(where, path, module_name, error)) from None
    except Exception as error:  # the user's module raised while it was imported
        raise ConfigurationError(_failed(where, path, module_name, error)) from None
    try:
        return getattr(module, attribute)
    except AttributeError:
        defined = sorted(name for name, value in vars(module).items()
                         if not name.startswith("_") and callable(value)
                         and getattr(value, "__module__", None) == module.__name__)
        raise ConfigurationError(
            f"{where}: cannot import {path!r}: module {module_name!r} "
            f"({getattr(module, '__file__', None) or 'built in'}) has no attribute "
            f"{attribute!r} (it defines: {', '.join(defined) or 'no functions or classes'})"
        ) from None


def _not_found(where: str, path: str, module_name: str, missing: str,
               directories: Sequence[Path]) -> str:
    which = (f"module {module_name!r}" if missing == module_name
             else f"module {module_name!r} (its package {missing!r})")
    searched = ", ".join(str(d) for d in directories) or "none given"
    file = missing.replace(".", "/")
    return (f"{where}: cannot import {path!r}: {which} was not found. Searched the "
            f"config's directories ({searched}), then the Python path (PYTHONPATH and "
            f"installed packages). Put {file}.py (or the package {file}/) in one of "
            "those directories, list its directory under python_path: in the config "
            "(relative to the config file), or add it to PYTHONPATH")


def _failed(where: str, path: str, module_name: str, error: BaseException) -> str:
    frames = traceback.extract_tb(error.__traceback__)
    # The innermost frame of the user's code, not importlib's.
    user = [f for f in frames if "importlib" not in f.filename]
    at = f" (at {user[-1].filename}:{user[-1].lineno})" if user else ""
    if isinstance(error, SyntaxError) and error.filename:
        at = f" (at {error.filename}:{error.lineno})"
    return (f"{where}: cannot import {path!r}: importing module {module_name!r} raised "
            f"{type(error).__name__}: {error}{at}. The error is in that module (or one "
            "it imports): fix it there")
