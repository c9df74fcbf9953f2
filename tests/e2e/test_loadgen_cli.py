"""``servemon ramp`` and ``servemon sweep`` as a user runs them: real processes, the
built-in simulator as their child, real signals, and the run directory they leave."""

from __future__ import annotations

import csv
import json
import os
import signal
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest

pytestmark = pytest.mark.e2e

T = TypeVar("T")

#: Short requests on a free live-metrics port: the tiny simulator answers at once.
QUICK = ("--workload", "random:prompt=16,output=4", "--metrics-port", "0")
RUN_FILES = (
    "run.json",
    "requests.jsonl",
    "summary.json",
    "summary.csv",
    "server_metrics.jsonl",
)
#: Fields every line of requests.jsonl carries (the documented, stable format).
REQUEST_FIELDS = {
    "id", "stage", "outcome", "status", "scheduled_s", "sent_s", "first_chunk_s",
    "first_content_s", "end_s", "ttft_s", "ttfc_s", "e2e_s", "tpot_s", "itl_s",
    "dispatch_lag_s", "prompt_tokens", "output_tokens", "token_source",
    "finish_reason", "error",
}  # fmt: skip
OUTCOMES = {
    "ok",
    "http_error",
    "timeout",
    "connect_error",
    "stream_error",
    "response_too_large",
    "cancelled",
}


def poll(predicate: Callable[[], T | None], timeout: float, what: str) -> T:
    """``predicate()`` once it is truthy; fails the test after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not within {timeout} s")
        time.sleep(0.02)


def run_dir_of(out: Path) -> Path | None:
    """The one run directory under ``out``, once it exists."""
    found = [p for p in out.glob("*-*") if p.is_dir()] if out.exists() else []
    assert len(found) <= 1, found
    return found[0] if found else None


def complete_lines(path: Path) -> list[dict[str, Any]]:
    """Every newline-terminated line of a JSONL file, parsed; a partial last line
    (a write cut by kill -9) is left out."""
    text = path.read_text(encoding="utf-8") if path.exists() else ""
    lines = text.split("\n")[:-1]
    records = [json.loads(line) for line in lines]
    for record in records:
        assert set(record) >= REQUEST_FIELDS, sorted(REQUEST_FIELDS - set(record))
        assert record["outcome"] in OUTCOMES
    return records


def wait_for_requests(cli: Any, out: Path, count: int) -> Path:
    """The run directory, once ``count`` requests are recorded in it."""

    def ready() -> Path | None:
        if cli.proc.poll() is not None:
            pytest.fail(f"servemon exited early ({cli.proc.returncode}): {cli.stderr}")
        run_dir = run_dir_of(out)
        if run_dir is None:
            return None
        recorded = complete_lines(run_dir / "requests.jsonl")
        return run_dir if len(recorded) >= count else None

    return poll(ready, 30, f"{count} lines in requests.jsonl")


def read_json(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


def assert_no_traceback(text: str) -> None:
    assert "Traceback" not in text, text


def test_ramp_without_target_starts_the_simulator_and_writes_the_run(
    servemon: Callable[..., Any], tmp_path: Path
) -> None:
    out = tmp_path / "runs"
    cli = servemon(
        "ramp",
        "--sim-profile",
        "tiny",
        "--stages",
        "10:1,20:1",
        *QUICK,
        "--out",
        str(out),
    )
    assert cli.wait(60) == 0, cli.stderr
    stdout = cli.stdout
    assert "no --target given: started the built-in simulator (profile tiny)" in stdout
    assert "servemon ramp: completed" in stdout
    assert "TTFT p95" in stdout
    run_dir = run_dir_of(out)
    assert run_dir is not None
    assert f"run directory: {run_dir} (completed)" in stdout
    assert_no_traceback(cli.stderr)
    for name in RUN_FILES:
        assert (run_dir / name).stat().st_size > 0, name
    # The fixture asked for no report (--no-report): none drawn, the way to it said.
    assert f"report: not written (--no-report; servemon report {run_dir})" in stdout
    assert not (run_dir / "report.html").exists()

    run_json = read_json(run_dir / "run.json")
    assert run_json["status"] == "completed"
    assert run_json["kind"] == "ramp"
    assert run_json["target"]["embedded_simulator"]["profile"] == "tiny"
    assert run_json["target"]["model"] == "sim-tiny"
    assert [s["target_rate"] for s in run_json["stages"]] == [10, 20]

    records = complete_lines(run_dir / "requests.jsonl")
    summary = read_json(run_dir / "summary.json")
    assert summary["status"] == "completed"
    assert summary["overall"]["requests"] == len(records) > 10
    assert summary["overall"]["outcomes"].get("ok", 0) > 10
    assert [s["stage"] for s in summary["stages"]] == [0, 1]
    with (run_dir / "summary.csv").open(encoding="utf-8", newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert [row["stage"] for row in rows] == ["0", "1", "all"]
    assert int(rows[-1]["requests"]) == len(records)

    samples = [
        json.loads(line)
        for line in (run_dir / "server_metrics.jsonl").read_text().splitlines()
    ]
    names = {s[0] for line in samples for s in line.get("samples", [])}
    # The engine's running batch, by its servemon name (or raw, before normalizing).
    assert names & {"servemon_engine_requests_running", "vllm:num_requests_running"}


@pytest.mark.parametrize(
    ("sig", "to_group"),
    [(signal.SIGINT, True), (signal.SIGTERM, False)],
    ids=["sigint-as-ctrl-c", "sigterm"],
)
def test_a_signal_mid_run_stops_it_and_leaves_complete_records(
    servemon: Callable[..., Any],
    process_running: Callable[[tuple[int, int]], bool],
    tmp_path: Path,
    sig: signal.Signals,
    to_group: bool,
) -> None:
    out = tmp_path / "runs"
    cli = servemon(
        "ramp", "--sim-profile", "tiny", "--stages", "20:60", "--grace", "2", *QUICK,
        "--out", str(out),
    )  # fmt: skip
    run_dir = wait_for_requests(cli, out, 5)
    simulators = cli.children()
    assert simulators, "the built-in simulator runs as a child"
    if to_group:
        os.killpg(cli.pid, sig)  # what a terminal's Ctrl-C does
    else:
        os.kill(cli.pid, sig)
    assert cli.wait(20) == 130, cli.stderr
    assert "servemon: stopping" in cli.stdout
    assert f"run directory: {run_dir} (interrupted)" in cli.stdout
    assert_no_traceback(cli.stderr)

    run_json = read_json(run_dir / "run.json")
    assert run_json["status"] == "interrupted"
    assert run_json["stages"][0]["end_s"] is not None
    summary = read_json(run_dir / "summary.json")
    assert summary["status"] == "interrupted"
    records = complete_lines(run_dir / "requests.jsonl")
    assert (run_dir / "requests.jsonl").read_text().endswith("\n")
    assert len({r["id"] for r in records}) == len(records)
    # Every request sent was recorded, finished or cancelled; none was lost.
    assert summary["overall"]["requests"] == len(records) >= 5
    assert run_json["stages"][0]["sent"] == len(records)
    assert (run_dir / "summary.csv").stat().st_size > 0
    poll(
        lambda: not any(process_running(p) for p in simulators),
        10,
        "the built-in simulator exits with the run",
    )


def test_kill_9_leaves_valid_records_and_no_simulator_behind(
    servemon: Callable[..., Any],
    process_running: Callable[[tuple[int, int]], bool],
    tmp_path: Path,
) -> None:
    out = tmp_path / "runs"
    cli = servemon(
        "ramp", "--sim-profile", "tiny", "--stages", "40:60", *QUICK, "--out", str(out)
    )
    run_dir = wait_for_requests(cli, out, 10)
    simulators = cli.children()
    assert simulators, "the built-in simulator runs as a child"
    os.kill(cli.pid, signal.SIGKILL)
    assert cli.wait(10) == -signal.SIGKILL
    records = complete_lines(run_dir / "requests.jsonl")
    assert len(records) >= 10
    assert len({r["id"] for r in records}) == len(records)
    # run.json is written whole or not at all: it still says the run was running.
    assert read_json(run_dir / "run.json")["status"] == "running"
    poll(
        lambda: not any(process_running(p) for p in simulators),
        10,
        "the built-in simulator exits after its parent is killed",
    )
    # The report rebuilds the summary from what was recorded, and says so.
    assert not (run_dir / "summary.json").exists()
    report = servemon("report", str(run_dir))
    assert report.wait(60) == 0, report.stderr
    summary = read_json(run_dir / "summary.json")
    assert summary["status"] == "unfinished"
    assert summary["overall"]["requests"] == len(records)
    ok = sum(1 for r in records if r["outcome"] == "ok")
    assert summary["stages"][0]["summary"]["outcomes"].get("ok", 0) == ok
    assert summary["stages"][0]["target_rate"] == 40  # the plan, from run.json
    page = (run_dir / "report.html").read_text(encoding="utf-8")
    assert "did not finish" in page


def _ticks(path: Path) -> list[dict[str, Any]]:
    """The whole lines of a ``control.jsonl`` (the last may be cut by a kill)."""
    lines = path.read_text(encoding="utf-8").split("\n")[:-1]
    return [json.loads(line) for line in lines]


def test_kill_9_of_a_control_run_keeps_what_it_held_in_the_rebuilt_summary(
    servemon: Callable[..., Any], tmp_path: Path
) -> None:
    out = tmp_path / "runs"
    cli = servemon(
        "control", "--sim-profile", "tiny", "--hold", "waiting=4",
        "--duration", "120", "--control-interval", "0.5", *QUICK, "--out", str(out),
    )  # fmt: skip
    ticks = poll(
        lambda: next(
            (
                lines
                for path in out.glob("*/control.jsonl")
                if len(lines := _ticks(path)) >= 4
            ),
            None,
        ),
        60,
        "four control ticks",
    )
    os.kill(cli.pid, signal.SIGKILL)
    assert cli.wait(10) == -signal.SIGKILL
    (run_dir,) = list(out.iterdir())
    kept = _ticks(run_dir / "control.jsonl")
    assert len(kept) >= len(ticks)
    report = servemon("report", str(run_dir))
    assert report.wait(60) == 0, report.stderr
    summary = read_json(run_dir / "summary.json")
    assert summary["status"] == "unfinished"
    held = summary["control"]
    assert (held["signal"], held["setpoint"], held["ticks"]) == (
        "waiting",
        4.0,
        len(kept),
    )
    assert held["interval_s"] == pytest.approx(0.5, abs=0.1)
    page = (run_dir / "report.html").read_text(encoding="utf-8")
    assert "<h2 id='control'>Control</h2>" in page


@pytest.mark.report
def test_no_secret_reaches_the_run_directory_or_the_output(
    servemon: Callable[..., Any], tmp_path: Path
) -> None:
    secrets = (
        "sk-test-SECRET-1",
        "hdr-SECRET-2",
        "hdr-SECRET-3",
        "bearer-SECRET-4",
        "file-SECRET-5",
    )
    header_file = tmp_path / "headers.txt"
    header_file.write_text(
        f"# from a file, not the command line\nX-Auth-Token: {secrets[4]}\n"
    )
    out = tmp_path / "runs"
    cli = servemon(
        "ramp", "--sim-profile", "tiny", "--stages", "10:1", *QUICK, "--out", str(out),
        "--header", f"X-Api-Key: {secrets[1]}", f"--header=X-Team: {secrets[2]}",
        "--header", f"Authorization: Bearer {secrets[3]}",
        "--header-file", str(header_file),
        env={"SERVEMON_API_KEY": secrets[0]},
    )  # fmt: skip
    assert cli.wait(60) == 0, cli.stderr
    run_dir = run_dir_of(out)
    assert run_dir is not None
    files = [p for p in run_dir.rglob("*") if p.is_file()]
    assert {p.name for p in files} >= {*RUN_FILES, "report.html"}
    for path in files:
        content = path.read_bytes()
        for secret in secrets:
            assert secret.encode() not in content, f"{secret} in {path.name}"
    for secret in secrets:
        assert secret not in cli.stdout
        assert secret not in cli.stderr
    # Credentials on the command line: one warning, naming them (not their values)
    # and what to use instead; the header file's and X-Team are not named.
    warnings = [line for line in cli.stderr.splitlines() if "warning: --header" in line]
    assert len(warnings) == 1, cli.stderr
    assert "X-Api-Key, Authorization:" in warnings[0]
    assert "SERVEMON_API_KEY" in warnings[0]
    assert "--header-file" in warnings[0]
    assert "X-Team" not in warnings[0]
    assert "X-Auth-Token" not in warnings[0]

    run_json = read_json(run_dir / "run.json")
    assert run_json["config"]["header"] == [
        "X-Api-Key: <redacted>",
        "X-Team: <redacted>",
        "Authorization: <redacted>",
    ]
    assert run_json["config"]["header_file"] == str(header_file)
    assert "X-Api-Key: <redacted>" in run_json["command"]
    assert "--header=X-Team: <redacted>" in run_json["command"]
    summary = read_json(run_dir / "summary.json")
    assert summary["overall"]["outcomes"].get("ok", 0) >= 3


def test_a_dead_target_is_one_line_and_exit_code_2(
    servemon: Callable[..., Any], tmp_path: Path
) -> None:
    # A port bound but not listening: connections to it are refused.
    with socket.socket() as reserved:
        reserved.bind(("127.0.0.1", 0))
        port = reserved.getsockname()[1]
        cli = servemon(
            "ramp", "--target", f"http://127.0.0.1:{port}", "--stages", "1:1",
            *QUICK, "--out", str(tmp_path / "runs"),
        )  # fmt: skip
        code = cli.wait(30)
    assert code == 2, cli.stderr
    lines = cli.stderr.strip().splitlines()
    assert len(lines) == 1, cli.stderr
    assert lines[0].startswith("servemon: error: ")
    assert f"127.0.0.1:{port}" in lines[0]
    assert_no_traceback(cli.stdout + cli.stderr)


def test_sweep_takes_evalscopes_space_separated_levels(
    servemon: Callable[..., Any], tmp_path: Path
) -> None:
    out = tmp_path / "runs"
    cli = servemon(
        "sweep", "--parallel", "1", "2", "--number", "4", "--sim-profile", "tiny",
        *QUICK, "--out", str(out),
    )  # fmt: skip
    assert cli.wait(60) == 0, cli.stderr
    assert "servemon sweep: completed" in cli.stdout
    run_dir = run_dir_of(out)
    assert run_dir is not None
    run_json = read_json(run_dir / "run.json")
    assert run_json["config"]["parallel"] == [1, 2]
    assert run_json["config"]["number"] == [4]
    summary = read_json(run_dir / "summary.json")
    assert [s["parallel"] for s in summary["stages"]] == [1, 2]
    assert [s["summary"]["requests"] for s in summary["stages"]] == [4, 4]
    records = complete_lines(run_dir / "requests.jsonl")
    assert len(records) == 8
    assert all(r["outcome"] == "ok" for r in records)
