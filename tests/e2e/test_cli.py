"""The console script as a user runs it: real processes, real HTTP, real signals."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio

from tests.support.margins import Margin

pytestmark = pytest.mark.e2e

SERVEMON = [sys.executable, "-m", "servemon"]
#: Ctrl-C twice: seconds to the ramp's first line (its simulator started), and from
#: the first Ctrl-C to "stopping" (docs/testing.md); a wait longer than HANG_S is a
#: hang, not a slow machine.
START_S = 40.0
STOP_S = 10.0
HANG_S = 120.0


async def _start(*args: str) -> tuple[asyncio.subprocess.Process, str]:
    proc = await asyncio.create_subprocess_exec(
        *SERVEMON, *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    assert proc.stdout is not None
    line = await asyncio.wait_for(proc.stdout.readline(), timeout=20)
    match = re.search(rb"http://127\.0\.0\.1:(\d+)", line)
    assert match, f"no URL in the ready line: {line!r}"
    return proc, match.group(0).decode()


@pytest_asyncio.fixture
async def sim_process() -> AsyncIterator[tuple[asyncio.subprocess.Process, str]]:
    """``servemon sim --port 0 --profile tiny --speed 0.05``: about 20 ms a token."""
    proc, url = await _start(
        "sim", "--port", "0", "--profile", "tiny", "--speed", "0.05"
    )
    try:
        yield proc, url
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


@pytest.mark.asyncio
async def test_sim_streams_chunk_by_chunk_and_stops_on_sigterm(
    sim_process: tuple[asyncio.subprocess.Process, str],
) -> None:
    proc, url = sim_process
    body = {
        "messages": [{"role": "user", "content": "hello"}],
        "max_tokens": 6,
        "ignore_eos": True,
        "stream": True,
    }
    arrivals: list[tuple[float, bytes]] = []
    timeout = aiohttp.ClientTimeout(total=20)
    async with (
        aiohttp.ClientSession(timeout=timeout) as session,
        session.post(f"{url}/v1/chat/completions", json=body) as resp,
    ):
        assert resp.headers["Content-Type"].startswith("text/event-stream")
        async for line in resp.content:
            if line.startswith(b"data: "):
                arrivals.append((time.monotonic(), line.strip()))
    assert arrivals[-1][1] == b"data: [DONE]"
    content = [t for t, data in arrivals if b'"content":" ' in data]
    assert len(content) == 6
    # Chunk by chunk: each token arrives on its own, a step (about 20 ms) apart.
    # The median gap: on a busy machine this client's loop may read two chunks in
    # one wake-up (a fresh clone's suite saw gaps of 4.9, 20, 20, 22, 25 ms).
    gaps = [b - a for a, b in itertools.pairwise(content)]
    assert statistics.median(gaps) > 0.01, gaps
    proc.send_signal(signal.SIGTERM)
    out, _ = await asyncio.wait_for(proc.communicate(), timeout=10)
    assert proc.returncode == 0
    assert b"stopped" in out


@pytest.mark.parametrize(
    ("yaml_text", "field"),
    [
        ("faults:\n  http_500_fraction: 2\n", "faults.http_500_fraction"),
        ("max_num_seqs: many\n", "max_num_seqs"),
        ("no_such_field: 1\n", "no_such_field"),
        ("port: [1,\n", "line 2"),
    ],
)
def test_bad_config_is_one_line_naming_the_field(
    tmp_path: Path, yaml_text: str, field: str
) -> None:
    config = tmp_path / "sim.yaml"
    config.write_text(yaml_text)
    done = subprocess.run(
        [*SERVEMON, "sim", "--config", str(config), "--port", "0"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("servemon: error: ")
    assert str(config) in lines[0]
    assert field in lines[0]


def test_bad_flag_value_names_the_field() -> None:
    done = subprocess.run(
        [*SERVEMON, "sim", "--port", "0", "--http-503-fraction", "1.5"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1
    assert "faults.http_503_fraction" in done.stderr


@pytest.mark.parametrize(
    ("command", "flag", "named"),
    [
        ("ramp", ("--stages", "2:x"), "--stages"),
        ("ramp", ("--workload", "random:prompt=abc"), "--workload"),
        ("sweep", ("--workload", "file:/no/such.jsonl"), "/no/such.jsonl"),
        ("ramp", ("--arrival", "gamma:zz"), "--arrival"),
        ("capacity", ("--slo", "ttft_p95<<3"), "--slo"),
        ("ramp", ("--cancel-fraction", "0.5"), "--cancel-fraction"),
    ],
)
def test_a_bad_load_setting_fails_before_anything_starts(
    tmp_path: Path, command: str, flag: tuple[str, ...], named: str
) -> None:
    # No --target: a valid command would start the built-in simulator first.
    done = subprocess.run(
        [*SERVEMON, command, *flag, "--out", str(tmp_path / "runs")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=tmp_path,
    )
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert named in lines[0]
    assert "simulator" not in done.stdout
    assert not (tmp_path / "runs").exists()


def test_demo_runs_the_main_job_end_to_end(tmp_path: Path) -> None:
    done = subprocess.run(
        [
            *SERVEMON,
            "demo",
            "--profile",
            "tiny",
            "--max-num-seqs",
            "2",
            "--step-seconds",
            "2",
            "--max-duration",
            "14",
            "--out",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=150,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    out = done.stdout
    assert re.search(
        r"simulator \(tiny, --max-num-seqs 2\): http://127\.0\.0\.1:\d+", out
    )
    assert re.search(r"exporter: http://127\.0\.0\.1:\d+/metrics", out)
    assert "capacity:" in out
    assert "saturated first:" in out
    (run_dir,) = [p for p in tmp_path.iterdir() if p.name.endswith("-capacity")]
    summary = json.loads((run_dir / "summary.json").read_text())
    found = summary["capacity"]
    assert found["capacity_rps"] is not None, found
    assert any(step["good"] for step in found["steps"]), found
    assert (run_dir / "report.html").stat().st_size > 10_000


def test_capacity_finds_two_slo_tiers_in_one_search(tmp_path: Path) -> None:
    """Two named tiers through the CLI against the built-in simulator: each gets
    its capacity, the strict one no higher than the loose one, in summary.json and
    on the terminal, and no rate is measured twice."""
    done = subprocess.run(
        [
            *SERVEMON,
            "capacity",
            "--sim-profile",
            "tiny",
            "--sim-arg=--max-num-seqs=2",
            "--slo",
            "interactive=ttft_p95<=0.1",
            "--slo",
            "batch=e2e_p95<=2",
            "--workload",
            "random:prompt=16,output=8",
            "--arrival",
            "constant",
            "--rps-min",
            "16",
            "--rps-max",
            "512",
            "--step-seconds",
            "2",
            "--settle",
            "0.5",
            "--precision",
            "0.5",
            "--max-duration",
            "90",
            "--metrics-port",
            "0",
            "--out",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=150,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    (run_dir,) = [p for p in tmp_path.iterdir() if p.name.endswith("-capacity")]
    found = json.loads((run_dir / "summary.json").read_text())["capacity"]
    tiers = {t["name"]: t for t in found["tiers"]}
    assert list(tiers) == ["interactive", "batch"], found
    strict, loose = tiers["interactive"]["capacity_rps"], tiers["batch"]["capacity_rps"]
    assert strict is not None, found
    assert loose is not None, found
    assert strict <= loose
    assert found["capacity_rps"] == strict
    rates = [s["rate"] for s in found["steps"]]
    assert len(set(rates)) == len(rates)
    assert all(set(s["tiers"]) == {"interactive", "batch"} for s in found["steps"])
    for name, capacity in (("interactive", strict), ("batch", loose)):
        assert re.search(
            rf"capacity \({name}: [^)]*\): {capacity:.4g} req/s meets it", done.stdout
        ), done.stdout[-3000:]
    report = (run_dir / "report.html").read_text(encoding="utf-8")
    assert "<h2 id='capacity'>Capacity</h2>" in report
    assert "interactive" in report


def test_ramp_workers_send_the_same_schedule_as_one_process(tmp_path: Path) -> None:
    common = [
        "ramp",
        "--sim-profile",
        "tiny",
        "--stages",
        "20:3",
        "--metrics-port",
        "0",
        "--workload",
        "random:prompt=16,output=4",
        "--seed",
        "7",
    ]
    sent = {}
    for workers in (1, 2):
        out = tmp_path / f"w{workers}"
        done = subprocess.run(
            [*SERVEMON, *common, "--workers", str(workers), "--out", str(out)],
            capture_output=True,
            text=True,
            timeout=90,
            check=False,
        )
        assert done.returncode == 0, done.stderr[-2000:]
        (run_dir,) = [p for p in out.iterdir() if not p.name.startswith(".")]
        summary = json.loads((run_dir / "summary.json").read_text())
        assert summary["status"] == "completed"
        sent[workers] = summary["stages"][0]["sent"]
        ids = [
            json.loads(line)["id"].rsplit("-", 1)[1]
            for line in (run_dir / "requests.jsonl").read_text().splitlines()
        ]
        assert len(ids) == len(set(ids)) == sent[workers]
    assert sent[1] == sent[2] > 40


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (("sim", "--config", "{tmp}/no.yaml"), "no.yaml: cannot read"),
        (("exporter",), "--target: give at least one"),
        (("ramp", "--config", "{tmp}/no.yaml"), "no.yaml: cannot read"),
        (("sweep", "--parallel", "two"), "--parallel: expected integers"),
        (("capacity", "--extra-body", "[1]"), "--extra-body: expected a JSON"),
        (("report", "{tmp}"), "run.json: missing"),
        (("compare", "{tmp}"), "give at least two run directories"),
        (("merge", "{tmp}", "{tmp}"), "run.json: missing"),
        (("plan", "{tmp}", "--peak-rps", "5"), "run.json: missing"),
        (("rules", "--slo-config", "{tmp}/list.yaml"), "expected a mapping"),
        (("dashboards", "--out", "{tmp}/list.yaml/x"), "--out {tmp}/list.yaml/x"),
        (("demo", "--profile", "no-such", "--out", "{tmp}/runs"), "did not start"),
    ],
    ids=lambda v: v[0] if isinstance(v, tuple) else None,
)
def test_a_servemon_error_from_any_command_is_one_line_and_exit_2(
    tmp_path: Path, argv: tuple[str, ...], named: str
) -> None:
    (tmp_path / "list.yaml").write_text("- 1\n")
    done = subprocess.run(
        [*SERVEMON, *(a.format(tmp=tmp_path) for a in argv)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=tmp_path,
    )
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("servemon: error: ")
    assert named.format(tmp=tmp_path) in lines[0]


@pytest.mark.report
def test_ctrl_c_twice_stops_a_ramp_and_report_reads_what_it_left(
    servemon: Any, tmp_path: Path, margin: Margin
) -> None:
    # Slow streams (about 20 ms a token, 40 tokens) keep requests in flight, and a
    # long grace: the first Ctrl-C waits for them, the second cancels them.
    out = tmp_path / "runs"
    began = time.monotonic()
    cli = servemon(
        "ramp", "--sim-profile", "tiny", "--sim-arg=--speed=0.05",
        "--stages", "10:60", "--grace", "60", "--metrics-port", "0",
        "--workload", "random:prompt=16,output=40", "--ignore-eos", "--out", str(out),
    )  # fmt: skip
    while "servemon ramp" not in cli.stdout and not list(out.glob("*/requests.jsonl")):
        assert cli.proc.poll() is None, cli.stderr
        assert time.monotonic() < began + HANG_S, cli.stdout
        time.sleep(0.1)
    margin("ramp started s", time.monotonic() - began, below=START_S, why=cli.stdout)
    time.sleep(1.5)  # requests in flight
    os.killpg(cli.pid, signal.SIGINT)
    signalled = time.monotonic()
    while "servemon: stopping" not in cli.stdout:
        assert time.monotonic() < signalled + HANG_S, cli.stdout
        time.sleep(0.05)
    margin("stopping line after Ctrl-C s", time.monotonic() - signalled, below=STOP_S)
    os.killpg(cli.pid, signal.SIGINT)
    assert cli.wait(20) == 130, cli.stderr
    assert "servemon: cancelling the requests in flight" in cli.stdout
    assert "Traceback" not in cli.stderr
    (run_dir,) = [p for p in out.iterdir() if p.is_dir()]
    assert f"run directory: {run_dir} (interrupted)" in cli.stdout
    records = [
        json.loads(line)
        for line in (run_dir / "requests.jsonl").read_text().splitlines()
    ]
    assert any(r["outcome"] == "cancelled" for r in records), records

    summary = _report_again(run_dir)
    assert summary["status"] == "interrupted"
    assert summary["overall"]["requests"] == len(records)


@pytest.mark.report
def test_ctrl_c_stops_a_control_run_and_keeps_its_ticks(
    servemon: Any, tmp_path: Path
) -> None:
    """A control run stopped by Ctrl-C keeps every tick it took: in
    ``control.jsonl``, in the summary's controller section and in the report
    ``servemon report`` makes again."""
    out = tmp_path / "runs"
    cli = servemon(
        "control", "--sim-profile", "tiny", "--hold", "waiting=4",
        "--duration", "120", "--control-interval", "0.5", "--sample-interval", "0.25",
        "--metrics-port", "0", "--workload", "random:prompt=16,output=8",
        "--out", str(out),
    )  # fmt: skip
    deadline = time.monotonic() + 60
    ticks: list[str] = []
    while len(ticks) < 4:
        assert cli.proc.poll() is None, cli.stderr
        assert time.monotonic() < deadline, cli.stdout
        found = list(out.glob("*/control.jsonl"))
        ticks = found[0].read_text().splitlines() if found else []
        time.sleep(0.1)
    os.killpg(cli.pid, signal.SIGINT)
    assert cli.wait(30) == 130, cli.stderr
    assert "Traceback" not in cli.stderr
    (run_dir,) = [p for p in out.iterdir() if p.is_dir()]
    lines = (run_dir / "control.jsonl").read_text().splitlines()
    kept = [json.loads(line) for line in lines]
    assert len(kept) >= len(ticks)
    assert all(t["signal"] == "waiting" for t in kept)
    summary = _report_again(run_dir)
    assert summary["status"] == "interrupted"
    assert summary["control"]["ticks"] == len(kept)
    assert "<h2 id='control'>Control</h2>" in (run_dir / "report.html").read_text()


def _report_again(run_dir: Path) -> dict[str, Any]:
    """``servemon report`` on a stopped run, its page made again; the summary."""
    (run_dir / "report.html").unlink()
    report = subprocess.run(
        [*SERVEMON, "report", str(run_dir)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert report.returncode == 0, report.stderr
    assert report.stdout.strip() == str(run_dir / "report.html")
    summary: dict[str, Any] = json.loads((run_dir / "summary.json").read_text())
    return summary
