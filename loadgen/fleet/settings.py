"""A load command's fleet flags, checked before anything starts."""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Literal

from servemon.core.errors import ConfigError
from servemon.core.fields import Secret
from servemon.loadgen.fleet.wire import read_token
from servemon.loadgen.run.config import LoadConfig

__all__ = ["FleetSettings", "fleet_settings"]


@dataclass(frozen=True, slots=True)
class FleetSettings:
    """Where the coordinator listens, whom it waits for, and the token."""

    host: str
    port: int
    expect: int
    wait_s: float
    on_loss: Literal["abort", "continue"]
    token: Secret
    #: Started once the coordinator listens, with the URL to join (``--workers N``:
    #: this machine's own workers).
    spawn: Callable[[str], Awaitable[None]] | None = None


def fleet_settings(
    kind: str, config: LoadConfig, env: Mapping[str, str] = os.environ
) -> FleetSettings | None:
    """The fleet a run coordinates (None: it sends from here); a one-line
    :class:`ConfigError` naming the flag at fault."""
    if config.workers == "auto" and kind != "ramp":
        raise ConfigError(
            "--workers auto: a ramp's only (it reads the peak stage rate); give N"
        )
    if config.fleet_listen is None:
        if config.fleet_workers is not None:
            raise ConfigError("--fleet-workers: give --fleet-listen HOST:PORT too")
        return None
    if config.fleet_workers is None:
        raise ConfigError(
            "--fleet-listen: give --fleet-workers N, the workers to wait for"
        )
    if config.shard is not None or config.workers != 1:
        raise ConfigError(
            "--fleet-listen: a fleet splits the run itself; drop --shard and --workers"
        )
    host, sep, port_text = config.fleet_listen.rpartition(":")
    try:
        port = int(port_text)
    except ValueError:
        port = -1
    if not sep or not host or not 0 <= port <= 65535:
        raise ConfigError(
            f"--fleet-listen {config.fleet_listen!r}: expected HOST:PORT (port 0: "
            "any free one)"
        )
    return FleetSettings(
        host=host.strip("[]"),
        port=port,
        expect=config.fleet_workers,
        wait_s=config.fleet_wait,
        on_loss=config.on_worker_loss,
        token=read_token(config.fleet_token_file, env),
    )
