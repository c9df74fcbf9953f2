"""A capacity search's answer as table rows, one per SLO tier: what the terminal
prints at the end of a search over several tiers and the report's capacity table
shows (a search over one SLO is one row).
"""

from __future__ import annotations

from servemon.loadgen.record.findings import CapacityResult, TierResult
from servemon.loadgen.record.runrecord import RunSummary
from servemon.loadgen.record.summary import Summary

__all__ = ["TIER_HEADER", "at_capacity", "tier_results", "tier_rows"]

TIER_HEADER = (
    "tier",
    "SLO",
    "capacity req/s",
    "bracket req/s",
    "broke first",
    "saturated first",
    "J/token",
    "$/Mtok",
    "ended because",
)


def tier_results(found: CapacityResult, slo: list[str]) -> list[TierResult]:
    """Each tier's answer, strictest first; a search over one SLO (``slo``: its
    terms) as one tier named ``slo``."""
    if found.tiers:
        return list(found.tiers)
    return [
        TierResult(
            "slo",
            ",".join(slo),
            found.capacity_rps,
            found.bracket,
            found.first_breach,
            found.saturated_first,
            found.ended_because,
        )
    ]


def at_capacity(
    found: CapacityResult, record: RunSummary, rate: float | None
) -> Summary | None:
    """The summary of the good step at ``rate`` (a tier's capacity), if any."""
    if rate is None:
        return None
    stages = {s.stage: s for s in record.stages}
    for step in found.steps:
        stage = stages.get(step.stage)
        if step.rate == rate and not step.blind and stage is not None:
            return stage.summary
    return None


def _rate(value: float | None) -> str:
    return "-" if value is None else f"{value:.4g}"


def _value(summary: Summary | None, key: str) -> str:
    value = None if summary is None else summary.value(key)
    return "-" if value is None else f"{value:.3g}"


def tier_rows(record: RunSummary) -> list[list[str]]:
    """One row per tier (columns :data:`TIER_HEADER`); none without a search."""
    found = record.capacity
    if found is None:
        return []
    rows = []
    for tier in tier_results(found, record.slo):
        low, high = tier.bracket
        at = at_capacity(found, record, tier.capacity_rps)
        rows.append(
            [
                tier.name,
                tier.slo,
                _rate(tier.capacity_rps),
                f"{_rate(low)} - {_rate(high)}",
                tier.first_breach or "none",
                tier.saturated_first or "nothing",
                _value(at, "joules_per_token"),
                _value(at, "cost_per_mtok"),
                tier.ended_because,
            ]
        )
    return rows
