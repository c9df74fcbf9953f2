"""One streaming pass over a run directory's request and sample files, keeping only
what the report draws: bounded however long the run was.

- requests sent per second (a count per second of the run);
- the TTFT of ok requests per window of :data:`WINDOW_S` seconds (a
  :class:`~servemon.loadgen.record.figures.FigureStats` each, for its p95 over time);
- per stage, the distributions of TTFT, ITL and E2E (for the CDFs) and the sums of
  the server-reported TTFT parts;
- a seeded uniform sample of :data:`SCATTER_POINTS` requests (reservoir sampling)
  for the TTFT-over-time scatter, with the count it stands for;
- the few sampled server series the time line plots.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from servemon.core import names
from servemon.loadgen.record.figures import FigureStats
from servemon.loadgen.record.line import keys
from servemon.loadgen.record.record import read_jsonl

__all__ = ["CDF_FIGURES", "SCATTER_POINTS", "SERIES", "WINDOW_S", "RunScan", "scan"]

WINDOW_S = 5.0
SCATTER_POINTS = 4000
#: Values kept exactly per time window before its sketch takes over.
WINDOW_EXACT = 2000
#: Figures drawn as CDFs per stage, with the requests.jsonl field each comes from.
CDF_FIGURES = dict(
    zip(("ttft", "itl", "e2e"), keys("ttft_s", "itl_s", "e2e_s"), strict=True)
)
#: The keys of a request's line this pass reads (:mod:`servemon.loadgen.record.line`).
SENT, STAGE, OUTCOME, TTFT, FIRST_CONTENT, GAP, QUEUE, PREFILL = keys(
    "sent_s",
    "stage",
    "outcome",
    "ttft_s",
    "first_content_s",
    "ttft_gap_s",
    "server_queue_s",
    "server_prefill_s",
)
#: The sampled server series the time line plots.
SERIES = (
    names.ENGINE_REQUESTS_RUNNING.name,
    names.ENGINE_REQUESTS_WAITING.name,
    names.ENGINE_KV_CACHE_USAGE.name,
    names.ENGINE_PREFIX_HITS.name,
    names.ENGINE_PREFIX_QUERIES.name,
)


@dataclass(slots=True)
class Point:
    """One sampled request for the scatter: when it was sent (seconds since the
    run's start), its TTFT or None (not ok), its stage."""

    sent_s: float
    ttft_s: float | None
    stage: int


@dataclass(slots=True)
class RunScan:
    """What one pass over a run directory keeps (see the module docstring)."""

    requests: int = 0
    sent_per_second: Counter[int] = field(default_factory=Counter)
    ttft_windows: dict[int, FigureStats] = field(default_factory=dict)
    cdf: dict[int, dict[str, FigureStats]] = field(default_factory=dict)
    #: stage -> [requests, queue s, prefill s, gap s] summed over ok requests whose
    #: server reported its part of TTFT.
    parts: dict[int, list[float]] = field(default_factory=dict)
    scatter: list[Point] = field(default_factory=list)
    series: dict[str, tuple[list[float], list[float]]] = field(default_factory=dict)
    samples: int = 0

    def has_server_metrics(self) -> bool:
        """Whether any sample held the target's series."""
        return any(xs for xs, _ys in self.series.values())


def scan(run_dir: Path, origin_s: float, *, seed: int = 0) -> RunScan:
    """Scan ``run_dir``'s ``requests.jsonl`` and ``server_metrics.jsonl`` once."""
    out = RunScan()
    _requests(out, read_jsonl(run_dir / "requests.jsonl"), origin_s, seed)
    _samples(out, read_jsonl(run_dir / "server_metrics.jsonl"), origin_s)
    return out


def _requests(
    out: RunScan, lines: Iterable[dict[str, Any]], origin: float, seed: int
) -> None:
    rng = random.Random(seed)
    for line in lines:
        try:
            sent = float(line[SENT]) - origin
            stage = int(line.get(STAGE, 0))
        except (KeyError, TypeError, ValueError):
            continue
        out.requests += 1
        out.sent_per_second[int(sent // 1.0)] += 1
        ok = line.get(OUTCOME) == "ok"
        ttft = _number(line.get(TTFT)) if ok else None
        point = Point(sent, ttft, stage)
        if len(out.scatter) < SCATTER_POINTS:
            out.scatter.append(point)
        else:
            slot = rng.randrange(out.requests)
            if slot < SCATTER_POINTS:
                out.scatter[slot] = point
        if not ok:
            continue
        figures = out.cdf.get(stage)
        if figures is None:
            figures = out.cdf[stage] = {k: FigureStats() for k in CDF_FIGURES}
        for name, key in CDF_FIGURES.items():
            value = line.get(key)
            if isinstance(value, list):
                figures[name].extend(float(v) for v in value)
            elif (number := _number(value)) is not None:
                figures[name].add(number)
        first = _number(line.get(FIRST_CONTENT))
        if ttft is not None and first is not None:
            window = int((first - origin) // WINDOW_S)
            stats = out.ttft_windows.get(window)
            if stats is None:
                stats = out.ttft_windows[window] = FigureStats(WINDOW_EXACT)
            stats.add(ttft)
        gap = _number(line.get(GAP))
        if gap is not None:
            sums = out.parts.setdefault(stage, [0.0, 0.0, 0.0, 0.0])
            sums[0] += 1
            sums[1] += _number(line.get(QUEUE)) or 0.0
            sums[2] += _number(line.get(PREFILL)) or 0.0
            sums[3] += gap


def _samples(out: RunScan, lines: Iterable[dict[str, Any]], origin: float) -> None:
    wanted = set(SERIES)
    for name in SERIES:
        out.series[name] = ([], [])
    for line in lines:
        out.samples += 1
        sums: dict[str, float] = {}
        try:
            at = float(line["mono_s"]) - origin
            for name, _labels, value in line.get("samples") or ():
                if name in wanted:
                    sums[name] = sums.get(name, 0.0) + float(value)
        except (KeyError, TypeError, ValueError):
            continue
        for name, total in sums.items():
            xs, ys = out.series[name]
            xs.append(at)
            ys.append(total)


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)
