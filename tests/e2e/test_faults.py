"""Faults, end to end: the console script against targets, disks and a Prometheus
that fail as real ones do (docs/reliability.md lists them).

For each: every request gets the outcome it should (core/outcomes.py), the run
goes on or stops by its guard rails (loadgen/run/guard.py), the terminal shows one
line and no traceback, and ``summary.json`` and ``report.html`` say what happened.
The stand-ins are in :mod:`tests.support.faulty`.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import shutil
import subprocess
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.certs import make_pki
from tests.support.faulty import (
    FakePrometheus,
    gateway_502,
    hung_target,
    tls_target,
    when,
)

pytestmark = pytest.mark.e2e

Start = Callable[..., Any]


def run_dir_of(out: Path) -> Path:
    found = sorted(p for p in out.iterdir() if p.is_dir())
    assert len(found) == 1, found
    return found[0]


def records(run_dir: Path) -> list[dict[str, Any]]:
    """Every line of requests.jsonl, which must end with a whole line."""
    text = (run_dir / "requests.jsonl").read_text(encoding="utf-8")
    assert not text or text.endswith("\n"), text[-200:]
    return [json.loads(line) for line in text.splitlines()]


def read_json(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


def no_traceback(proc: Any) -> None:
    for stream in (proc.stdout, proc.stderr):
        assert "Traceback" not in stream, stream
        assert "Task exception was never retrieved" not in stream, stream


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("servemon: error")]


def start_sim(servemon: Start) -> str:
    sim = servemon("sim", "--port", "0", "--profile", "tiny")
    found = when(
        lambda: (
            sim.proc.poll() is None
            and re.search(r"on (http://127\.0\.0\.1:\d+)", sim.stdout)
        ),
        30,
        f"servemon sim serving (stderr: {sim.stderr})",
    )
    return str(found.group(1))


RAMP = ("--workload", "random:prompt=16,output=4", "--metrics-port", "0")


# -- target hung: accepts, never answers -----------------------------------------------


@pytest.mark.report
def test_a_hung_target_times_requests_out_and_the_run_stops(
    servemon: Start, tmp_path: Path
) -> None:
    out = tmp_path / "runs"
    with hung_target() as url:
        cli = servemon(
            "ramp", "--target", url, "--stages", "10:60", "--timeout", "2",
            "--out", str(out), *RAMP,
        )  # fmt: skip
        code = cli.wait(60)
    no_traceback(cli)
    assert code == 3, cli.stderr
    assert "servemon: stopping: the target stopped answering" in cli.stdout
    run_dir = run_dir_of(out)
    got = records(run_dir)
    outcomes = Counter(r["outcome"] for r in got)
    assert set(outcomes) <= {"timeout", "cancelled"}, outcomes
    assert outcomes["timeout"] >= 5, outcomes
    for r in got:
        if r["outcome"] == "timeout":
            assert r["error"] == "no complete answer within 2 s", r
            assert 1.9 < r["e2e_s"] < 3.0, r  # at --timeout, not long after
    summary = read_json(run_dir / "summary.json")
    assert summary["status"] == "aborted"
    assert "stopped answering" in summary["stop_reason"]
    assert summary["overall"]["outcomes"] == dict(outcomes)
    report = (run_dir / "report.html").read_text(encoding="utf-8")
    assert "stopped because" in report
    assert "the target stopped answering" in report
    # Stopped by the rail, long before the 60 s planned.
    assert max(r["end_s"] for r in got) - min(r["sent_s"] for r in got) < 20


def test_a_target_hung_from_the_start_is_one_line(
    servemon: Start, tmp_path: Path
) -> None:
    with hung_target(lists_models=False) as url:
        cli = servemon("ramp", "--target", url, "--out", str(tmp_path), *RAMP)
        code = cli.wait(60)
    no_traceback(cli)
    assert code == 2, cli.stderr
    assert error_lines(cli.stderr) == [
        f"servemon: error: {url}/v1/models: no answer within 10 s"
    ]
    assert not list(tmp_path.glob("*/requests.jsonl"))


# -- a gateway answering 502 with an HTML page -----------------------------------------


@pytest.mark.report
def test_a_gateways_html_502_is_one_clean_line_and_the_error_rate_stops_the_run(
    servemon: Start, tmp_path: Path
) -> None:
    out = tmp_path / "runs"
    with gateway_502() as url:
        cli = servemon(
            "ramp", "--target", url, "--stages", "20:60", "--out", str(out), *RAMP
        )
        code = cli.wait(60)
    no_traceback(cli)
    assert code == 3, cli.stderr
    run_dir = run_dir_of(out)
    got = records(run_dir)
    outcomes = Counter(r["outcome"] for r in got)
    assert set(outcomes) <= {"http_error", "cancelled"}, outcomes  # in flight: cut
    assert outcomes["http_error"] >= 10, outcomes
    for r in got:
        if r["outcome"] == "http_error":
            assert r["status"] == 502, r
            assert r["error"] == "502 Bad Gateway", r
    summary = read_json(run_dir / "summary.json")
    assert summary["status"] == "aborted"
    assert summary["stop_reason"].startswith("error rate 100%"), summary
    report = (run_dir / "report.html").read_text(encoding="utf-8")
    assert "passed --abort-error-rate 0.2" in report


# -- TLS: a certificate servemon does not trust ----------------------------------------


def test_an_untrusted_certificate_is_one_line_naming_the_fix(
    servemon: Start, tmp_path: Path
) -> None:
    pki = make_pki(tmp_path / "pki")
    out = tmp_path / "runs"
    with tls_target(pki.server_cert, pki.server_key) as url:
        cli = servemon(
            "ramp", "--target", url, "--stages", "5:2", "--out", str(out), *RAMP
        )
        code = cli.wait(30)
        # Trusting the test's CA (as the message says) gets past it: the stand-in
        # then answers the completions themselves with 404, an http_error.
        trusted = servemon(
            "ramp", "--target", url, "--stages", "10:30", "--out", str(out), *RAMP,
            env={"SSL_CERT_FILE": str(pki.ca)},
        )  # fmt: skip
        trusted_code = trusted.wait(60)
    no_traceback(cli)
    assert code == 2, cli.stderr
    (line,) = error_lines(cli.stderr)
    port = url.rsplit(":", 1)[1]
    assert line == (
        f"servemon: error: {url}/v1/models: TLS: the certificate of 127.0.0.1:{port} "
        "is not trusted here (unable to get local issuer certificate); for a private "
        "CA, set SSL_CERT_FILE to its PEM file"
    )
    no_traceback(trusted)
    assert trusted_code == 3, trusted.stderr
    got = records(run_dir_of(out))
    assert {r["outcome"] for r in got} <= {"http_error", "cancelled"}
    assert {r["status"] for r in got if r["outcome"] == "http_error"} == {404}


# -- the disk fills while a run writes -------------------------------------------------


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 1 MiB tmpfs, mounted for the test (needs root and a kernel that lets us)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    if shutil.which("mount") is None:
        pytest.skip("no mount(8) here")
    disk = tmp_path / "disk"
    disk.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(disk)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


@pytest.mark.report
def test_a_full_disk_stops_the_run_with_one_line_and_keeps_every_record_whole(
    servemon: Start, small_disk: Path, tmp_path: Path
) -> None:
    sim = start_sim(servemon)
    cli = servemon(
        "ramp", "--target", sim, "--stages", "150:60", "--out", str(small_disk),
        "--workload", "random:prompt=16,output=16", "--metrics-port", "0",
    )  # fmt: skip
    code = cli.wait(90)
    no_traceback(cli)
    assert code == 74, cli.stderr
    run_dir = run_dir_of(small_disk)
    (line,) = error_lines(cli.stderr)
    assert line.startswith(f"servemon: error: cannot write {run_dir}/"), line
    assert "No space left on device" in line
    assert f"servemon report {run_dir} rebuilds the summary" in line
    assert (
        f"servemon: stopping: cannot write {run_dir}/requests.jsonl: "
        "No space left on device"
    ) in cli.stdout
    got = records(run_dir)  # whole lines only, to the last byte
    assert len(got) > 100
    assert {r["outcome"] for r in got} == {"ok"}
    assert not list(run_dir.glob("*.tmp"))

    # On the full disk, report says so in one line; copied elsewhere, it reads
    # every request that was written.
    report = servemon("report", str(run_dir))
    assert report.wait(60) == 74
    no_traceback(report)
    (line,) = error_lines(report.stderr)
    assert line == (
        f"servemon: error: cannot write {run_dir}/report.html: No space left on device"
    )
    copy = tmp_path / "copy"
    shutil.copytree(run_dir, copy)
    report = servemon("report", str(copy))
    assert report.wait(60) == 0, report.stderr
    summary = read_json(copy / "summary.json")
    assert summary["status"] == "unfinished"
    assert summary["overall"]["requests"] == len(got)
    assert (copy / "report.html").exists()


# -- Prometheus down or restarting under --prometheus ----------------------------------


def control_ticks(out: Path) -> list[dict[str, Any]]:
    for path in out.glob("*/control.jsonl"):
        lines = path.read_text(encoding="utf-8").splitlines()
        return [json.loads(line) for line in lines if line.endswith("}")]
    return []


@pytest.mark.report
def test_control_holds_its_rate_while_prometheus_is_blind_then_stops(
    servemon: Start, tmp_path: Path
) -> None:
    sim = start_sim(servemon)
    prometheus = FakePrometheus(waiting=1.0)  # below the setpoint: the rate rises
    out = tmp_path / "runs"
    try:
        cli = servemon(
            "control", "--target", sim, "--prometheus", prometheus.url,
            "--hold", "waiting=4", "--scrape-interval", "1", "--duration", "120",
            "--blind-timeout", "8", "--rps-start", "4", "--rps-max", "50",
            "--out", str(out), *RAMP,
        )  # fmt: skip

        def tracking(after: int) -> list[dict[str, Any]] | None:
            ticks = control_ticks(out)
            done = [t for t in ticks[after:] if t["state"] == "tracking"]
            return ticks if len(done) >= 2 else None

        def blind_after(after: int) -> list[dict[str, Any]] | None:
            ticks = control_ticks(out)
            return ticks if any(t["state"] == "blind" for t in ticks[after:]) else None

        before = when(lambda: tracking(0), 60, "two tracking ticks")
        prometheus.restarting()  # 503 to every query
        during = when(lambda: blind_after(len(before)), 30, "a blind tick")
        prometheus.up()
        after = when(lambda: tracking(len(during)), 30, "tracking again")
        prometheus.down()  # connection refused, for good
        code = cli.wait(60)
    finally:
        prometheus.close()
    no_traceback(cli)
    assert code == 3, cli.stderr
    ticks = control_ticks(out)
    # While blind the rate held where it was: absence is not read as a zero queue.
    for previous, tick in itertools.pairwise(ticks):
        if tick["state"] == "blind":
            assert tick["measured"] is None, tick
            assert tick["offered_rps"] == previous["offered_rps"], (previous, tick)
    # After the restart it tracked again, then went blind for --blind-timeout.
    assert any(t["state"] == "tracking" for t in ticks[len(during) :])
    assert ticks[-1]["state"] == "blind"
    assert len(after) < len(ticks)
    run_dir = run_dir_of(out)
    summary = read_json(run_dir / "summary.json")
    assert summary["status"] == "aborted"
    assert re.fullmatch(
        r"blind: no fresh waiting for \d+ s \(--blind-timeout 8\)",
        summary["stop_reason"],
    ), summary["stop_reason"]
    assert summary["control"]["blind"] >= 3
    lines = [
        json.loads(line)
        for line in (run_dir / "server_metrics.jsonl").read_text().splitlines()
    ]
    errors = [x["error"] for x in lines if "error" in x]
    assert "Prometheus: HTTP 503: Service Unavailable" in errors, errors
    assert any("ClientConnectorError" in e for e in errors), errors
    assert "blind: no fresh waiting" in (run_dir / "report.html").read_text()
    assert {r["outcome"] for r in records(run_dir)} <= {"ok", "cancelled"}


@pytest.mark.report
def test_capacity_never_judges_a_step_good_when_prometheus_is_down(
    servemon: Start, tmp_path: Path
) -> None:
    sim = start_sim(servemon)
    prometheus = FakePrometheus(waiting=0.0)  # never saturated while it answers
    out = tmp_path / "runs"
    try:
        cli = servemon(
            "capacity", "--target", sim, "--prometheus", prometheus.url,
            "--scrape-interval", "1", "--rps-min", "4", "--rps-max", "64",
            "--step-seconds", "4", "--settle", "1", "--max-duration", "120",
            "--slo", "ttft_p95<=5", "--out", str(out), *RAMP,
        )  # fmt: skip
        when(
            lambda: "capacity: 4 req/s meets the SLO" in cli.stdout,
            60,
            f"the first step judged (stdout: {cli.stdout})",
        )
        prometheus.down()
        code = cli.wait(60)
    finally:
        prometheus.close()
    no_traceback(cli)
    assert code == 3, cli.stderr
    assert "capacity: 8 req/s cannot be judged: blind:" in cli.stdout
    run_dir = run_dir_of(out)
    summary = read_json(run_dir / "summary.json")
    found = summary["capacity"]
    assert found["capacity_rps"] == 4.0  # not the 8 it never saw the server at
    assert [s["rate"] for s in found["steps"]] == [4.0, 8.0]
    blind_step = found["steps"][-1]
    assert blind_step["good"] is False
    assert blind_step["blind"] is True
    assert blind_step["breaches"] == []
    assert found["ended_because"].startswith("blind: ")
    assert found["ended_because"].endswith(" at 8 req/s")
    assert found["first_breach"] is None  # a blind step is no breach
    assert summary["status"] == "aborted"
    assert summary["stop_reason"] == (
        f"capacity search stopped: {found['ended_because']}"
    )
    assert "capacity search stopped: blind" in (run_dir / "report.html").read_text()
