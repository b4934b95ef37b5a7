"""Every old import path the docs once named still works, warns with a
DeprecationWarning that names the new place, and gives the very same object."""

from __future__ import annotations

import importlib
import sys

import pytest

#: old module -> the module it moved to
MOVED_MODULES = {
    "meshpoint.integrity": "meshpoint.history.integrity",
    "meshpoint.reconstruction": "meshpoint.events.reconstruction",
}
#: (module, old name) -> new name in the same module
RENAMED: dict[tuple[str, str], str] = {
    ("meshpoint.errors", "IntegrityError"): "HistoryIntegrityError",
    ("meshpoint.store", "PeerSubTask"): "SubTask",
    ("meshpoint.store.results", "PeerSubTask"): "SubTask",
}

#: (package that was a module, a name it held) -> the module that holds it now
FORMER_MODULES = {
    ("meshpoint.history", "plan_record"): "meshpoint.history.planning",
    ("meshpoint.history", "request_digest"): "meshpoint.history.planning",
    ("meshpoint.events", "STEP_START"): "meshpoint.events.log",
}


@pytest.mark.parametrize(("old", "new"), sorted(MOVED_MODULES.items()))
def test_a_moved_module_warns_and_is_the_new_one(old: str, new: str) -> None:
    sys.modules.pop(old, None)
    with pytest.warns(DeprecationWarning, match=new.replace(".", r"\.")):
        module = importlib.import_module(old)
    assert module is importlib.import_module(new)
    # and what was imported from it is the object the new module holds
    name = next(n for n in vars(module) if not n.startswith("_"))
    assert getattr(module, name) is getattr(importlib.import_module(new), name)


@pytest.mark.parametrize(("where", "old", "new"),
                         sorted((m, o, n) for (m, o), n in RENAMED.items()))
def test_a_renamed_name_warns_and_is_the_new_one(where: str, old: str, new: str) -> None:
    module = importlib.import_module(where)
    with pytest.warns(DeprecationWarning, match=new):
        value = getattr(module, old)
    assert value is getattr(module, new)


@pytest.mark.parametrize(("package", "name", "new"),
                         sorted((p, n, m) for (p, n), m in FORMER_MODULES.items()))
def test_a_name_of_a_former_module_warns_and_is_the_same(package: str, name: str,
                                                         new: str) -> None:
    with pytest.warns(DeprecationWarning, match=new.replace(".", r"\.")):
        value = getattr(importlib.import_module(package), name)
    assert value is getattr(importlib.import_module(new), name)


def test_the_packages_own_names_and_submodules_do_not_warn() -> None:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        from meshpoint.events import EventStore, reconstruct, values  # noqa: F401
        from meshpoint.history import HistoryOptions, Prices, retention  # noqa: F401
        with pytest.raises(ImportError):
            from meshpoint.history import no_such_name  # noqa: F401


def test_the_new_paths_import_without_a_warning() -> None:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for new in MOVED_MODULES.values():
            importlib.import_module(new)
        for (where, _old), new_name in RENAMED.items():
            getattr(importlib.import_module(where), new_name)
