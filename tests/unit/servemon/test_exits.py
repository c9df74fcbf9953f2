"""The exit statuses have one table (servemon/exits.py): ``--help`` prints it and
README.md lists the same numbers."""

from __future__ import annotations

import re
from pathlib import Path

from click.testing import CliRunner

from servemon.cli import cli
from servemon.exits import MEANINGS, ExitStatus, for_run

README = Path(__file__).resolve().parents[3] / "README.md"


def test_readme_lists_every_exit_status_and_no_other() -> None:
    text = README.read_text(encoding="utf-8")
    section = text.split("## Exit statuses", 1)[1].split("\n## ", 1)[0]
    listed = {int(n) for n in re.findall(r"^\| (\d+) \|", section, re.M)}
    assert listed == {int(s) for s in ExitStatus}


def test_help_lists_every_exit_status() -> None:
    for args in (["--help"], ["ramp", "--help"], ["control", "--help"]):
        out = CliRunner().invoke(cli, args).output
        for status, meaning in MEANINGS.items():
            assert f"{int(status):>3}  {meaning}" in out, (args, out)


def test_a_runs_status_maps_to_its_exit_status() -> None:
    assert for_run("completed") is ExitStatus.COMPLETED
    assert for_run("aborted") is ExitStatus.ABORTED
    assert for_run("interrupted") is ExitStatus.INTERRUPTED
    assert for_run("failed") is ExitStatus.ABORTED
    # merged shards
    assert for_run("aborted+completed") is ExitStatus.ABORTED
    assert for_run("aborted+interrupted") is ExitStatus.INTERRUPTED
