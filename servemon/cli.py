"""The ``servemon`` console script: the group that holds every command.

The commands themselves are in :mod:`servemon.commands`. What is the same for all of
them lives here, once: a :class:`~servemon.core.errors.ServemonError` is one line on
stderr and an exit status of :mod:`servemon.exits` (74 for a record that could not
be written, 2 for anything else), an interrupt that reaches a command is exit
status 130, and ``--parallel 1 2 4`` is accepted as EvalScope writes it.

A command's module is imported only when the command is asked for (:data:`COMMANDS`
says where each lives), so ``servemon exporter`` never imports the load generator,
and the base install (``pip install servemon``: the exporter, the simulator,
``rules``) runs without the extras (:data:`EXTRAS`). A command whose extra is
missing is one line that says what to install, for ``--help`` too.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import click

from servemon.core.errors import MissingExtra, RecordError, ServemonError
from servemon.core.version import __version__
from servemon.exits import ExitStatus, epilog

__all__ = [
    "COMMANDS",
    "EXTRAS",
    "CommandHome",
    "ServemonGroup",
    "cli",
    "error_status",
    "join_multi_values",
    "main",
]

#: Options whose values may be given as separate words (EvalScope's form).
MULTI_VALUE_OPTIONS = ("--parallel", "--number")


@dataclass(frozen=True, slots=True)
class CommandHome:
    """Where a command lives, and the extra it needs beyond the base install."""

    module: str
    attribute: str
    extra: str | None = None


_LOAD, _RUNS, _GENERATE = (
    "servemon.commands.load",
    "servemon.commands.runs",
    "servemon.commands.generate",
)
#: Every command, by name. ``extra`` is None for what the base install runs.
COMMANDS: dict[str, CommandHome] = {
    "autoscale": CommandHome("servemon.commands.autoscale", "autoscale", "loadgen"),
    "capacity": CommandHome(_LOAD, "capacity", "loadgen"),
    "compare": CommandHome(_RUNS, "compare", "stats"),
    "control": CommandHome(_LOAD, "control", "loadgen"),
    "dashboards": CommandHome(_GENERATE, "dashboards", "dashboards"),
    "demo": CommandHome("servemon.commands.demo", "demo", "loadgen"),
    "exporter": CommandHome("servemon.commands.exporter", "exporter"),
    "merge": CommandHome(_RUNS, "merge_command", "loadgen"),
    "plan": CommandHome("servemon.commands.plan", "plan", "loadgen"),
    "ramp": CommandHome(_LOAD, "ramp", "loadgen"),
    "replay": CommandHome(_LOAD, "replay", "loadgen"),
    "report": CommandHome(_RUNS, "report", "loadgen"),
    "rules": CommandHome(_GENERATE, "rules"),
    "sim": CommandHome("servemon.commands.sim", "sim"),
    "sweep": CommandHome(_LOAD, "sweep", "loadgen"),
    "trace": CommandHome("servemon.commands.trace", "trace", "loadgen"),
    "worker": CommandHome("servemon.commands.fleet", "worker", "loadgen"),
}
#: The modules each extra of pyproject.toml brings (a test holds the two equal).
EXTRAS: dict[str, tuple[str, ...]] = {
    "loadgen": ("ddsketch", "matplotlib", "numpy", "rich"),
    "stats": ("ddsketch", "matplotlib", "numpy", "rich", "scipy"),
    "dashboards": ("grafanalib",),
}


def _missing(extra: str | None) -> list[str]:
    """The modules of ``extra`` that are not installed (none are imported)."""
    if extra is None:
        return []
    return [name for name in EXTRAS[extra] if importlib.util.find_spec(name) is None]


def _needs(name: str, extra: str, missing: Sequence[str]) -> MissingExtra:
    return MissingExtra(
        f"servemon {name} needs the {extra} extra (no {', '.join(missing)}): "
        f"pip install 'servemon[{extra}]'"
    )


def _stand_in(name: str, extra: str, missing: Sequence[str]) -> click.Command:
    """A command that only says what to install, whatever its arguments."""

    def say(args: tuple[str, ...]) -> None:
        del args
        raise _needs(name, extra, missing)

    return click.Command(
        name,
        callback=say,
        params=[click.Argument(["args"], nargs=-1, type=click.UNPROCESSED)],
        help=f"(needs pip install 'servemon[{extra}]')",
        add_help_option=False,
        context_settings={"ignore_unknown_options": True},
    )


class ServemonGroup(click.Group):
    """A group whose commands load when asked for (from :data:`COMMANDS`) and end
    the same way on a ServemonError or an interrupt."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        """Every command's name, sorted, without importing any."""
        return sorted({*COMMANDS, *self.commands})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        """The command, its module imported now; a stand-in that names the pip
        command where the command's extra is not installed."""
        if cmd_name in self.commands or cmd_name not in COMMANDS:
            return super().get_command(ctx, cmd_name)
        home = COMMANDS[cmd_name]
        missing = _missing(home.extra)
        if home.extra is not None and missing:
            return _stand_in(cmd_name, home.extra, missing)
        command = getattr(importlib.import_module(home.module), home.attribute)
        assert isinstance(command, click.Command), home
        self.add_command(command, cmd_name)
        return command

    def invoke(self, ctx: click.Context) -> Any:
        """Run the command; a ServemonError becomes ``servemon: error: ...`` on
        stderr and its exit status, a KeyboardInterrupt exit status 130."""
        try:
            try:
                return super().invoke(ctx)
            except ModuleNotFoundError as exc:
                needs = _needs_extra(ctx.invoked_subcommand, exc)
                if needs is None:
                    raise
                raise needs from None
        except ServemonError as exc:
            click.echo(f"servemon: error: {exc}", err=True)
            sys.exit(error_status(exc))
        except KeyboardInterrupt:
            with contextlib.suppress(Exception):
                click.echo("servemon: interrupted", err=True)
            sys.exit(ExitStatus.INTERRUPTED)


def _needs_extra(name: str | None, exc: ModuleNotFoundError) -> MissingExtra | None:
    """A module missing while a command that needs an extra runs (one that
    :data:`EXTRAS` does not list, say) as the same one line; None for a command of
    the base install or a module of servemon's own: a bug, kept as a traceback."""
    home = COMMANDS.get(name) if name is not None else None
    module = (exc.name or "").partition(".")[0]
    if name is None or home is None or home.extra is None:
        return None
    if module in {"", "servemon"}:
        return None
    return _needs(name, home.extra, [module])


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
