"""What a stage cost: the energy the target's GPUs used while it ran, and with a
price, the money.

A stage's :class:`Energy` is the rise of the GPUs' energy counters (NVML's total
energy since the driver loaded, ``servemon_gpu_energy_joules_total``) between its
start and its end, read where the run could read it (:mod:`loadgen.run.energy`).
The figures per token and per request divide it by what the stage's requests
produced, so they are the cost of a good token at that operating point:

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
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import Any

__all__ = ["ENERGY_KEYS", "Energy"]

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

    def to_json(self) -> dict[str, Any]:
        """The record's form."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | None) -> Energy | None:
        """Back from :meth:`to_json`; None for anything else."""
        if not isinstance(data, Mapping):
            return None
        known = {f.name for f in fields(cls)}
        try:
            return cls(**{k: v for k, v in data.items() if k in known})
        except TypeError:
            return None
