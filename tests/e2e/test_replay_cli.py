"""``servemon trace synth`` then ``servemon replay``, as a user runs them; a bad
trace line fails before anything starts."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

SERVEMON = [sys.executable, "-m", "servemon"]


def servemon(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*SERVEMON, *args],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
        cwd=tmp_path,
    )


def test_a_synthetic_trace_replays_against_the_built_in_simulator(
    tmp_path: Path,
) -> None:
    trace = tmp_path / "trace.jsonl"
    made = servemon(
        tmp_path,
        "trace",
        "synth",
        "--out",
        str(trace),
        "--duration",
        "30",
        "--rate",
        "1",
        "--turns",
        "3",
        "--think",
        "3",
        "--input-median",
        "64",
        "--output-median",
        "8",
        "--seed",
        "2",
    )
    assert made.returncode == 0, made.stderr
    assert "prefix-cache hit ratio from its hash_ids" in made.stdout
    lines = trace.read_text().splitlines()
    assert {"timestamp", "input_length", "output_length", "hash_ids"} <= set(
        json.loads(lines[0])
    )
    done = servemon(
        tmp_path,
        "replay",
        str(trace),
        "--to",
        "20",
        "--rate-scale",
        "4",
        "--sim-profile",
        "tiny",
        "--metrics-port",
        "0",
        "--out",
        "runs",
    )
    assert done.returncode == 0, done.stderr
    assert "servemon replay: completed" in done.stdout
    (run,) = (tmp_path / "runs").glob("*-replay")
    stamps = [json.loads(x)["timestamp"] for x in lines]
    sent = [t for t in stamps if t - min(stamps) < 20_000]  # --to: from the first
    requests = (run / "requests.jsonl").read_text().splitlines()
    assert len(requests) == len(sent)
    info = json.loads((run / "run.json").read_text())
    assert info["kind"] == "replay"
    assert info["config"]["rate_scale"] == 4.0
    assert (run / "report.html").stat().st_size > 10_000


def test_a_bad_trace_line_fails_before_anything_starts(tmp_path: Path) -> None:
    trace = tmp_path / "bad.jsonl"
    trace.write_text(
        '{"timestamp": 0, "input_length": 10, "output_length": 2}\n'
        '{"timestamp": 5, "input_length": "ten", "output_length": 2}\n'
    )
    done = servemon(tmp_path, "replay", str(trace), "--out", "runs")
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert f"{trace}: line 2: input_length: must be a whole number" in line
    assert "simulator" not in done.stdout
    assert not (tmp_path / "runs").exists()
