"""Deprecated: this module moved to :mod:`meshpoint.history.integrity`; import it from there."""

import sys
import warnings

from meshpoint.history import integrity as _moved

warnings.warn("meshpoint.integrity moved to meshpoint.history.integrity; import it from there",
              DeprecationWarning, stacklevel=2)
sys.modules[__name__] = _moved
