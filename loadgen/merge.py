"""``servemon merge DIR...``: shard run directories into the run of the whole load.

Shards (``servemon ramp --shard I/N``) send disjoint parts of one seeded schedule, so
their requests together are the whole load. Each shard's times are on its own
process's monotonic clock; merging moves them onto the first shard's clock through the
UTC time each run recorded at its origin (on one machine the clocks agree already).
The merged directory holds every request, the first shard's server samples, and a
summary and report computed as for a single run: per stage, over the planned stage
length, with the SLO the shards were run with.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from loadgen.record import RunDirectory, timing_from_line
from loadgen.report import RunData, load_run, write_report
from loadgen.slo import parse_slo
from loadgen.summary import summarize_stages, summary_from_json
from loadgen.timing import RequestTiming
from servemon.errors import ConfigError

if TYPE_CHECKING:
    from loadgen.runner import RunResult

__all__ = ["load_result", "merge_runs"]


def _utc(run: dict[str, Any]) -> float:
    return datetime.fromisoformat(run["clock_origin"]["utc"]).timestamp()


def _plan(data: RunData) -> list[tuple[Any, Any]]:
    return [(s.get("target_rate"), s.get("planned_s")) for s in data.summary["stages"]]


def merge_runs(dirs: Sequence[Path], out_parent: Path) -> Path:
    """Merge shard run directories into a new one under ``out_parent``."""
    shards = [load_run(d) for d in dirs]
    first = shards[0]
    for data in shards[1:]:
        if _plan(data) != _plan(first):
            raise ConfigError(
                f"{data.path}: its stages differ from {first.path}'s: not shards of "
                "one schedule"
            )
    origin_mono = first.origin
    origin_utc = _utc(first.run)
    rundir = RunDirectory.create(out_parent, "merged")
    # The merged run's clock is the first shard's: its origin, not the new dir's.
    rundir.clock_origin = dict(first.run["clock_origin"])
    stages = [dict(s) for s in first.summary["stages"]]
    for stage in stages:
        stage.pop("summary", None)
        stage.update(sent=0, held_back=0, skipped=0)
    timings: list[list[RequestTiming]] = [[] for _ in stages]
    for data in shards:
        # shard time -> first shard's monotonic frame
        shift = (origin_mono - data.origin) + (_utc(data.run) - origin_utc)
        offset = _utc(data.run) - origin_utc
        for line in data.requests:
            timing = timing_from_line(line, shift)
            rundir.append_request(timing)
            if 0 <= timing.stage < len(stages):
                timings[timing.stage].append(timing)
        for stage, own in zip(stages, data.summary["stages"], strict=True):
            for key in ("sent", "held_back", "skipped"):
                stage[key] += int(own.get(key) or 0)
            for key, pick in (("start_s", min), ("end_s", max)):
                if own.get(key) is not None:
                    value = float(own[key]) + offset
                    stage[key] = (
                        value if stage.get(key) is None else pick(stage[key], value)
                    )
    for line in first.samples:
        rundir.append_server_sample(line)
    slo = (
        parse_slo(",".join(first.run.get("slo") or [])) if first.run.get("slo") else []
    )
    metas = [
        {k: v for k, v in stage.items() if k != "achieved_rate"} for stage in stages
    ]
    built = summarize_stages(
        metas, timings, [stage.get("planned_s") for stage in stages], slo
    )
    stage_json, overall = built.entries, built.overall
    rundir.write_summary(
        {
            "kind": first.run.get("kind", "ramp"),
            "status": _status(shards),
            "stages": stage_json,
            "overall": overall.to_json(),
            "slo": [str(t) for t in slo],
            "merged_from": [str(d) for d in dirs],
        },
        built.rows,
    )
    run = json.loads(json.dumps(first.run))
    run.update(
        status=_status(shards),
        merged_from=[
            {
                "path": str(d.path),
                "shard": d.run.get("shard"),
                "status": d.run.get("status"),
            }
            for d in shards
        ],
        stages=[{k: v for k, v in s.items()} for s in stages],
        ended_utc=max(str(d.run.get("ended_utc")) for d in shards),
    )
    rundir.write_run(run)
    rundir.close()
    write_report(rundir.path)
    return rundir.path


def _status(shards: Sequence[RunData]) -> str:
    states = {str(d.run.get("status")) for d in shards}
    return "completed" if states == {"completed"} else "+".join(sorted(states))


def load_result(path: Path) -> RunResult:
    """A finished run directory as the :class:`RunResult` a run returns."""
    from loadgen.runner import RunResult, StageRecord

    summary = json.loads((path / "summary.json").read_text(encoding="utf-8"))
    stages = [
        StageRecord(
            s["stage"],
            s.get("label") or "",
            s.get("target_rate"),
            s.get("parallel"),
            s.get("planned_s"),
            sent=int(s.get("sent") or 0),
        )
        for s in summary["stages"]
    ]
    return RunResult(
        path=path,
        status=str(summary.get("status")),
        stages=stages,
        summaries=[summary_from_json(s["summary"]) for s in summary["stages"]],
        overall=summary_from_json(summary["overall"]),
        stop_reason=summary.get("stop_reason"),
    )
