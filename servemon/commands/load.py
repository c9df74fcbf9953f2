"""The load commands: ``ramp`` (open loop), ``sweep`` (closed loop), ``capacity``,
``replay`` (a trace at its own times), ``control`` (a signal held at a setpoint).

Each option is a field of :class:`servemon.loadgen.run.config.LoadConfig` or of the
command's own section of it (:mod:`servemon.loadgen.run.sections`); the options every
one takes are :func:`servemon.commands.options.load_options`. The run itself, its
signals and its summary are :func:`servemon.load.run_command`'s.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from servemon import exits
from servemon.commands import options
from servemon.commands.defaults import fill_defaults
from servemon.commands.fleet import fleet_options
from servemon.core.errors import ConfigError
from servemon.core.fields import read_yaml
from servemon.lifecycle import run_async
from servemon.loadgen.run.config import SECTIONS, LoadConfig, secret_header_names
from servemon.loadgen.run.flat import config_of
from servemon.loadgen.run.plan import (
    DEFAULT_PARALLEL,
    DEFAULT_STAGES,
    LOOPBACK_RPS_MAX,
    RAMP_RPS_STEP,
    RAMP_STEP_S,
    Kind,
)
from servemon.loadgen.run.sections import DEFAULT_STEP_S

__all__ = [
    "capacity",
    "control",
    "load_config",
    "ramp",
    "replay",
    "sweep",
    "warn_secret_headers",
]


def load_config(
    kind: Kind, config_file: Path | None, flags: dict[str, Any]
) -> LoadConfig:
    """A load run's config from a load command's options: defaults, then
    ``--config``'s flat keys, then the flags given (:func:`config_of`)."""
    layers = [] if config_file is None else [(str(config_file), read_yaml(config_file))]
    given = {k: v for k, v in flags.items() if v is not None and v != ()}
    return config_of(kind, *layers, ("command line", given))


def warn_secret_headers(headers: tuple[str, ...]) -> None:
    """One warning (on stderr) when ``--header`` on the command line carries what
    looks like a credential: every user of the machine can read a command line."""
    names = secret_header_names(headers)
    if names:
        click.echo(
            f"servemon: warning: --header {', '.join(dict.fromkeys(names))}: a "
            "secret on the command line is visible to every user in the process "
            "list; use SERVEMON_API_KEY, --header-file or header: in --config",
            err=True,
        )


def _run(kind: Kind, config_file: Path | None, flags: dict[str, Any]) -> None:
    from servemon.load import run_command

    config = load_config(kind, config_file, flags)
    warn_secret_headers(flags.get("header") or ())
    result = run_async(run_command(kind, config, sys.argv))
    if result.status != "completed":
        sys.exit(exits.for_run(result.status))


def _int_list(
    _ctx: click.Context, param: click.Parameter, value: str | None
) -> tuple[int, ...] | None:
    """``1,2,4`` (or ``1 2 4``) as integers: ``--parallel`` and ``--number``."""
    if value is None:
        return None
    try:
        numbers = tuple(int(part) for part in value.replace(",", " ").split())
    except ValueError:
        numbers = ()
    if not numbers:
        name = param.name
        raise ConfigError(f"--{name}: expected integers, e.g. --{name} 1 2 4 8")
    return numbers


@click.command(epilog=exits.epilog())
@options.load_options()
@click.option(
    "--stages", help=f"RPS:SECONDS,... e.g. 2:30,4:30,8:30. [default: {DEFAULT_STAGES}]"
)
@click.option("--rps-start", type=float, help="First rate of a linear ramp.")
@click.option("--rps-end", type=float, help="Last rate of a linear ramp.")
@click.option(
    "--rps-step", type=float, help=f"Rate increment. [default: {RAMP_RPS_STEP:g}]"
)
@click.option(
    "--rps-max",
    type=float,
    help="Refuse stages above this rate (required when the target is not on this "
    "machine).",
)
@options.step_seconds(shown=f"{RAMP_STEP_S:g}")
@options.arrival()
@options.drain()
@options.open_loop()
@click.option(
    "--late",
    type=click.Choice(["send", "skip"]),
    help="Requests that could only go out late: send them late, or skip them.",
)
@click.option(
    "--late-tolerance",
    type=float,
    help="Seconds late before --late skip applies.",
)
@options.prometheus()
@fleet_options()
def ramp(config_file: Path | None, **flags: Any) -> None:
    """Open-loop load: requests at scheduled times, whatever is in flight."""
    _run("ramp", config_file, flags)


@click.command(epilog=exits.epilog())
@options.load_options()
@click.option(
    "--parallel",
    callback=_int_list,
    help="Concurrency levels, e.g. --parallel 1 2 4 8. "
    f"[default: {' '.join(map(str, DEFAULT_PARALLEL))}]",
)
@click.option(
    "--number",
    callback=_int_list,
    help="Requests measured per level (one value, or one per level).",
)
@click.option("--warmup", type=int, help="Warm-up requests per level, not counted.")
@options.prometheus()
@fleet_options()
def sweep(config_file: Path | None, **flags: Any) -> None:
    """Closed loop: each level keeps N requests in flight until M have finished."""
    _run("sweep", config_file, flags)


@click.command(epilog=exits.epilog())
@options.load_options()
@click.option("--rps-min", type=float, help="Where the search starts.")
@click.option(
    "--rps-max",
    type=float,
    help="Never offer more (required when the target is not on this machine). "
    f"[default: {LOOPBACK_RPS_MAX['capacity']:g} on loopback]",
)
@options.max_duration()
@options.step_seconds(shown=f"{DEFAULT_STEP_S:g}")
@click.option(
    "--settle",
    type=float,
    help="Seconds at the start of a step that are not judged.",
)
@click.option(
    "--precision",
    type=float,
    help="Stop bisecting when bad/good - 1 is below this.",
)
@options.arrival()
@options.drain()
@click.option(
    "--abort-error-rate",
    type=float,
    help="Stop at once above this error share over 10 s.",
)
@options.prometheus()
@fleet_options()
def capacity(config_file: Path | None, **flags: Any) -> None:
    """Find the highest request rate that meets the SLO, and what saturates first."""
    _run("capacity", config_file, flags)


@click.command(epilog=exits.epilog())
@click.argument("trace", type=click.Path(path_type=Path))
@options.load_options()
@click.option(
    "--time-scale",
    type=float,
    help="Multiply the trace's gaps by this (2: twice as long).",
)
@click.option(
    "--rate-scale",
    type=float,
    help="Send this many times as fast (2: twice the rate).",
)
@click.option(
    "--from", "trace_from", type=float, help="Start at this second of the trace."
)
@click.option("--to", "trace_to", type=float, help="Stop at this second of the trace.")
@click.option("--loops", type=int, help="Send the window this many times.")
@click.option(
    "--keep-failed",
    is_flag=True,
    default=False,
    help="Send the lines the trace marks failed (BurstGPT: Response tokens 0), "
    "with the default output budget, instead of skipping them.",
)
@options.open_loop()
@options.drain()
@fleet_options()
def replay(
    trace: Path, config_file: Path | None, keep_failed: bool, **flags: Any
) -> None:
    """Send a trace (Mooncake JSONL, JSONL/CSV of lengths, timed prompts, Azure's
    or BurstGPT's CSV as published) open loop at its own times, with its lengths
    and prefix structure."""
    if flags.get("workload"):
        raise ConfigError("--workload: replay takes its trace as TRACE, not both")
    flags["workload"] = f"trace:{trace}" + (",failed=keep" if keep_failed else "")
    _run("replay", config_file, flags)


@click.command(epilog=exits.epilog())
@options.load_options()
@click.option(
    "--hold",
    help="SIGNAL=SETPOINT to hold: waiting=8, kv_cache_usage=0.8, ttft_p95=0.4, "
    "burn_rate=1 or gpu_utilization=0.9 (the last two need --prometheus).",
)
@click.option("--duration", type=float, help="Seconds to hold it.")
@click.option(
    "--rps-start", type=float, help="The rate to start from. [default: 1 or --rps-min]"
)
@click.option("--rps-min", type=float, help="Never offer less.")
@click.option(
    "--rps-max",
    type=float,
    help="Never offer more (required when the target is not on this machine). "
    f"[default: {LOOPBACK_RPS_MAX['control']:g} on loopback]",
)
@click.option(
    "--control-interval",
    type=float,
    help=(
        "Seconds between rate changes. [default: twice the signal's delay, >= 1; "
        "KV usage, and a queue through Prometheus: two samples, >= 2]"
    ),
)
@click.option(
    "--blind-timeout",
    type=float,
    help="Stop when the signal has been missing this long.",
)
@click.option(
    "--pace/--no-pace",
    default=None,
    help="ttft_p95, waiting, kv_cache_usage: draw each gap at the rate times a "
    "factor from what the client knows without lag (ttft_p95, waiting: its "
    "prompts sent with no first token yet; kv_cache_usage: its requests in "
    "flight), so bursts do not pile up; the sends are then less bursty than "
    "--arrival. [default: paced for kv_cache_usage only]",
)
@options.arrival()
@options.drain()
@options.prometheus()
@fleet_options()
def control(config_file: Path | None, **flags: Any) -> None:
    """Hold a server signal at a setpoint by steering the open-loop rate."""
    _run("control", config_file, flags)


_COMMANDS: dict[Kind, click.Command] = {
    "ramp": ramp,
    "sweep": sweep,
    "capacity": capacity,
    "replay": replay,
    "control": control,
}
for _kind, _command in _COMMANDS.items():
    _own = SECTIONS.get(_kind)
    fill_defaults(_command, *([] if _own is None else [_own]), LoadConfig)
