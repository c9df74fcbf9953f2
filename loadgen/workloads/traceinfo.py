"""What a trace holds, before anyone replays it (``servemon trace info``): its
length, its rate and how that rate moves, how bursty its arrivals are, and its
prompt and output lengths.

One summary (:class:`TraceSummary`, from :func:`summarize`), which the terminal and
JSON render. Quantiles are nearest-rank over every entry (a trace is read whole
anyway). Burstiness is the coefficient of variation of the gaps between
consecutive requests: 1 for a Poisson process, above it for bursts, below it for
a steadier stream. The rate over time is counted in bins of a round width, chosen
so that the trace makes at most :data:`MAX_BINS` of them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise

from servemon.loadgen.workloads.tracefile import TraceFile, prefix_hit_ratio

__all__ = ["MAX_BINS", "Lengths", "TraceSummary", "summarize"]

#: The most rate bins a summary makes.
MAX_BINS = 60
#: Bin widths to choose from, in seconds.
_WIDTHS = (1, 5, 10, 30, 60, 300, 600, 1800, 3600, 3 * 3600, 6 * 3600, 86_400)


@dataclass(frozen=True, slots=True)
class Lengths:
    """The distribution of a token length over a trace's entries that give it."""

    count: int
    mean: float
    p50: int
    p90: int
    p99: int
    max: int

    @classmethod
    def of(cls, values: Sequence[int]) -> Lengths | None:
        if not values:
            return None
        ordered = sorted(values)
        return cls(
            count=len(ordered),
            mean=sum(ordered) / len(ordered),
            p50=_rank(ordered, 0.50),
            p90=_rank(ordered, 0.90),
            p99=_rank(ordered, 0.99),
            max=ordered[-1],
        )


@dataclass(frozen=True, slots=True)
class TraceSummary:
    """What a trace holds (see the module docstring)."""

    format: str
    requests: int
    #: Seconds from the first request to the last.
    duration_s: float
    #: Requests a second over the duration (None: one request, or all at once).
    mean_rate: float | None
    #: Width of the rate bins in seconds, and the rate (requests a second) in each.
    bin_s: int
    rates: tuple[float, ...]
    #: Coefficient of variation of the gaps between requests (None: under 3
    #: requests, or no gap).
    gap_cv: float | None
    prompt: Lengths | None
    output: Lengths | None
    #: Entries with a real prompt (their lengths are counted when a run builds them).
    real_prompts: int
    #: Lines the trace marks failed, and whether they were kept.
    failed: int
    failed_lines: str
    labels: tuple[tuple[str, tuple[tuple[str, int], ...]], ...]
    #: The prefix-cache hit ratio its ``hash_ids`` say (None: it has none).
    prefix_hit_ratio: float | None


def summarize(trace: TraceFile) -> TraceSummary:
    """The summary of a trace read (entries in time order, from 0)."""
    entries = trace.entries
    times = [e.at_s for e in entries]
    duration = times[-1] - times[0] if times else 0.0
    width = next(
        (w for w in _WIDTHS if duration / w < MAX_BINS), math.ceil(duration / MAX_BINS)
    )
    counts = [0] * (int(duration // width) + 1)
    for at in times:
        counts[int(at // width)] += 1
    # The last bin is cut short where the trace ends: its rate is over what it has.
    last = duration - (len(counts) - 1) * width
    rates = [n / width for n in counts[:-1]]
    rates.append(counts[-1] / last if last > 0 else float(counts[-1]) / width)
    return TraceSummary(
        format=trace.format,
        requests=len(entries),
        duration_s=duration,
        mean_rate=len(entries) / duration if duration > 0 else None,
        bin_s=width,
        rates=tuple(rates),
        gap_cv=_cv([b - a for a, b in pairwise(times)]),
        prompt=Lengths.of([e.prompt_tokens for e in entries if e.prompt_tokens]),
        output=Lengths.of([e.output_tokens for e in entries if e.output_tokens]),
        real_prompts=sum(
            1 for e in entries if e.text is not None or e.messages is not None
        ),
        failed=trace.failed,
        failed_lines=trace.failed_lines,
        labels=trace.labels,
        prefix_hit_ratio=prefix_hit_ratio(list(entries)),
    )


def _rank(ordered: Sequence[int], q: float) -> int:
    """The nearest-rank ``q`` quantile of sorted values."""
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def _cv(gaps: Sequence[float]) -> float | None:
    if len(gaps) < 2:
        return None
    mean = sum(gaps) / len(gaps)
    if mean <= 0:
        return None
    variance = sum((g - mean) ** 2 for g in gaps) / len(gaps)
    return math.sqrt(variance) / mean
