"""What a capacity run measured, as a plan of replicas reads it
(:mod:`servemon.loadgen.reports.replicas`): each SLO tier's capacity with the output
tokens per request and the prefix-cache hit rate of its capacity step, the GPUs
of one replica, and the prompt and output lengths the run sent.

Read from the run directory alone: its typed record
(:func:`~servemon.loadgen.record.record.read_run`) and one pass over ``requests.jsonl``
for the lengths of its ok requests.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from servemon.core.errors import ConfigError
from servemon.loadgen.record.capacityrows import tier_results
from servemon.loadgen.record.findings import CapacityResult
from servemon.loadgen.record.record import read_jsonl, read_run
from servemon.loadgen.record.runrecord import RunInfo, RunSummary, StageResult

__all__ = ["Measured", "Span", "TierCapacity", "measure"]

_LOCAL_HOSTS = frozenset({"localhost", "127.0.0.1", "::1"})


@dataclass(frozen=True, slots=True)
class Span:
    """The distribution of a token length: count, mean, nearest-rank
    percentiles, and the range."""

    count: int
    mean: float
    min: int
    p50: int
    p99: int
    max: int

    @classmethod
    def of(cls, values: Sequence[int]) -> Span | None:
        """The span of ``values``; None when empty."""
        return cls.of_counts(sorted(Counter(values).items()))

    @classmethod
    def of_counts(cls, counts: Sequence[tuple[int, int]]) -> Span | None:
        """The span of lengths counted: ``(length, how many)``, ascending by
        length; None when empty (a trace's lengths, in memory bounded by how many
        distinct lengths it has)."""
        total = sum(n for _, n in counts)
        if not total:
            return None

        def rank(q: float) -> int:
            wanted, seen = max(1, math.ceil(q * total)), 0
            for value, n in counts:
                seen += n
                if seen >= wanted:
                    return value
            return counts[-1][0]

        return cls(
            count=total,
            mean=sum(v * n for v, n in counts) / total,
            min=counts[0][0],
            p50=rank(0.50),
            p99=rank(0.99),
            max=counts[-1][0],
        )

    def outside(self, counts: Sequence[tuple[int, int]]) -> int:
        """How many of the lengths counted fall outside ``[min, max]``."""
        return sum(n for v, n in counts if v < self.min or v > self.max)


@dataclass(frozen=True, slots=True)
class TierCapacity:
    """One tier's capacity and what its capacity step measured (None: the run
    found no capacity for it, or the step did not measure it)."""

    name: str
    slo: str
    capacity_rps: float | None
    #: Mean output tokens of the ok requests of the step at the capacity.
    output_tokens: float | None
    #: The server's prefix-cache hit rate over that step (its own counters),
    #: else the share of prompt tokens the requests said were cached.
    hit_rate: float | None


@dataclass(frozen=True, slots=True)
class Measured:
    """What a capacity run measured (see the module docstring)."""

    run: str
    #: The run's workload, as given (``random:prompt=512,output=256``).
    workload: str
    tiers: tuple[TierCapacity, ...]
    #: GPUs of the target (one replica), and where that count came from.
    gpus: int | None
    gpus_from: str
    prompt: Span | None
    output: Span | None


def measure(run_dir: Path) -> Measured:
    """Read a capacity run directory; a one-line :class:`ConfigError` naming it
    when it is not one."""
    run = read_run(run_dir)
    found = run.record.capacity
    if run.info.kind != "capacity" or found is None:
        raise ConfigError(
            f"{run_dir}: a {run.info.kind} run, not a capacity search: plan reads "
            "the run directory of servemon capacity"
        )
    tiers = tuple(
        _tier(t.name, t.slo, t.capacity_rps, found, run.record)
        for t in tier_results(found, run.record.slo)
    )
    gpus, gpus_from = _gpus(run.info, run.record, found)
    prompts: list[int] = []
    outputs: list[int] = []
    for line in read_jsonl(run_dir / "requests.jsonl"):
        if line.get("outcome") != "ok":
            continue
        if isinstance(p := line.get("prompt_tokens"), int):
            prompts.append(p)
        if isinstance(o := line.get("output_tokens"), int) and o > 0:
            outputs.append(o)
    return Measured(
        run=str(run_dir),
        workload=run.info.workload.spec or "unknown",
        tiers=tiers,
        gpus=gpus,
        gpus_from=gpus_from,
        prompt=Span.of(prompts),
        output=Span.of(outputs),
    )


def _step(
    found: CapacityResult, record: RunSummary, rate: float | None
) -> StageResult | None:
    """The good step at ``rate`` (a tier's capacity)."""
    if rate is None:
        return None
    stages = {s.stage: s for s in record.stages}
    for step in found.steps:
        if step.rate == rate and not step.blind and step.stage in stages:
            return stages[step.stage]
    return None


def _tier(
    name: str, slo: str, rate: float | None, found: CapacityResult, record: RunSummary
) -> TierCapacity:
    stage = _step(found, record, rate)
    summary = None if stage is None else stage.summary
    hit = None if stage is None else stage.server_hit_rate
    if hit is None and summary is not None:
        hit = summary.cached_fraction
    return TierCapacity(
        name=name,
        slo=slo,
        capacity_rps=rate,
        output_tokens=None if summary is None else summary.mean_output_tokens,
        hit_rate=hit,
    )


def _gpus(
    info: RunInfo, record: RunSummary, found: CapacityResult
) -> tuple[int | None, str]:
    """The target's GPUs: where the run read their energy, else (a target on
    the load generator's machine) the GPUs NVML saw there."""
    first = _step(found, record, found.capacity_rps)
    summaries = [first.summary] if first is not None and first.summary else []
    for summary in [*summaries, *record.summaries, record.overall]:
        if summary.energy is not None and summary.energy.gpus:
            return summary.energy.gpus, f"energy read from {summary.energy.source}"
    host = urlsplit(info.target.url).hostname or ""
    local = info.environment.gpus
    if host in _LOCAL_HOSTS and isinstance(local, list) and local:
        return len(local), "NVML on the load generator's machine (a local target)"
    return None, "not recorded"
