"""Figures in bounded memory: exact while small, within the sketch's stated error
past it, mergeable either way."""

from __future__ import annotations

import math
import random
import statistics
from array import array
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from servemon.loadgen.record.figures import FOLD_EVERY, RELATIVE_ACCURACY, FigureStats

latencies = st.lists(
    st.floats(min_value=1e-6, max_value=600.0, allow_nan=False), min_size=2
)


def exact_cuts(values: list[float]) -> list[float]:
    return statistics.quantiles(values, n=100, method="inclusive")


@given(latencies)
def test_small_sets_are_exact(values: list[float]) -> None:
    stats = FigureStats()
    stats.extend(values)
    d = stats.distribution()
    assert d is not None
    cuts = exact_cuts(values)
    assert (d.p50, d.p90, d.p95, d.p99) == (cuts[49], cuts[89], cuts[94], cuts[98])
    assert d.count == len(values)
    assert d.max == max(values)
    assert d.mean == pytest.approx(statistics.fmean(values))
    assert d.relative_error == 0.0


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 2**32), st.sampled_from([0.3, 1.0, 2.5]))
def test_past_the_limit_percentiles_are_within_the_stated_error(
    seed: int, sigma: float
) -> None:
    rng = random.Random(seed)
    values = [rng.lognormvariate(-3.0, sigma) for _ in range(3000)]
    stats = FigureStats(exact_limit=500)
    stats.extend(values)
    assert not stats.exact
    d = stats.distribution()
    assert d is not None
    assert d.relative_error == RELATIVE_ACCURACY
    ordered = sorted(values)
    for q, got in ((0.5, d.p50), (0.9, d.p90), (0.95, d.p95), (0.99, d.p99)):
        # Some value of the data at about that rank lies within the bound.
        rank = q * (len(ordered) - 1)
        lo = ordered[math.floor(rank) - 1]
        hi = ordered[min(math.ceil(rank) + 1, len(ordered) - 1)]
        assert lo * (1 - RELATIVE_ACCURACY) <= got <= hi * (1 + RELATIVE_ACCURACY)
    assert d.count == len(values)
    assert d.max == max(values)
    assert d.mean == pytest.approx(statistics.fmean(values))


@settings(max_examples=50)
@given(latencies, latencies, st.sampled_from([4, 10_000]))
def test_merging_is_adding(left: list[float], right: list[float], limit: int) -> None:
    a, b, both = (FigureStats(exact_limit=limit) for _ in range(3))
    a.extend(left)
    b.extend(right)
    both.extend(left + right)
    a.merge(b)
    merged, whole = a.distribution(), both.distribution()
    assert merged is not None
    assert whole is not None
    assert merged.count == whole.count
    assert merged.max == whole.max
    assert merged.mean == pytest.approx(whole.mean)
    if whole.relative_error == 0.0:
        assert replace(merged, mean=0.0) == replace(whole, mean=0.0)
    else:
        for stat in ("p50", "p90", "p99"):
            assert merged.stat(stat) == pytest.approx(
                whole.stat(stat), rel=3 * RELATIVE_ACCURACY
            )


def test_memory_stops_growing_past_the_limit() -> None:
    stats = FigureStats(exact_limit=1000)
    rng = random.Random(1)
    stats.extend(rng.expovariate(50) for _ in range(1000))
    assert stats.exact
    stats.extend(rng.expovariate(50) for _ in range(200_000))
    assert not stats.exact
    # The values are gone but for at most one fold's worth; the sketch holds bins.
    assert len(stats._pending) <= FOLD_EVERY
    assert stats._sketch is not None
    assert stats._sketch.num_values + len(stats._pending) == 201_000


def test_nothing_gives_none_and_nan() -> None:
    stats = FigureStats()
    assert stats.distribution() is None
    assert math.isnan(stats.quantile(0.5))


@settings(max_examples=30, deadline=None)
@given(st.lists(st.floats(min_value=-1.0, max_value=1e4, allow_nan=False), min_size=1))
def test_folding_in_bulk_is_adding_one_by_one(values: list[float]) -> None:
    """The bulk fold gives the sketch the same buckets as its own add would."""
    from ddsketch import DDSketch

    from servemon.loadgen.record.figures import _fold

    one_by_one = DDSketch(relative_accuracy=RELATIVE_ACCURACY)
    for value in values:
        one_by_one.add(value)
    bulk = DDSketch(relative_accuracy=RELATIVE_ACCURACY)
    _fold(bulk, array("d", values))
    assert bulk.count == one_by_one.count
    for q in (0.0, 0.1, 0.5, 0.9, 0.99, 1.0):
        assert bulk.get_quantile_value(q) == pytest.approx(
            one_by_one.get_quantile_value(q), rel=1e-9, abs=1e-12
        )
