"""``plan.html``: a plan of replicas (:mod:`servemon.loadgen.reports.replicas`) as one
self-contained page: the tiers' table, what the plan assumed and warns of, for
runs at several sizes each tier's capacity against replicas (the points measured,
the curve the plan reads, and the linear line for comparison), and for a trace a
step plot of the replicas each tier needs over time above the forecast's rate
(inline SVG, as the run reports draw theirs)."""

from __future__ import annotations

import html
from collections.abc import Sequence
from pathlib import Path

import matplotlib.pyplot as plt
from matplotlib.ticker import MaxNLocator

from servemon.core.errors import RecordError
from servemon.loadgen.reports.plots import svg
from servemon.loadgen.reports.replicas import Plan, TierPlan
from servemon.loadgen.reports.report import CSS

__all__ = [
    "PLAN_HEADER",
    "plan_rows",
    "plot_replicas",
    "plot_sizes",
    "render_plan",
    "write_plan",
]

PLAN_HEADER = (
    "tier",
    "SLO",
    "capacity req/s",
    "planned req/s",
    "replicas at peak",
    "cost/h",
    "$/Mtok",
)
#: Added for a trace.
TRACE_HEADER = ("replicas min-max", "cost of trace", "static at peak", "trace $/Mtok")


def _money(value: float | None) -> str:
    return "-" if value is None else f"{value:,.2f}"


def _num(value: float | None, spec: str = ".4g") -> str:
    return "-" if value is None else format(value, spec)


def _capacity(t: TierPlan) -> str:
    """A tier's capacity: one replica's, or at each size measured (``C@N``)."""
    if len(t.sizes) > 1 or (t.sizes and t.sizes[0][0] != 1):
        return ", ".join(f"{c:.4g}@{n}" for n, c in t.sizes)
    return _num(t.capacity_rps)


def plan_rows(plan: Plan) -> tuple[tuple[str, ...], list[list[str]]]:
    """The table's header and one row per tier (terminal and page alike)."""
    trace = plan.forecast.bin_s is not None
    header = PLAN_HEADER + (TRACE_HEADER if trace else ())
    rows = []
    for t in plan.tiers:
        row = [
            t.name,
            t.slo,
            _capacity(t),
            _num(t.planned_rps),
            _num(t.peak_replicas, "d"),
            _money(t.cost_per_hour),
            _money(t.cost_per_mtok),
        ]
        if trace:
            span = f"{min(t.replicas)}-{max(t.replicas)}" if t.replicas else "-"
            row += [
                span,
                _money(t.trace_cost),
                _money(t.static_cost),
                _money(t.trace_cost_per_mtok),
            ]
        rows.append(row)
    return header, rows


def plot_replicas(plan: Plan) -> str | None:
    """Replicas per bin for each tier (steps) above the forecast's rate; None
    for a forecast without bins."""
    f = plan.forecast
    tiers: Sequence[TierPlan] = [t for t in plan.tiers if t.replicas]
    if f.bin_s is None or not tiers:
        return None
    hours = [i * f.bin_s / 3600 for i in range(len(f.counts) + 1)]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(10, 5.2), sharex=True)
    for t in tiers:
        steps = [*t.replicas, t.replicas[-1]]
        top.step(hours, steps, where="post", label=f"{t.name} ({t.planned_rps:.3g}/r)")
    top.set_ylabel("replicas")
    top.set_ylim(bottom=0)
    top.yaxis.set_major_locator(MaxNLocator(integer=True))
    top.legend(fontsize=7, loc="upper right")
    top.set_title(
        f"Replicas per {f.bin_s:g}-s bin (each planned at capacity x "
        f"(1 - {plan.headroom:g}))"
    )
    rates = f.rates
    bottom.step(hours, [*rates, rates[-1]], where="post", color="tab:grey")
    bottom.set_ylabel("forecast req/s")
    bottom.set_xlabel("hours since the trace's start")
    bottom.set_ylim(bottom=0)
    for axis in (top, bottom):
        axis.grid(alpha=0.3)
    return svg(fig)


def plot_sizes(plan: Plan) -> str | None:
    """Each tier's capacity against replicas: the sizes measured (points), the
    curve the plan reads (dashed past the largest size, out to the most replicas
    the forecast needs), and ``N x`` the smallest size's per-replica capacity
    (dotted); None for a plan from one size."""
    tiers = [t for t in plan.tiers if t.sizes]
    if len(plan.sizes) < 2 or not tiers:
        return None
    fig, axis = plt.subplots(figsize=(6.4, 3.6))
    for i, t in enumerate(tiers):
        color = f"C{i}"
        measured = [n for n, _ in t.sizes]
        needed = max((t.peak_replicas or 0, *t.replicas, measured[-1]))
        # Through the origin to the smallest size, then point to point.
        axis.plot([0, *measured], [0.0, *(c for _, c in t.sizes)], color=color,
                  label=f"{t.name} (measured)")  # fmt: skip
        axis.plot(*zip(*t.sizes, strict=True), "o", color=color)
        if needed > measured[-1]:
            each = t.sizes[-1][1] / measured[-1]
            axis.plot([measured[-1], needed], [t.sizes[-1][1], needed * each],
                      "--", color=color)  # fmt: skip
        first = t.sizes[0][1] / measured[0]
        axis.plot([0, needed], [0, needed * first], ":", color=color, alpha=0.7,
                  label=f"{t.name} linear ({first:.3g}/replica)")  # fmt: skip
    axis.set_xlabel("replicas")
    axis.set_ylabel("capacity req/s")
    axis.set_xlim(left=0)
    axis.set_ylim(bottom=0)
    axis.xaxis.set_major_locator(MaxNLocator(integer=True))
    axis.grid(alpha=0.3)
    axis.legend(fontsize=7, loc="upper left")
    axis.set_title("Capacity against replicas (points: the runs)")
    return svg(fig)


def render_plan(plan: Plan) -> str:
    """The page as one HTML document."""
    header, rows = plan_rows(plan)
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>"
        for row in rows
    )
    f = plan.forecast
    facts = [
        ("capacity runs" if len(plan.sizes) > 1 else "capacity run", plan.run),
        ("forecast", f.source),
        ("peak", f"{f.peak_rps:.4g} req/s"),
        ("headroom", f"{plan.headroom:g}"),
        ("a replica's hour", plan.pricing.said),
        ("GPUs per replica", f"{_num(plan.gpus, 'd')} ({plan.gpus_from})"),
    ]
    if f.hours is not None:
        facts.append(("covers", f"{f.hours:.3g} h in {len(f.counts)} bins"))
    dl = "".join(
        f"<dt>{html.escape(k)}</dt><dd>{html.escape(v)}</dd>" for k, v in facts
    )
    plot = plot_replicas(plan)
    sizes = plot_sizes(plan)
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'>",
        "<title>servemon plan</title>",
        f"<style>{CSS}</style></head><body>",
        "<h1>servemon plan — replicas for a forecast</h1>",
        f"<dl>{dl}</dl>",
        "<h2>Tiers</h2>",
        f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>",
        *([] if sizes is None else ["<h2>Capacity against replicas</h2>", sizes]),
        *([] if plot is None else ["<h2>Replicas over time</h2>", plot]),
        "<h2>Assumed</h2><ul>",
        *(f"<li>{html.escape(a)}</li>" for a in plan.assumptions),
        "</ul>",
    ]
    if plan.warnings:
        parts += [
            "<h2>Warnings</h2><ul>",
            *(f"<li>{html.escape(w)}</li>" for w in plan.warnings),
            "</ul>",
        ]
    parts.append("</body></html>")
    return "\n".join(parts)


def write_plan(plan: Plan, out: Path) -> None:
    """Write the page to ``out``; a failed write is one line naming it."""
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(render_plan(plan), encoding="utf-8")
    except OSError as exc:
        raise RecordError(f"cannot write {out}: {exc.strerror or exc}") from None
