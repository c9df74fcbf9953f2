"""The saturation point of a capacity run: what the signal that gave out first read
while the server still held the SLO at the capacity found.

A capacity search (:mod:`servemon.loadgen.drivers.capacity`) names what saturated first
(``queue`` or ``kv_cache``) at the first step that broke the SLO. The highest good
step, the one at ``capacity_rps``, is the load one replica can take; the value that
signal had during that step (after the step's settle time, from
``server_metrics.jsonl``) is the level an autoscaler should keep each replica
under. ``servemon autoscale`` turns it into a threshold.

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
from servemon.loadgen.record.reading import reading_of
from servemon.loadgen.record.record import read_jsonl
from servemon.loadgen.record.runrecord import (
    CapacityResult,
    RunInfo,
    StepVerdict,
    read_record,
)

__all__ = [
    "SATURATING",
    "STATISTICS",
    "SaturationPoint",
    "Statistic",
    "saturation_point",
]

#: What a capacity search says saturated, and the reading's signal it rests on.
SATURATING: dict[str, str] = {"queue": "waiting", "kv_cache": "kv_cache_usage"}
Statistic = Literal["mean", "p90"]
STATISTICS: tuple[Statistic, ...] = ("mean", "p90")


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
    #: The statistic over the step, per replica.
    value: float
    measured_replicas: int


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


def _values(
    run_dir: Path, info: RunInfo, stage: int, signal: str, settle_s: float
) -> list[float]:
    record = next((s for s in info.stages if s.stage == stage), None)
    if record is None or record.start_s is None or record.end_s is None:
        raise ConfigError(f"{run_dir / 'run.json'}: stage {stage} has no times")
    start = info.origin_s + record.start_s + settle_s
    end = info.origin_s + record.end_s
    path = run_dir / "server_metrics.jsonl"
    if not path.exists():
        raise ConfigError(f"{path}: missing: the run read no server signals")
    values = []
    for line in read_jsonl(path):
        reading = reading_of(line)
        if reading is None or not start <= reading.at <= end:
            continue
        value = reading.signal(SATURATING[signal])
        if value is not None:
            values.append(value)
    return values


def saturation_point(
    run_dir: Path,
    *,
    signal: str | None = None,
    statistic: Statistic = "mean",
    tier: str | None = None,
    measured_replicas: int = 1,
) -> SaturationPoint:
    """The level of the signal that saturated first (or ``signal``) during the
    capacity step of the run in ``run_dir``; a one-line ConfigError when the run
    found no capacity, no server signal saturated, or the step has no samples."""
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
    values = _values(run_dir, info, step.stage, chosen, settle)
    if not values:
        raise ConfigError(
            f"{run_dir / 'server_metrics.jsonl'}: no {SATURATING[chosen]} sample "
            f"during the capacity step (stage {step.stage})"
        )
    value = (
        sum(values) / len(values) if statistic == "mean" else _nearest_rank(values, 0.9)
    )
    if chosen == "queue":
        value /= measured_replicas
    return SaturationPoint(
        signal=chosen,
        found=chosen == saturated,
        capacity_rps=rate,
        slo=slo or ",".join(info.slo),
        stage=step.stage,
        samples=len(values),
        settle_s=settle,
        statistic=statistic,
        value=value,
        measured_replicas=measured_replicas,
    )
