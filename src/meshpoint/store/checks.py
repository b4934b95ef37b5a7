"""The store's argument checks, shared by every operation and by the parts built on the
store: ids, timeouts, leases' TTLs, limits and time ranges, each refused with an
:class:`~meshpoint.errors.InvalidArgumentError` that says what was wanted and what came;
and a task or sub-task of another agent refused with a
:class:`~meshpoint.errors.WrongAgentError`. Pure: no I/O.
"""

from __future__ import annotations

import math
from typing import Any

from meshpoint.errors import InvalidArgumentError, WrongAgentError

MAX_ID = 255


def is_id(value: Any, max_len: int = MAX_ID) -> bool:
    return type(value) is str and 0 < len(value) <= max_len and is_text(value)


def is_text(value: str) -> bool:
    """Whether every database can store ``value`` as text: no NUL (PostgreSQL's text
    cannot hold it) and no lone surrogate (half of a UTF-16 pair, which is not UTF-8:
    SQLite's driver fails on it)."""
    if "\x00" in value:
        return False
    if value.isascii():
        return True
    try:
        value.encode()
    except UnicodeEncodeError:
        return False
    return True


def is_timeout(value: Any) -> bool:
    return type(value) in (int, float) and 0 <= value < math.inf  # NaN fails too


def check_agent(what: str, owner: str, wanted: str | None) -> None:
    """WrongAgentError unless ``wanted`` is None or ``owner``, the agent whose task
    ``what`` (a phrase naming the task or sub-task) is."""
    if wanted is not None and owner != wanted:
        raise WrongAgentError(what, owner, wanted)


def check_id(name: str, value: Any, *, max_len: int = MAX_ID) -> None:
    if not is_id(value, max_len):
        text = type(value) is str and 0 < len(value) <= max_len
        raise InvalidArgumentError(
            f"{name} must be a str of 1 to {max_len} characters"
            + (" without NUL or a lone surrogate (text no database can store)"
               if text else "") + f", got {value!r:.80}")


def check_timeout(name: str, value: Any) -> None:
    if not is_timeout(value):
        raise InvalidArgumentError(f"{name} must be a finite number >= 0, got {value!r}")


#: The largest ``limit`` a read takes: PostgreSQL's LIMIT is bound as a 32-bit int.
MAX_LIMIT = 2**31 - 1


def check_limit(limit: Any) -> None:
    if type(limit) is not int or not 1 <= limit <= MAX_LIMIT:
        raise InvalidArgumentError(
            f"limit must be an int from 1 to {MAX_LIMIT}, got {limit!r}")


def check_time_range(since: Any, until: Any) -> tuple[float, float]:
    """``(since, until)`` as epoch seconds (None: no end); InvalidArgumentError
    unless both are finite numbers and ``since <= until``."""
    for name, value in (("since", since), ("until", until)):
        if name == "until" and value is None:
            continue
        try:
            finite = type(value) in (int, float) and math.isfinite(value)
        except OverflowError:  # an int too large for a float
            finite = False
        if not finite:
            raise InvalidArgumentError(
                f"{name} must be epoch seconds (a finite int or float), got {value!r:.80}")
    end = math.inf if until is None else float(until)
    if float(since) > end:
        raise InvalidArgumentError(f"since ({since}) is after until ({until})")
    return float(since), end


def check_ttl(ttl_s: Any) -> None:
    if type(ttl_s) not in (int, float) or not math.isfinite(ttl_s) or ttl_s <= 0:
        raise InvalidArgumentError(f"ttl_s must be a finite number > 0, got {ttl_s!r}")


def check_lease(owner: str | None, ttl_s: float) -> None:
    """A lease owner's id and the lease's time to live, when an owner is given."""
    if owner is not None:
        check_id("lease_owner", owner)
        check_ttl(ttl_s)
