"""The commands that generate files for Grafana and Prometheus: ``dashboards``,
``rules``."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import click

from servemon.core.errors import ConfigError

__all__ = ["dashboards", "rules"]

gpu_hour_cost_option = click.option(
    "--gpu-hour-cost",
    type=click.FloatRange(min=0, min_open=True),
    metavar="USD",
    help="Price of one GPU for one hour, in dollars: adds the cost per million "
    "output tokens (none without a price).",
)


@click.command()
@click.option(
    "--out",
    "out_dir",
    type=click.Path(path_type=Path),
    default=Path("dashboards/json"),
    show_default=True,
    help="Folder for the dashboard JSON files.",
)
@gpu_hour_cost_option
def dashboards(out_dir: Path, gpu_hour_cost: float | None) -> None:
    """Generate the Grafana dashboards (serving overview, ramp test, GPU)."""
    from servemon.dashboards.build import write_dashboards

    with _writable(out_dir):
        written = write_dashboards(out_dir, gpu_hour_cost=gpu_hour_cost)
    for path in written:
        click.echo(str(path))


@click.command()
@click.option(
    "--slo-config",
    type=click.Path(path_type=Path, dir_okay=False),
    required=True,
    help="SLO YAML (see deploy/slos.example.yaml).",
)
@click.option(
    "--out",
    "out_dir",
    type=click.Path(path_type=Path),
    default=Path("deploy/rules"),
    show_default=True,
    help="Folder for the rule files.",
)
@gpu_hour_cost_option
def rules(slo_config: Path, out_dir: Path, gpu_hour_cost: float | None) -> None:
    """Generate Prometheus recording rules and SLO burn-rate alerts, and GPU power,
    energy per output token and (given a price) cost per million output tokens."""
    from servemon.dashboards.rules import load_slo_config, write_rules

    config = load_slo_config(slo_config)
    with _writable(out_dir):
        written = write_rules(config, out_dir, gpu_hour_cost=gpu_hour_cost)
    for path in written:
        click.echo(str(path))


@contextlib.contextmanager
def _writable(out_dir: Path) -> Iterator[None]:
    """A folder that cannot be written is one line naming it, not a traceback."""
    try:
        yield
    except OSError as exc:
        raise ConfigError(
            f"--out {out_dir}: cannot write: {exc.strerror or exc}"
        ) from None
