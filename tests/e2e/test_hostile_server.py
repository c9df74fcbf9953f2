"""A hostile server cannot exhaust the load generator (docs/reliability.md, "A
hostile server"): the console script runs a ramp against a target that answers
with gzip bombs (streamed and not), header floods, an endless stream and a slow
drip, mixed with good answers (:mod:`tests.support.hostile`).

Each request ends as an error that names why, the load generator's peak memory
(the child's ``ru_maxrss``, read by a wrapper process that has no other child)
stays under :data:`PEAK_RSS_BOUND`, and its loop keeps its schedule while the
bombs inflate: the run's median dispatch lag, less that of the same run against
good answers beside it, stays under :data:`LAG_P50_BOUND`.

Why the median and not the p99 docs/reliability.md quotes: on a busy 2-core
machine the tail of 42 sends is the machine's scheduling, which hits the control
run as much but not at the same moments, so a tail's difference is mostly noise.
A loop that a bomb holds is late for every send due while it inflates, and half
the answers here are hostile: that moves the median. So does the bombs' own CPU
on a machine that other tests keep busy, which is why the test is marked
``alone``. The figures behind the bound: docs/testing.md, "Timing bounds and
their margins".
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support.hostile import MODEL, hostile_target
from tests.support.margins import Margin

pytestmark = pytest.mark.e2e

#: The bound docs/reliability.md states for a run against a hostile server.
PEAK_RSS_BOUND = 300 * 1024 * 1024
#: Median dispatch lag over the control's beside it (a loop held 100 ms by each
#: bomb fails it; the figures are in docs/testing.md).
LAG_P50_BOUND = 0.015

#: Runs servemon as its only child; prints the child's peak RSS (KiB) last.
WRAPPER = (
    "import resource, subprocess, sys\n"
    "code = subprocess.call(sys.argv[1:])\n"
    "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n"
    "sys.exit(code)\n"
)

STREAMED = {
    "sse_bomb": ("response_too_large", "an SSE line over 1 MiB"),
    "header_flood": ("response_too_large", "response head refused: Too many headers"),
    "huge_header": ("response_too_large", "response head refused: Got more than 8190"),
    "endless": ("timeout", "no complete answer within 2 s"),
    "drip": ("timeout", "no complete answer within 2 s"),
}
WHOLE = {"bomb": ("response_too_large", "a response body over 4 MiB (gzip: ")}


def ramp(url: str, out: Path, *flags: str) -> subprocess.Popen[str]:
    """A ramp against ``url`` started (:func:`finish` waits for it); the error-rate
    guard rail off (most answers here fail on purpose)."""
    out.mkdir(parents=True)
    config = out / "no-error-rail.yaml"
    config.write_text("abort_error_rate: 1.0\n")
    argv = [
        sys.executable, "-c", WRAPPER, sys.executable, "-m", "servemon", "ramp",
        "--target", url, "--model", MODEL, "--stages", "14:3",
        "--grace", "3", "--config", str(config), "--metrics-port", "0",
        "--workload", "random:prompt=16,output=4", "--out", str(out), *flags,
    ]  # fmt: skip
    return subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def finish(child: subprocess.Popen[str]) -> tuple[int, int, str]:
    """(exit status, peak RSS in bytes, stderr) of a :func:`ramp`."""
    try:
        stdout, stderr = child.communicate(timeout=90)
    finally:
        child.kill()
    peak_kib = int(stdout.strip().splitlines()[-1])
    return child.returncode, peak_kib * 1024, stderr


def run_of(out: Path) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    (run_dir,) = [p for p in out.iterdir() if p.is_dir()]
    lines = (run_dir / "requests.jsonl").read_text().splitlines()
    summary = json.loads((run_dir / "summary.json").read_text())
    return [json.loads(line) for line in lines], summary


@pytest.mark.alone  # its lag bound is on the load generator's own timing
@pytest.mark.parametrize(
    ("kinds", "flags"),
    # The endless stream and the drip end at the deadline; a bomb at its bound,
    # which on a loaded machine took up to 1.6 s to inflate to (10 s: never its
    # deadline first).
    [(STREAMED, ("--timeout", "2")), (WHOLE, ("--no-stream", "--timeout", "10"))],
    ids=["streamed", "not-streamed"],
)
def test_a_hostile_server_costs_bounded_memory_and_no_schedule(
    tmp_path: Path,
    kinds: dict[str, tuple[str, str]],
    flags: tuple[str, ...],
    request: pytest.FixtureRequest,
    margin: Margin,
) -> None:
    out, control_out = tmp_path / "runs", tmp_path / "control"
    # The same run against good answers only, at the same time on the same
    # machine: what the machine's load alone makes of the schedule.
    with hostile_target([*kinds, "ok"]) as url, hostile_target(["ok"]) as good:
        runs = ramp(url, out, *flags), ramp(good, control_out, *flags)
        (code, peak, stderr), (control_code, _, control_stderr) = map(finish, runs)
    assert code == 0, stderr
    assert "Traceback" not in stderr, stderr
    assert control_code == 0, control_stderr
    records, summary = run_of(out)
    assert len(records) >= 35, len(records)

    def named(r: dict[str, Any]) -> set[str]:
        """The hostile answers whose outcome and error ``r`` has (the endless
        stream and the drip are both ended by the deadline)."""
        return {
            k for k, (o, e) in kinds.items() if o == r["outcome"] and e in r["error"]
        }

    failed = [r for r in records if r["outcome"] != "ok"]
    for r in failed:
        assert named(r), r  # every failure is one of the hostile answers, named
    assert set().union(*map(named, failed)) == set(kinds)
    assert len(records) - len(failed) >= 4  # the good answers among them are ok
    control_records, control = run_of(control_out)
    assert {r["outcome"] for r in control_records} == {"ok"}
    lag = summary["overall"]["dispatch_lag"]
    control_lag = control["overall"]["dispatch_lag"]
    request.node.user_properties += [
        (f"lag_{q}", lag[q]) for q in ("p50", "p90", "p99")
    ] + [(f"control_lag_{q}", control_lag[q]) for q in ("p50", "p90", "p99")]
    margin(
        "dispatch lag p50 over the control's s",
        lag["p50"] - control_lag["p50"],
        below=LAG_P50_BOUND,
        why=f"{lag}\ncontrol: {control_lag}",
    )
    assert peak < PEAK_RSS_BOUND, f"peak RSS {peak / 2**20:.0f} MiB"
