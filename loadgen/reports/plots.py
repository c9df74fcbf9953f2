"""The report's plots, drawn with matplotlib as inline SVG from the typed record and
one scan of the run (:mod:`servemon.loadgen.record.scan`): no JavaScript, no external
URL.

- throughput and latency percentiles against the offered load, sorted by load (a
  capacity search visits rates out of order);
- latency distributions: the CDF of TTFT, ITL and E2E per stage;
- TTFT by a conversation's turn, with the share of the prompt the cache served;
- TTFT of each (sampled) request against when it was sent, so a queue building up
  shows as a rising band;
- where TTFT went: the server-reported queue and prefill and the client-side rest;
- one time line: target vs achieved rate and, where the target has ``/metrics``,
  running and waiting requests, KV cache usage and the prefix-cache hit ratio; the
  client's TTFT p95 over time.
"""

from __future__ import annotations

import io
import math
from collections.abc import Sequence
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.ticker import FuncFormatter

from servemon.core import names
from servemon.loadgen.record.runrecord import RunInfo, RunSummary, StageResult
from servemon.loadgen.record.scan import CDF_FIGURES, WINDOW_S, RunScan
from servemon.loadgen.reports.marks import (
    Tier,
    figure_label,
    mark_capacity,
    mark_steps,
    mark_thresholds,
    tiers_of,
)

__all__ = [
    "plot_by_turn",
    "plot_cdf",
    "plot_energy_vs_load",
    "plot_timeline",
    "plot_ttft_parts",
    "plot_ttft_scatter",
    "plot_vs_load",
    "svg",
]

plt.rcParams.update({"svg.fonttype": "none", "font.size": 9, "figure.dpi": 96})
#: Quantiles a CDF is drawn through.
CDF_POINTS = [i / 200 for i in range(1, 200)] + [0.999]
LABELS = {"ttft": "TTFT", "itl": "ITL", "e2e": "E2E"}
#: The latencies drawn against load (an SLO term on another figure adds its own).
LATENCY_SERIES = {
    "ttft_p50": "o-",
    "ttft_p95": "o-",
    "ttft_p99": "o-",
    "itl_p95": "^--",
    "e2e_p95": "s:",
}


def svg(fig: Any) -> str:
    """A matplotlib figure as inline SVG text."""
    buffer = io.StringIO()
    # No metadata: it names matplotlib's web site and a timestamp (no URL may appear
    # in a report, and the same run should render the same bytes).
    fig.savefig(
        buffer,
        format="svg",
        bbox_inches="tight",
        metadata={"Creator": None, "Date": None, "Format": None, "Type": None},
    )
    plt.close(fig)
    text = buffer.getvalue()
    return text[text.index("<svg") :]


def _load(info: RunInfo, stage: StageResult) -> float:
    if info.kind == "sweep":
        return float(stage.parallel or 0)
    return float(stage.target_rate or 0)


def plot_vs_load(info: RunInfo, record: RunSummary) -> str:
    """Throughput and latency percentiles against the offered load, by load."""
    label = "concurrency" if info.kind == "sweep" else "offered rate (req/s)"
    stages = sorted(
        (s for s in record.stages if s.summary is not None),
        key=lambda s: _load(info, s),
    )
    x = [_load(info, s) for s in stages]
    summaries = [s.summary for s in stages if s.summary is not None]
    # The latency panel is the wider one: it carries the SLO and the capacity.
    fig, (left, right) = plt.subplots(
        1, 2, figsize=(11, 3.8), gridspec_kw={"width_ratios": [1, 1.4]}
    )
    left.plot(x, [s.request_throughput for s in summaries], "o-", label="requests/s")
    left.set_xlabel(label)
    left.set_ylabel("requests/s (ok)")
    twin = left.twinx()
    twin.plot(
        x,
        [s.output_throughput for s in summaries],
        "s--",
        color="tab:orange",
        label="output tokens/s",
    )
    twin.set_ylabel("output tokens/s")
    for axis in (left, twin):
        axis.set_ylim(bottom=0)
    left.set_title("Throughput")
    left.legend(loc="upper left")
    twin.legend(loc="lower right")
    tiers = tiers_of(info, record)
    drawn = dict(LATENCY_SERIES)
    for tier in tiers:
        for term in tier.terms:
            if term.key != "error_rate":
                drawn.setdefault(term.key, "x-.")
    colours = {}
    for key, style in drawn.items():
        values = [s.value(key) for s in summaries]
        (line,) = right.plot(
            x,
            [float("nan") if v is None else v * 1000 for v in values],
            style,
            label=figure_label(key),
        )
        colours[key] = line.get_color()
    mark_thresholds(right, tiers, colours)
    mark_capacity(right, tiers, max(x, default=0.0))
    right.set_xlabel(label)
    right.set_ylabel("ms")
    right.set_yscale("log")
    right.set_title("Latency (client)")
    right.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.02, 0.5))
    for axis in (left, right):
        axis.grid(alpha=0.3)
    fig.subplots_adjust(wspace=0.55)
    return svg(fig)


def plot_energy_vs_load(info: RunInfo, record: RunSummary) -> str | None:
    """What a token cost at each offered load: J per output token and mean power,
    and (with a price) dollars per million output tokens; None where no stage
    has its energy."""
    stages = sorted(
        (s for s in record.stages if s.summary is not None and s.summary.energy),
        key=lambda s: _load(info, s),
    )
    if not stages:
        return None
    label = "concurrency" if info.kind == "sweep" else "offered rate (req/s)"
    x = [_load(info, s) for s in stages]
    summaries = [s.summary for s in stages if s.summary is not None]

    def of(key: str) -> list[float]:
        return [float("nan") if (v := s.value(key)) is None else v for s in summaries]

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.4))
    left.plot(x, of("joules_per_token"), "o-", label="J/token")
    left.set_ylabel("J per output token")
    twin = left.twinx()
    twin.plot(x, of("watts"), "s--", color="tab:orange", label="W")
    twin.set_ylabel("mean power (W)")
    left.set_title("Energy per token")
    right.plot(x, of("cost_per_mtok"), "o-", label="$ per million output tokens")
    right.set_ylabel("$ / Mtok")
    right.set_title("Cost per token (at the run's price)")
    # From zero: a steady 300 W drawn on 299.8-300.1 W would look like a swing.
    # Headroom above the highest point keeps the legends off the lines.
    for axis in (left, twin, right):
        axis.set_ylim(0, axis.get_ylim()[1] * 1.3)
    left.legend(loc="upper left")
    twin.legend(loc="upper right")
    right.legend(fontsize=7)
    for axis in (left, right):
        axis.set_xlabel(label)
        axis.grid(alpha=0.3)
    fig.subplots_adjust(wspace=0.55)
    return svg(fig)


def plot_by_turn(record: RunSummary) -> str | None:
    """TTFT by a conversation's turn index, with the share of the prompt the
    server's prefix cache served: what the cache buys later turns."""
    groups = record.by_turn or {}
    turns = sorted((int(k), v) for k, v in groups.items() if v.figure("ttft"))
    if not turns:
        return None
    x = [k for k, _ in turns]
    fig, left = plt.subplots(figsize=(7, 3.2))
    for key, style in (("ttft_p50", "o-"), ("ttft_p95", "s--")):
        values = [s.value(key) for _, s in turns]
        left.plot(
            x,
            [float("nan") if v is None else v * 1000 for v in values],
            style,
            label=key.replace("_", " ").upper().replace(" P", " p"),
        )
    left.set_xlabel("turn of the conversation")
    left.set_ylabel("TTFT (ms)")
    left.set_xticks(x)
    left.set_ylim(bottom=0)
    left.grid(alpha=0.3)
    cached = [s.cached_fraction for _, s in turns]
    if any(c is not None for c in cached):
        twin = left.twinx()
        twin.plot(
            x,
            [float("nan") if c is None else c * 100 for c in cached],
            "^:",
            color="tab:green",
            label="cached prompt (%)",
        )
        twin.set_ylabel("prompt served from cache (%)")
        twin.set_ylim(0, 100)
        twin.legend(loc="lower right")
    left.legend(loc="upper right")
    left.set_title("TTFT by turn")
    return svg(fig)


def plot_cdf(scan: RunScan, record: RunSummary) -> str:
    """The distribution of TTFT, ITL and E2E per stage (ok requests)."""
    fig, axes = plt.subplots(1, len(CDF_FIGURES), figsize=(11, 3.2))
    for axis, name in zip(axes, CDF_FIGURES, strict=True):
        for stage in record.stages:
            stats = scan.cdf.get(stage.stage, {}).get(name)
            if stats is None or stats.count == 0:
                continue
            values = stats.quantiles(CDF_POINTS)
            axis.plot([v * 1000 for v in values], CDF_POINTS, label=stage.load_label)
        _log_ms_axis(axis)
        axis.set_xlabel(f"{LABELS[name]} (ms)")
        axis.set_title(f"{LABELS[name]} CDF")
        axis.grid(alpha=0.3)
    axes[0].set_ylabel("share of requests (ITL: of gaps)")
    handles, labels = axes[0].get_legend_handles_labels()
    if handles:
        # Beside the panels: inside one it hid the slowest stages' curves.
        axes[-1].legend(
            handles, labels, fontsize=7, loc="center left", bbox_to_anchor=(1.02, 0.5)
        )
    fig.subplots_adjust(wspace=0.35)
    return svg(fig)


def _plain(value: float) -> str:
    return f"{value:g}" if 1e-4 <= value < 1e5 else f"{value:.0e}"


def _log_ms_axis(axis: Any) -> None:
    """A log x axis labelled in plain numbers (``200``, not ``2x10^2``): decades
    always; within one or two decades 2 and 5 of each too, and within less than
    one most of the rest. matplotlib's own minor labels overlapped on a narrow
    span."""
    axis.set_xscale("log")
    axis.xaxis.set_major_formatter(FuncFormatter(lambda v, _p: _plain(v)))

    def minor(value: float, _pos: int | None) -> str:
        low, high = axis.get_xlim()
        if value <= 0 or low <= 0 or high <= low:
            return ""
        span = math.log10(high / low)
        mantissa = round(value / 10 ** math.floor(math.log10(value) + 1e-9), 6)
        shown = (2, 3, 4, 5, 6, 8) if span < 0.7 else (2, 5) if span < 2 else ()
        return _plain(value) if mantissa in shown else ""

    axis.xaxis.set_minor_formatter(FuncFormatter(minor))


def plot_ttft_scatter(scan: RunScan, record: RunSummary) -> str:
    """TTFT of each sampled request against its send time; failures marked."""
    fig, axis = plt.subplots(figsize=(10, 3.2))
    ok = [p for p in scan.scatter if p.ttft_s is not None]
    failed = [p for p in scan.scatter if p.ttft_s is None]
    axis.scatter(
        [p.sent_s for p in ok],
        [(p.ttft_s or 0.0) * 1000 for p in ok],
        s=3,
        c=[p.stage for p in ok],
        cmap="viridis",
        alpha=0.6,
        linewidths=0,
    )
    if failed:
        low = min(((p.ttft_s or 0.0) * 1000 for p in ok), default=1.0)
        axis.scatter(
            [p.sent_s for p in failed],
            [low] * len(failed),
            s=8,
            marker="x",
            color="tab:red",
            label="no first token (failed, cancelled)",
        )
        axis.legend(fontsize=7)
    if ok:
        axis.set_yscale("log")
    _stage_lines(axis, record)
    shown = len(scan.scatter)
    of = f" ({shown} of {scan.requests} requests, sampled uniformly)"
    axis.set_title(
        "TTFT per request over the run" + (of if shown < scan.requests else "")
    )
    axis.set_xlabel("sent, seconds since the run started")
    axis.set_ylabel("TTFT (ms)")
    axis.grid(alpha=0.3)
    return svg(fig)


def plot_ttft_parts(scan: RunScan, record: RunSummary) -> str | None:
    """Mean TTFT per stage split into server queue, prefill and the client-side
    rest, from the requests whose server reported its part (means add up); None
    when no server reported one."""
    stages = [s for s in record.stages if scan.parts.get(s.stage)]
    if not stages:
        return None
    means = [
        [1000 * scan.parts[s.stage][i] / scan.parts[s.stage][0] for s in stages]
        for i in (1, 2, 3)
    ]
    fig, axis = plt.subplots(figsize=(8, 3.2))
    labels = [s.load_label for s in stages]
    bottom = [0.0] * len(stages)
    for values, name in zip(
        means,
        ("server queue", "server prefill", "client, network, front end"),
        strict=True,
    ):
        axis.bar(labels, values, bottom=bottom, label=name)
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    axis.set_ylabel("mean TTFT (ms)")
    axis.set_title("Where TTFT went (server-reported parts)")
    axis.legend(fontsize=7)
    axis.grid(alpha=0.3, axis="y")
    return svg(fig)


def _stage_lines(axis: Any, record: RunSummary) -> None:
    for stage in record.stages:
        if stage.start_s is not None:
            axis.axvline(stage.start_s, color="grey", linestyle=":", lw=0.8)


def _hit_ratio(scan: RunScan) -> tuple[list[float], list[float]]:
    hx, hits = scan.series[names.ENGINE_PREFIX_HITS.name]
    _qx, queries = scan.series[names.ENGINE_PREFIX_QUERIES.name]
    xs, ys = [], []
    for i in range(1, min(len(hits), len(queries))):
        dq = queries[i] - queries[i - 1]
        if dq > 0:
            xs.append(hx[i])
            ys.append((hits[i] - hits[i - 1]) / dq)
    return xs, ys


def plot_timeline(scan: RunScan, record: RunSummary, tiers: Sequence[Tier] = ()) -> str:
    """The run on one time axis, stage boundaries marked; the server's panels only
    where the target served ``/metrics``. A capacity search's steps that broke an
    SLO are shaded and each tier's capacity step marked; ``tiers``' TTFT p95
    thresholds are drawn on the TTFT panel."""
    server = scan.has_server_metrics()
    rows = 5 if server else 2
    fig, axes = plt.subplots(rows, 1, figsize=(10, 1.8 * rows + 0.6), sharex=True)
    rate_ax, ttft_ax = axes[0], axes[-1]
    per_second = scan.sent_per_second
    if per_second:
        seconds = range(min(per_second), max(per_second) + 1)
        rate_ax.plot(list(seconds), [per_second.get(s, 0) for s in seconds])
    for stage in record.stages:
        if stage.start_s is not None and stage.end_s is not None and stage.target_rate:
            rate_ax.hlines(stage.target_rate, stage.start_s, stage.end_s, "tab:red")
    rate_ax.set_ylabel("req/s")
    rate_ax.set_title("Target (red) vs achieved request rate")
    if server:
        queue_ax, kv_ax, hit_ax = axes[1:4]
        for series, label in (
            (names.ENGINE_REQUESTS_RUNNING, "running"),
            (names.ENGINE_REQUESTS_WAITING, "waiting"),
        ):
            xs, ys = scan.series[series.name]
            queue_ax.plot(xs, ys, label=label)
        queue_ax.set_ylabel("requests")
        queue_ax.legend(fontsize=7)
        xs, ys = scan.series[names.ENGINE_KV_CACHE_USAGE.name]
        kv_ax.plot(xs, [y * 100 for y in ys], color="tab:purple")
        kv_ax.set_ylabel("KV usage %")
        kv_ax.set_ylim(0, 100)
        xs, ys = _hit_ratio(scan)
        hit_ax.plot(xs, [y * 100 for y in ys], color="tab:green")
        hit_ax.set_ylabel("prefix hits %")
        hit_ax.set_ylim(0, 100)
    keys = sorted(scan.ttft_windows)
    (ttft_line,) = ttft_ax.plot(
        [k * WINDOW_S + WINDOW_S / 2 for k in keys],
        [scan.ttft_windows[k].quantile(0.95) * 1000 for k in keys],
        "o-",
        markersize=3,
    )
    ttft_ax.set_ylabel("TTFT p95 ms")
    ttft_ax.set_xlabel("seconds since the run started")
    mark_thresholds(
        ttft_ax, tiers, {"ttft_p95": ttft_line.get_color()}, prefix="timeline-"
    )
    if mark_steps(axes, tiers, record):
        broke = "every SLO tier (red) or some (orange)" if len(tiers) > 1 else "the SLO"
        rate_ax.set_title(
            f"Target (red) vs achieved request rate; shaded: steps that broke {broke}"
        )
    for axis in axes:
        axis.grid(alpha=0.3)
        axis.set_ylim(bottom=0)
        _stage_lines(axis, record)
    return svg(fig)
