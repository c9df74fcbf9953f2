"""``servemon trace synth``: write a synthetic trace
(:mod:`servemon.loadgen.workloads.tracesynth`); ``servemon trace info``: what a trace
holds (:mod:`servemon.loadgen.workloads.traceinfo`)."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import click

from servemon.core.errors import ConfigError
from servemon.loadgen.workloads.tracefile import (
    FORMATS,
    FailedLines,
    parse_trace,
    prefix_hit_ratio,
)
from servemon.loadgen.workloads.traceinfo import Lengths, TraceSummary, summarize_file
from servemon.loadgen.workloads.tracesynth import SynthSpec, synthesize

__all__ = ["trace"]


@click.group()
def trace() -> None:
    """Traces to replay: what one holds, or make a synthetic one."""


@trace.command()
@click.option("--out", type=click.Path(path_type=Path), required=True)
@click.option("--duration", type=float, default=600.0, show_default=True)
@click.option(
    "--rate",
    type=float,
    default=2.0,
    show_default=True,
    help="Mean conversations started per second.",
)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option(
    "--diurnal",
    type=float,
    default=0.0,
    show_default=True,
    help="The rate swings by this fraction over --period.",
)
@click.option("--period", type=float, default=86_400.0, show_default=True)
@click.option("--bursts-per-hour", type=float, default=0.0, show_default=True)
@click.option("--burst-seconds", type=float, default=30.0, show_default=True)
@click.option(
    "--burst-x",
    type=float,
    default=3.0,
    show_default=True,
    help="Rate multiplier during a burst.",
)
@click.option("--input-median", type=int, default=256, show_default=True)
@click.option("--output-median", type=int, default=128, show_default=True)
@click.option(
    "--sigma",
    type=float,
    default=0.8,
    show_default=True,
    help="Log-normal spread of message and answer lengths.",
)
@click.option("--max-tokens", type=int, default=8192, show_default=True)
@click.option("--system-prompts", type=int, default=4, show_default=True)
@click.option("--system-tokens", type=int, default=1024, show_default=True)
@click.option(
    "--turns",
    type=int,
    default=1,
    show_default=True,
    help="Turns per conversation: 1 to this, uniform.",
)
@click.option(
    "--think",
    type=float,
    default=20.0,
    show_default=True,
    help="Mean seconds between a conversation's turns.",
)
def synth(out: Path, **knobs: float) -> None:
    """Write a seeded Mooncake-format trace with a real trace's shape."""
    try:
        spec = SynthSpec(
            duration_s=knobs["duration"],
            rate=knobs["rate"],
            seed=int(knobs["seed"]),
            diurnal=knobs["diurnal"],
            period_s=knobs["period"],
            bursts_per_hour=knobs["bursts_per_hour"],
            burst_s=knobs["burst_seconds"],
            burst_x=knobs["burst_x"],
            input_median=int(knobs["input_median"]),
            output_median=int(knobs["output_median"]),
            sigma=knobs["sigma"],
            max_tokens=int(knobs["max_tokens"]),
            system_prompts=int(knobs["system_prompts"]),
            system_tokens=int(knobs["system_tokens"]),
            turns=int(knobs["turns"]),
            think_s=knobs["think"],
        )
    except ValueError as exc:
        raise ConfigError(f"servemon trace synth: {exc}") from None
    lines = [json.dumps(line, separators=(",", ":")) for line in synthesize(spec)]
    if not lines:
        raise ConfigError("servemon trace synth: no request in that duration")
    text = "\n".join(lines) + "\n"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text, encoding="utf-8")
    entries = parse_trace(text, str(out), csv_format=False)
    ratio = prefix_hit_ratio(entries)
    click.echo(
        f"wrote {out}: {len(entries)} requests over {entries[-1].at_s:.0f} s; "
        f"prefix-cache hit ratio from its hash_ids (unbounded cache): "
        f"{0.0 if ratio is None else ratio:.3f}"
    )


@trace.command()
@click.argument("file", type=click.Path(path_type=Path))
@click.option(
    "--keep-failed",
    is_flag=True,
    default=False,
    help="Count the lines the trace marks failed (BurstGPT) as requests.",
)
@click.option("--json", "as_json", is_flag=True, default=False, help="Print JSON.")
def info(file: Path, keep_failed: bool, as_json: bool) -> None:
    """What a trace holds: its length, rate over time, burstiness and lengths
    (read as a stream: memory stays bounded whatever the file's size)."""
    failed: FailedLines = "keep" if keep_failed else "skip"
    summary = summarize_file(file, failed=failed, where=str(file))
    if as_json:
        click.echo(json.dumps({"file": str(file), **asdict(summary)}, indent=2))
        return
    for line in describe(file, summary):
        click.echo(line)


#: Eight heights of a bar, for the rate over time on one line.
_BARS = "▁▂▃▄▅▆▇█"


def describe(file: Path, s: TraceSummary) -> list[str]:
    """The terminal's lines for a trace summary."""
    lines = [
        f"{file}: {FORMATS.get(s.format, s.format)}",
        f"  requests      {s.requests:,}"
        + (f" ({s.real_prompts:,} with real prompts)" if s.real_prompts else ""),
        f"  duration      {_duration(s.duration_s)}",
        "  mean rate     "
        + ("-" if s.mean_rate is None else f"{s.mean_rate:.3g} req/s"),
    ]
    if s.rates:
        peak = max(s.rates)
        lines.append(
            f"  rate per {_duration(s.bin_s)}: min {min(s.rates):.3g}, "
            f"median {sorted(s.rates)[len(s.rates) // 2]:.3g}, max {peak:.3g} req/s"
            + (f" (peak/mean {peak / s.mean_rate:.2f})" if s.mean_rate else "")
        )
        if len(s.rates) > 1 and peak > 0:
            top = len(_BARS) - 1
            lines.append("  " + "".join(_BARS[round(r / peak * top)] for r in s.rates))
    lines.append(
        "  burstiness    "
        + (
            "-"
            if s.gap_cv is None
            else f"CV of gaps {s.gap_cv:.2f} (1: Poisson; above: bursty)"
        )
    )
    lines.append(_lengths("prompt tokens", s.prompt))
    lines.append(_lengths("output tokens", s.output))
    if s.format == "burstgpt" or s.failed:
        verb = "kept" if s.failed_lines == "keep" else "skipped"
        lines.append(f"  failed lines  {s.failed:,} (Response tokens 0), {verb}")
    for column, counts in s.labels:
        shown = ", ".join(f"{value} {n:,}" for value, n in counts[:8])
        lines.append(f"  {column:<13} {shown}")
    if s.prefix_hit_ratio is not None:
        lines.append(
            f"  prefix hits   {s.prefix_hit_ratio:.3f} of prompt tokens from its "
            "hash_ids (unbounded cache)"
        )
    return lines


def _lengths(name: str, lengths: Lengths | None) -> str:
    if lengths is None:
        return f"  {name:<13} -"
    return (
        f"  {name:<13} p50 {lengths.p50:,}, p90 {lengths.p90:,}, "
        f"p99 {lengths.p99:,}, max {lengths.max:,} (mean {lengths.mean:,.0f})"
    )


def _duration(seconds: float) -> str:
    if seconds >= 2 * 86_400:
        return f"{seconds / 86_400:.3g} d"
    if seconds >= 2 * 3600:
        return f"{seconds / 3600:.3g} h"
    if seconds >= 120:
        return f"{seconds / 60:.3g} min"
    return f"{seconds:.4g} s"
