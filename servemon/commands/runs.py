"""The commands that read run directories: ``report``, ``compare``, ``merge``."""

from __future__ import annotations

from pathlib import Path

import click

from servemon.commands import options
from servemon.core.errors import ConfigError

__all__ = ["compare", "merge_command", "report"]


@click.command()
@click.argument("run_dir", type=click.Path(path_type=Path, file_okay=False))
def report(run_dir: Path) -> None:
    """Write RUN_DIR/report.html from the run directory alone."""
    from servemon.loadgen.reports.report import write_report

    click.echo(str(write_report(run_dir)))


@click.command()
@options.run_dirs()
@click.option(
    "--out",
    type=click.Path(path_type=Path),
    default=Path("compare.html"),
    show_default=True,
    help="Where to write the HTML comparison.",
)
def compare(run_dirs: tuple[Path, ...], out: Path) -> None:
    """Compare run directories level by level, with ratios and caveats."""
    from rich.table import Table

    from servemon.load import console_for
    from servemon.loadgen.reports.compare import (
        header,
        rows,
        verdict_notes,
        write_compare,
    )

    if len(run_dirs) < 2:
        raise ConfigError("compare: give at least two run directories")
    result = write_compare(run_dirs, out)
    if not result.levels:
        raise ConfigError("compare: the runs share no load level (rate or parallel)")
    table = Table(title="servemon compare", title_justify="left")
    for column in header(result):
        table.add_column(column, justify="right")
    for row in rows(result):
        table.add_row(*row)
    console = console_for()
    console.print(table)
    for note in verdict_notes(result):
        console.print(f"verdicts: {note}", soft_wrap=True)
    for warning in result.warnings:
        console.print(f"caution: {warning}")
    console.print(f"written: {out}")


@click.command("merge")
@options.run_dirs()
@options.out(default="runs")
def merge_command(run_dirs: tuple[Path, ...], out: str) -> None:
    """Merge shard run directories (servemon ramp --shard I/N) into one run."""
    from servemon.loadgen.reports.merge import merge_runs

    path = merge_runs(run_dirs, Path(out))
    click.echo(f"merged run directory: {path}")
    click.echo(f"report: {path / 'report.html'}")
