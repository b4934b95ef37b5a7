"""Deprecated: this module moved to :mod:`meshpoint.events.reconstruction`; import it from there."""

import sys
import warnings

from meshpoint.events import reconstruction as _moved

warnings.warn("meshpoint.reconstruction moved to meshpoint.events.reconstruction; "
              "import it from there", DeprecationWarning, stacklevel=2)
sys.modules[__name__] = _moved
