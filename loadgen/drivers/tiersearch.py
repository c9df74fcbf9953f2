"""Which rate a capacity search measures next, from the steps judged so far: the
search's policy alone (no sending, no clock), over one SLO or several named tiers.

Every step is judged against every tier, and a tier's bracket is read from all the
steps: the lowest rate that broke it, and the highest rate below that which met it.
The search doubles the rate from ``--rps-min`` and bisects a tier's bracket until
it is within ``--precision``, strictest tier first (the one whose bracket lies
lowest; ties in the order given). When the strictest is done, the next one starts
from what the steps already say of it: often its bracket is already narrowed, or
it only needs the doubling carried on from the highest rate measured. No rate is
measured twice: a midpoint lies between two rates with nothing measured between
them, and a doubling goes above every rate measured.

With one SLO this is the search ``servemon capacity`` always ran: doubling until a
step breaks it, then bisection between the last good and the first bad rate.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

__all__ = ["TierSearch"]

#: Why a tier's search ended (besides the whole search ending).
PRECISION = "precision reached"
AT_MIN = "the SLO breaks already at --rps-min"
AT_MAX = "--rps-max reached with the SLO still met"


class TierSearch:
    """The steps judged so far, and what they say of each tier."""

    def __init__(
        self, tiers: Sequence[str], rps_min: float, rps_max: float, precision: float
    ) -> None:
        self.tiers = tuple(tiers)
        self.rps_min, self.rps_max, self.precision = rps_min, rps_max, precision
        #: Each measured rate: whether it met each tier.
        self.met: dict[float, dict[str, bool]] = {}

    def add(self, rate: float, met: Mapping[str, bool]) -> None:
        """One step judged: whether it met each tier."""
        if rate in self.met:
            raise ValueError(f"{rate:g} req/s was measured already")
        self.met[rate] = {tier: bool(met[tier]) for tier in self.tiers}

    def bracket(self, tier: str) -> tuple[float | None, float | None]:
        """(the highest good rate below the lowest bad one, the lowest bad rate)."""
        bad = min((r for r, m in self.met.items() if not m[tier]), default=None)
        good = max(
            (r for r, m in self.met.items() if m[tier] and (bad is None or r < bad)),
            default=None,
        )
        return good, bad

    def ranked(self) -> list[str]:
        """The tiers, strictest first: by the lowest rate that broke them (those
        not broken yet last), then in the order given."""

        def key(tier: str) -> tuple[bool, float, int]:
            bad = self.bracket(tier)[1]
            return bad is None, bad or 0.0, self.tiers.index(tier)

        return sorted(self.tiers, key=key)

    def settled(self, tier: str) -> str | None:
        """Why the search for ``tier`` is over, or None while it is not."""
        good, bad = self.bracket(tier)
        if bad is not None and good is None:
            return AT_MIN
        if bad is None:
            return AT_MAX if self.met and max(self.met) >= self.rps_max else None
        assert good is not None
        return PRECISION if (bad - good) / good <= self.precision else None

    def next_rate(self) -> float | None:
        """The rate to measure next; None when every tier is settled."""
        if not self.met:
            return min(self.rps_min, self.rps_max)
        for tier in self.ranked():
            if self.settled(tier) is not None:
                continue
            good, bad = self.bracket(tier)
            if bad is None:
                return min(max(self.met) * 2, self.rps_max)
            assert good is not None
            return (good + bad) / 2
        return None
