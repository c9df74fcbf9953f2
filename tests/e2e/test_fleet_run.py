"""One run from many load machines (``--fleet-listen`` and ``servemon worker``),
as processes: a coordinator, workers whose wall clocks are set off by libfaketime,
the simulator as the target.

What is checked: each worker's clock offset as measured against the one it was
given; the workers together sent exactly the one seeded schedule; a worker without
the token is refused; a worker killed mid-run is named with the time its share
stopped and what it recorded is kept; a coordinator killed mid-run leaves the
target without load within 2 s (seen by a proxy in front of the target), and
``servemon merge --spool`` takes what its workers kept into its run, with every
request the target saw."""

from __future__ import annotations

import itertools
import re
import signal
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from servemon.embedded import free_port
from tests.support.fleet import (
    COORDINATOR,
    RecordingProxy,
    clock_env,
    sent_one_schedule,
)
from tests.support.margins import Margin
from tests.support.rundirs import only_run, poll, read_json, read_jsonl

pytestmark = pytest.mark.e2e

TOKEN = "fleet-token-of-the-tests-0123456789"
#: Clock offsets the workers are given (s): up to a second either way.
OFFSETS = (0.5, -0.25, 1.0, -1.0)
STAGES, SEED = ((20.0, 2.0), (40.0, 2.0)), 17
RAMP = ",".join(f"{rate:g}:{secs:g}" for rate, secs in STAGES)
LOAD = (
    "--seed",
    str(SEED),
    "--workload",
    "random:prompt=16,output=8",
    "--ignore-eos",
    "--metrics-port",
    "0",
    "--timeout",
    "20",
)
ENV = {"SERVEMON_FLEET_TOKEN": TOKEN}


def start_sim(servemon: Callable[..., Any], *args: str) -> str:
    sim = servemon("sim", "--port", "0", "--profile", "tiny", *args)

    def url() -> str | None:
        if sim.proc.poll() is not None:
            pytest.fail(f"servemon sim exited: {sim.stderr}")
        found = re.search(r"serving .* on (http://127\.0\.0\.1:\d+)", sim.stdout)
        return found.group(1) if found else None

    found: str = poll(url, 30, "servemon sim ready")
    return found


def coordinate(
    servemon: Callable[..., Any],
    target: str,
    out: Path,
    stages: str,
    workers: int,
    *extra: str,
    listen: str = "127.0.0.1:0",
) -> Any:
    """A ramp of ``stages`` against ``target`` that waits for ``workers``."""
    return servemon(
        "ramp",
        *("--target", target, *LOAD, "--stages", stages, *extra),
        *("--fleet-listen", listen, "--fleet-workers", str(workers)),
        *("--out", str(out)),
        env=ENV,
    )


def coordinator_url(proc: Any) -> str:
    def url() -> str | None:
        if proc.proc.poll() is not None:
            pytest.fail(f"the coordinator exited: {proc.stdout}\n{proc.stderr}")
        found = COORDINATOR.search(proc.stdout)
        return found.group(1) if found else None

    found: str = poll(url, 60, "the coordinator's URL")
    return found


def join(servemon: Callable[..., Any], url: str, name: str, **env: str) -> Any:
    return servemon("worker", "--join", url, "--name", name, env={**ENV, **env})


def test_four_workers_with_skewed_clocks_send_one_schedule(
    servemon: Callable[..., Any], tmp_path: Path, margin: Margin
) -> None:
    target = start_sim(servemon, "--speed", "0.2")
    out = tmp_path / "runs"
    coordinator = coordinate(servemon, target, out, RAMP, 4)
    url = coordinator_url(coordinator)
    skewed = bool(clock_env(0.0))
    workers = [
        join(servemon, url, f"w{i}", **clock_env(offset))
        for i, offset in enumerate(OFFSETS)
    ]
    assert coordinator.wait(90) == 0, coordinator.stdout + coordinator.stderr
    for worker in workers:
        assert worker.wait(20) == 0, worker.stderr
    run = only_run(out)
    info = read_json(run / "run.json")
    fleet = info["fleet"]
    by_name = {w["name"]: w for w in fleet["workers"]}
    assert sorted(by_name) == [f"w{i}" for i in range(4)]

    # Each worker's clock, measured: within 1 ms of the offset it was given.
    for i, offset in enumerate(OFFSETS):
        worker = by_name[f"w{i}"]
        given = offset if skewed else 0.0
        error = worker["offset_s"] - given
        margin("clock offset error s", error, low=-1e-3, high=1e-3, why=worker)
        margin("clock uncertainty s", worker["uncertainty_s"], below=1e-3, why=worker)
        assert worker["clock_samples"] >= 12
        assert worker["stop_reason"] == "run ended"
        assert worker["records"] == worker["credits"] > 0

    # Together they sent exactly the schedule one process draws from the seed.
    records = sent_one_schedule(run, STAGES, SEED)
    assert len({r["id"] for r in records}) == len(records)
    # Every worker took a share (round the live workers in turn), and each record
    # names its worker.
    shares = Counter(r["worker"] for r in records)
    assert sorted(shares) == [0, 1, 2, 3]
    assert max(shares.values()) - min(shares.values()) <= 1
    # In the coordinator's frame each worker's first send was on time.
    for index in range(4):
        first = min(
            (r for r in records if r["worker"] == index), key=lambda r: r["sent_s"]
        )
        margin("first send lag s", abs(first["dispatch_lag_s"]), below=0.05, why=first)

    # One run directory that servemon report reads like any other.
    report = servemon("report", str(run))
    assert report.wait(60) == 0, report.stderr
    assert (run / "report.html").stat().st_size > 0


def test_a_sweep_from_two_workers_keeps_each_levels_concurrency(
    servemon: Callable[..., Any], tmp_path: Path, margin: Margin
) -> None:
    """A closed loop stays in the coordinator: each user's next request goes to a
    worker once the last one's record is back, so every level keeps its
    concurrency across the workers and finishes its number."""
    target = start_sim(servemon, "--speed", "0.2")
    out = tmp_path / "runs"
    coordinator = servemon(
        "sweep",
        *("--target", target, *LOAD, "--parallel", "1,3", "--number", "12"),
        *("--warmup", "2", "--fleet-listen", "127.0.0.1:0", "--fleet-workers", "2"),
        *("--out", str(out)),
        env=ENV,
    )
    url = coordinator_url(coordinator)
    workers = [
        join(servemon, url, f"w{i}", **clock_env(offset))
        for i, offset in enumerate(OFFSETS[:2])
    ]
    assert coordinator.wait(90) == 0, coordinator.stdout + coordinator.stderr
    for worker in workers:
        assert worker.wait(20) == 0, worker.stderr
    run = only_run(out)
    records = read_jsonl(run / "requests.jsonl")
    assert Counter(r["stage"] for r in records) == {0: 12, 1: 12}
    assert {r["outcome"] for r in records} == {"ok"}
    assert sorted({r["worker"] for r in records}) == [0, 1]
    # No schedule to be late to: each request is due when its worker takes it.
    lag = max(r["dispatch_lag_s"] for r in records)
    margin("closed loop send lag s", lag, below=0.05)
    # In the coordinator's frame: never more in flight than the level's users
    # (each request's span narrowed by 2 ms, twice the clocks' bound), and the
    # level of 3 had its 3 at once.
    for stage, users in ((0, 1), (1, 3)):
        edges = sorted(
            edge
            for r in records
            if r["stage"] == stage
            for edge in ((r["sent_s"] + 0.002, 1), (r["end_s"] - 0.002, -1))
        )
        most = max(itertools.accumulate(step for _at, step in edges))
        assert most == users, (stage, most)
    report = servemon("report", str(run))
    assert report.wait(60) == 0, report.stderr


def test_a_worker_without_the_token_is_refused(
    servemon: Callable[..., Any], tmp_path: Path
) -> None:
    target = start_sim(servemon)
    out = tmp_path / "runs"
    coordinator = coordinate(servemon, target, out, "5:1", 1)
    url = coordinator_url(coordinator)
    intruder = servemon("worker", "--join", url, env={"SERVEMON_FLEET_TOKEN": "x" * 32})
    assert intruder.wait(30) != 0
    assert "token does not match" in intruder.stderr
    assert intruder.stderr.count("\n") <= 2, intruder.stderr
    worker = join(servemon, url, "good")
    assert coordinator.wait(60) == 0, coordinator.stdout + coordinator.stderr
    assert worker.wait(20) == 0
    info = read_json(only_run(out) / "run.json")
    assert info["fleet"]["refused"] == 1
    assert [w["name"] for w in info["fleet"]["workers"]] == ["good"]
    assert TOKEN not in (only_run(out) / "run.json").read_text(encoding="utf-8")


def test_a_worker_started_first_waits_for_its_coordinator(
    servemon: Callable[..., Any], tmp_path: Path
) -> None:
    """A Job's pods start in any order: a worker given --join-timeout keeps trying
    a coordinator that is not listening yet, and joins once it is; without one
    (or past it) it is one line and a non-zero exit."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    started = time.monotonic()
    alone = servemon("worker", "--join", url, "--join-timeout", "1", env=ENV)
    assert alone.wait(20) == 2, alone.stderr
    assert time.monotonic() - started >= 1.0
    assert "cannot reach the coordinator" in alone.stderr
    assert "(tried for 1 s)" in alone.stderr
    assert alone.stderr.count("servemon") <= 3, alone.stderr

    target = start_sim(servemon)
    early = servemon(
        "worker", "--join", url, "--name", "early", "--join-timeout", "60", env=ENV
    )
    poll(lambda: "waiting for the coordinator" in early.stderr, 30, "the worker waits")
    time.sleep(2.5)  # a few tries against nothing
    assert early.proc.poll() is None, early.stderr
    out = tmp_path / "runs"
    coordinator = coordinate(
        servemon, target, out, "5:1", 1, listen=f"127.0.0.1:{port}"
    )
    assert coordinator.wait(60) == 0, coordinator.stdout + coordinator.stderr
    assert early.wait(20) == 0, early.stderr
    info = read_json(only_run(out) / "run.json")
    (joined,) = info["fleet"]["workers"]
    assert joined["name"] == "early"
    assert joined["records"] > 0


def test_a_worker_that_joins_late_gets_its_share_from_then_on(
    servemon: Callable[..., Any], tmp_path: Path
) -> None:
    """The run has started with the workers it waited for; one more joins: it gets
    credits from the moment it is handed the plan, never the sends due before (no
    burst of owed requests), and from then on the two share the rate."""
    target = start_sim(servemon)
    out = tmp_path / "runs"
    coordinator = coordinate(servemon, target, out, "10:8", 1)
    url = coordinator_url(coordinator)
    first = join(servemon, url, "first")
    run = poll(lambda: next(iter(out.glob("*")), None), 60, "the run directory")
    poll(lambda: len(read_jsonl(run / "requests.jsonl")) >= 10, 60, "ten records")
    late = join(servemon, url, "late")
    assert coordinator.wait(90) == 0, coordinator.stdout + coordinator.stderr
    assert first.wait(20) == 0
    assert late.wait(20) == 0
    info = read_json(run / "run.json")
    workers = {w["name"]: w for w in info["fleet"]["workers"]}
    origin = info["clock_origin"]["monotonic_s"]
    handed = origin + workers["late"]["working_s"]
    records = read_jsonl(run / "requests.jsonl")
    theirs = sorted(r["scheduled_s"] for r in records if r["worker"] == 1)
    assert theirs, "the late worker sent nothing"
    # Nothing due before it came: its first send is scheduled after the plan was
    # handed to it (a credit leaves 100 ms ahead of its time).
    assert theirs[0] > handed, theirs[0] - handed
    # From then on the rate is shared, not doubled: the two split what was due.
    after = [r for r in records if r["scheduled_s"] > theirs[0]]
    shares = Counter(r["worker"] for r in after)
    assert abs(shares[0] - shares[1]) <= 1, shares
    assert len(records) == len({r["id"] for r in records})


@pytest.mark.parametrize("on_loss", ["abort", "continue"])
def test_a_killed_worker_is_named_and_its_records_kept(
    servemon: Callable[..., Any], tmp_path: Path, on_loss: str
) -> None:
    target = start_sim(servemon)
    out = tmp_path / "runs"
    coordinator = coordinate(
        servemon, target, out, "10:8", 2, "--on-worker-loss", on_loss
    )
    url = coordinator_url(coordinator)
    keep = join(servemon, url, "keep")
    poll(lambda: "worker 0 (keep," in coordinator.stdout, 30, "the first worker")
    doomed = join(servemon, url, "doomed")
    run = poll(lambda: next(iter(out.glob("*")), None), 60, "the run directory")

    def recorded() -> int:
        return sum(1 for r in read_jsonl(run / "requests.jsonl") if r["worker"] == 1)

    poll(lambda: recorded() >= 5, 60, "five records of the doomed worker")
    doomed.proc.send_signal(signal.SIGKILL)
    status = coordinator.wait(90)
    assert keep.wait(20) == 0
    info = read_json(run / "run.json")
    lost = next(w for w in info["fleet"]["workers"] if w["name"] == "doomed")
    assert lost["stopped_s"] is not None
    assert lost["stop_reason"] != "run ended"
    assert f"worker 1 (doomed) stopped at {lost['stopped_s']:.1f} s" in (
        coordinator.stdout
    )
    records = read_jsonl(run / "requests.jsonl")
    theirs = [r for r in records if r["worker"] == 1 and r["outcome"] == "ok"]
    # Every record the coordinator got from it before it died is in the run.
    assert len(theirs) == lost["records"] >= 5
    if on_loss == "abort":
        assert status == 3, coordinator.stdout
        assert "lost at" in (read_json(run / "summary.json")["stop_reason"] or "")
    else:
        assert status == 0, coordinator.stdout
        # The rest of the schedule went to the worker left, at the same rate.
        stopped = info["clock_origin"]["monotonic_s"] + lost["stopped_s"]
        after = [r for r in records if r["scheduled_s"] > stopped + 1]
        assert after
        assert {r["worker"] for r in after} == {0}
        assert sum(1 for r in records if r["outcome"] == "ok") >= 70


def test_a_killed_coordinator_leaves_the_target_without_load(
    servemon: Callable[..., Any], tmp_path: Path, margin: Margin
) -> None:
    # Slow answers (about 0.3 s): requests are in flight when the coordinator dies,
    # and only their workers' spools have them.
    target = start_sim(servemon, "--speed", "0.05")
    with RecordingProxy(target) as proxy:
        out = tmp_path / "runs"
        coordinator = coordinate(servemon, proxy.url, out, "20:30", 2)
        url = coordinator_url(coordinator)
        workers = [join(servemon, url, f"w{i}") for i in range(2)]
        poll(lambda: len(proxy.arrivals) >= 20, 60, "20 requests at the target")
        coordinator.proc.send_signal(signal.SIGKILL)
        killed = time.monotonic()
        for worker in workers:
            assert worker.wait(10) == 3, worker.stderr
            assert "stopped sending" in worker.stderr
        time.sleep(1.0)  # what arrives late would arrive by now (not a readiness wait)
        last = proxy.last_arrival()
        assert last is not None
        # The issue's own bound: no request 2 s after the coordinator died.
        margin("last request after the kill s", last - killed, below=2.0)
        arrived = len(proxy.arrivals)
    # Each worker kept its records, on the coordinator's clock.
    paths = sorted((tmp_path / "servemon-spool").glob("*.jsonl"))
    spools = [read_jsonl(p) for p in paths]
    assert len(spools) == 2
    assert all(spools)

    # servemon merge takes the spools into a new run directory: every request the
    # target saw is in it, once, with its worker.
    run = only_run(out)
    written = len(read_jsonl(run / "requests.jsonl"))
    merge = servemon("merge", str(run), *(f"--spool={p}" for p in paths))
    assert merge.wait(60) == 0, merge.stderr
    recovered = [
        int(found)
        for found in re.findall(r"\(worker \d\): (\d+) recovered", merge.stdout)
    ]
    assert len(recovered) == 2, merge.stdout
    assert sum(recovered) > 0, merge.stdout
    merged = Path(re.findall(r"recovered run directory: (\S+)", merge.stdout)[0])
    assert merged.parent == run.parent
    records = read_jsonl(merged / "requests.jsonl")
    assert len(records) == written + sum(recovered)
    assert len({r["id"] for r in records}) == len(records)
    assert {r["worker"] for r in records} == {0, 1}
    # The workers recorded every request they sent: ok, or cancelled when they
    # stopped (one cancelled on its way out may not have reached the proxy).
    cancelled = sum(1 for r in records if r["outcome"] == "cancelled")
    assert len(records) - cancelled <= arrived <= len(records), (arrived, merge.stdout)
    report = servemon("report", str(merged))
    assert report.wait(60) == 0, report.stderr
    summary = read_json(merged / "summary.json")
    assert summary["overall"]["requests"] == len(records)
    assert summary["status"] == "unfinished"
