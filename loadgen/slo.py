"""Service-level objectives on client figures: parsing and checking.

``--slo ttft_p95<=0.5,itl_p95<=0.05,e2e_p99<=10,error_rate<=0.01``: each term is a
figure, a statistic and a threshold in seconds (or a ratio for ``error_rate``).

Figures: ``ttft``, ``ttfc``, ``itl``, ``tpot``, ``e2e``, ``dispatch_lag``. Statistics:
``mean``, ``p50``, ``p90``, ``p95``, ``p99``, ``max``. ``error_rate`` is the share of
finished requests whose outcome is not ``ok``.

Goodput counts the ok requests that meet every latency term on their own: a request's
TTFT, TPOT, E2E and dispatch lag are single values; its ITL term compares the
request's own percentile of its gaps (DistServe's per-request definition, extended to
ITL).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

from loadgen.timing import Outcome, RequestTiming
from servemon.errors import ConfigError

__all__ = ["FIGURES", "STATS", "SloTerm", "parse_slo", "request_meets"]

FIGURES = ("ttft", "ttfc", "itl", "tpot", "e2e", "dispatch_lag")
STATS = ("mean", "p50", "p90", "p95", "p99", "max")
_TERM = re.compile(
    r"^\s*([a-z0-9_]+?)(?:_(mean|p50|p90|p95|p99|max))?\s*<=\s*([0-9.eE+-]+)\s*$"
)


@dataclass(frozen=True, slots=True)
class SloTerm:
    """``figure_stat <= threshold``."""

    figure: str
    stat: str
    threshold: float

    def __str__(self) -> str:
        if self.figure == "error_rate":
            return f"error_rate<={self.threshold:g}"
        return f"{self.figure}_{self.stat}<={self.threshold:g}"

    @property
    def key(self) -> str:
        """The name of the figure in a summary, e.g. ``ttft_p95``."""
        return (
            "error_rate"
            if self.figure == "error_rate"
            else f"{self.figure}_{self.stat}"
        )


def parse_slo(text: str) -> list[SloTerm]:
    """Parse a comma-separated SLO; a bad term gives one line naming it."""
    terms: list[SloTerm] = []
    for raw in text.split(","):
        if not raw.strip():
            continue
        match = _TERM.match(raw)
        bad = f"--slo: {raw.strip()!r}"
        if not match:
            raise ConfigError(
                f"{bad}: expected FIGURE_STAT<=NUMBER, e.g. ttft_p95<=0.5"
            )
        figure, stat, number = match.groups()
        try:
            threshold = float(number)
        except ValueError:
            raise ConfigError(f"{bad}: {number!r} is not a number") from None
        if not math.isfinite(threshold) or threshold < 0:
            raise ConfigError(f"{bad}: the threshold must be a number >= 0")
        if figure == "error_rate" and stat is None:
            terms.append(SloTerm("error_rate", "ratio", threshold))
            continue
        if figure not in FIGURES:
            known = ", ".join((*FIGURES, "error_rate"))
            raise ConfigError(f"{bad}: unknown figure {figure!r} (known: {known})")
        if stat is None:
            raise ConfigError(f"{bad}: name a statistic ({', '.join(STATS)})")
        terms.append(SloTerm(figure, stat, threshold))
    if not terms:
        raise ConfigError("--slo: no terms")
    return terms


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
        rank = int(term.stat[1:]) / 100 * (len(gaps) - 1)
        return gaps[round(rank)]
    values = {
        "ttft": timing.ttft,
        "ttfc": timing.time_to_first_chunk,
        "tpot": timing.tpot,
        "e2e": timing.e2e,
        "dispatch_lag": timing.dispatch_lag,
    }
    return values.get(term.figure)
