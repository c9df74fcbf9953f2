"""Open-loop load on another machine needs ``--rps-max`` (the guard rail in
``loadgen/run/plan.py``), so every open-loop command that has no bound of its own
takes the flag."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from servemon.cli import cli
from servemon.exits import ExitStatus


def test_a_ramp_takes_its_rate_bound_as_a_flag(tmp_path: Path) -> None:
    """A stage above ``--rps-max`` is refused before anything is sent (the closed
    port on loopback is never tried)."""
    args = ["ramp", "--target", "http://127.0.0.1:1", "--stages", "10:1"]
    result = CliRunner().invoke(cli, [*args, "--rps-max", "5", "--out", str(tmp_path)])
    assert result.exit_code == ExitStatus.USAGE, result.output
    assert "10 req/s is over --rps-max 5" in result.output
