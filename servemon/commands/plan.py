"""``servemon plan``: replicas for a forecast, from a capacity run or runs at
several sizes (:mod:`servemon.loadgen.reports.replicas`,
:mod:`servemon.loadgen.reports.scaling`; the page:
:mod:`servemon.loadgen.reports.planpage`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import click

from servemon.core.errors import ConfigError

if TYPE_CHECKING:
    from servemon.loadgen.reports.replicas import Forecast, Plan

__all__ = ["plan"]


@click.command()
@click.argument("runs", nargs=-1, required=True, metavar="RUN[@N]...")
@click.option("--peak-rps", type=float, help="The forecast's peak, requests/s.")
@click.option(
    "--trace",
    "trace_file",
    type=click.Path(path_type=Path, dir_okay=False),
    help="A trace to plan for (any format servemon replay reads).",
)
@click.option(
    "--bin",
    "bin_s",
    type=float,
    default=300.0,
    show_default=True,
    help="Seconds per bin of a trace: each bin gets the replicas of its rate.",
)
@click.option(
    "--headroom",
    type=float,
    default=0.2,
    show_default=True,
    help="Plan each replica at capacity x (1 - headroom).",
)
@click.option("--gpu-hour-cost", type=float, help="Price of one GPU for an hour.")
@click.option("--replica-hour-cost", type=float, help="Price of a replica an hour.")
@click.option(
    "--gpus-per-replica",
    type=int,
    help="GPUs of one replica, where the run did not record them.",
)
@click.option("--min-replicas", type=int, default=1, show_default=True)
@click.option(
    "--out",
    type=click.Path(path_type=Path, dir_okay=False),
    default=Path("plan.html"),
    show_default=True,
    help="Where to write the HTML plan.",
)
@click.option("--json", "as_json", is_flag=True, default=False, help="Print JSON.")
def plan(
    runs: tuple[str, ...],
    peak_rps: float | None,
    trace_file: Path | None,
    bin_s: float,
    headroom: float,
    gpu_hour_cost: float | None,
    replica_hour_cost: float | None,
    gpus_per_replica: int | None,
    min_replicas: int,
    out: Path,
    as_json: bool,
) -> None:
    """How many replicas meet each SLO tier of RUN (a capacity run directory) at
    a forecast's peak rate or over a trace, and what they cost. RUN@N: the run
    measured N replicas behind a balancer (one RUN alone: 1); several runs at
    different sizes give capacity against replicas instead of assuming it linear."""
    from servemon.loadgen.reports.planpage import write_plan
    from servemon.loadgen.reports.replicas import Pricing, plan_replicas
    from servemon.loadgen.reports.scaling import gpus_per_replica as gpus_of
    from servemon.loadgen.reports.scaling import measure_sizes, parse_run_size

    _check(peak_rps, trace_file, bin_s, headroom, min_replicas)
    if gpu_hour_cost is not None and replica_hour_cost is not None:
        raise ConfigError("--gpu-hour-cost and --replica-hour-cost: give one")
    for name, value in (
        ("--gpu-hour-cost", gpu_hour_cost),
        ("--replica-hour-cost", replica_hour_cost),
        ("--gpus-per-replica", gpus_per_replica),
    ):
        if value is not None and value <= 0:
            raise ConfigError(f"{name}: expected a number above 0, got {value:g}")
    sizes = measure_sizes([parse_run_size(run) for run in runs])
    forecast = (
        _trace_forecast(trace_file, bin_s)
        if trace_file is not None
        else _peak_forecast(peak_rps)
    )
    gpus = gpus_per_replica if gpus_per_replica is not None else gpus_of(sizes)[0]
    if replica_hour_cost is not None:
        pricing = Pricing(replica_hour_cost, f"{replica_hour_cost:g} (given)")
    elif gpu_hour_cost is not None:
        if gpus is None:
            raise ConfigError(
                f"--gpu-hour-cost: {sizes[0].measured.run} records no GPU count "
                "for its target's replicas; "
                "give --gpus-per-replica or --replica-hour-cost"
            )
        pricing = Pricing(
            gpu_hour_cost * gpus, f"{gpu_hour_cost:g} a GPU-hour x {gpus} GPUs"
        )
    else:
        pricing = Pricing(None, "no price given")
    found = plan_replicas(
        sizes,
        forecast,
        headroom=headroom,
        pricing=pricing,
        min_replicas=min_replicas,
        gpus=gpus_per_replica,
    )
    write_plan(found, out)
    if as_json:
        click.echo(json.dumps({**found.to_json(), "html": str(out)}, indent=2))
        return
    _print(found, out)


def _check(
    peak_rps: float | None,
    trace_file: Path | None,
    bin_s: float,
    headroom: float,
    min_replicas: int,
) -> None:
    if (peak_rps is None) == (trace_file is None):
        raise ConfigError("--peak-rps or --trace: give one forecast")
    if peak_rps is not None and not peak_rps > 0:
        raise ConfigError(f"--peak-rps: expected a rate above 0, got {peak_rps:g}")
    if not 0 <= headroom < 1:
        raise ConfigError(
            f"--headroom: expected a fraction in [0, 1), got {headroom:g}"
        )
    if not bin_s > 0:
        raise ConfigError(f"--bin: expected seconds above 0, got {bin_s:g}")
    if min_replicas < 0:
        raise ConfigError(f"--min-replicas: expected 0 or more, got {min_replicas}")


def _peak_forecast(peak_rps: float | None) -> Forecast:
    from servemon.loadgen.reports.replicas import Forecast

    assert peak_rps is not None
    return Forecast(source=f"--peak-rps {peak_rps:g}", peak_rps=peak_rps)


def _trace_forecast(path: Path, bin_s: float) -> Forecast:
    """The trace counted in bins as it is read: memory bounded whatever the
    file's size (:mod:`servemon.loadgen.workloads.tracetally`)."""
    from servemon.loadgen.reports.replicas import Forecast
    from servemon.loadgen.workloads.tracetally import tally_trace

    tally, _ = tally_trace(path, bin_s=bin_s, where=f"--trace: {path}")
    return Forecast.of_bins(
        f"--trace {path}",
        tally.counts,
        bin_s,
        prompt_lengths=tuple(sorted(tally.prompt.items())),
        output_lengths=tuple(sorted(tally.output.items())),
        hit_rate=tally.hits.ratio,
    )


def _print(found: Plan, out: Path) -> None:
    from rich.table import Table

    from servemon.load import console_for
    from servemon.loadgen.reports.planpage import plan_rows

    f = found.forecast
    console = console_for()
    covers = "" if f.hours is None else f" over {f.hours:.3g} h"
    console.print(
        f"{f.source}: peak {f.peak_rps:.4g} req/s{covers}; headroom "
        f"{found.headroom:g}; a replica's hour: {found.pricing.said}"
    )
    header, rows = plan_rows(found)
    table = Table(title="servemon plan", title_justify="left")
    for column in header:
        table.add_column(column, justify="right")
    for row in rows:
        table.add_row(*row)
    console.print(table)
    for line in found.assumptions:
        console.print(f"assumed: {line}")
    for line in found.warnings:
        console.print(f"warning: {line}")
    console.print(f"written: {out}")
