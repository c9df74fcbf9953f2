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
@click.option(
    "--spool",
    "spools",
    multiple=True,
    type=click.Path(path_type=Path, dir_okay=False),
    help="A fleet worker's spool (NAME.jsonl; repeatable): take into the one fleet "
    "run directory given what its coordinator never recorded.",
)
@options.out(default=None)
def merge_command(
    run_dirs: tuple[Path, ...], spools: tuple[Path, ...], out: str | None
) -> None:
    """Merge shard run directories (servemon ramp --shard I/N) into one run, or,
    with --spool, recover a fleet run's records from its workers' spools.

    Either way a new run directory is written (shards: under --out, default
    runs; spools: beside the run, or under --out); the runs read are left as
    they are."""
    if spools:
        _recover(run_dirs, spools, None if out is None else Path(out))
        return
    from servemon.loadgen.reports.merge import merge_runs

    path = merge_runs(run_dirs, Path(out or "runs"))
    click.echo(f"merged run directory: {path}")
    click.echo(f"report: {path / 'report.html'}")


#: The unreadable lines named per spool; the rest are counted.
_NAMED = 5


def _recover(
    run_dirs: tuple[Path, ...], spools: tuple[Path, ...], out: Path | None
) -> None:
    from servemon.loadgen.reports.recover import recover_spools

    if len(run_dirs) != 1:
        raise ConfigError(
            f"merge: --spool takes one fleet run directory ({len(run_dirs)} given)"
        )
    result = recover_spools(run_dirs[0], spools, out)
    for count in result.spools:
        for line in count.unreadable[:_NAMED]:
            click.echo(f"skipped {line}", err=True)
        more = len(count.unreadable) - _NAMED
        if more > 0:
            click.echo(f"skipped {more} more lines of {count.path}", err=True)
        click.echo(
            f"{count.path} (worker {count.worker}): {count.recovered} recovered, "
            f"{count.replaced} replacing cancelled records, {count.present} already "
            f"in the run, {count.other_runs} of other runs, "
            f"{len(count.unreadable)} unreadable"
        )
    click.echo(f"recovered run directory: {result.path}")
    click.echo(f"report: {result.path / 'report.html'}")
