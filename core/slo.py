"""The SLO terms servemon speaks: ``figure_stat<=threshold``, parsed in one place.

``ttft_p95<=0.5,itl_p95<=0.05,e2e_p99<=10,error_rate<=0.01``: each term is a figure, a
statistic and a threshold in seconds (or a ratio for ``error_rate``). Figures:
``ttft``, ``ttfc``, ``itl``, ``tpot``, ``e2e``, ``dispatch_lag``; statistics: ``mean``,
``p50``, ``p90``, ``p95``, ``p99``, ``max``. The load generator judges runs with them
(:mod:`loadgen.record.slo`) and the rules generator reads them (``loadgen_slo``).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from servemon.core.errors import ConfigError

__all__ = ["SLO_FIGURES", "STATS", "SloTerm", "parse_slo"]

#: The client figures an SLO term may name (besides ``error_rate``).
SLO_FIGURES = ("ttft", "ttfc", "itl", "tpot", "e2e", "dispatch_lag")
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
        if figure not in SLO_FIGURES:
            known = ", ".join((*SLO_FIGURES, "error_rate"))
            raise ConfigError(f"{bad}: unknown figure {figure!r} (known: {known})")
        if stat is None:
            raise ConfigError(f"{bad}: name a statistic ({', '.join(STATS)})")
        terms.append(SloTerm(figure, stat, threshold))
    if not terms:
        raise ConfigError("--slo: no terms")
    return terms
