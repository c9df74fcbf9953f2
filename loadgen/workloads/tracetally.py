"""What a trace adds up to, counted as it is read (``servemon trace info``,
``servemon plan --trace``): requests per bin, prompt and output lengths counted by
value, the gaps between requests, real prompts, and the prefix-cache hits its
``hash_ids`` imply.

Memory stays bounded whatever the file's size (a week of Azure's 2024 trace or
BurstGPT is 10-17 GB): no text and no entry is kept, only the bins (the trace's
duration over the bin width; with no width given, at most
:data:`~servemon.loadgen.workloads.traceinfo.MAX_BINS` of a round width, merged as
the trace grows), a count per distinct length, and for a trace with ``hash_ids``
the block ids seen. A file is taken in its own order, which for every published
trace is time order; one whose times go back is read again whole and sorted
(:func:`~servemon.loadgen.workloads.tracefile.read_trace_file`), so the figures
are the same either way.
"""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path

from servemon.core.errors import ConfigError
from servemon.loadgen.workloads.traceentry import (
    FailedLines,
    TraceEntry,
    TraceFile,
    seconds_after,
)
from servemon.loadgen.workloads.tracefile import (
    PrefixHits,
    read_trace_file,
    stream_trace,
)

__all__ = ["MAX_BINS", "WIDTHS", "OutOfOrder", "TraceTally", "tally_trace"]

#: The most rate bins a tally of no given width makes.
MAX_BINS = 60
#: Bin widths to choose from, in seconds (each divides the next); past the last,
#: whole days doubling.
WIDTHS = (1, 5, 10, 30, 60, 300, 600, 1800, 3600, 3 * 3600, 6 * 3600, 86_400)


class OutOfOrder(Exception):
    """An entry earlier than the one before it: the tally needs time order."""


def round_width(duration_s: float) -> int:
    """The first of :data:`WIDTHS` that cuts ``duration_s`` into under
    :data:`MAX_BINS` bins; past them, days doubling."""
    for width in WIDTHS:
        if duration_s / width < MAX_BINS:
            return width
    width = WIDTHS[-1] * 2
    while duration_s / width >= MAX_BINS:
        width *= 2
    return width


class TraceTally:
    """A trace's figures, entries added in time order (see the module docstring);
    ``bin_s`` None: a round width (:func:`round_width`) of the duration so far."""

    def __init__(self, bin_s: float | None = None) -> None:
        self.fixed = bin_s
        self.bin_s: float = bin_s if bin_s is not None else 1
        self.counts: list[int] = []
        self.requests = 0
        self.duration_s = 0.0
        self.prompt: Counter[int] = Counter()
        self.output: Counter[int] = Counter()
        self.real_prompts = 0
        self.hits = PrefixHits()
        #: The gaps between requests: how many, their sum, and Welford's sum of
        #: squared deviations.
        self.gaps = 0
        self.gap_sum = 0.0
        self._gap_mean = 0.0
        self._gap_m2 = 0.0

    def add(self, at_s: float, entry: TraceEntry) -> None:
        """One entry, ``at_s`` seconds after the first (:class:`OutOfOrder` if
        earlier than the last added)."""
        if self.requests:
            gap = at_s - self.duration_s
            if gap < 0:
                raise OutOfOrder(entry.line)
            self.gaps += 1
            self.gap_sum += gap
            delta = gap - self._gap_mean
            self._gap_mean += delta / self.gaps
            self._gap_m2 += delta * (gap - self._gap_mean)
        self.requests += 1
        self.duration_s = at_s
        if self.fixed is None and at_s / self.bin_s >= MAX_BINS:
            self._widen(round_width(at_s))
        i = int(at_s // self.bin_s)
        if i >= len(self.counts):
            self.counts.extend([0] * (i + 1 - len(self.counts)))
        self.counts[i] += 1
        if entry.prompt_tokens:
            self.prompt[entry.prompt_tokens] += 1
        if entry.output_tokens:
            self.output[entry.output_tokens] += 1
        if entry.text is not None or entry.messages is not None:
            self.real_prompts += 1
        self.hits.add(entry)

    def _widen(self, width: int) -> None:
        """Merge the bins into bins of ``width`` (a multiple of the present one)."""
        k = round(width / self.bin_s)
        merged = [0] * ((len(self.counts) - 1) // k + 1) if self.counts else []
        for i, n in enumerate(self.counts):
            merged[i // k] += n
        self.counts, self.bin_s = merged, width

    @property
    def gap_cv(self) -> float | None:
        """The coefficient of variation of the gaps (None: under 2 gaps, or a
        mean gap of 0)."""
        if self.gaps < 2:
            return None
        mean = self.gap_sum / self.gaps
        if mean <= 0:
            return None
        return math.sqrt(max(self._gap_m2, 0.0) / self.gaps) / mean


def tally_trace(
    path: Path,
    *,
    bin_s: float | None = None,
    failed: FailedLines = "skip",
    where: str | None = None,
) -> tuple[TraceTally, TraceFile]:
    """A trace file counted as it is read (``bin_s``: as :class:`TraceTally`),
    and what reading found (a :class:`TraceFile` without its entries: format,
    failed lines, labels)."""
    where = where or str(path)
    reading = stream_trace(path, failed=failed, where=where)
    tally = TraceTally(bin_s)
    base: float | int | None = None
    try:
        for stamp, entry in reading.rows:
            if base is None:
                base = stamp
            tally.add(seconds_after(stamp, base), entry)
    except OutOfOrder:
        reading.close()
        whole = read_trace_file(path, failed=failed, where=where)
        tally = TraceTally(bin_s)
        for entry in whole.entries:
            tally.add(entry.at_s, entry)
        return tally, TraceFile((), whole.format, whole.failed, whole.failed_lines,
                                whole.labels)  # fmt: skip
    if not tally.requests:
        raise ConfigError(f"{where}: no requests in the file")
    return tally, reading.found()
