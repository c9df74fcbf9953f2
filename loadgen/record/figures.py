"""One latency figure over a stream of values, in bounded memory.

:class:`FigureStats` keeps every value while there are at most :data:`EXACT_LIMIT`
of them, so the percentiles of a short run are exact (the inclusive method: linear
interpolation between closest ranks, numpy's default). Past that it folds them into a
DDSketch with :data:`RELATIVE_ACCURACY`: every percentile it reports is then within
that fraction of a true value of the data, however long the run, and its memory
grows with the logarithm of the value range, not with the count.

Why DDSketch: its guarantee is relative, which is what latency needs from sub-ms
dispatch lags to minute-long answers with one setting; it merges exactly (shards,
stages into a run); it is a small pure-Python package. HdrHistogram, the tradition
of wrk2, needs integer values, a unit and a range chosen up front, and was measured
slower per value here (2.3 µs against 1.2 µs, Python 3.11).

Count, mean and max stay exact in both regimes.
"""

from __future__ import annotations

import math
import statistics
from array import array
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np
from ddsketch import DDSketch
from ddsketch.mapping import LogarithmicMapping

from servemon.loadgen.send.timing import RequestTiming

__all__ = [
    "EXACT_LIMIT",
    "FIGURES",
    "FIGURE_NAMES",
    "RELATIVE_ACCURACY",
    "Distribution",
    "Figure",
    "FigureStats",
    "exact_quantile",
]

#: Values of one figure kept exactly before the sketch takes over (8 bytes each).
EXACT_LIMIT = 50_000
#: The sketch's bound on the relative error of a percentile.
RELATIVE_ACCURACY = 0.01
#: Values waiting past the exact limit before they are folded into the sketch.
FOLD_EVERY = 4096
QUANTILES = {"p50": 0.50, "p90": 0.90, "p95": 0.95, "p99": 0.99}


@dataclass(frozen=True, slots=True)
class Distribution:
    """Count, mean, percentiles and max of one figure, in seconds.

    ``relative_error`` is 0 when the percentiles are exact, else the sketch's bound.
    """

    count: int
    mean: float
    p50: float
    p90: float
    p95: float
    p99: float
    max: float = 0.0
    relative_error: float = 0.0

    @classmethod
    def of(cls, values: Iterable[float]) -> Distribution | None:
        """The exact distribution of ``values``; None when empty."""
        stats = FigureStats()
        stats.extend(values)
        return stats.distribution()

    def stat(self, name: str) -> float:
        """One statistic by name (``mean``, ``p50`` ... ``max``)."""
        value: float = getattr(self, name)
        return value


class FigureStats:
    """The values of one figure seen so far (see the module docstring).

    Values are appended to an array (a C-level append, no object per value);
    past the exact limit they wait in that array until :data:`FOLD_EVERY` have
    come, then are folded into the sketch in bulk (:func:`_fold`), since adding
    them to a DDSketch one by one costs about 1.2 µs each in Python.
    """

    __slots__ = ("_limit", "_max", "_pending", "_sketch", "_sum", "count")

    def __init__(self, exact_limit: int = EXACT_LIMIT) -> None:
        self._limit = exact_limit
        #: Every value while exact; the values not yet folded once sketched.
        self._pending: array[float] = array("d")
        self._sketch: DDSketch | None = None
        self.count = 0
        self._sum = 0.0
        self._max = -math.inf

    def add(self, value: float) -> None:
        """One more value."""
        self.count += 1
        self._sum += value
        if value > self._max:
            self._max = value
        pending = self._pending
        pending.append(value)
        if len(pending) > (self._limit if self._sketch is None else FOLD_EVERY):
            self._fold()

    def extend(self, values: Iterable[float]) -> None:
        """Several more values."""
        pending = self._pending
        before = len(pending)
        pending.extend(values)
        added = pending[before:]
        if not added:
            return
        self.count += len(added)
        self._sum += math.fsum(added)
        self._max = max(self._max, max(added))
        if len(pending) > (self._limit if self._sketch is None else FOLD_EVERY):
            self._fold()

    def merge(self, other: FigureStats) -> None:
        """Fold ``other``'s values into these (exact while both fit)."""
        if other.count == 0:
            return
        if other._sketch is None:
            self.extend(other._pending)
            return
        if self._sketch is None:
            self._fold()
        assert self._sketch is not None
        self._sketch.merge(other._sketch)
        self._pending.extend(other._pending)
        self.count += other.count
        self._sum += other._sum
        self._max = max(self._max, other._max)
        self._fold()

    @property
    def exact(self) -> bool:
        """Whether the percentiles are exact."""
        return self._sketch is None

    def quantile(self, q: float) -> float:
        """The ``q`` quantile (0..1) of the values; NaN when there are none."""
        return self.quantiles([q])[0]

    def quantiles(self, qs: Sequence[float]) -> list[float]:
        """Several quantiles at once (one sort of the exact values)."""
        if self.count == 0:
            return [math.nan for _ in qs]
        if self._sketch is None:
            ordered = sorted(self._pending)
            return [exact_quantile(ordered, q) for q in qs]
        self._fold()
        out = []
        for q in qs:
            value = self._sketch.get_quantile_value(q)
            out.append(math.nan if value is None else min(float(value), self._max))
        return out

    def distribution(self) -> Distribution | None:
        """What the values come to; None when there are none."""
        if self.count == 0:
            return None
        if self._sketch is None:
            ordered = sorted(self._pending)
            if len(ordered) == 1:
                cuts = dict.fromkeys(QUANTILES, ordered[0])
            else:
                # statistics' inclusive cut points, as summaries have always given.
                every = statistics.quantiles(ordered, n=100, method="inclusive")
                cuts = {k: every[round(q * 100) - 1] for k, q in QUANTILES.items()}
            error = 0.0
        else:
            values = self.quantiles(list(QUANTILES.values()))
            cuts = dict(zip(QUANTILES, values, strict=True))
            error = RELATIVE_ACCURACY
        return Distribution(
            count=self.count,
            mean=self._sum / self.count,
            max=self._max,
            relative_error=error,
            **cuts,
        )

    def _fold(self) -> None:
        """Move the pending values into the sketch (making it if need be)."""
        if self._sketch is None:
            self._sketch = DDSketch(relative_accuracy=RELATIVE_ACCURACY)
        if self._pending:
            _fold(self._sketch, self._pending)
            self._pending = array("d")


#: The sketch's own mapping of values to buckets (the same for every sketch of
#: this accuracy), used to fold values in bulk.
_MAPPING = LogarithmicMapping(RELATIVE_ACCURACY)
_PER_LOG = 1.0 / math.log(_MAPPING.gamma)


def _fold(sketch: DDSketch, values: array[float]) -> None:
    """Add ``values`` to ``sketch`` as it would add them one by one, but counted
    per bucket first: each bucket's count is added once, at the value the sketch
    represents that bucket by (so its key, and the error bound, are the
    sketch's own). Values too small for a bucket, zero or negative are added
    one by one."""
    data = np.frombuffer(values, dtype=np.float64)
    small = data <= _MAPPING.min_possible
    for value in data[small]:
        sketch.add(float(value))
    keys = np.ceil(np.log(data[~small]) * _PER_LOG)
    buckets, counts = np.unique(keys, return_counts=True)
    for key, count in zip(buckets.tolist(), counts.tolist(), strict=True):
        sketch.add(_MAPPING.value(int(key)), float(count))


def exact_quantile(ordered: Sequence[float], q: float) -> float:
    """The ``q`` quantile (0..1) of sorted values, interpolated linearly between the
    two nearest ranks (the inclusive method): the one percentile of servemon's, which
    the summaries report, the live display shows and ``--hold ttft_p95`` steers on."""
    rank = q * (len(ordered) - 1)
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def _first_chunk(t: RequestTiming) -> float | None:
    return t.time_to_first_chunk


@dataclass(frozen=True, slots=True)
class Figure:
    """One latency figure of a summary: its name (the key in ``summary.json`` and
    the stem of the CSV columns), a short label for tables, what it means, and how
    one request gives its value(s)."""

    name: str
    label: str
    doc: str
    #: The request's value, or None where it has none.
    value: Callable[[RequestTiming], float | None]
    #: Over ok requests only (latencies), or over every request (dispatch lag).
    ok_only: bool = True
    #: Several values per request, pooled (ITL: every gap of every request).
    values: Callable[[RequestTiming], Sequence[float]] | None = None


#: Every latency figure a summary holds, in the order tables show them. Adding a
#: figure is one entry here (and a column in :mod:`servemon.loadgen.record.columns` to
#: show it).
FIGURES: tuple[Figure, ...] = (
    Figure("ttft", "TTFT", "first content chunk minus send", lambda t: t.ttft),
    Figure("ttfc", "TTFC", "first chunk of any kind minus send", _first_chunk),
    Figure(
        "ttfa",
        "TTFA",
        "first answer chunk (after any reasoning) minus send",
        lambda t: t.ttfa,
    ),
    Figure(
        "itl",
        "ITL",
        "gaps between content chunks, pooled",
        lambda t: None,
        values=lambda t: t.itl,
    ),
    Figure("tpot", "TPOT", "(E2E - TTFT) / (output tokens - 1)", lambda t: t.tpot),
    Figure("e2e", "E2E", "end minus send", lambda t: t.e2e),
    Figure(
        "dispatch_lag",
        "lag",
        "actual minus scheduled send (every request)",
        lambda t: t.dispatch_lag,
        ok_only=False,
    ),
    Figure(
        "ttft_from_scheduled",
        "TTFT sched",
        "first content chunk minus scheduled send",
        lambda t: t.ttft_from_scheduled,
    ),
    Figure(
        "e2e_from_scheduled",
        "E2E sched",
        "end minus scheduled send",
        lambda t: t.e2e_from_scheduled,
    ),
    Figure(
        "server_queue",
        "queue",
        "server-reported queue time",
        lambda t: t.server_queue_s,
    ),
    Figure(
        "server_prefill",
        "prefill",
        "server-reported scheduling to first token",
        lambda t: t.server_prefill_s,
    ),
    Figure(
        "server_decode",
        "decode",
        "server-reported first to last token",
        lambda t: t.server_decode_s,
    ),
    Figure(
        "ttft_gap",
        "TTFT gap",
        "TTFT minus the server's queue and prefill",
        lambda t: t.ttft_gap,
    ),
)
FIGURE_NAMES = tuple(f.name for f in FIGURES)
