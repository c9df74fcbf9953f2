"""``--workers N``: a fleet of this machine's processes over loopback. The token is
made for the run and reaches the workers in their environment, never on their
command lines (which every user of the machine can read); the request headers
reach them only over the coordinator's connection."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from servemon.core.errors import ConfigError
from servemon.loadgen.fleet.settings import fleet_settings
from servemon.loadgen.run.config import LoadConfig
from servemon.workers import local_workers, worker_argv


def test_a_local_worker_is_told_where_to_join_and_nothing_secret() -> None:
    argv = worker_argv("http://127.0.0.1:9500", 3, Path("/tmp/spool"))
    assert argv[argv.index("--join") + 1] == "http://127.0.0.1:9500"
    assert argv[argv.index("--name") + 1] == "local-3"
    assert not any("token" in a.lower() or "header" in a.lower() for a in argv)


@pytest.mark.asyncio
async def test_the_local_fleet_has_a_token_of_its_own(tmp_path: Path) -> None:
    async with (
        local_workers(2, tmp_path) as one,
        local_workers(2, tmp_path) as other,
    ):
        assert one.expect == 2
        assert one.host == "127.0.0.1"
        assert one.port == 0
        assert len(one.token.reveal()) >= 16
        assert one.token.reveal() != other.token.reveal()
        assert "redacted" in str(one.token)
    folders = await asyncio.to_thread(lambda: list(tmp_path.glob(".workers-*")))
    assert len(folders) == 2


def test_every_load_command_takes_workers_and_auto_is_a_ramps() -> None:
    for kind in ("ramp", "sweep", "replay", "capacity", "control"):
        assert fleet_settings(kind, LoadConfig(workers=2)) is None  # local_workers'
    with pytest.raises(ConfigError, match="--workers auto: a ramp's only"):
        fleet_settings("sweep", LoadConfig(workers="auto"))
