"""What a stage cost: the energy the target's GPUs used while it ran, and with a
price, the money.

A stage's :class:`Energy` is the rise of the GPUs' energy counters (NVML's total
energy since the driver loaded, ``servemon_gpu_energy_joules_total``) between its
start and its end, read where the run could read it
(:mod:`servemon.loadgen.run.energy`). The figures per token and per request divide it by
what the stage's requests produced, so they are the cost of a good token at that
operating point:

- mean power ``W = J / s`` (all the target's GPUs together);
- ``J/token = J / output tokens`` of the stage's ok requests;
- ``J/good request = J / requests that met every --slo term`` (every ok request
  without an SLO);
- with ``--gpu-hour-cost P`` (per GPU): ``cost = P x GPUs x s / 3600``; with
  ``--node-hour-cost P`` (the whole target): ``cost = P x s / 3600``; then
  ``$/Mtok = cost / output tokens x 10^6`` and ``$/1k good = cost / good x 1000``.

The window is the stage's, the tokens its requests': a request that ends after its
stage's end spent some of its energy in the next one, which evens out in a steady
stage and is why the figures of a very short stage are rough.

:class:`EnergyCounters` holds the counters' readings and gives any window's
energy: the run's sampler fills it as it reads, and a killed run's rebuilt
summary fills it again from the readings ``server_metrics.jsonl`` kept, so both
interpolate the same way.

A source that was missing at the start and answered later (a fresh Prometheus
that has not scraped yet) marks its first reading ``starts_late``: nothing was
read before it, so a window that starts before it has no energy (never one
extrapolated from later readings); the whole run's then has none either.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields, replace

from servemon.core.jsonvalue import as_float

__all__ = ["ENERGY_KEYS", "Energy", "EnergyCounters", "Window"]

#: The figures :meth:`Energy.figure` gives (``Summary.value`` looks them up).
ENERGY_KEYS = (
    "watts",
    "joules_per_token",
    "joules_per_good",
    "cost_per_mtok",
    "cost_per_kgood",
)


@dataclass(frozen=True, slots=True)
class Energy:
    """The energy of one stage (or of a level's repeats together)."""

    joules: float
    seconds: float
    gpus: int
    #: Where it was read: ``nvml``, ``prometheus`` or ``exporter URL``.
    source: str
    gpu_hour_cost: float | None = None
    node_hour_cost: float | None = None

    @property
    def watts(self) -> float | None:
        """Mean power over the window."""
        return self.joules / self.seconds if self.seconds > 0 else None

    @property
    def cost(self) -> float | None:
        """The window's cost at the run's price; None without one."""
        hours = self.seconds / 3600.0
        if self.node_hour_cost is not None:
            return self.node_hour_cost * hours
        if self.gpu_hour_cost is not None:
            return self.gpu_hour_cost * self.gpus * hours
        return None

    def figure(self, key: str, tokens: float, good: float) -> float | None:
        """One of :data:`ENERGY_KEYS` given the window's output tokens and good
        requests; None where a count is zero or there is no price."""
        cost = self.cost
        if key == "watts":
            return self.watts
        if key == "joules_per_token":
            return self.joules / tokens if tokens else None
        if key == "joules_per_good":
            return self.joules / good if good else None
        if key == "cost_per_mtok":
            return None if cost is None or not tokens else cost / tokens * 1e6
        if key == "cost_per_kgood":
            return None if cost is None or not good else cost / good * 1e3
        raise KeyError(key)

    def plus(self, other: Energy) -> Energy:
        """Two windows together (a level's repeats): joules and seconds summed."""
        return replace(
            self,
            joules=self.joules + other.joules,
            seconds=self.seconds + other.seconds,
            gpus=max(self.gpus, other.gpus),
        )

    def to_json(self) -> dict[str, object]:
        """The record's form."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_json(cls, data: object) -> Energy | None:
        """Back from :meth:`to_json`; None for anything else."""
        if not isinstance(data, Mapping):
            return None
        known = {f.name for f in fields(cls)}
        try:
            return cls(**{k: v for k, v in data.items() if k in known})
        except TypeError:
            return None


#: A window: its start and end (monotonic seconds; None where not known).
Window = tuple[float | None, float | None]


@dataclass(slots=True)
class EnergyCounters:
    """The GPUs' energy counters as read (the total of every GPU, monotonic
    times), and the energy of any window between them."""

    #: Where they were read (:attr:`Energy.source`).
    source: str
    #: How often they were read: two readings closer than half of it with the
    #: same total are one snapshot, and a window's end may lie up to one and a
    #: half of it outside the readings.
    interval_s: float = 1.0
    times: list[float] = field(default_factory=list)
    joules: list[float] = field(default_factory=list)
    #: The most GPUs one reading counted.
    gpus: int = 0
    #: The first reading of a source that came late: no window starts before it.
    known_from: float | None = None

    def add(
        self, at: float, joules: float, gpus: int, *, starts_late: bool = False
    ) -> bool:
        """One reading; False where it adds nothing (not later than the last, or
        the same snapshot again). A total below the last is a reset: the
        readings start over from it. ``starts_late``: the source's first reading,
        after the run had started."""
        if self.times and (
            at <= self.times[-1]
            or (joules == self.joules[-1] and at - self.times[-1] < self.interval_s / 2)
        ):
            # The same snapshot again: its age moves its time by the jitter of
            # the read (milliseconds), and a second point that close with the same
            # total would make the counter look flat around it.
            return False
        if self.joules and joules < self.joules[-1]:
            self.times.clear()
            self.joules.clear()
        self.times.append(at)
        self.joules.append(joules)
        self.gpus = max(self.gpus, gpus)
        if starts_late and self.known_from is None:
            self.known_from = at
        return True

    def at(self, mono_s: float) -> float | None:
        """The total at ``mono_s``, between the readings around it (or from the
        nearest two, at most one and a half intervals outside them); None where
        no reading is near."""
        times, joules = self.times, self.joules
        if len(times) < 2:
            return None
        slack = 1.5 * self.interval_s
        if mono_s < times[0] - slack or mono_s > times[-1] + slack:
            return None
        i = min(max(bisect.bisect_left(times, mono_s), 1), len(times) - 1)
        t0, t1, j0, j1 = times[i - 1], times[i], joules[i - 1], joules[i]
        if t1 <= t0:
            return j1
        return j0 + (j1 - j0) * (mono_s - t0) / (t1 - t0)

    def window(
        self, window: Window, prices: tuple[float | None, float | None]
    ) -> Energy | None:
        """The energy between two monotonic times, at ``prices`` (per GPU-hour,
        per node-hour); None where the readings do not cover them, or where it
        starts before a late source's first reading."""
        start_s, end_s = window
        if start_s is None or end_s is None or end_s <= start_s:
            return None
        if self.known_from is not None and start_s < self.known_from:
            return None
        first, last = self.at(start_s), self.at(end_s)
        if first is None or last is None or last < first:
            return None
        return Energy(
            joules=last - first,
            seconds=end_s - start_s,
            gpus=self.gpus,
            source=self.source,
            gpu_hour_cost=prices[0],
            node_hour_cost=prices[1],
        )

    @classmethod
    def from_lines(
        cls, lines: Iterable[Mapping[str, object]], interval_s: float
    ) -> EnergyCounters | None:
        """The readings a run kept in ``server_metrics.jsonl`` (its lines with an
        ``energy`` entry; any other line, or one servemon did not write, is
        skipped); None where it kept none. A line marked ``starts_late`` is a late
        source's first reading."""
        counters: EnergyCounters | None = None
        for line in lines:
            energy = line.get("energy")
            if not isinstance(energy, Mapping):
                continue
            try:
                at, joules = as_float(line["mono_s"]), float(energy["joules"])
                gpus, source = int(energy.get("gpus") or 0), str(energy["source"])
            except (KeyError, TypeError, ValueError):
                continue
            if counters is None:
                counters = cls(source, interval_s)
            counters.add(
                at, joules, gpus, starts_late=energy.get("starts_late") is True
            )
        return counters
