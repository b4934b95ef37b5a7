"""Cost attribution of the checkpoint history: a price table, and what each record's
``metrics.cost`` holds, in exact decimal arithmetic.

A record's cost is what its checkpoint's tokens cost at the prices of the time it was
written (its ``iteration``), and the task's ``total`` is the previous record's total
plus that: so the per-checkpoint costs of a chain add up to its last total exactly,
whatever the prices did in between, and ``meshpoint tasks cost`` prints rows that sum
to the total it prints. Amounts are :class:`~decimal.Decimal` from the price table on
(a price given as a float is read as the decimal it prints as: ``0.1`` is one tenth)
and stored as decimal strings, never rounded: a float rounds each amount on its own,
and rounded rows no longer add up to a total computed from the exact sum.

Pure: no I/O; :mod:`meshpoint.history.planning` puts the section into each record.
"""

from __future__ import annotations

import decimal
from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from meshpoint.errors import InvalidArgumentError

TOKEN_KINDS = ("prompt_tokens", "completion_tokens", "cached_tokens")
#: Enough digits for any token count times any price the table can hold: amounts are
#: exact (a price has at most 17 significant digits as a float, a count 20).
_EXACT = decimal.Context(prec=80, traps=[decimal.InvalidOperation, decimal.Overflow])
_MILLION = Decimal(1_000_000)
Spent = Mapping[str, Decimal]


def _price(value: Any) -> Decimal | None:
    """A price as an exact decimal (a float as the decimal it prints as), or None if it
    is not a finite number >= 0."""
    if type(value) in (int, float):
        value = Decimal(repr(value))
    if isinstance(value, Decimal) and value.is_finite() and value >= 0:
        return value
    return None


@dataclass(frozen=True)
class Prices:
    """Prices per million tokens, by model: ``{model: {"prompt_tokens": p,
    "completion_tokens": c, "cached_tokens": k}}`` (cached tokens are also counted in
    prompt tokens; their price replaces the prompt price for them). A price is an
    int, a float (read as the decimal it prints as) or a :class:`~decimal.Decimal`."""

    per_million: Mapping[str, Mapping[str, float | Decimal]] = field(default_factory=dict)
    currency: str = "USD"
    _exact: Mapping[str, Mapping[str, Decimal]] = field(init=False, repr=False,
                                                        compare=False)

    def __post_init__(self) -> None:
        exact: dict[str, dict[str, Decimal]] = {}
        for model, prices in self.per_million.items():
            for kind, price in prices.items():
                if kind not in TOKEN_KINDS:
                    raise InvalidArgumentError(f"price of {model!r}: {kind!r} is not one of "
                                               f"{TOKEN_KINDS}")
                value = _price(price)
                if value is None:
                    raise InvalidArgumentError(f"price of {model!r} {kind}: a number >= 0, "
                                               f"got {price!r}")
                exact.setdefault(model, {})[kind] = value
        object.__setattr__(self, "_exact", exact)

    def cost(self, model: str, counts: Mapping[str, int]) -> Decimal | None:
        """The exact cost of ``counts`` on ``model``, or None if it has no price."""
        prices = self._exact.get(model)
        if prices is None:
            return None
        prompt = prices.get("prompt_tokens", Decimal(0))
        cached = int(counts.get("cached_tokens", 0))
        with decimal.localcontext(_EXACT):
            return ((int(counts.get("prompt_tokens", 0)) - cached) * prompt
                    + cached * prices.get("cached_tokens", prompt)
                    + int(counts.get("completion_tokens", 0))
                    * prices.get("completion_tokens", Decimal(0))) / _MILLION


def amount(value: Decimal) -> str:
    """An amount as a plain decimal string, exact (``"0.0000000022"``, never an
    exponent): readable in an audit, and no float in the record (see
    :func:`meshpoint.history.integrity.canonical`)."""
    return "0" if value.is_zero() else format(value.normalize(_EXACT), "f")


def spent(document: Mapping[str, Any]) -> dict[str, Decimal] | None:
    """A record document's total cost by model, or None when it cannot be read (a
    record older than these fields, or whose ``metrics.cost`` is encrypted)."""
    try:
        by_model = document["metrics"]["cost"]["by_model"]
        return {str(model): Decimal(str(figures["total"]))
                for model, figures in by_model.items()}
    except (KeyError, TypeError, AttributeError, decimal.InvalidOperation):
        return None


def spent_by_source(document: Mapping[str, Any]) -> dict[str, Decimal] | None:
    """A record document's total cost by source, or None when it holds none (a record
    older than the field, or whose ``metrics.cost`` is encrypted)."""
    try:
        by_source = document["metrics"]["cost"]["by_source"]
        return {str(source): Decimal(str(figures["total"]))
                for source, figures in by_source.items()}
    except (KeyError, TypeError, AttributeError, decimal.InvalidOperation):
        return None


def _by_source(prices: Prices, iteration: Mapping[str, Any], iteration_cost: Decimal,
               total_cost: Decimal, before: Spent | None) -> dict[str, Any]:
    """The ``by_source`` and ``unattributed`` part of a record's cost. A record counts
    tokens by model and by source, not by both, so an iteration's cost goes to its
    sources exactly when it had one source (all of it) or one model (each source's
    tokens at that model's price); otherwise, and for what records before a source's
    first cost (``before`` None) spent, it is ``unattributed``: the sources' totals
    and it add up to the task's total exactly."""
    zero = Decimal(0)
    sources = {name: counts for name, counts in (iteration.get("by_source") or {}).items()
               if any(counts.values())}
    models = [name for name, counts in (iteration.get("by_model") or {}).items()
              if any(counts.values())]
    part: dict[str, Decimal] = {}
    if len(sources) == 1:
        part = {next(iter(sources)): iteration_cost}
    elif len(models) == 1:
        part = {name: prices.cost(models[0], counts) or zero
                for name, counts in sources.items()}
    totals = dict(before or {})
    with decimal.localcontext(_EXACT):
        for name, amount_ in part.items():
            totals[name] = totals.get(name, zero) + amount_
        unattributed = total_cost - sum(totals.values(), zero)
    # Each key only when it has something to say: a record without tokens is the
    # bytes it was before costs were kept by source.
    return {**({"by_source": {name: {"iteration": amount(part.get(name, zero)),
                                     "total": amount(value)}
                              for name, value in sorted(totals.items())}} if totals else {}),
            **({"unattributed": amount(unattributed)} if unattributed else {})}


def cost_section(prices: Prices, total: Mapping[str, Any], iteration: Mapping[str, Any],
                 before: Spent | None, tokens_before: Mapping[str, Any],
                 sources_before: Spent | None = None) -> dict[str, Any]:
    """A record's ``metrics.cost``: each model's ``iteration`` (its tokens since the
    previous record, at today's price) and ``total`` (the previous record's total,
    ``before``, plus the iteration). When the previous total cannot be read
    (``before`` None), it is counted again from its tokens (``tokens_before``) at
    today's prices. Models without a price count 0 and are listed as ``unpriced``.
    The cost by source (``by_source``, ``unattributed``) is :func:`_by_source`'s,
    from the previous record's (``sources_before``)."""
    by_model: dict[str, dict[str, Decimal]] = {}
    unpriced: list[str] = []
    earlier = tokens_before.get("by_model") or {}
    zero = Decimal(0)
    with decimal.localcontext(_EXACT):
        for model in sorted(set(total.get("by_model") or {}) | set(before or {})):
            part = prices.cost(model, (iteration.get("by_model") or {}).get(model) or {})
            previous = (before or {}).get(model) if before is not None else prices.cost(
                model, earlier.get(model) or {})
            if part is None:
                unpriced.append(model)
                if not previous:
                    continue
            by_model[model] = {"iteration": part or zero,
                               "total": (previous or zero) + (part or zero)}
        iteration_cost = sum((c["iteration"] for c in by_model.values()), zero)
        total_cost = sum((c["total"] for c in by_model.values()), zero)
    return {"currency": prices.currency, "iteration": amount(iteration_cost),
            "total": amount(total_cost),
            "by_model": {model: {k: amount(v) for k, v in c.items()}
                         for model, c in by_model.items()},
            "unpriced": unpriced,
            **_by_source(prices, iteration, iteration_cost, total_cost, sources_before)}
