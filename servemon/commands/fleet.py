"""A run from many load machines: the options that make a load command coordinate
a fleet (:func:`fleet_options`), and ``servemon worker``, a machine of one
(:mod:`servemon.loadgen.fleet`)."""

from __future__ import annotations

import os
import socket
import ssl
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from servemon.commands.options import _option, compose
from servemon.core.errors import ConfigError
from servemon.lifecycle import run_async
from servemon.loadgen.fleet.wire import TOKEN_ENV, read_token

__all__ = ["fleet_options", "worker"]

F = TypeVar("F", bound=Callable[..., Any])

#: ``servemon worker``'s exit status when its coordinator went away (it stopped
#: sending; its records are in its spool).
LOST = 3


def fleet_options() -> Callable[[F], F]:
    """What makes ``ramp``, ``sweep``, ``replay``, ``capacity`` and ``control``
    coordinate a fleet of ``servemon worker`` processes instead of sending from
    here."""
    return compose(
        _option(
            "--workers",
            help="Send from this many worker processes of this machine (a fleet "
            "over loopback), when one cannot keep up; auto (ramp): as many as the "
            "peak rate needs at the measured CPU cost of a request, up to the CPUs "
            "here.",
        ),
        _option(
            "--fleet-listen",
            help="HOST:PORT to take workers on (servemon worker --join): this "
            "process coordinates and the workers send.",
        ),
        _option(
            "--fleet-workers",
            type=int,
            help="Workers to wait for before the run starts.",
        ),
        _option(
            "--fleet-token-file",
            help=f"File holding the fleet's shared token (else ${TOKEN_ENV}).",
        ),
        _option(
            "--fleet-wait",
            type=float,
            help="Seconds to wait for the workers.",
        ),
        _option(
            "--on-worker-loss",
            type=click.Choice(["abort", "continue"]),
            help="A worker lost mid-run: stop the run (exit 3), or go on with "
            "the others at the same total rate.",
        ),
    )


@click.command()
@click.option(
    "--join",
    "url",
    required=True,
    help="The coordinator's URL (http://HOST:PORT, or https:// with TLS).",
)
@click.option(
    "--fleet-token-file",
    help=f"File holding the fleet's shared token (else ${TOKEN_ENV}).",
)
@click.option(
    "--name", help="This worker's name in the run record. [default: host-pid]"
)
@click.option(
    "--spool",
    type=click.Path(path_type=Path),
    default=Path("servemon-spool"),
    show_default=True,
    help="Folder that keeps every record this worker made (servemon merge "
    "takes in what the coordinator did not get).",
)
@click.option(
    "--join-timeout",
    type=click.FloatRange(min=0),
    default=0.0,
    show_default=True,
    help="Seconds to keep trying to reach a coordinator that is not up yet (a "
    "Job's pods start in any order); 0: try once.",
)
@click.option(
    "--ca-file",
    type=click.Path(path_type=Path, exists=True, dir_okay=False),
    help="CA certificate to verify an https:// coordinator with.",
)
def worker(
    url: str,
    fleet_token_file: str | None,
    name: str | None,
    spool: Path,
    join_timeout: float,
    ca_file: Path | None,
) -> None:
    """Send a coordinator's requests (a load command run with --fleet-listen)."""
    from servemon.loadgen.fleet.worker import run_worker

    if not url.startswith(("http://", "https://")):
        raise ConfigError(f"--join {url!r}: expected http://HOST:PORT or https://")
    token = read_token(fleet_token_file)
    context: ssl.SSLContext | bool = True
    if ca_file is not None:
        context = ssl.create_default_context(cafile=str(ca_file))
    name = name or f"{socket.gethostname()}-{os.getpid()}"
    spool.mkdir(parents=True, exist_ok=True)

    def say(line: str) -> None:
        click.echo(line, err=True)

    end = run_async(
        run_worker(
            url,
            token,
            name=name,
            spool_dir=spool,
            ssl_context=context,
            join_timeout_s=join_timeout,
            say=say,
        )
    )
    say(
        f"servemon worker: {end.how}; sent {end.sent}, recorded {end.recorded}"
        + (f" (spool {end.spool})" if end.spool else "")
    )
    if end.how != "stopped":
        sys.exit(LOST)
