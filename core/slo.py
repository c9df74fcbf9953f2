"""The SLO terms servemon speaks: ``figure_stat<=threshold``, parsed in one place.

``ttft_p95<=0.5,itl_p95<=0.05,e2e_p99<=10,error_rate<=0.01``: each term is a figure, a
statistic and a threshold in seconds (or a ratio for ``error_rate``). Figures:
``ttft``, ``ttfc``, ``itl``, ``tpot``, ``e2e``, ``dispatch_lag``; statistics: ``mean``,
``p50``, ``p90``, ``p95``, ``p99``, ``max``. The load generator judges runs with them
(:mod:`servemon.loadgen.record.slo`) and the rules generator reads them
(``loadgen_slo``).

A capacity search can take several named SLOs, tiers (``interactive=ttft_p95<=0.3``
and ``batch=e2e_p95<=30``): :func:`parse_tiers` reads them from repeated ``--slo``
flags or a YAML mapping; a plain SLO is one tier without a name.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from servemon.core.errors import ConfigError

__all__ = ["SLO_FIGURES", "STATS", "SloTerm", "SloTier", "parse_slo", "parse_tiers"]

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


def parse_slo(text: str, where: str = "--slo") -> list[SloTerm]:
    """Parse a comma-separated SLO; a bad term gives one line naming it (after
    ``where``: the flag, and the tier if it has a name)."""
    terms: list[SloTerm] = []
    for raw in text.split(","):
        if not raw.strip():
            continue
        match = _TERM.match(raw)
        bad = f"{where}: {raw.strip()!r}"
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
        raise ConfigError(f"{where}: no terms")
    return terms


#: A tier's name: ``NAME=`` before its terms (the ``=`` of a term follows ``<``).
_TIER = re.compile(r"^\s*([A-Za-z][A-Za-z0-9_-]*)\s*=(?!=)(.*)$", re.DOTALL)


@dataclass(frozen=True, slots=True)
class SloTier:
    """One named SLO (``name`` is ``""`` for a plain, unnamed ``--slo``)."""

    name: str
    terms: tuple[SloTerm, ...]

    @property
    def text(self) -> str:
        """The terms as ``--slo`` writes them."""
        return ",".join(str(t) for t in self.terms)

    def __str__(self) -> str:
        return f"{self.name}={self.text}" if self.name else self.text


def _tier(name: str, text: object) -> SloTier:
    where = f"--slo {name}" if name else "--slo"
    if not isinstance(text, str):
        raise ConfigError(f"{where}: expected terms as text, e.g. ttft_p95<=0.5")
    return SloTier(name, tuple(parse_slo(text, where)))


def parse_tiers(value: str | Iterable[str] | Mapping[str, str]) -> tuple[SloTier, ...]:
    """SLO tiers from one ``--slo`` text, several (a repeated flag, a YAML list of
    ``NAME=TERMS``) or a YAML mapping of name to terms. Several tiers must each have
    a name, and a name is used once; a bad tier gives one line naming the flag and
    the tier."""
    if isinstance(value, str):
        value = [value]
    if isinstance(value, Mapping):
        tiers = [_tier(str(name), text) for name, text in value.items()]
    else:
        tiers = []
        for text in value:
            if not isinstance(text, str):
                raise ConfigError("--slo: expected NAME=TERMS or TERMS as text")
            named = _TIER.match(text)
            tiers.append(_tier(*named.groups()) if named else _tier("", text))
    if not tiers:
        raise ConfigError("--slo: no terms")
    if len(tiers) > 1:
        unnamed = [t for t in tiers if not t.name]
        if unnamed:
            raise ConfigError(
                f"--slo {unnamed[0].text}: several SLOs need a name each, "
                "e.g. --slo interactive=ttft_p95<=0.3 --slo batch=e2e_p95<=30"
            )
        names = [t.name for t in tiers]
        twice = next((n for n in names if names.count(n) > 1), None)
        if twice is not None:
            raise ConfigError(f"--slo {twice}: the tier is named twice")
    return tuple(tiers)
