"""``servemon merge DIR...``: shard run directories into the run of the whole load.

Shards (``servemon ramp --shard I/N``) send disjoint parts of one seeded schedule, so
their requests together are the whole load. Each shard's times are on its own
process's monotonic clock; merging moves them onto the first shard's clock through the
UTC time each run recorded at its origin (on one machine the clocks agree already).
The merged directory holds every request, the first shard's server samples, and a
summary and report computed as for a single run: per stage, over the planned stage
length, with the SLO the shards were run with. Each shard's requests are read in
one streaming pass and summed as they go by
(:class:`servemon.loadgen.record.tally.Tally`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime
from pathlib import Path
from typing import Any

from servemon.core.errors import ConfigError
from servemon.loadgen.record.line import timing_from_line
from servemon.loadgen.record.record import RunDirectory, read_jsonl, read_run
from servemon.loadgen.record.runrecord import (
    RunInfo,
    RunResult,
    RunSummary,
    StageResult,
    write_record,
)
from servemon.loadgen.record.sections import MergedShard
from servemon.loadgen.record.tally import Tally
from servemon.loadgen.reports.report import write_report

__all__ = ["merge_runs"]


def _utc(info: RunInfo) -> float:
    return datetime.fromisoformat(str(info.clock_origin.utc)).timestamp()


def _plan(data: RunResult) -> list[tuple[Any, Any]]:
    return [(s.target_rate, s.planned_s) for s in data.record.stages]


def _combined(first: RunResult, shards: Sequence[RunResult]) -> list[StageResult]:
    """The stages of the whole load: counts summed, the earliest start, the latest
    end, every shard's client limits (on the first shard's clock)."""
    origin_utc = _utc(first.info)
    stages = [
        replace(
            s,
            summary=None,
            sent=0,
            held_back=0,
            skipped=0,
            achieved_rate=None,
            client_limits=[],
        )
        for s in first.record.stages
    ]
    for number, data in enumerate(shards):
        offset = _utc(data.info) - origin_utc
        for stage, own in zip(stages, data.record.stages, strict=True):
            # Each worker watched its own health: its limits say which one.
            stage.client_limits += [
                replace(
                    x,
                    message=f"worker {number + 1}: {x.message}",
                    first_s=x.first_s + offset,
                )
                for x in own.client_limits
            ]
            stage.sent += own.sent
            stage.held_back += own.held_back
            stage.skipped += own.skipped
            if own.start_s is not None:
                start = own.start_s + offset
                stage.start_s = (
                    start if stage.start_s is None else min(stage.start_s, start)
                )
            if own.end_s is not None:
                end = own.end_s + offset
                stage.end_s = end if stage.end_s is None else max(stage.end_s, end)
    return stages


def merge_runs(dirs: Sequence[Path], out_parent: Path) -> Path:
    """Merge shard run directories into a new one under ``out_parent``."""
    shards = [read_run(d) for d in dirs]
    first = shards[0]
    for data in shards[1:]:
        if _plan(data) != _plan(first):
            raise ConfigError(
                f"{data.path}: its stages differ from {first.path}'s: not shards of "
                "one schedule"
            )
    origin_mono, origin_utc = first.info.origin_s, _utc(first.info)
    rundir = RunDirectory.create(out_parent, "merged")
    # The merged run's clock is the first shard's: its origin, not the new dir's.
    rundir.clock_origin = first.info.clock_origin
    slo = first.info.terms()
    tally = Tally(slo)
    stages = _combined(first, shards)
    for data in shards:
        # shard time -> first shard's monotonic frame
        shift = (origin_mono - data.info.origin_s) + (_utc(data.info) - origin_utc)
        for line in read_jsonl(data.path / "requests.jsonl"):
            timing = timing_from_line(line, shift)
            rundir.append_request(timing)
            if 0 <= timing.stage < len(stages):
                tally.add(timing)
    for sample in read_jsonl(first.path / "server_metrics.jsonl"):
        rundir.append_server_sample(sample)
    durations = [s.planned_s for s in stages]
    results, overall = tally.results(stages, durations)
    status = _status(shards)
    summary = RunSummary(
        kind=first.info.kind,
        status=status,
        stages=results,
        overall=overall,
        slo=[str(t) for t in slo],
        merged_from=[str(d) for d in dirs],
        **tally.groups(stages, durations),
    )
    info = replace(
        first.info,
        status=status,
        clock_origin=rundir.clock_origin,
        merged_from=[
            MergedShard(str(d.path), d.info.shard, d.info.status) for d in shards
        ],
        stages=results,
        ended_utc=max(str(d.info.ended_utc) for d in shards),
    )
    rundir.close()
    rundir.check()  # a line that could not be written (a full disk) fails the merge
    write_record(rundir.path, info, summary)
    write_report(rundir.path)
    return rundir.path


def _status(shards: Sequence[RunResult]) -> str:
    states = {d.info.status for d in shards}
    return "completed" if states == {"completed"} else "+".join(sorted(states))
