"""The ``servemon`` console script: the group that holds every command.

The commands themselves are in :mod:`servemon.commands`. What is the same for all of
them lives here, once: a :class:`~servemon.core.errors.ServemonError` is one line on
stderr and an exit status of :mod:`servemon.exits` (74 for a record that could not
be written, 2 for anything else), an interrupt that reaches a command is exit
status 130, and ``--parallel 1 2 4`` is accepted as EvalScope writes it.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Sequence
from typing import Any

import click

from servemon.commands.demo import demo
from servemon.commands.exporter import exporter
from servemon.commands.generate import dashboards, rules
from servemon.commands.load import capacity, control, ramp, replay, sweep
from servemon.commands.runs import compare, merge_command, report
from servemon.commands.sim import sim
from servemon.commands.trace import trace
from servemon.core.errors import RecordError, ServemonError
from servemon.core.version import __version__
from servemon.exits import ExitStatus, epilog

__all__ = ["ServemonGroup", "cli", "error_status", "join_multi_values", "main"]

#: Options whose values may be given as separate words (EvalScope's form).
MULTI_VALUE_OPTIONS = ("--parallel", "--number")


class ServemonGroup(click.Group):
    """A group whose commands end the same way on a ServemonError or an interrupt."""

    def invoke(self, ctx: click.Context) -> Any:
        """Run the command; a ServemonError becomes ``servemon: error: ...`` on
        stderr and its exit status, a KeyboardInterrupt exit status 130."""
        try:
            return super().invoke(ctx)
        except ServemonError as exc:
            click.echo(f"servemon: error: {exc}", err=True)
            sys.exit(error_status(exc))
        except KeyboardInterrupt:
            with contextlib.suppress(Exception):
                click.echo("servemon: interrupted", err=True)
            sys.exit(ExitStatus.INTERRUPTED)


def error_status(exc: ServemonError) -> ExitStatus:
    """The exit status of a command that ``exc`` ended."""
    if isinstance(exc, RecordError):
        return ExitStatus.RECORD_ERROR
    return ExitStatus.USAGE


@click.group(
    cls=ServemonGroup,
    context_settings={"help_option_names": ["-h", "--help"]},
    epilog=epilog(),
)
@click.version_option(__version__, prog_name="servemon")
def cli() -> None:
    """Watch LLM serving endpoints under load."""


for _command in (
    capacity,
    control,
    compare,
    dashboards,
    demo,
    exporter,
    merge_command,
    ramp,
    replay,
    report,
    rules,
    sim,
    sweep,
    trace,
):
    cli.add_command(_command)


def join_multi_values(argv: list[str], names: Sequence[str]) -> list[str]:
    """``--parallel 1 2 4`` (EvalScope's form) as ``--parallel 1,2,4`` for click."""
    out: list[str] = []
    i = 0
    while i < len(argv):
        out.append(argv[i])
        if argv[i] in names:
            values = []
            i += 1
            while i < len(argv) and argv[i].replace(",", "").isdigit():
                values.append(argv[i])
                i += 1
            out.append(",".join(values))
            continue
        i += 1
    return out


def main() -> None:
    """The console script."""
    cli(args=join_multi_values(sys.argv[1:], MULTI_VALUE_OPTIONS))
