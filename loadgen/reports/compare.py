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
from dataclasses import dataclass, field
from pathlib import Path

import matplotlib.pyplot as plt

from servemon.core.outcomes import failed, judged
from servemon.loadgen.record.columns import COMPARED
from servemon.loadgen.record.figures import FIGURES
from servemon.loadgen.record.line import timing_from_line
from servemon.loadgen.record.record import read_jsonl, read_run
from servemon.loadgen.record.runrecord import (
    RunResult,
    StageResult,
    parallel_label,
    rate_label,
)
from servemon.loadgen.record.summary import Summary
from servemon.loadgen.reports.plots import svg
from servemon.loadgen.reports.report import CSS
from servemon.loadgen.reports.significance import (
    Difference,
    FigureQuestion,
    Samples,
    judge,
)
from servemon.loadgen.send.timing import Outcome

__all__ = [
    "Comparison",
    "compare",
    "render_compare",
    "run_names",
    "verdict_notes",
    "verdict_text",
    "write_compare",
]


@dataclass(frozen=True, slots=True)
class Comparison:
    """Runs compared: per level, per figure, the value of each run (a repeated
    level's pooled value), and each later run's differences from the first with
    their intervals and verdicts (:mod:`servemon.loadgen.reports.significance`)."""

    runs: list[RunResult]
    levels: list[str]
    values: dict[str, dict[str, list[float | None]]]
    warnings: list[str]
    #: Per later run, its differences from the first, keyed by (level, figure).
    differences: list[dict[tuple[str, str], Difference]] = field(default_factory=list)


def _level_key(data: RunResult, stage: StageResult) -> str:
    if data.info.kind == "sweep":
        return parallel_label(stage.parallel or 0)
    return rate_label(stage.target_rate or 0.0)


def compare(paths: Sequence[Path], *, confidence: float = 0.95) -> Comparison:
    """Load and line up the runs, and judge each later run against the first."""
    runs = [read_run(p) for p in paths]
    repeats = [_repeats(r) for r in runs]
    per_run = [
        {
            **{level: pooled for level, (pooled, _) in own.items()},
            # The whole run's requests of each model of a mix, and of each turn.
            **{f"model {m}": v for m, v in (r.record.by_model or {}).items()},
            **{f"turn {k}": v for k, v in (r.record.by_turn or {}).items()},
        }
        for r, own in zip(runs, repeats, strict=True)
    ]
    levels = [k for k in per_run[0] if all(k in other for other in per_run[1:])]
    values: dict[str, dict[str, list[float | None]]] = {}
    for level in levels:
        values[level] = {
            figure.label: [figure.value(p[level]) for p in per_run]
            for figure in COMPARED
        }
    shared = [level for level in levels if all(level in own for own in repeats)]
    differences = [
        _judged(runs[0], repeats[0], run, own, shared, confidence)
        for run, own in zip(runs[1:], repeats[1:], strict=True)
    ]
    return Comparison(
        runs, levels, values, _warnings(runs, per_run, levels), differences
    )


def _repeats(data: RunResult) -> dict[str, tuple[Summary, list[StageResult]]]:
    """Each load level of a run: its summary (a repeated level's pooled one) and
    the stages that ran it (one, or its repeats)."""
    stages: dict[str, list[StageResult]] = {}
    for stage in data.record.stages:
        if stage.summary is not None:
            stages.setdefault(_level_key(data, stage), []).append(stage)
    pooled = data.record.by_level or {}
    out = {}
    for level, own in stages.items():
        whole = pooled.get(own[0].label) if len(own) > 1 else None
        out[level] = (
            whole or own[-1].summary or Summary(0, {}, 0.0, 0.0, 0.0, None, None),
            own,
        )
    return out


def _judged(
    first: RunResult,
    first_levels: dict[str, tuple[Summary, list[StageResult]]],
    other: RunResult,
    other_levels: dict[str, tuple[Summary, list[StageResult]]],
    levels: Sequence[str],
    confidence: float,
) -> dict[tuple[str, str], Difference]:
    """``other``'s differences from ``first`` at every level both ran, every
    figure both have, judged together (one family)."""
    single = any(
        len(own[level][1]) == 1
        for own in (first_levels, other_levels)
        for level in levels
    )
    requests = (
        [_request_values(first, first_levels), _request_values(other, other_levels)]
        if single
        else [{}, {}]
    )
    questions = []
    for level in levels:
        for figure in COMPARED:
            sides = []
            for own, values in zip((first_levels, other_levels), requests, strict=True):
                pooled, stages = own[level]
                each = [
                    v
                    for s in stages
                    if s.summary is not None
                    and (v := figure.value(s.summary)) is not None
                ]
                if not each or figure.value(pooled) is None:
                    break
                per_request = values.get((level, figure.figure or ""))
                sides.append(
                    Samples(
                        tuple(each),
                        None if per_request is None else tuple(per_request),
                        _rests_on(figure.figure, pooled),
                    )
                )
            if len(sides) == 2:
                questions.append(
                    FigureQuestion(
                        level,
                        figure.label,
                        figure.higher_is_better,
                        figure.quantile,
                        sides[0],
                        sides[1],
                    )
                )
    return {(d.level, d.figure): d for d in judge(questions, confidence=confidence)}


def _rests_on(figure: str | None, summary: Summary) -> int:
    """How many values a figure rests on: its distribution's count (ITL: every
    gap), judged requests for the error rate, ok requests for a rate."""
    if figure == "error_rate":
        return summary.ok + summary.failed
    if figure is not None:
        dist = summary.figure(figure)
        return 0 if dist is None else dist.count
    return summary.ok


def _request_values(
    data: RunResult, levels: dict[str, tuple[Summary, list[StageResult]]]
) -> dict[tuple[str, str], list[float]]:
    """Per level and figure, the values of the run's requests (one pass over
    ``requests.jsonl``): what one run's interval rests on without repeats."""
    level_of = {s.stage: level for level, (_, own) in levels.items() for s in own}
    out: dict[tuple[str, str], list[float]] = {}
    for line in read_jsonl(data.path / "requests.jsonl"):
        try:
            timing = timing_from_line(line)
        except (KeyError, TypeError, ValueError):
            continue
        level = level_of.get(timing.stage)
        if level is None:
            continue
        if judged(timing.outcome):
            out.setdefault((level, "error_rate"), []).append(
                1.0 if failed(timing.outcome) else 0.0
            )
        if timing.outcome is not Outcome.OK:
            continue
        for figure in FIGURES:
            if figure.values is not None:
                out.setdefault((level, figure.name), []).extend(figure.values(timing))
            elif (value := figure.value(timing)) is not None:
                out.setdefault((level, figure.name), []).append(value)
    return out


def _warnings(
    runs: list[RunResult], per_run: list[dict[str, Summary]], levels: list[str]
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
    workloads = [r.info.workload.spec for r in runs]
    if len(set(workloads)) > 1:
        notes.append(f"workloads differ: {workloads}")
    return notes


def _fmt(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.3g}" if abs(value) < 10 else f"{value:.1f}"


def rows(c: Comparison) -> list[list[str]]:
    """Table rows: level, figure, each run's value, and each later run's ratio to
    the first with its interval and verdict."""
    out = []
    for level in c.levels:
        for figure in COMPARED:
            vals = c.values[level][figure.label]
            base = vals[0]
            ratios = []
            for i, v in enumerate(vals[1:]):
                ratio = "-" if base in (None, 0) or v is None else f"{v / base:.2f}x"
                found = (
                    c.differences[i].get((level, figure.label))
                    if c.differences
                    else None
                )
                ratios.append(
                    ratio if found is None else f"{ratio} {verdict_text(found)}"
                )
            out.append([level, figure.label, *(_fmt(v) for v in vals), *ratios])
    return out


def verdict_text(d: Difference) -> str:
    """``[1.18-1.32] slower``: the interval of the ratio and the verdict; a
    verdict resting on one run each says so. An interval that excludes 1 is
    shown with the digits it takes to see that (``[0.994-0.998] faster``, not
    ``[0.99-1.00]``)."""
    interval = ""
    if d.low is not None and d.high is not None:
        digits = 2
        if d.verdict in ("faster", "slower"):
            while digits < 4 and "1" in (_round(d.low, digits), _round(d.high, digits)):
                digits += 1
        interval = f"[{d.low:.{digits}f}-{d.high:.{digits}f}] "
    basis = (
        " (one run each)"
        if d.basis == "one run each"
        and d.verdict in ("faster", "slower", "no difference")
        else ""
    )
    return f"{interval}{d.verdict}{basis}"


def _round(value: float, digits: int) -> str:
    """``value`` with ``digits`` decimals, or "1" where that shows 1."""
    shown = f"{value:.{digits}f}"
    return "1" if float(shown) == 1.0 else shown


def verdict_notes(c: Comparison) -> list[str]:
    """What the verdicts rest on, once per comparison: the confidence, the
    number of figures judged together, and each figure not judged and why."""
    notes = []
    names = run_names(c)
    for i, found in enumerate(c.differences):
        judged_ = [d for d in found.values() if d.confidence is not None]
        bases = sorted({d.basis for d in judged_})
        if judged_:
            notes.append(
                f"{names[i + 1]} vs {names[0]}: {len(judged_)} figures judged "
                "together, "
                f"each interval at {judged_[0].confidence:.2%} (95 % for the family); "
                f"resting on {', '.join(bases)}"
                + (
                    ": a verdict from one run each holds the requests' variation only, "
                    "not the runs' (use --repeats 3 on both)"
                    if "one run each" in bases
                    else ""
                )
            )
        unjudged: dict[str, list[str]] = {}
        for d in found.values():
            if d.verdict in ("too short", "cannot tell"):
                unjudged.setdefault(d.verdict, []).append(f"{d.figure} at {d.level}")
        for verdict, which in unjudged.items():
            why = (
                "too few requests per run beyond the quantile (a p95 needs 200, a "
                "p99 1,000)"
                if verdict == "too short"
                else "one run each, and nothing shows how much it varies"
            )
            notes.append(f"{names[i + 1]}: not judged, {why}: {', '.join(which)}")
    return notes


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
            "<p>Each later run against the first: the ratio, its confidence "
            "interval and a verdict (faster, slower, or no difference at this "
            "confidence); how they are judged: docs/compare.md.</p>",
            "<ul>"
            + "".join(f"<li>{html.escape(n)}</li>" for n in verdict_notes(c))
            + "</ul>",
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
