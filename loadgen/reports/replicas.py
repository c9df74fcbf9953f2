"""Replicas for a forecast (``servemon plan``): how many replicas of the
deployment capacity runs measured (one replica, or several sizes:
:mod:`servemon.loadgen.reports.scaling`) meet each SLO tier at a forecast's rate,
at what cost, and what the plan assumed.

The formulas (``docs/capacity.md``, *Replicas for a forecast*), for a tier of
capacity ``C`` req/s, headroom ``h`` and a forecast rate ``L`` req/s:

- each replica is planned at ``r = C * (1 - h)``;
- replicas ``N(L) = max(m, ceil(L / r))`` (``m``: ``--min-replicas``); with runs
  at several sizes, the fewest ``N >= m`` with ``C(N) * (1 - h) >= L``, ``C(N)``
  read from the sizes measured (``scaling.Curve``);
- a replica's hour costs ``P`` (``--replica-hour-cost``, or
  ``--gpu-hour-cost * GPUs``), ``N`` replicas ``N * P`` an hour;
- ``$/Mtok = N * P / (L * 3600 * o) * 10^6``, ``o`` the output tokens of a
  request (the trace's mean, else the capacity step's);
- over a trace cut in bins of ``b`` seconds with ``n_i`` requests each:
  ``L_i = n_i / b``, ``N_i = N(L_i)``, its cost ``sum(N_i) * b / 3600 * P`` and
  its ``$/Mtok`` that cost over the trace's output tokens (``requests * o``).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from servemon.loadgen.reports.measured import Measured, Span, TierCapacity
from servemon.loadgen.reports.scaling import (
    Curve,
    Size,
    curve_of,
    gpus_per_replica,
    size_notes,
)

__all__ = [
    "DRIFT",
    "OUTSIDE_WARN",
    "Forecast",
    "Plan",
    "Pricing",
    "TierPlan",
    "plan_replicas",
    "replicas_for",
]

#: The share of a trace's lengths outside the measured range that warns.
OUTSIDE_WARN = 0.01
#: How far apart mean lengths (or hit rates, absolute) may be before a warning.
DRIFT = 0.10

#: Lengths counted: ``(tokens, requests)``, ascending by tokens.
LengthCounts = tuple[tuple[int, int], ...]


def count_lengths(lengths: Iterable[int]) -> LengthCounts:
    """Lengths as :data:`LengthCounts`."""
    return tuple(sorted(Counter(lengths).items()))


def bin_counts(times: Iterable[float], bin_s: float) -> list[int]:
    """Requests in bins of ``bin_s`` from 0 (``times``: seconds from the first);
    the bin holding the last request counts as a whole."""
    counts: list[int] = [0]
    for at in times:
        i = int(at // bin_s)
        if i >= len(counts):
            counts.extend([0] * (i + 1 - len(counts)))
        counts[i] += 1
    return counts


@dataclass(frozen=True, slots=True)
class Forecast:
    """The load to plan for: a peak rate, or a trace's requests counted in bins."""

    source: str
    peak_rps: float
    #: The bins' width and each bin's request count (a trace only).
    bin_s: float | None = None
    counts: tuple[int, ...] = ()
    #: The trace's lengths, counted (bounded by how many distinct lengths it has).
    prompt_lengths: LengthCounts = ()
    output_lengths: LengthCounts = ()
    #: The prefix-cache hit rate the trace's ``hash_ids`` say (None: unknown).
    hit_rate: float | None = None

    @classmethod
    def of_trace(
        cls,
        source: str,
        times: Sequence[float],
        bin_s: float,
        *,
        prompt_lengths: Sequence[int] = (),
        output_lengths: Sequence[int] = (),
        hit_rate: float | None = None,
    ) -> Forecast:
        """A trace's requests (``times``: seconds from its first) in bins of
        ``bin_s`` from 0 (:func:`bin_counts`)."""
        return cls.of_bins(
            source,
            bin_counts(times, bin_s),
            bin_s,
            prompt_lengths=count_lengths(prompt_lengths),
            output_lengths=count_lengths(output_lengths),
            hit_rate=hit_rate,
        )

    @classmethod
    def of_bins(
        cls,
        source: str,
        counts: Sequence[int],
        bin_s: float,
        *,
        prompt_lengths: LengthCounts = (),
        output_lengths: LengthCounts = (),
        hit_rate: float | None = None,
    ) -> Forecast:
        """A trace counted already: requests per bin of ``bin_s``, lengths counted."""
        return cls(
            source=source,
            peak_rps=max(counts) / bin_s,
            bin_s=bin_s,
            counts=tuple(counts),
            prompt_lengths=prompt_lengths,
            output_lengths=output_lengths,
            hit_rate=hit_rate,
        )

    @property
    def rates(self) -> list[float]:
        """Each bin's rate, requests a second."""
        return [n / self.bin_s for n in self.counts] if self.bin_s else []

    @property
    def hours(self) -> float | None:
        """The hours the bins cover (None: a peak rate has no duration)."""
        return len(self.counts) * self.bin_s / 3600 if self.bin_s else None

    @property
    def mean_output(self) -> float | None:
        """The trace's mean output tokens per request, where it gives them."""
        span = Span.of_counts(self.output_lengths)
        return None if span is None else span.mean


@dataclass(frozen=True, slots=True)
class Pricing:
    """What a replica costs an hour, and where that came from (None: no price)."""

    replica_hour: float | None
    said: str


@dataclass(frozen=True, slots=True)
class TierPlan:
    """One tier's plan (see the module docstring for the formulas)."""

    name: str
    slo: str
    capacity_rps: float | None
    #: ``r``: the rate one replica is planned at.
    planned_rps: float | None
    peak_replicas: int | None
    cost_per_hour: float | None
    output_tokens: float | None
    output_tokens_from: str
    cost_per_mtok: float | None
    #: A trace's bins: replicas in each, and the trace's cost and $/Mtok.
    replicas: tuple[int, ...] = ()
    trace_cost: float | None = None
    trace_cost_per_mtok: float | None = None
    #: What the trace would cost with the peak's replicas all the time.
    static_cost: float | None = None
    #: The capacity (req/s) at each size measured, and the scaling efficiency
    #: there: ``(replicas, value)``, smallest first.
    sizes: tuple[tuple[int, float], ...] = ()
    efficiency: tuple[tuple[int, float], ...] = ()


@dataclass(frozen=True, slots=True)
class Plan:
    """Replicas for a forecast, every tier, with what it assumed."""

    run: str
    forecast: Forecast
    headroom: float
    min_replicas: int
    pricing: Pricing
    gpus: int | None
    gpus_from: str
    tiers: tuple[TierPlan, ...]
    assumptions: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()
    measured: Measured | None = field(default=None, repr=False)
    #: The runs measured and their sizes, smallest first.
    sizes: tuple[Size, ...] = field(default=(), repr=False)

    def to_json(self) -> dict[str, Any]:
        """The ``--json`` form: the forecast's bins and rates, not its lengths."""
        f = self.forecast
        data: dict[str, Any] = {
            "run": self.run,
            "forecast": {
                "source": f.source,
                "peak_rps": f.peak_rps,
                "bin_s": f.bin_s,
                "hours": f.hours,
                "requests": sum(f.counts) if f.counts else None,
                "rates": f.rates,
                "mean_output_tokens": f.mean_output,
                "prompt": _span(Span.of_counts(f.prompt_lengths)),
                "output": _span(Span.of_counts(f.output_lengths)),
                "hit_rate": f.hit_rate,
            },
            "headroom": self.headroom,
            "min_replicas": self.min_replicas,
            "replica_hour_cost": self.pricing.replica_hour,
            "cost_from": self.pricing.said,
            "gpus_per_replica": self.gpus,
            "gpus_from": self.gpus_from,
            "sizes": [
                {"run": s.measured.run, "replicas": s.replicas} for s in self.sizes
            ],
            "tiers": [asdict(t) for t in self.tiers],
            "assumptions": list(self.assumptions),
            "warnings": list(self.warnings),
        }
        if self.measured is not None:
            m = self.measured
            data["measured"] = {
                "workload": m.workload,
                "prompt": _span(m.prompt),
                "output": _span(m.output),
                "tiers": [asdict(t) for t in m.tiers],
            }
        return data


def _span(span: Span | None) -> dict[str, Any] | None:
    return None if span is None else asdict(span)


def replicas_for(rate: float, planned_rps: float, min_replicas: int = 1) -> int:
    """``N(L) = max(m, ceil(L / r))`` (a hair under a whole number rounds down: a
    rate that is exactly ``k`` replicas' worth needs ``k``)."""
    return max(min_replicas, math.ceil(rate / planned_rps - 1e-9))


def plan_replicas(
    measured: Measured | Sequence[Size],
    forecast: Forecast,
    *,
    headroom: float,
    pricing: Pricing,
    min_replicas: int = 1,
    gpus: int | None = None,
) -> Plan:
    """The plan for every tier, from one run (one replica) or runs at several
    sizes (``gpus``: the count behind ``pricing``, where it came from a flag;
    else a replica's GPUs as the smallest size recorded them)."""
    sizes = (Size(1, measured),) if isinstance(measured, Measured) else tuple(measured)
    first = sizes[0].measured
    curves = {t.name: curve_of(sizes, t.name) for t in first.tiers}
    tiers = tuple(
        _tier(t, curves[t.name], forecast, headroom, pricing, min_replicas)
        for t in first.tiers
    )
    needed = {t.name: max((t.peak_replicas or 0, *t.replicas)) for t in tiers}
    notes, cautions = size_notes(sizes, curves, needed)
    gpus_from = "--gpus-per-replica"
    if gpus is None:
        gpus, gpus_from = gpus_per_replica(sizes)
    return Plan(
        run=first.run if len(sizes) == 1 else ", ".join(s.label for s in sizes),
        forecast=forecast,
        headroom=headroom,
        min_replicas=min_replicas,
        pricing=pricing,
        gpus=gpus,
        gpus_from=gpus_from,
        tiers=tiers,
        assumptions=tuple(notes + _assumptions(first, forecast, headroom, sizes)),
        warnings=tuple(_warnings(first, forecast) + cautions),
        measured=first,
        sizes=sizes,
    )


def _tier(
    t: TierCapacity,
    curve: Curve | None,
    forecast: Forecast,
    headroom: float,
    pricing: Pricing,
    min_replicas: int,
) -> TierPlan:
    trace_mean = forecast.mean_output
    if trace_mean is not None:
        tokens, tokens_from = trace_mean, "the trace's mean"
    elif t.output_tokens is not None:
        tokens, tokens_from = t.output_tokens, f"the capacity step ({t.capacity_rps:g})"
    else:
        tokens, tokens_from = None, "unknown"
    if curve is None:
        return TierPlan(
            t.name, t.slo, t.capacity_rps, None, None, None, tokens, tokens_from, None
        )
    planned = curve.per_replica * (1 - headroom)
    peak = curve.replicas(forecast.peak_rps, headroom, min_replicas)
    price = pricing.replica_hour
    per_hour = None if price is None else peak * price
    plan = TierPlan(
        name=t.name,
        slo=t.slo,
        capacity_rps=curve.per_replica,
        planned_rps=planned,
        peak_replicas=peak,
        cost_per_hour=per_hour,
        output_tokens=tokens,
        output_tokens_from=tokens_from,
        cost_per_mtok=_per_mtok(per_hour, forecast.peak_rps * 3600 * (tokens or 0)),
        sizes=curve.points,
        efficiency=tuple((n, curve.efficiency(n)) for n, _ in curve.points),
    )
    if not forecast.counts or forecast.bin_s is None:
        return plan
    replicas = tuple(curve.replicas(x, headroom, min_replicas) for x in forecast.rates)
    hours = forecast.bin_s / 3600
    cost = None if price is None else sum(replicas) * hours * price
    static = None if price is None else peak * len(replicas) * hours * price
    tokens_total = sum(forecast.counts) * (tokens or 0)
    return replace(
        plan,
        replicas=replicas,
        trace_cost=cost,
        trace_cost_per_mtok=_per_mtok(cost, tokens_total),
        static_cost=static,
    )


def _per_mtok(cost: float | None, tokens: float) -> float | None:
    return None if cost is None or tokens <= 0 else cost / tokens * 1e6


def _assumptions(
    m: Measured, f: Forecast, headroom: float, sizes: Sequence[Size]
) -> list[str]:
    said = [
        f"each replica is planned at its capacity x (1 - {headroom:g}) headroom",
    ]
    if len(sizes) == 1:
        n = sizes[0].replicas
        said.insert(
            0,
            "replicas scale linearly behind a load balancer that spreads requests "
            + (
                "evenly: N replicas take N times one replica's capacity"
                if n == 1
                else f"evenly: N replicas take N/{n} of the {n} measured together"
            ),
        )
    if f.bin_s is not None:
        said.append(
            f"each {f.bin_s:g}-s bin needs the replicas of its mean rate; "
            "bursts within a bin must fit in the headroom, and scaling is instant"
        )
    else:
        said.append(
            f"a peak rate carries no lengths: the forecast's requests are taken to "
            f"be the capacity run's ({m.workload})"
        )
    run_hits = [t.hit_rate for t in m.tiers if t.hit_rate is not None]
    run_hit = f"{run_hits[0]:.3f}" if run_hits else "not measured"
    trace_hit = (
        "unknown in the forecast (it has no hash_ids)"
        if f.hit_rate is None
        else f"{f.hit_rate:.3f} in the forecast (its hash_ids, an unbounded cache)"
    )
    said.append(
        f"prefix-cache hit rate: {run_hit} in the capacity run (at the first "
        f"tier's capacity), {trace_hit}"
    )
    if f.hit_rate is not None and run_hits and f.hit_rate - run_hits[0] > DRIFT:
        said.append(
            "the forecast's prompts share more prefix than the capacity run's: "
            "its prefills cost less, so the plan likely has room to spare"
        )
    return said


def _warnings(m: Measured, f: Forecast) -> list[str]:
    out = [
        f"tier {t.name}: the capacity run found no capacity (no step met it)"
        for t in m.tiers
        if not t.capacity_rps
    ]
    for what, span, lengths in (
        ("prompt", m.prompt, f.prompt_lengths),
        ("output", m.output, f.output_lengths),
    ):
        if span is None or not lengths:
            continue
        outside = span.outside(lengths)
        total = sum(n for _, n in lengths)
        if outside / total > OUTSIDE_WARN:
            out.append(
                f"{outside / total:.1%} of the forecast's {what} lengths "
                f"({outside:,} of {total:,}) fall outside the "
                f"{span.min:,}-{span.max:,} tokens the capacity run measured"
            )
        mean = sum(v * n for v, n in lengths) / total
        if abs(mean / span.mean - 1) > DRIFT:
            out.append(
                f"the forecast's mean {what} length ({mean:,.0f} tokens) is "
                f"{mean / span.mean - 1:+.0%} off the capacity run's "
                f"({span.mean:,.0f}): a capacity in req/s holds for its lengths"
            )
    hits = [t.hit_rate for t in m.tiers if t.hit_rate is not None]
    if f.hit_rate is not None and hits and hits[0] - f.hit_rate > DRIFT:
        out.append(
            f"the capacity run's prefix cache served {hits[0]:.0%} of prompt tokens "
            f"and the forecast's would serve {f.hit_rate:.0%}: its prefills cost "
            "more than the run's, so the plan may be short"
        )
    return out
