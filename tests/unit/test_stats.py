"""The one percentile definition of the runtime and the benchmarks."""

from __future__ import annotations

import statistics

import pytest

from meshpoint.runtime.stats import percentile


def test_percentile_interpolates_between_the_nearest_ranks() -> None:
    samples = [float(n) for n in range(100, 0, -1)]  # any order
    assert percentile(samples, 50) == 50.5 == statistics.median(samples)
    assert percentile(samples, 99) == pytest.approx(99.01)
    assert percentile([3.0, 1.0], 50) == 2.0


def test_percentile_of_one_sample_or_none() -> None:
    assert percentile([7.0], 99) == 7.0
    assert percentile([], 50) is None
    with pytest.raises(ValueError, match="from 1 to 99"):
        percentile([1.0, 2.0], 100)
