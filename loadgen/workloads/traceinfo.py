"""What a trace holds, before anyone replays it (``servemon trace info``): its
length, its rate and how that rate moves, how bursty its arrivals are, and its
prompt and output lengths.

One summary (:class:`TraceSummary`), which the terminal and JSON render, from a
file counted as it is read (:func:`summarize_file`, in bounded memory:
:mod:`servemon.loadgen.workloads.tracetally`) or from a trace read whole
(:func:`summarize`), by the same tally. Quantiles are nearest-rank over every
entry (lengths are counted by value). Burstiness is the coefficient of variation
of the gaps between consecutive requests: 1 for a Poisson process, above it for
bursts, below it for a steadier stream. The rate over time is counted in bins of a
round width, chosen so that the trace makes at most :data:`MAX_BINS` of them
(past 60 days, whole days doubling).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from servemon.loadgen.workloads.traceentry import FailedLines, TraceFile
from servemon.loadgen.workloads.tracetally import MAX_BINS, TraceTally, tally_trace

__all__ = ["MAX_BINS", "Lengths", "TraceSummary", "summarize", "summarize_file"]


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
        counts: dict[int, int] = {}
        for value in values:
            counts[value] = counts.get(value, 0) + 1
        return cls.of_counts(counts)

    @classmethod
    def of_counts(cls, counts: Mapping[int, int]) -> Lengths | None:
        """From lengths counted by value."""
        ordered = sorted(counts.items())
        total = sum(n for _, n in ordered)
        if not total:
            return None
        return cls(
            count=total,
            mean=sum(v * n for v, n in ordered) / total,
            p50=_rank(ordered, total, 0.50),
            p90=_rank(ordered, total, 0.90),
            p99=_rank(ordered, total, 0.99),
            max=ordered[-1][0],
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
    """The summary of a trace read whole (entries in time order, from 0)."""
    tally = TraceTally()
    for entry in trace.entries:
        tally.add(entry.at_s, entry)
    return summary_of(tally, trace)


def summarize_file(path: Path, *, failed: FailedLines, where: str) -> TraceSummary:
    """The summary of a trace file counted as it is read (bounded memory)."""
    return summary_of(*tally_trace(path, failed=failed, where=where))


def summary_of(tally: TraceTally, read: TraceFile) -> TraceSummary:
    """A tally of no fixed width, and what reading found, as a summary."""
    duration, width, counts = tally.duration_s, int(tally.bin_s), tally.counts
    # The last bin is cut short where the trace ends: its rate is over what it has.
    last = duration - (len(counts) - 1) * width
    rates = [n / width for n in counts[:-1]]
    if counts:
        rates.append(counts[-1] / last if last > 0 else float(counts[-1]) / width)
    return TraceSummary(
        format=read.format,
        requests=tally.requests,
        duration_s=duration,
        mean_rate=tally.requests / duration if duration > 0 else None,
        bin_s=width,
        rates=tuple(rates),
        gap_cv=tally.gap_cv,
        prompt=Lengths.of_counts(tally.prompt),
        output=Lengths.of_counts(tally.output),
        real_prompts=tally.real_prompts,
        failed=read.failed,
        failed_lines=read.failed_lines,
        labels=read.labels,
        prefix_hit_ratio=tally.hits.ratio,
    )


def _rank(ordered: Sequence[tuple[int, int]], total: int, q: float) -> int:
    """The nearest-rank ``q`` quantile of lengths counted, sorted by length."""
    wanted, seen = max(1, math.ceil(q * total)), 0
    for value, n in ordered:
        seen += n
        if seen >= wanted:
            return value
    return ordered[-1][0]
