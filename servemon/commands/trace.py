"""``servemon trace synth``: write a synthetic trace
(:mod:`loadgen.workloads.tracesynth`)."""

from __future__ import annotations

import json
from pathlib import Path

import click

from servemon.core.errors import ConfigError
from servemon.loadgen.workloads.tracefile import parse_trace, prefix_hit_ratio
from servemon.loadgen.workloads.tracesynth import SynthSpec, synthesize

__all__ = ["trace"]


@click.group()
def trace() -> None:
    """Traces to replay: make a synthetic one."""


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
