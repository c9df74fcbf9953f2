"""The client tells when it is the limit: live, in the record and in the report.

A load generator is asked for far more than any one event loop sends — 5,000
requests/s against a simulator in a process of its own — so its schedule slips on
any machine this suite runs on.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.e2e


@pytest.mark.report
def test_an_overloaded_client_warns_live_and_the_record_and_report_say_so(
    servemon: Callable[..., Any], tmp_path: Path
) -> None:
    sim = servemon("sim", "--port", "0", "--profile", "tiny")
    deadline = time.monotonic() + 30
    while not (found := re.search(r"on (http://127\.0\.0\.1:\d+)", sim.stdout)):
        assert sim.proc.poll() is None, sim.stderr
        assert time.monotonic() < deadline, "servemon sim did not start"
        time.sleep(0.02)
    out = tmp_path / "runs"
    cli = servemon(
        "ramp",
        "--target",
        found.group(1),
        "--stages",
        "5000:1",
        "--workload",
        "random:prompt=16,output=4",
        "--metrics-port",
        "0",
        "--max-inflight",
        "20000",
        "--timeout",
        "60",
        "--out",
        str(out),
    )
    assert cli.wait(120) == 0, cli.stderr
    live = [x for x in cli.stdout.splitlines() if x.startswith("servemon: warning")]
    assert live, cli.stdout
    assert all("stage 1 (5000 rps)" in x and "--workers" in x for x in live)
    (run,) = out.glob("*-ramp")
    stage = json.loads((run / "summary.json").read_text())["stages"][0]
    reasons = {x["reason"] for x in stage["client_limits"]}
    assert "lag" in reasons, stage["client_limits"]
    lag = next(x for x in stage["client_limits"] if x["reason"] == "lag")
    assert lag["worst"] > 0.005
    assert lag["seconds"] >= 1
    # The end-of-run lines and the report say it too.
    assert "warning: stage 1 (5000 rps): the client was the limit" in cli.stdout
    page = (run / "report.html").read_text()
    assert "The client was the limit" in page
    assert "fell behind its schedule" in page
