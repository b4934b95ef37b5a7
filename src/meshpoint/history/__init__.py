"""The checkpoint history: one immutable, hash-chained record per checkpoint of a task.

What this package owns, module by module:

* :mod:`~meshpoint.history.record`: the record's model, schema version 1.0, field by field;
* :mod:`~meshpoint.history.planning`: the options (:class:`HistoryOptions`) and how a
  checkpoint's record is planned (its sections, annotations, metrics);
* :mod:`~meshpoint.history.costs`: the price table and each record's ``metrics.cost``;
* :mod:`~meshpoint.history.integrity`: canonical JSON, the hash chain, signatures and keys;
* :mod:`~meshpoint.history.verification`: checking what is read back against its chain;
* :mod:`~meshpoint.history.encryption`: encryption at rest of chosen fields;
* :mod:`~meshpoint.history.retention`: what a purge may remove.

Nothing here does I/O. The store writes and reads the records
(:mod:`meshpoint.store.history_store`, :mod:`meshpoint.store.history_chain`,
:mod:`meshpoint.store.history_restore`, :mod:`meshpoint.store.history_queries`); this
package may import :mod:`meshpoint.errors`, :mod:`meshpoint.compression` and
:mod:`meshpoint._json`, never the store, the runtime or a broker. See docs/history.md.
"""

import warnings
from typing import Any

from meshpoint.history.costs import Prices
from meshpoint.history.encryption import EncryptionKeys
from meshpoint.history.integrity import SigningKeys
from meshpoint.history.planning import HistoryOptions
from meshpoint.history.record import CheckpointRecord

__all__ = ["CheckpointRecord", "EncryptionKeys", "HistoryOptions", "Prices", "SigningKeys"]


def __getattr__(name: str) -> Any:
    """The other names of the former module ``meshpoint.history``, now in
    :mod:`meshpoint.history.planning`: still importable from here, with a warning."""
    from meshpoint.history import planning

    if name.startswith("__") or not hasattr(planning, name):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    warnings.warn(f"meshpoint.history.{name} moved to meshpoint.history.planning.{name}; "
                  "import it from there", DeprecationWarning, stacklevel=2)
    return getattr(planning, name)
