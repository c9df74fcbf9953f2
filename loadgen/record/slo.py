"""Service-level objectives on client figures: how one request is judged against
the terms (:mod:`servemon.core.slo`).

``error_rate`` is the share of finished requests (cancelled ones aside) whose outcome
is not ``ok``.

Goodput counts the ok requests that meet every latency term on their own: a request's
TTFT, TPOT, E2E and dispatch lag are single values; its ITL term compares the
request's own percentile of its gaps (DistServe's per-request definition, extended to
ITL).
"""

from __future__ import annotations

from collections.abc import Sequence

from servemon.core.slo import SloTerm
from servemon.loadgen.record.figures import QUANTILES, exact_quantile
from servemon.loadgen.send.timing import Outcome, RequestTiming

__all__ = ["request_meets"]


def request_meets(timing: RequestTiming, terms: Sequence[SloTerm]) -> bool:
    """Whether one ok request meets every latency term on its own."""
    if timing.outcome is not Outcome.OK:
        return False
    for term in terms:
        value = _request_value(timing, term)
        if value is not None and value > term.threshold:
            return False
    return True


def _request_value(timing: RequestTiming, term: SloTerm) -> float | None:
    if term.figure == "itl":
        gaps = sorted(timing.itl)
        if not gaps:
            return None
        if term.stat == "mean":
            return sum(gaps) / len(gaps)
        if term.stat == "max":
            return gaps[-1]
        return exact_quantile(gaps, QUANTILES[term.stat])
    values = {
        "ttft": timing.ttft,
        "ttfc": timing.time_to_first_chunk,
        "tpot": timing.tpot,
        "e2e": timing.e2e,
        "dispatch_lag": timing.dispatch_lag,
    }
    return values.get(term.figure)
