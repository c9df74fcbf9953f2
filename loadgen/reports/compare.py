"""``servemon compare RUN_A RUN_B ...``: runs side by side, level by level.

For every load level the runs share (the same target rate, or the same concurrency),
each figure is shown per run with its ratio to the first run, as the course compared
vLLM with Transformers Serve (output throughput 187.08 vs 121.20 tok/s at
concurrency 8: 1.54x). Conditions that make a ratio misleading are flagged: different
mean prompt or output lengths (over 10 % apart), token counts from different sources,
a different TTFT caliber (one server sends a chunk long before the first token, so
tools that count the first chunk disagree), different engine configuration.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import matplotlib.pyplot as plt

from servemon.loadgen.record.columns import COMPARED
from servemon.loadgen.record.runrecord import StageResult
from servemon.loadgen.record.summary import Summary
from servemon.loadgen.reports.plots import svg
from servemon.loadgen.reports.report import CSS, RunData, load_run
from servemon.loadgen.run.plan import parallel_label, rate_label

__all__ = [
    "Comparison",
    "compare",
    "render_compare",
    "run_names",
    "write_compare",
]


@dataclass(frozen=True, slots=True)
class Comparison:
    """Runs compared: per level, per figure, the value of each run."""

    runs: list[RunData]
    levels: list[str]
    values: dict[str, dict[str, list[float | None]]]
    warnings: list[str]


def _level_key(data: RunData, stage: StageResult) -> str:
    if data.info.kind == "sweep":
        return parallel_label(stage.parallel or 0)
    return rate_label(stage.target_rate or 0.0)


def compare(paths: Sequence[Path]) -> Comparison:
    """Load and line up the runs."""
    runs = [load_run(p) for p in paths]
    per_run = [
        {
            **{
                _level_key(r, s): summary
                for s, summary in zip(
                    r.summary.stages, r.summary.summaries, strict=True
                )
            },
            # The whole run's requests of each model of a mix, and of each turn.
            **{f"model {m}": v for m, v in (r.summary.by_model or {}).items()},
            **{f"turn {k}": v for k, v in (r.summary.by_turn or {}).items()},
        }
        for r in runs
    ]
    levels = [k for k in per_run[0] if all(k in other for other in per_run[1:])]
    values: dict[str, dict[str, list[float | None]]] = {}
    for level in levels:
        values[level] = {
            figure.label: [figure.value(p[level]) for p in per_run]
            for figure in COMPARED
        }
    return Comparison(runs, levels, values, _warnings(runs, per_run, levels))


def _warnings(
    runs: list[RunData], per_run: list[dict[str, Summary]], levels: list[str]
) -> list[str]:
    notes: list[str] = []
    names = [r.path.name for r in runs]
    if len(set(names)) < len(names):
        names = [f"{r.path.parent.name}/{r.path.name}" for r in runs]
    for level in levels:
        for key, what in (
            ("mean_prompt_tokens", "prompt"),
            ("mean_output_tokens", "output"),
        ):
            vals = [getattr(p[level], key) for p in per_run]
            nums = [v for v in vals if v]
            if len(nums) == len(vals) and max(nums) > 1.1 * min(nums):
                shown = ", ".join(
                    f"{n}: {v:.1f}" for n, v in zip(names, nums, strict=True)
                )
                notes.append(f"{level}: mean {what} tokens differ ({shown})")
        sources = [tuple(sorted(p[level].token_sources)) for p in per_run]
        if len(set(sources)) > 1:
            notes.append(f"{level}: output tokens counted differently ({sources})")
        gaps = []
        for p in per_run:
            ttft, ttfc = p[level].figure("ttft"), p[level].figure("ttfc")
            gaps.append(None if not (ttft and ttfc) else ttft.mean - ttfc.mean)
        cached = [p[level].cached_fraction for p in per_run]
        if any(c is not None for c in cached) and (
            max(c or 0.0 for c in cached) - min(c or 0.0 for c in cached) > 0.1
        ):
            shown = ", ".join(
                f"{n}: {'not reported' if c is None else f'{c:.0%}'}"
                for n, c in zip(names, cached, strict=True)
            )
            notes.append(
                f"{level}: the prefix cache served different shares of the prompt "
                f"tokens ({shown}): prefill work differs"
            )
        reconnects = [p[level].reconnects for p in per_run]
        if max(reconnects) > 0 and min(reconnects) == 0:
            shown = ", ".join(
                f"{n}: {r}" for n, r in zip(names, reconnects, strict=True)
            )
            notes.append(
                f"{level}: one server closed its connections after answers "
                f"(reconnects {shown}): those requests paid for a new connection"
            )
        known = [g for g in gaps if g is not None]
        if known and (max(known) > 0.005) != (min(known) > 0.005):
            notes.append(
                f"{level}: TTFT caliber differs: one server sends a chunk well before "
                "the first token (time to first chunk << TTFT); tools that time the "
                "first chunk would report very different TTFTs"
            )
    engines = [tuple(sorted(r.info.engine_info.items())) for r in runs]
    if len(set(engines)) > 1:
        notes.append(
            "engine configuration differs: "
            + " vs ".join(
                ", ".join(f"{k}={v}" for k, v in e) or "unknown" for e in engines
            )
        )
    workloads = [r.info.workload.get("spec") for r in runs]
    if len(set(workloads)) > 1:
        notes.append(f"workloads differ: {workloads}")
    return notes


def _fmt(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.3g}" if abs(value) < 10 else f"{value:.1f}"


def rows(c: Comparison) -> list[list[str]]:
    """Table rows: level, figure, each run's value, each later run's ratio."""
    out = []
    for level in c.levels:
        for figure in COMPARED:
            vals = c.values[level][figure.label]
            base = vals[0]
            ratios = [
                "-" if base in (None, 0) or v is None else f"{v / base:.2f}x"
                for v in vals[1:]
            ]
            out.append([level, figure.label, *(_fmt(v) for v in vals), *ratios])
    return out


def run_names(c: Comparison) -> list[str]:
    """Each run's label: its directory's name, with its parent's when names clash."""
    names = [r.path.name for r in c.runs]
    if len(set(names)) < len(names):
        names = [f"{r.path.parent.name}/{r.path.name}" for r in c.runs]
    return names


def header(c: Comparison) -> list[str]:
    """Column names for :func:`rows`."""
    names = run_names(c)
    return ["level", "figure", *names, *(f"{n} / {names[0]}" for n in names[1:])]


def _plot(c: Comparison, label: str) -> str:
    fig, axis = plt.subplots(figsize=(6, 3))
    width = 0.8 / len(c.runs)
    for i, name in enumerate(run_names(c)):
        vals = [c.values[level][label][i] or 0.0 for level in c.levels]
        axis.bar(
            [x + i * width for x in range(len(c.levels))],
            vals,
            width,
            label=name,
        )
    axis.set_xticks([x + width * (len(c.runs) - 1) / 2 for x in range(len(c.levels))])
    axis.set_xticklabels(c.levels)
    axis.set_title(label)
    axis.legend(fontsize=7)
    axis.grid(alpha=0.3, axis="y")
    return svg(fig)


def render_compare(c: Comparison) -> str:
    """compare.html as one document."""
    table_head = "".join(f"<th>{html.escape(h)}</th>" for h in header(c))
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(v)}</td>" for v in row) + "</tr>"
        for row in rows(c)
    )
    notes = "".join(f"<li>{html.escape(w)}</li>" for w in c.warnings) or "<li>none</li>"
    plots = "".join(
        _plot(c, label) for label in ("output tok/s", "TTFT mean ms", "E2E mean s")
    )
    return "\n".join(
        [
            "<!doctype html><html><head><meta charset='utf-8'><title>servemon compare"
            "</title>",
            f"<style>{CSS}</style></head><body>",
            "<h1>servemon compare</h1>",
            "<h2>Conditions that make a ratio misleading</h2>",
            f"<ul>{notes}</ul>",
            "<h2>Side by side</h2>",
            f"<table><thead><tr>{table_head}</tr></thead><tbody>{body}</tbody></table>",
            "<h2>Plots</h2>",
            plots,
            "</body></html>",
        ]
    )


def write_compare(paths: Sequence[Path], out: Path) -> Comparison:
    """Compare ``paths`` and write ``out`` (compare.html)."""
    c = compare(paths)
    out.write_text(render_compare(c), encoding="utf-8")
    return c
