"""What a run found beside its figures: a capacity search's steps and answer, what
``servemon control`` held, and when the client itself was the limit (parts of
``run.json`` and ``summary.json``, :mod:`servemon.loadgen.record.runrecord`)."""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field

import pydantic

from servemon.core.jsonvalue import as_float

__all__ = [
    "CapacityResult",
    "ClientLimit",
    "ControlResult",
    "StepVerdict",
    "TierResult",
]

_LENIENT = pydantic.ConfigDict(extra="ignore")


@dataclass(slots=True)
class StepVerdict:
    """One step of a capacity search, judged."""

    __pydantic_config__ = _LENIENT

    stage: int
    rate: float
    good: bool
    breaches: list[str] = field(default_factory=list)
    saturated: str | None = None
    early_stop: str | None = None
    judged_requests: int = 0
    #: Read from Prometheus, the step had too few fresh server signals to be judged
    #: (Prometheus down or its series stale): not good, not a breach either.
    blind: bool = False
    #: With named SLO tiers: each tier's name and whether the step met it (``good``
    #: is then whether it met every tier, ``breaches`` every tier's broken terms).
    tiers: dict[str, bool] = field(default_factory=dict)


@dataclass(slots=True)
class ClientLimit:
    """A stretch of a stage in which the load generator itself was the limit
    (:mod:`servemon.loadgen.run.clientwatch`): ``reason`` is ``lag``, ``loop`` or
    ``cpu``."""

    __pydantic_config__ = _LENIENT

    reason: str
    message: str
    #: When it first tripped, seconds since the run's clock origin.
    first_s: float
    #: Seconds of checks during which it stayed tripped.
    seconds: float
    #: The worst value seen: seconds of lag or of loop delay, or a share of a core.
    worst: float


@dataclass(slots=True)
class TierResult:
    """The capacity of one named SLO tier, found by a search over several."""

    __pydantic_config__ = _LENIENT

    name: str
    #: The tier's terms, as ``--slo`` writes them.
    slo: str
    capacity_rps: float | None
    bracket: tuple[float | None, float | None]
    first_breach: str | None
    saturated_first: str | None
    ended_because: str


@dataclass(slots=True)
class CapacityResult:
    """What a capacity search found. With several SLO tiers, ``tiers`` holds each
    one's answer, strictest first, and the fields above it are the strictest
    tier's (a record from before tiers, or of one SLO, has no ``tiers``)."""

    __pydantic_config__ = _LENIENT

    capacity_rps: float | None
    bracket: tuple[float | None, float | None]
    first_breach: str | None
    saturated_first: str | None
    ended_because: str
    steps: list[StepVerdict]
    tiers: list[TierResult] = field(default_factory=list)

    def to_json(self) -> dict[str, object]:
        """A JSON-ready dict (one SLO's search writes no ``tiers``, as before)."""
        data = asdict(self)
        if not self.tiers:
            del data["tiers"]
            for step in data["steps"]:
                step.pop("tiers", None)
        return data


@dataclass(slots=True)
class ControlResult:
    """What ``servemon control`` held: its ticks summed up (every tick is in
    ``control.jsonl``). ``within`` is the share of the ticks after ``settle_s``
    whose signal was within ±15 % of the setpoint (blind ticks count as out)."""

    __pydantic_config__ = _LENIENT

    signal: str
    setpoint: float
    interval_s: float
    source: str
    settle_s: float
    ticks: int = 0
    judged: int = 0
    inside: int = 0
    blind: int = 0
    offered_sum: float = 0.0
    unreachable: str | None = None
    #: Whether the sends were paced (``--pace``, the default for KV usage).
    paced: bool = False

    @property
    def within(self) -> float | None:
        """The share of judged ticks within the tolerance."""
        return self.inside / self.judged if self.judged else None

    def add(self, tick: Mapping[str, object], since_start_s: float) -> None:
        """Count one tick (``control.jsonl``'s line)."""
        self.ticks += 1
        self.offered_sum += as_float(tick["offered_rps"])
        measured = tick.get("measured")
        if measured is None:
            self.blind += 1
        if since_start_s < self.settle_s:
            return
        self.judged += 1
        if measured is not None and abs(as_float(measured) - self.setpoint) <= (
            0.15 * self.setpoint
        ):
            self.inside += 1

    def mean_offered_rps(self) -> float | None:
        """The mean rate offered over the ticks."""
        return self.offered_sum / self.ticks if self.ticks else None

    @staticmethod
    def settle_for(duration_s: float, interval_s: float) -> float:
        """The ticks not judged: ten intervals or 30 s, whichever is longer, but
        no more than a third of the run."""
        return min(duration_s / 3, max(30.0, 10 * interval_s))

    @classmethod
    def from_ticks(
        cls, ticks: Sequence[Mapping[str, object]], duration_s: float, source: str
    ) -> ControlResult | None:
        """The result again from ``control.jsonl``'s ticks, for a run that never
        wrote its summary (killed): the interval is the ticks' median spacing and
        the start one interval before the first (None without a tick)."""
        if not ticks:
            return None
        times = [as_float(t["t_s"]) for t in ticks]
        gaps = sorted(b - a for a, b in itertools.pairwise(times))
        interval = gaps[len(gaps) // 2] if gaps else times[0]
        result = cls(
            signal=str(ticks[0]["signal"]),
            setpoint=as_float(ticks[0]["setpoint"]),
            interval_s=interval,
            source=source,
            settle_s=cls.settle_for(duration_s, interval),
            paced=any(t.get("pace") is not None for t in ticks),
        )
        start = times[0] - interval
        for tick, at in zip(ticks, times, strict=True):
            result.add(tick, at - start)
        return result

    def to_json(self) -> dict[str, object]:
        """A JSON-ready dict, with ``within``."""
        return {**asdict(self), "within": self.within}
