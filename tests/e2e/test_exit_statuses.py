"""Each way a run ends has its own exit status (``servemon/exits.py``), over real
runs of the console script: completed, bad input, aborted by a guard rail,
interrupted, and a record that could not be written. The run's record says the
same thing as the status (``summary.json``'s ``status``)."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from servemon.exits import ExitStatus
from tests.support.faulty import gateway_502

pytestmark = pytest.mark.e2e

Start = Callable[..., Any]
#: A short run against the built-in simulator.
RUN = ("--sim-profile", "tiny", "--metrics-port", "0")
WORKLOAD = ("--workload", "random:prompt=16,output=4")


def summary_of(out: Path) -> dict[str, Any]:
    (run_dir,) = [p for p in out.iterdir() if p.is_dir()]
    summary: dict[str, Any] = json.loads((run_dir / "summary.json").read_text())
    run = json.loads((run_dir / "run.json").read_text())
    assert run["status"] == summary["status"]
    return summary


def clean(cli: Any) -> None:
    assert "Traceback" not in cli.stderr, cli.stderr


def test_a_completed_run_exits_0(servemon: Start, tmp_path: Path) -> None:
    out = tmp_path / "runs"
    cli = servemon("ramp", *RUN, *WORKLOAD, "--stages", "5:1", "--out", str(out))
    assert cli.wait(60) == ExitStatus.COMPLETED == 0, cli.stderr
    clean(cli)
    assert summary_of(out)["status"] == "completed"


def test_bad_input_exits_2_before_anything_starts(
    servemon: Start, tmp_path: Path
) -> None:
    out = tmp_path / "runs"
    cli = servemon("ramp", *RUN, *WORKLOAD, "--stages", "fast", "--out", str(out))
    assert cli.wait(30) == ExitStatus.USAGE == 2, cli.stderr
    clean(cli)
    assert cli.stderr.startswith("servemon: error: "), cli.stderr
    assert not out.exists()


def test_a_run_its_guard_rail_stopped_exits_3(servemon: Start, tmp_path: Path) -> None:
    out = tmp_path / "runs"
    with gateway_502() as url:
        cli = servemon(
            "ramp", "--target", url, *WORKLOAD, "--metrics-port", "0",
            "--stages", "20:60", "--out", str(out),
        )  # fmt: skip
        code = cli.wait(60)
    assert code == ExitStatus.ABORTED == 3, cli.stderr
    clean(cli)
    summary = summary_of(out)
    assert summary["status"] == "aborted"
    assert summary["stop_reason"].startswith("error rate"), summary


def test_an_interrupted_run_exits_130(servemon: Start, tmp_path: Path) -> None:
    out = tmp_path / "runs"
    cli = servemon(
        "ramp", *RUN, *WORKLOAD, "--stages", "5:60", "--grace", "1",
        "--out", str(out),
    )  # fmt: skip
    deadline = time.monotonic() + 40
    while not [p for p in out.glob("*/requests.jsonl") if p.stat().st_size]:
        assert cli.proc.poll() is None, cli.stderr
        assert time.monotonic() < deadline, cli.stdout
        time.sleep(0.1)
    os.killpg(cli.pid, signal.SIGINT)
    assert cli.wait(30) == ExitStatus.INTERRUPTED == 130, cli.stderr
    clean(cli)
    assert summary_of(out)["status"] == "interrupted"


def test_a_record_that_cannot_be_written_exits_74(
    servemon: Start, tmp_path: Path
) -> None:
    # A file where the run directory's parent should be: mkdir fails, as root too
    # (a read-only directory would not stop root).
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    cli = servemon(
        "ramp", *RUN, *WORKLOAD, "--stages", "5:1", "--out", str(blocker / "runs")
    )
    assert cli.wait(60) == ExitStatus.RECORD_ERROR == 74, cli.stderr
    clean(cli)
    (line,) = [x for x in cli.stderr.splitlines() if x.startswith("servemon: error")]
    assert line.startswith(f"servemon: error: cannot write {blocker}/runs"), line
