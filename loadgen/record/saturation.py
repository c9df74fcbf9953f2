"""The saturation point of a capacity run: what the signal that gave out first read
where the server reached the limit of its SLO.

A capacity search (:mod:`servemon.loadgen.drivers.capacity`) names what saturated first
(``queue`` or ``kv_cache``) at the first step that broke the SLO. Each step gives two
figures from the same stretch of time (after the step's settle time): the signal's
level (from ``server_metrics.jsonl``) and how far the SLO was from its limit (the
worst term's value over its threshold, from the step's judged requests in
``requests.jsonl``: 1 is the limit). The level at the limit (``at="limit"``, the
default) is read off the line between the step nearest the limit from below and
the one nearest it from above. Both figures of a step move together with its luck
(a step whose arrivals came light queued less and answered sooner), so the level
read at the SLO's limit does not depend on whether the search's last step landed
just below the limit or a bracket lower, as the level at ``capacity_rps`` does
(``at="capacity"``: the good step at the capacity found): on the fleet test's
simulator, 6 searches read 0.12-1.33 waiting at the capacity found (3.75 or 5.25
req/s) and 2.27-3.01 at the limit (``benchmarks/autoscale_threshold.py``). Without a
step on each side of the limit (every bad step stopped early, or broke only an
error rate) it falls back to the capacity step, and says so. ``servemon
autoscale`` turns the level into a threshold.

Per replica: the queue is the sum over the engines that served the run (its ranks,
or with ``--measured-replicas N`` a fleet of N behind a gateway, divided by N); KV
usage is the fullest engine's, already a per-engine figure.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from servemon.core.errors import ConfigError
from servemon.core.slo import SloTerm, parse_slo
from servemon.loadgen.record.line import timing_from_line
from servemon.loadgen.record.reading import reading_of
from servemon.loadgen.record.record import read_jsonl
from servemon.loadgen.record.runrecord import (
    CapacityResult,
    RunInfo,
    StepVerdict,
    read_record,
)
from servemon.loadgen.record.summary import Summarizer

__all__ = [
    "LEVELS",
    "SATURATING",
    "STATISTICS",
    "Bound",
    "Level",
    "SaturationPoint",
    "Statistic",
    "saturation_point",
]

#: What a capacity search says saturated, and the reading's signal it rests on.
SATURATING: dict[str, str] = {"queue": "waiting", "kv_cache": "kv_cache_usage"}
Statistic = Literal["mean", "p90"]
STATISTICS: tuple[Statistic, ...] = ("mean", "p90")
#: Where the level is read: at the SLO's limit, or at the capacity step.
Level = Literal["limit", "capacity"]
LEVELS: tuple[Level, ...] = ("limit", "capacity")


@dataclass(frozen=True, slots=True)
class Bound:
    """One step the level at the SLO's limit is read between."""

    stage: int
    rate: float
    #: The SLO's worst term over its threshold, on the step's judged requests.
    slo_ratio: float
    #: The statistic of the signal over the step, per replica.
    value: float


@dataclass(frozen=True, slots=True)
class SaturationPoint:
    """The saturating signal's level at the capacity found, per replica."""

    #: ``queue`` or ``kv_cache``.
    signal: str
    #: Whether ``signal`` is what the search found saturated first (else: asked for).
    found: bool
    capacity_rps: float
    #: The SLO the capacity is for (a tier's terms, or the run's SLO).
    slo: str
    stage: int
    #: The samples the statistic is over, and the settle time skipped before them.
    samples: int
    settle_s: float
    statistic: Statistic
    #: The level: at the SLO's limit, or the statistic over the capacity step.
    value: float
    measured_replicas: int
    #: Where ``value`` was read (``capacity``: asked for, or no step on one side of
    #: the SLO's limit).
    at: Level = "capacity"
    #: At the limit: the steps below and above it that ``value`` lies between.
    below: Bound | None = None
    above: Bound | None = None


def _nearest_rank(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def _result(found: CapacityResult, tier: str | None) -> tuple[float, str | None, str]:
    """(capacity, what saturated first, the SLO's text) of the run or of a tier."""
    if tier is None:
        if found.capacity_rps is None:
            raise ConfigError("the capacity search found no rate that met the SLO")
        return found.capacity_rps, found.saturated_first, ""
    names = [t.name for t in found.tiers]
    chosen = next((t for t in found.tiers if t.name == tier), None)
    if chosen is None:
        raise ConfigError(f"--tier {tier}: the run's tiers are {', '.join(names)}")
    if chosen.capacity_rps is None:
        raise ConfigError(f"--tier {tier}: no rate met its SLO")
    return chosen.capacity_rps, chosen.saturated_first, chosen.slo


def _capacity_step(found: CapacityResult, rate: float, tier: str | None) -> StepVerdict:
    def met(step: StepVerdict) -> bool:
        if tier is None or not step.tiers:
            return step.good
        return step.tiers.get(tier, False) and not step.blind

    steps = [s for s in found.steps if met(s) and math.isclose(s.rate, rate)]
    if not steps:
        raise ConfigError(f"no good step at the capacity found ({rate:g} req/s)")
    return steps[-1]


def _stage_window(
    run_dir: Path, info: RunInfo, stage: int, settle_s: float
) -> tuple[float, float]:
    """A step's judged stretch, from its settle time to its end (monotonic)."""
    record = next((s for s in info.stages if s.stage == stage), None)
    if record is None or record.start_s is None or record.end_s is None:
        raise ConfigError(f"{run_dir / 'run.json'}: stage {stage} has no times")
    return info.origin_s + record.start_s + settle_s, info.origin_s + record.end_s


def _readings(run_dir: Path, signal: str) -> list[tuple[float, float]]:
    """(when, value) of ``signal`` in every sample of the run."""
    path = run_dir / "server_metrics.jsonl"
    if not path.exists():
        raise ConfigError(f"{path}: missing: the run read no server signals")
    found = []
    for line in read_jsonl(path):
        reading = reading_of(line)
        value = None if reading is None else reading.signal(SATURATING[signal])
        if reading is not None and value is not None:
            found.append((reading.at, value))
    return found


def _statistic(values: list[float], statistic: Statistic) -> float:
    if statistic == "mean":
        return sum(values) / len(values)
    return _nearest_rank(values, 0.9)


def _slo_ratios(
    run_dir: Path, info: RunInfo, terms: list[SloTerm], settle_s: float
) -> dict[int, float]:
    """Each step's SLO ratio: the worst term's value over its threshold, on the
    requests scheduled after its settle time (all of its requests if none were),
    as the search judged it; terms with a threshold of 0 cannot say how near."""
    scaled = [t for t in terms if t.threshold > 0]
    windows = {
        s.stage: _stage_window(run_dir, info, s.stage, settle_s)
        for s in info.stages
        if s.start_s is not None and s.end_s is not None
    }
    judged: dict[int, Summarizer] = {}
    every: dict[int, Summarizer] = {}
    for line in read_jsonl(run_dir / "requests.jsonl"):
        timing = timing_from_line(line)
        if timing.stage not in windows:
            continue
        every.setdefault(timing.stage, Summarizer(scaled)).add(timing)
        if timing.scheduled_s >= windows[timing.stage][0]:
            judged.setdefault(timing.stage, Summarizer(scaled)).add(timing)
    ratios = {}
    for stage, summarizer in every.items():
        summary = judged.get(stage, summarizer).summary()
        values = [
            value / t.threshold
            for t in scaled
            if (value := summary.value(t.key)) is not None
        ]
        if values:
            ratios[stage] = max(values)
    return ratios


def _bounds(
    steps: list[Bound],
) -> tuple[Bound, Bound] | None:
    """The steps nearest the SLO's limit from below (at it, too) and from above."""
    below = [b for b in steps if b.slo_ratio <= 1]
    above = [b for b in steps if b.slo_ratio > 1]
    if not below or not above:
        return None
    return (
        max(below, key=lambda b: (b.slo_ratio, b.stage)),
        min(above, key=lambda b: (b.slo_ratio, b.stage)),
    )


def saturation_point(
    run_dir: Path,
    *,
    signal: str | None = None,
    statistic: Statistic = "mean",
    tier: str | None = None,
    measured_replicas: int = 1,
    at: Level = "limit",
) -> SaturationPoint:
    """The level of the signal that saturated first (or ``signal``) where the SLO
    reached its limit (``at="limit"``), or during the capacity step of the run in
    ``run_dir`` (``at="capacity"``, and the fallback); a one-line ConfigError when
    the run found no capacity, no server signal saturated, or the capacity step has
    no samples."""
    info, summary = read_record(run_dir)
    if summary is None or summary.capacity is None:
        raise ConfigError(f"{run_dir}: not a finished capacity run (no capacity)")
    found = summary.capacity
    rate, saturated, slo = _result(found, tier)
    chosen = signal or saturated
    if chosen not in SATURATING:
        raise ConfigError(
            f"{run_dir}: what saturated first was {saturated or 'not found'}, "
            "not a server signal: give --signal queue or --signal kv_cache"
        )
    step = _capacity_step(found, rate, tier)
    settle = float(info.config.get("settle") or 0.0)
    readings = _readings(run_dir, chosen)
    per = measured_replicas if chosen == "queue" else 1

    def values(stage: int) -> list[float]:
        start, end = _stage_window(run_dir, info, stage, settle)
        return [v for when, v in readings if start <= when <= end]

    capacity_values = values(step.stage)
    if not capacity_values:
        raise ConfigError(
            f"{run_dir / 'server_metrics.jsonl'}: no {SATURATING[chosen]} sample "
            f"during the capacity step (stage {step.stage})"
        )
    bounds = None
    if at == "limit":
        terms = parse_slo(slo) if slo else list(info.slo_terms)
        ratios = _slo_ratios(run_dir, info, terms, settle)
        measured = []
        for s in found.steps:
            own = values(s.stage)
            if s.blind or s.stage not in ratios or not own:
                continue
            level = _statistic(own, statistic) / per
            measured.append(Bound(s.stage, s.rate, ratios[s.stage], level))
        bounds = _bounds(measured)
    if bounds is None:
        value = _statistic(capacity_values, statistic) / per
    else:
        below, above = bounds
        share = (1 - below.slo_ratio) / (above.slo_ratio - below.slo_ratio)
        value = below.value + (above.value - below.value) * share
    return SaturationPoint(
        signal=chosen,
        found=chosen == saturated,
        capacity_rps=rate,
        slo=slo or ",".join(info.slo),
        stage=step.stage,
        samples=len(capacity_values),
        settle_s=settle,
        statistic=statistic,
        value=value,
        measured_replicas=measured_replicas,
        at="capacity" if bounds is None else "limit",
        below=None if bounds is None else bounds[0],
        above=None if bounds is None else bounds[1],
    )
