"""The decision drawn on the report's plots: each SLO tier's thresholds, the
capacity each tier found, and which capacity steps broke an SLO.

A capacity search's tiers come from its summary
(:mod:`servemon.loadgen.record.findings`; one SLO is one tier named ``slo``); any other
run with an SLO has that one tier and no capacity. Every mark carries a stable SVG id
(matplotlib's ``gid``) that names what it is, so a reader of the SVG (and the browser
test) finds it:

- ``slo-{tier}-{figure}``: a threshold on the latency-against-load panel;
- ``capacity-{tier}``: a tier's capacity on the same panel;
- ``timeline-slo-{tier}-ttft_p95``: a TTFT p95 threshold on the time line;
- ``timeline-capacity-{tier}``: the step at a tier's capacity on the time line;
- ``timeline-breach-{stage}``: a step that broke an SLO, shaded.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from servemon.core.errors import ConfigError
from servemon.core.slo import SloTerm, parse_slo
from servemon.loadgen.record.capacityrows import tier_results
from servemon.loadgen.record.runrecord import RunInfo, RunSummary

__all__ = [
    "Tier",
    "figure_label",
    "mark_capacity",
    "mark_steps",
    "mark_thresholds",
    "tiers_of",
]

#: A tier's line style, by its place (strictest first).
STYLES = ("--", "-.", ":", (0, (6, 2, 1, 2, 1, 2)))
#: A step that broke every tier, and one that broke only some.
BROKE_ALL, BROKE_SOME = "#d62728", "#ff7f0e"
CAPACITY = "#2ca02c"
#: Behind a mark's label: it stays legible where it crosses a curve.
BEHIND = {"boxstyle": "square,pad=0.1", "fc": "white", "ec": "none", "alpha": 0.8}


@dataclass(frozen=True, slots=True)
class Tier:
    """One SLO tier as the plots draw it."""

    name: str
    terms: tuple[SloTerm, ...]
    capacity_rps: float | None
    style: Any


def tiers_of(info: RunInfo, record: RunSummary) -> list[Tier]:
    """The run's SLO tiers, strictest first; none without an SLO."""
    found = record.capacity
    if found is not None:
        pairs = [
            (t.name, _terms(t.slo), t.capacity_rps)
            for t in tier_results(found, info.slo)
        ]
    else:  # the run's one SLO, as the record has it (no second parse)
        pairs = [("slo", tuple(info.terms()), None)]
    tiers = []
    for i, (name, terms, rate) in enumerate(pairs):
        if terms or rate is not None:
            tiers.append(Tier(name, terms, rate, STYLES[i % len(STYLES)]))
    return tiers


def _terms(text: str) -> tuple[SloTerm, ...]:
    """A tier's terms from the text the record keeps (none if it does not read)."""
    try:
        return tuple(parse_slo(text)) if text else ()
    except ConfigError:
        return ()


def figure_label(key: str) -> str:
    """``ttft_p95`` as a legend writes it: ``TTFT p95``."""
    figure, _, stat = key.rpartition("_")
    return f"{figure.replace('_', ' ').upper()} {stat}"


def _stacked(placed: dict[float, int], where: float) -> int:
    """How many labels were put at ``where`` before this one (counted in
    ``placed``): the next one goes that many lines further out."""
    k = placed.get(where, 0)
    placed[where] = k + 1
    return k


def mark_thresholds(
    axis: Any,
    tiers: Sequence[Tier],
    colours: dict[str, str],
    *,
    prefix: str = "",
) -> None:
    """A horizontal line (ms) at each tier's term whose figure ``axis`` draws
    (``colours``: each drawn figure's colour), labelled with the tier and term."""
    placed: dict[float, int] = {}
    for tier in tiers:
        for term in tier.terms:
            colour = colours.get(term.key)
            if colour is None:
                continue
            ms = term.threshold * 1000
            axis.axhline(
                ms,
                color=colour,
                ls=tier.style,
                lw=1.1,
                gid=f"{prefix}slo-{tier.name}-{term.key}",
            )
            k = _stacked(placed, ms)
            axis.annotate(
                f"{tier.name}: {figure_label(term.key)} ≤ {ms:g} ms",
                xy=(0, ms),
                xycoords=("axes fraction", "data"),
                xytext=(3, 1 + 9 * k),
                textcoords="offset points",
                ha="left",
                va="bottom",
                fontsize=7,
                color=colour,
                bbox=BEHIND,
                gid=f"{prefix}slo-{tier.name}-{term.key}-label",
            )


def mark_capacity(axis: Any, tiers: Sequence[Tier], top_rate: float) -> None:
    """A vertical line at each tier's capacity, labelled with its name and rate;
    a tier that met no rate says so in the corner."""
    placed: dict[float, int] = {}
    unmet = []
    for tier in tiers:
        rate = tier.capacity_rps
        if rate is None:
            if tier.terms:
                unmet.append(tier.name)
            continue
        axis.axvline(
            rate, color=CAPACITY, ls=tier.style, lw=1.4, gid=f"capacity-{tier.name}"
        )
        k = _stacked(placed, rate)
        right = top_rate > 0 and rate > 0.8 * top_rate
        axis.annotate(
            f"{tier.name} capacity {rate:.4g} req/s",
            xy=(rate, 0),
            xycoords=("data", "axes fraction"),
            xytext=(-3 - 10 * k if right else 3 + 10 * k, 3),
            textcoords="offset points",
            rotation=90,
            ha="right" if right else "left",
            va="bottom",
            fontsize=7,
            color=CAPACITY,
            bbox=BEHIND,
            gid=f"capacity-{tier.name}-label",
        )
    if unmet:
        axis.text(
            0.01,
            0.01,
            "no rate met: " + ", ".join(unmet),
            transform=axis.transAxes,
            fontsize=7,
            color=BROKE_ALL,
        )


def mark_steps(axes: Sequence[Any], tiers: Sequence[Tier], record: RunSummary) -> bool:
    """On the time line: shade each capacity step that broke an SLO (lighter: only
    some tiers), and mark the step at each tier's capacity on the rate panel
    (``axes[0]``). True where anything was marked."""
    found = record.capacity
    if found is None:
        return False
    stages = {s.stage: s for s in record.stages}
    rate_ax, placed = axes[0], dict[float, int]()
    for step in found.steps:
        stage = stages.get(step.stage)
        if step.good or step.blind or stage is None:
            continue
        if stage.start_s is None or stage.end_s is None:
            continue
        some = bool(step.tiers) and any(step.tiers.values())
        for i, axis in enumerate(axes):
            axis.axvspan(
                stage.start_s,
                stage.end_s,
                color=BROKE_SOME if some else BROKE_ALL,
                alpha=0.1 if some else 0.14,
                lw=0,
                gid=f"timeline-breach-{step.stage}" if i == 0 else None,
            )
    for tier in tiers:
        at = [
            s
            for s in found.steps
            if tier.capacity_rps is not None
            and s.rate == tier.capacity_rps
            and not s.blind
        ]
        stage = stages.get(at[-1].stage) if at else None
        if stage is None or stage.start_s is None or stage.end_s is None:
            continue
        middle = (stage.start_s + stage.end_s) / 2
        rate_ax.plot(
            [middle],
            [tier.capacity_rps],
            marker="v",
            color=CAPACITY,
            markersize=7,
            gid=f"timeline-capacity-{tier.name}",
        )
        k = _stacked(placed, middle)
        rate_ax.annotate(
            f"{tier.name} capacity",
            xy=(middle, tier.capacity_rps),
            xytext=(0, 6 + 9 * k),
            textcoords="offset points",
            ha="center",
            va="bottom",
            fontsize=7,
            color=CAPACITY,
            bbox=BEHIND,
        )
    if placed:
        low, high = rate_ax.get_ylim()
        rate_ax.set_ylim(low, high * 1.35)  # room for the labels
    return True
