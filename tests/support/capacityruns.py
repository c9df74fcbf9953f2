"""A capacity run directory written by hand: its steps, verdicts and the server's
samples chosen by the test (for ``servemon autoscale`` and its reader); or a
search of several SLO tiers with requests behind every step (for ``servemon
plan``, at one size or several)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path

from servemon.core import names
from servemon.core.outcomes import Outcome
from servemon.core.slo import parse_slo
from servemon.loadgen.record.energy import Energy
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
from servemon.loadgen.record.summary import Summarizer, summarize
from servemon.loadgen.send.timing import RequestTiming

__all__ = ["ORIGIN_S", "STEP_S", "TIER_SLOS", "write_capacity_run", "write_tier_run"]

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


#: The SLO of each tier :func:`write_tier_run` can search.
TIER_SLOS = {"interactive": "ttft_p95<=0.3", "batch": "e2e_p95<=30"}


def _timing(i: int, stage: int, output: int) -> RequestTiming:
    sent = 100.0 * stage + i * 0.1
    return RequestTiming(
        request_id=f"s{stage}-{i}",
        stage=stage,
        scheduled_s=sent,
        sent_s=sent,
        end_s=sent + 1.0,
        outcome=Outcome.OK,
        first_chunk_s=sent + 0.05,
        content_s=(sent + 0.05, sent + 0.5),
        output_tokens=output,
        prompt_tokens=500 + i % 21,
    )


def write_tier_run(
    run_dir: Path,
    capacities: Mapping[str, float],
    *,
    rates: Sequence[float] = (),
    gpus: int | None = 2,
    hit_rate: float = 0.3,
    url: str = "http://10.0.0.5:8000",
    workload: str = "random:prompt=510,output=110",
) -> Path:
    """A finished capacity search of the tiers of :data:`TIER_SLOS` named in
    ``capacities`` (each its capacity, req/s). Its steps: ``rates`` (default:
    the capacities and twice the largest), each with 40 ok requests of 500-520
    prompt tokens and ``100 + 10 x step`` output tokens, the server's hit rate
    ``hit_rate``, and (``gpus``) the energy of that many GPUs; a tier meets every
    step at or below its capacity."""
    run_dir.mkdir(parents=True)
    rates = rates or [*sorted(set(capacities.values())), 2 * max(capacities.values())]
    stages, steps, lines = [], [], []
    for stage, rate in enumerate(rates):
        timings = [_timing(i, stage, 100 + 10 * stage) for i in range(40)]
        lines += [json.dumps(request_line(t)) for t in timings]
        summary = summarize(timings, duration_s=30.0)
        if gpus is not None:
            summary = replace(summary, energy=Energy(9000.0, 30.0, gpus, "nvml"))
        stages.append(
            StageResult(
                stage, f"{rate:g} rps", rate, summary=summary, server_hit_rate=hit_rate
            )
        )
        met = {name: rate <= cap for name, cap in capacities.items()}
        steps.append(StepVerdict(stage, rate, all(met.values()), tiers=met))
    (run_dir / "requests.jsonl").write_text("\n".join(lines) + "\n")
    tiers = []
    for name, cap in capacities.items():
        above = min((r for r in rates if r > cap), default=None)
        figure = TIER_SLOS[name].split("<=")[0]
        tiers.append(
            TierResult(
                name, TIER_SLOS[name], cap, (cap, above), figure, "queue", "bracket"
            )
        )
    first = min(tiers, key=lambda t: t.capacity_rps or 0.0)
    found = CapacityResult(first.capacity_rps, first.bracket, first.first_breach,
                           "queue", "bracket", steps, tiers)  # fmt: skip
    info = RunInfo(
        kind="capacity",
        status="completed",
        clock_origin=ClockOrigin(monotonic_s=0.0, utc="2026-01-01T00:00:00Z"),
        target={"url": url},
        workload={"spec": workload},
        stages=[replace(s, summary=None) for s in stages],
    )
    record = RunSummary("capacity", "completed", stages, summarize([]), capacity=found)
    write_record(run_dir, info, record)
    return run_dir
