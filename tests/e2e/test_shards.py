"""Sharded load, as machines that cannot reach each other send it: ``servemon ramp
--shard I/3 --start-at T`` in three processes against one simulator process,
``servemon merge`` over their run directories, and the merged run against one
unsharded run of the same seeded schedule at the same total rate; and ``--workers
N``, this machine's own fleet, stopped by SIGTERM."""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from tests.support.rundirs import only_run, poll, read_json, read_jsonl

pytestmark = pytest.mark.e2e

SHARDS = 3
#: Two stages (120 requests), so that merging has stages to line up.
STAGES, SEED = "20:2,40:2", 17
LOAD = (
    "--stages",
    STAGES,
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


def index_of(record: dict[str, Any]) -> int:
    """The request's index in the whole schedule (ids are ``TAG-INDEX``)."""
    return int(str(record["id"]).rpartition("-")[2])


def send_rate(records: list[dict[str, Any]]) -> float:
    """Requests a second between the first and the last send."""
    sent = sorted(r["sent_s"] for r in records)
    return (len(sent) - 1) / (sent[-1] - sent[0])


def close(a: float, b: float, what: str) -> None:
    """Within noise: at most 2x apart, or within 5 ms."""
    assert abs(a - b) <= 0.005 or 0.5 <= a / b <= 2.0, (what, a, b)


def test_three_shards_merged_match_one_unsharded_run(
    servemon: Callable[..., Any], tmp_path: Path
) -> None:
    sim = servemon("sim", "--port", "0", "--profile", "tiny", "--speed", "0.2")

    def url() -> str | None:
        if sim.proc.poll() is not None:
            pytest.fail(f"servemon sim exited: {sim.stderr}")
        found = re.search(r"serving .* on (http://127\.0\.0\.1:\d+)", sim.stdout)
        return found.group(1) if found else None

    target = poll(url, 30, "servemon sim ready")

    # The unsharded run first: it also tells how long a servemon process takes to
    # get going here (imports, the target's model list) before its clock starts.
    launched = datetime.now(UTC)
    single = servemon("ramp", "--target", target, *LOAD, "--out", str(tmp_path / "one"))
    assert single.wait(40) == 0, single.stderr
    one_dir = only_run(tmp_path / "one")
    origin = read_json(one_dir / "run.json")["clock_origin"]["utc"]
    startup = (datetime.fromisoformat(origin) - launched).total_seconds()
    # Three start at once on a machine that may have two cores, and other work
    # comes and goes: give them three times that and 3 s more (8 s at least).
    margin = min(20.0, max(8.0, 3 * startup + 3))

    # The shards: one seeded schedule, every third arrival each, one start time.
    start_at = (datetime.now(UTC) + timedelta(seconds=margin)).isoformat()
    shard_outs = [tmp_path / f"shard-{i}" for i in range(SHARDS)]
    shards = [
        servemon(
            "ramp",
            "--target",
            target,
            *LOAD,
            "--shard",
            f"{i}/{SHARDS}",
            "--start-at",
            start_at,
            "--out",
            str(out),
        )
        for i, out in enumerate(shard_outs)
    ]
    for shard in shards:
        assert shard.wait(40 + margin) == 0, shard.stderr
    shard_dirs = [only_run(out) for out in shard_outs]
    merge = servemon("merge", *map(str, shard_dirs), "--out", str(tmp_path / "merged"))
    assert merge.wait(40) == 0, merge.stderr
    merged_dir = only_run(tmp_path / "merged")
    assert f"merged run directory: {merged_dir}" in merge.stdout

    # Each shard ran its part from the shared start.
    for i, path in enumerate(shard_dirs):
        run_json = read_json(path / "run.json")
        assert run_json["status"] == "completed"
        assert run_json["shard"] == f"{i}/{SHARDS}"
        late = run_json["start_late_s"]
        assert late < 0.5, (
            f"shard {i} started {late} s after --start-at (+{margin:.1f} s)"
        )
        own = read_jsonl(path / "requests.jsonl")
        assert own
        assert {index_of(r) % SHARDS for r in own} == {i}

    one, merged = (read_jsonl(d / "requests.jsonl") for d in (one_dir, merged_dir))
    one_summary = read_json(one_dir / "summary.json")
    merged_summary = read_json(merged_dir / "summary.json")
    assert merged_summary["status"] == "completed"
    assert len(merged_summary["merged_from"]) == SHARDS
    assert {r["outcome"] for r in one} == {r["outcome"] for r in merged} == {"ok"}

    # Together the shards sent exactly the unsharded schedule: same count per
    # stage, request ids unique, indexes those of the single run.
    def per_stage(summary: dict[str, Any]) -> list[tuple[int, int]]:
        return [(s["sent"], s["summary"]["requests"]) for s in summary["stages"]]

    assert per_stage(merged_summary) == per_stage(one_summary)
    assert merged_summary["overall"]["requests"] == len(merged) == len(one)
    assert len({r["id"] for r in merged}) == len(merged)
    assert sorted(map(index_of, merged)) == sorted(map(index_of, one))
    assert sorted(map(index_of, one)) == list(range(len(one)))

    # On one clock: the merged schedule is the single run's, shifted to its start.
    by_index = {index_of(r): r for r in merged}
    single_at = {index_of(r): r["scheduled_s"] for r in one}
    shift = by_index[0]["scheduled_s"] - single_at[0]
    offsets = [
        abs(by_index[k]["scheduled_s"] - shift - at) for k, at in single_at.items()
    ]
    assert max(offsets) < 0.1, max(offsets)
    assert all(r["stage"] == by_index[index_of(r)]["stage"] for r in one)

    # Achieved rate within 5 %; latency within noise.
    assert send_rate(merged) == pytest.approx(send_rate(one), rel=0.05)
    for mine, theirs in zip(
        merged_summary["stages"], one_summary["stages"], strict=True
    ):
        assert mine["achieved_rate"] == pytest.approx(theirs["achieved_rate"], rel=0.05)
    for figure in ("ttft", "e2e"):
        close(
            merged_summary["overall"][figure]["p50"],
            one_summary["overall"][figure]["p50"],
            f"{figure} p50",
        )

    report = merged_dir / "report.html"
    assert report.stat().st_size > 0
    assert "<svg" in report.read_text(encoding="utf-8")


def test_workers_stopped_by_sigterm_keep_what_they_sent(tmp_path: Path) -> None:
    """``--workers 2`` sent SIGTERM mid-run (as Kubernetes stops a pod): the
    coordinating process stops its local fleet (the requests in flight get their
    grace), and the one run directory holds every request the workers sent,
    readable by ``servemon report``."""
    import signal
    import subprocess
    import sys

    out = tmp_path / "runs"
    argv = [sys.executable, "-m", "servemon", "ramp", "--sim-profile", "tiny"]
    argv += ["--stages", "20:60", "--workload", "random:prompt=16,output=4"]
    argv += ["--metrics-port", "0", "--workers", "2", "--out", str(out)]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:

        def both_sending() -> bool:
            files = list(out.glob("*-ramp/requests.jsonl"))
            if len(files) != 1:
                return False
            workers = {r["worker"] for r in read_jsonl(files[0])}
            return workers == {0, 1}

        poll(both_sending, 60, "both workers' requests recorded")
        proc.send_signal(signal.SIGTERM)
        _stdout, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, stderr.decode()[-2000:]
    (run,) = out.glob("*-ramp")
    summary = read_json(run / "summary.json")
    assert summary["status"] == "interrupted"
    lines = read_jsonl(run / "requests.jsonl")
    assert summary["overall"]["requests"] == len(lines) > 0
    fleet = read_json(run / "run.json")["fleet"]
    assert [w["name"] for w in fleet["workers"]] == ["local-0", "local-1"] or [
        w["name"] for w in fleet["workers"]
    ] == ["local-1", "local-0"]
    assert all(w["stop_reason"] == "run ended" for w in fleet["workers"])
    assert (run / "report.html").stat().st_size > 10_000
    # No worker outlives its coordinator.
    logs = list(out.glob(".workers-*/worker-*.log"))
    assert len(logs) == 2
