"""``servemon demo``: the main job against the built-in simulator (see
:mod:`servemon.demo`, which runs it)."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from servemon import exits
from servemon.commands import options
from servemon.lifecycle import run_async

__all__ = ["demo"]


@click.command(epilog=exits.epilog())
@options.profile(default="qwen3-0.6b-eager")
@options.max_num_seqs(type=click.IntRange(1, 4096), default=16)
@options.out(default="runs")
@options.max_duration(default=150.0)
@options.step_seconds(default=10.0)
@options.seed(default=0)
@click.option(
    "--keep", is_flag=True, help="Keep everything up after the search, until Ctrl-C."
)
def demo(
    profile: str,
    max_num_seqs: int,
    out: str,
    max_duration: float,
    step_seconds: float,
    seed: int,
    keep: bool,
) -> None:
    """Simulator, exporter and Prometheus, a short capacity search, a report."""
    from servemon.demo import run_demo

    result = run_async(
        run_demo(
            profile=profile,
            max_num_seqs=max_num_seqs,
            out=Path(out),
            seed=seed,
            max_duration=max_duration,
            step_seconds=step_seconds,
            keep=keep,
        )
    )
    if result.status != "completed":
        sys.exit(exits.for_run(result.status))
