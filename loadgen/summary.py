"""Figures over a set of requests: counts, throughput, latency percentiles."""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from loadgen.timing import Outcome, RequestTiming

__all__ = ["Distribution", "Summary", "summarize"]


@dataclass(frozen=True, slots=True)
class Distribution:
    """Mean and percentiles of one figure, in its own unit."""

    count: int
    mean: float
    p50: float
    p90: float
    p95: float
    p99: float

    @classmethod
    def of(cls, values: Sequence[float]) -> Distribution | None:
        """The distribution of ``values``; None when empty."""
        if not values:
            return None
        if len(values) == 1:
            v = values[0]
            return cls(1, v, v, v, v, v)
        cuts = statistics.quantiles(values, n=100, method="inclusive")
        return cls(
            len(values),
            statistics.fmean(values),
            cuts[49],
            cuts[89],
            cuts[94],
            cuts[98],
        )


@dataclass(frozen=True, slots=True)
class Summary:
    """What a set of requests measured."""

    requests: int
    outcomes: dict[str, int]
    duration_s: float
    request_throughput: float
    output_throughput: float
    mean_prompt_tokens: float | None
    mean_output_tokens: float | None
    ttft: Distribution | None
    tpot: Distribution | None
    itl: Distribution | None
    e2e: Distribution | None


def summarize(timings: Sequence[RequestTiming]) -> Summary:
    """Summarize finished requests; throughput over first send to last end."""
    ok = [t for t in timings if t.outcome is Outcome.OK]
    outcomes = Counter(str(t.outcome) for t in timings)
    duration = (
        max(t.end_s for t in timings) - min(t.sent_s for t in timings)
        if timings
        else 0.0
    )
    tokens = sum(t.output_tokens for t in ok)
    prompts = [t.prompt_tokens for t in ok if t.prompt_tokens is not None]
    return Summary(
        requests=len(timings),
        outcomes=dict(outcomes),
        duration_s=duration,
        request_throughput=len(ok) / duration if duration > 0 else 0.0,
        output_throughput=tokens / duration if duration > 0 else 0.0,
        mean_prompt_tokens=statistics.fmean(prompts) if prompts else None,
        mean_output_tokens=statistics.fmean([t.output_tokens for t in ok])
        if ok
        else None,
        ttft=Distribution.of([v for t in ok if (v := t.ttft) is not None]),
        tpot=Distribution.of([v for t in ok if (v := t.tpot) is not None]),
        itl=Distribution.of([gap for t in ok for gap in t.itl]),
        e2e=Distribution.of([t.e2e for t in ok]),
    )
