"""``servemon plan`` as a user runs it, ``python -m servemon plan RUN@1 RUN@4 ...``:
capacity runs at two sizes, written through the record's one writer
(``tests/support/capacityruns.py``: a real two-size search against simulators
behind nginx would cost the suite minutes), read by the console script, a trace
of a public format read as a stream, and the page written."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.e2e.conftest import SERVEMON
from tests.support.capacityruns import write_tier_run
from tests.support.publictraces import BURSTGPT

pytestmark = pytest.mark.e2e


def _servemon(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*SERVEMON, *args],
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
        cwd=cwd,
    )


def test_a_plan_from_two_sizes_reads_the_measured_curve(tmp_path: Path) -> None:
    one = write_tier_run(tmp_path / "one", {"interactive": 10.0, "batch": 40.0})
    four = write_tier_run(tmp_path / "four", {"interactive": 36.0, "batch": 120.0})
    trace = tmp_path / "BurstGPT_1.csv"
    trace.write_text(BURSTGPT)
    done = _servemon("plan", f"{one}@1", f"{four}@4", "--peak-rps", "100",
                     "--replica-hour-cost", "3", "--json", cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    found = json.loads(done.stdout)
    # interactive: 9 req/s a replica past 4 (36 / 4), 100 / 0.8 = 125 take 14;
    # batch: 120 x 0.8 at 4 is short of 100, 5 carry 150 x 0.8.
    assert [t["peak_replicas"] for t in found["tiers"]] == [14, 5]
    assert any("needs 14 replicas, more than the 4" in w for w in found["warnings"])
    page = (tmp_path / "plan.html").read_text()
    assert "Capacity against replicas" in page
    done = _servemon("plan", f"{one}@1", f"{four}@4", "--trace", str(trace),
                     "--bin", "10", "--out", "t.html", cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert "replicas min-max" in done.stdout
    done = _servemon("plan", str(one), str(four), "--peak-rps", "5", cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"servemon: error: {one}: how many replicas did it measure? With several runs "
        f"give each its size: {one}@N"
    ]
