"""Capacity against replicas, for ``servemon plan``: capacity runs at one or several
sizes (each a search against a deployment of a known number of replicas behind a
balancer), checked to measure the same thing, and each SLO tier's capacity at any
size read from the sizes measured.

The formulas (``docs/capacity.md``, *Replicas for a forecast*), for a tier measured
at sizes ``n_1 < ... < n_K`` replicas with capacities ``C_1 ... C_K`` req/s:

- ``C(N)`` is piecewise linear through the points: ``N * C_1 / n_1`` below
  ``n_1``; between ``n_k`` and ``n_k+1`` the line between their capacities; past
  ``n_K`` each replica adds the largest size's per-replica capacity,
  ``C(N) = N * C_K / n_K`` (conservative where scaling falls off with size);
- the scaling efficiency at ``N`` is ``C(N) / (N * C_1 / n_1)``;
- a rate ``L`` needs the fewest replicas ``N >= m`` whose ``C(N) * (1 - h)``
  carries it. One run at one replica is the linear plan: ``max(m, ceil(L / r))``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from servemon.core.errors import ConfigError
from servemon.loadgen.reports.measured import Measured, measure

__all__ = [
    "Curve",
    "Size",
    "curve_of",
    "gpus_per_replica",
    "measure_sizes",
    "parse_run_size",
    "size_notes",
]

#: A hair: a rate within this share of a whole replica's worth needs no more.
_HAIR = 1e-9


@dataclass(frozen=True, slots=True)
class Size:
    """One capacity run and the replicas it measured together."""

    replicas: int
    measured: Measured

    @property
    def label(self) -> str:
        return f"{self.measured.run}@{self.replicas}"


@dataclass(frozen=True, slots=True)
class Curve:
    """One tier's capacity at each size measured: ``(replicas, req/s)``, replicas
    ascending, at least one point (see the module docstring)."""

    points: tuple[tuple[int, float], ...]

    @property
    def largest(self) -> int:
        return self.points[-1][0]

    @property
    def per_replica(self) -> float:
        """A replica's capacity at the smallest size measured."""
        n, c = self.points[0]
        return c / n

    def capacity(self, replicas: int) -> float:
        """``C(N)``."""
        (n1, c1), (nk, ck) = self.points[0], self.points[-1]
        if replicas <= n1:
            return replicas * c1 / n1
        if replicas >= nk:
            return replicas * ck / nk
        for (a, ca), (b, cb) in zip(self.points, self.points[1:], strict=False):
            if a <= replicas <= b:
                return ca + (replicas - a) * (cb - ca) / (b - a)
        raise AssertionError("unreachable: the points are ascending")

    def efficiency(self, replicas: int) -> float:
        """``C(N) / (N * C_1 / n_1)``."""
        return self.capacity(replicas) / (replicas * self.per_replica)

    def replicas(self, rate: float, headroom: float, minimum: int = 1) -> int:
        """The fewest replicas (at least ``minimum``) whose capacity, less the
        headroom, carries ``rate`` (a hair over a whole replica's worth is none)."""
        keep = 1 - headroom
        for n in range(max(minimum, 0), self.largest + 1):
            planned = self.capacity(n) * keep
            if rate <= planned + (planned / n * _HAIR if n else 0.0):
                return n
        each = self.points[-1][1] / self.largest * keep
        return max(minimum, self.largest + 1, math.ceil(rate / each - _HAIR))


def parse_run_size(text: str) -> tuple[Path, int | None]:
    """``RUN@N``: a run directory and the replicas it measured (None: not said).
    Only digits after the last ``@`` are a count; ``@0`` is one line naming it."""
    head, at, tail = text.rpartition("@")
    if not at or not tail.isdigit():
        return Path(text), None
    if int(tail) < 1:
        raise ConfigError(f"{text}: expected RUN@N with N replicas of 1 or more")
    return Path(head), int(tail)


def measure_sizes(runs: Sequence[tuple[Path, int | None]]) -> tuple[Size, ...]:
    """Read capacity runs at their sizes, smallest first. One run without a size
    measured one replica; with several, each needs its size, one run a size, and
    all the same tiers (names and terms) and workload: else one line naming the
    run at fault."""
    if len(runs) > 1:
        for path, replicas in runs:
            if replicas is None:
                raise ConfigError(
                    f"{path}: how many replicas did it measure? With several "
                    f"runs give each its size: {path}@N"
                )
    sizes = sorted(
        (Size(replicas or 1, measure(path)) for path, replicas in runs),
        key=lambda s: s.replicas,
    )
    first = sizes[0]
    tiers = {t.name: t.slo for t in first.measured.tiers}
    for size, before in zip(sizes[1:], sizes, strict=False):
        if size.replicas == before.replicas:
            raise ConfigError(
                f"{size.label}: {before.measured.run} measured {size.replicas} "
                "replicas too: give one run a size"
            )
    for size in sizes[1:]:
        m = size.measured
        theirs = {t.name: t.slo for t in m.tiers}
        if theirs != tiers:
            raise ConfigError(
                f"{m.run}: its tiers ({_tiers(theirs)}) are not {first.measured.run}'s "
                f"({_tiers(tiers)}): runs at several sizes must measure the same tiers"
            )
        if m.workload != first.measured.workload:
            raise ConfigError(
                f"{m.run}: its workload ({m.workload}) is not "
                f"{first.measured.run}'s ({first.measured.workload}): runs at "
                "several sizes must send the same workload"
            )
    return tuple(sizes)


def _tiers(tiers: dict[str, str]) -> str:
    return ", ".join(f"{name}: {slo}" for name, slo in tiers.items())


def gpus_per_replica(sizes: Sequence[Size]) -> tuple[int | None, str]:
    """A replica's GPUs: the smallest size's count over its replicas (where
    that is a whole number)."""
    first = sizes[0]
    gpus, said = first.measured.gpus, first.measured.gpus_from
    if gpus is None or first.replicas == 1:
        return gpus, said
    if gpus % first.replicas:
        return None, (
            f"{gpus} GPUs over {first.replicas} replicas ({said}): "
            "not a whole number each"
        )
    return gpus // first.replicas, f"{said}, over {first.replicas} replicas"


def curve_of(sizes: Sequence[Size], tier: str) -> Curve | None:
    """A tier's capacity at the sizes that found one (None: none did)."""
    points = tuple(
        (s.replicas, t.capacity_rps)
        for s in sizes
        for t in s.measured.tiers
        if t.name == tier and t.capacity_rps
    )
    return Curve(points) if points else None


def size_notes(
    sizes: Sequence[Size], curves: Mapping[str, Curve | None], needed: Mapping[str, int]
) -> tuple[list[str], list[str]]:
    """What a plan from several sizes assumed (the sizes, each tier's capacity and
    scaling efficiency at them), and its warnings: a size that found no capacity
    for a tier, a forecast that needs more replicas than the largest size."""
    if len(sizes) == 1:
        return [], []
    counts = [s.replicas for s in sizes]
    largest = counts[-1]
    said = [
        f"capacity measured at {_and(counts)} replicas behind a load balancer; "
        "between sizes it is interpolated linearly, below the smallest each replica "
        f"takes the smallest's per-replica capacity, past {largest} each replica "
        f"adds the {largest}-replica run's per-replica capacity (conservative)"
    ]
    warned = []
    for name, curve in curves.items():
        if curve is None:
            continue
        measured = [n for n, _ in curve.points]
        said.append(
            f"tier {name}: "
            + ", ".join(f"{c:.4g}" for _, c in curve.points)
            + f" req/s at {_and(measured)} replicas: scaling efficiency "
            + ", ".join(f"{curve.efficiency(n):.2f}" for n in measured)
            + f" (capacity at N / (N x {curve.per_replica:.4g} req/s))"
        )
        warned += [
            f"tier {name}: the run at {n} replicas ({s.measured.run}) found no "
            "capacity; the plan reads the sizes that did"
            for s in sizes
            if (n := s.replicas) not in measured
        ]
        if needed.get(name, 0) > curve.largest:
            each = curve.points[-1][1] / curve.largest
            warned.append(
                f"tier {name}: the forecast needs {needed[name]} replicas, more than "
                f"the {curve.largest} measured: past {curve.largest} each replica "
                f"is taken at {each:.4g} req/s, that run's per-replica capacity"
            )
    return said, warned


def _and(values: Sequence[int]) -> str:
    text = [str(v) for v in values]
    return text[0] if len(text) == 1 else ", ".join(text[:-1]) + " and " + text[-1]
