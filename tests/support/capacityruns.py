"""A capacity run directory written by hand: its steps, verdicts and the server's
samples chosen by the test (for ``servemon autoscale`` and its reader)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path

from servemon.core import names
from servemon.core.outcomes import Outcome
from servemon.core.slo import parse_slo
from servemon.loadgen.record.line import request_line
from servemon.loadgen.record.runrecord import (
    CapacityResult,
    RunInfo,
    RunSummary,
    StageResult,
    StepVerdict,
    TierResult,
    write_record,
)
from servemon.loadgen.record.sections import ClockOrigin
from servemon.loadgen.record.summary import Summarizer
from servemon.loadgen.send.timing import RequestTiming

__all__ = ["ORIGIN_S", "STEP_S", "write_capacity_run"]

#: The run's monotonic origin, and each step's length (steps follow each other).
ORIGIN_S, STEP_S = 1000.0, 5.0

#: One sample: seconds into its step, then per rank (waiting, KV-cache usage).
Sample = tuple[float, Sequence[tuple[float, float]]]


def write_capacity_run(
    run_dir: Path,
    rates: Sequence[float],
    good: Sequence[bool],
    samples: Mapping[int, Sequence[Sample]],
    *,
    saturated_first: str = "queue",
    settle_s: float = 1.0,
    tiers: Sequence[TierResult] = (),
    step_tiers: Sequence[dict[str, bool]] = (),
    ttfts: Mapping[int, Sequence[float]] | None = None,
) -> Path:
    """A finished capacity search over ``rates`` (``good``: which met the SLO),
    the highest good rate its capacity; ``samples`` by step index; ``ttfts``: the
    TTFTs of each step's requests, one a second from its settle time on (none:
    no request says how near the SLO's limit a step came)."""
    run_dir.mkdir(parents=True)
    stages = [
        StageResult(i, f"{r:g} rps", r, start_s=i * STEP_S, end_s=(i + 1) * STEP_S)
        for i, r in enumerate(rates)
    ]
    steps = [
        StepVerdict(i, r, ok, saturated=None if ok else saturated_first)
        for i, (r, ok) in enumerate(zip(rates, good, strict=True))
    ]
    for step, met in zip(steps, step_tiers, strict=False):
        step.tiers = met
    capacity = max((r for r, ok in zip(rates, good, strict=True) if ok), default=None)
    found = CapacityResult(
        capacity_rps=capacity,
        bracket=(capacity, None),
        first_breach="ttft_p95<=0.5 (was 1)",
        saturated_first=saturated_first,
        ended_because="precision reached",
        steps=steps,
        tiers=list(tiers),
    )
    info = RunInfo(
        kind="capacity",
        status="completed",
        clock_origin=ClockOrigin(monotonic_s=ORIGIN_S),
        config={"settle": settle_s},
        slo_terms=parse_slo("ttft_p95<=0.5"),
        stages=stages,
    )
    summary = RunSummary(
        kind="capacity",
        status="completed",
        stages=stages,
        overall=Summarizer().summary(),
        capacity=found,
    )
    write_record(run_dir, info, summary)
    with (run_dir / "requests.jsonl").open("w", encoding="utf-8") as out:
        for step, chosen_ttfts in (ttfts or {}).items():
            for n, ttft in enumerate(chosen_ttfts):
                at = ORIGIN_S + step * STEP_S + settle_s + n
                timing = RequestTiming(
                    request_id=f"{step}-{n}",
                    stage=step,
                    scheduled_s=at,
                    sent_s=at,
                    end_s=at + ttft,
                    outcome=Outcome.OK,
                    first_chunk_s=at + ttft,
                    content_s=(at + ttft,),
                    output_tokens=1,
                )
                out.write(json.dumps(request_line(timing)) + "\n")
    with (run_dir / "server_metrics.jsonl").open("w", encoding="utf-8") as out:
        for step, chosen in samples.items():
            for at, ranks in chosen:
                rows = []
                for rank, (waiting, kv) in enumerate(ranks):
                    labels = {"rank": str(rank)}
                    rows.append([names.ENGINE_REQUESTS_WAITING.name, labels, waiting])
                    rows.append([names.ENGINE_KV_CACHE_USAGE.name, labels, kv])
                mono = ORIGIN_S + step * STEP_S + at
                out.write(json.dumps({"mono_s": mono, "samples": rows}) + "\n")
    return run_dir
