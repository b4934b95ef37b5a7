"""The event log: every agent step and protocol message, and what is rebuilt from it.

* :mod:`~meshpoint.events.log`: :class:`EventStore` (buffered writes, queries, follow),
  :func:`with_logging` and the runtime's :class:`EventJournal`;
* :mod:`~meshpoint.events.values`: what the log stores of a value (plain JSON, never
  pickled);
* :mod:`~meshpoint.events.reconstruction`: a task's state rebuilt as a recovery prompt
  from its history and its events (:func:`reconstruct`).

This package may import the store (its event statements, sealing and argument checks),
:mod:`meshpoint.history` and :mod:`meshpoint.a2a`; never the runtime, a broker or the
CLI. See docs/events.md.
"""

import warnings
from typing import Any

from meshpoint.events.log import Event, EventJournal, EventStore, to_json, with_logging
from meshpoint.events.reconstruction import reconstruct

__all__ = ["Event", "EventJournal", "EventStore", "reconstruct", "to_json", "with_logging"]


def __getattr__(name: str) -> Any:
    """The other names of the former module ``meshpoint.events``, now in
    :mod:`meshpoint.events.log`: still importable from here, with a warning."""
    from meshpoint.events import log

    if name.startswith("__") or not hasattr(log, name):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    warnings.warn(f"meshpoint.events.{name} moved to meshpoint.events.log.{name}; "
                  "import it from there", DeprecationWarning, stacklevel=2)
    return getattr(log, name)
