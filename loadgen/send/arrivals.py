"""When requests are due: stages of target rates and seeded arrival processes.

A schedule is a list of :class:`Stage` (a rate held for a duration) and an
:class:`Arrival` process. :func:`schedule` yields every request's absolute offset from
the run's start, computed up front from the seed alone — the sender never looks at
responses, which is what makes the load open-loop. Inter-arrival gaps are

- ``constant``: exactly ``1/rate``;
- ``poisson``: exponential with mean ``1/rate``;
- ``gamma:CV``: gamma with mean ``1/rate`` and coefficient of variation ``CV``
  (``CV`` > 1 is burstier than Poisson, < 1 smoother; 1 is Poisson).

Each stage starts its own process at the stage's start, so a rate change takes effect
at the boundary.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Literal

from servemon.core.errors import ConfigError

__all__ = [
    "WAKE",
    "Arrival",
    "Due",
    "Shard",
    "Stage",
    "linear_stages",
    "parse_arrival",
    "parse_stages",
    "parse_start_at",
    "schedule",
    "stages_text",
]


@dataclass(frozen=True, slots=True)
class Stage:
    """A target rate (requests/s) held for ``duration_s`` seconds."""

    index: int
    rate: float
    duration_s: float
    start_s: float

    @property
    def end_s(self) -> float:
        """Offset of the stage's end from the run's start."""
        return self.start_s + self.duration_s


@dataclass(frozen=True, slots=True)
class Arrival:
    """An inter-arrival distribution."""

    kind: Literal["constant", "poisson", "gamma"] = "poisson"
    cv: float = 1.0

    def __str__(self) -> str:
        return f"gamma:{self.cv:g}" if self.kind == "gamma" else self.kind

    def gap(self, rng: random.Random, rate: float) -> float:
        """One inter-arrival gap at ``rate``."""
        if self.kind == "constant":
            return 1.0 / rate
        if self.kind == "poisson":
            return rng.expovariate(rate)
        shape = 1.0 / (self.cv * self.cv)
        return rng.gammavariate(shape, 1.0 / (rate * shape))


@dataclass(frozen=True, slots=True)
class Due:
    """One request's place in the schedule (:data:`WAKE`: no request, see there)."""

    index: int
    stage: int
    offset_s: float


#: The index of a due that sends nothing: a schedule drawn as it goes (``servemon
#: control``'s) wakes there to read its rate again, rather than wait out a gap drawn
#: at a rate since raised. For Poisson arrivals, waking and drawing the rest of a
#: gap afresh is exact (the wait has no memory).
WAKE = -1


def parse_arrival(text: str) -> Arrival:
    """``constant``, ``poisson`` or ``gamma:CV``."""
    if text in ("constant", "poisson"):
        return Arrival(text)  # type: ignore[arg-type]
    if text.startswith("gamma:"):
        try:
            cv = float(text.removeprefix("gamma:"))
        except ValueError:
            cv = -1.0
        if cv > 0:
            return Arrival("gamma", cv)
        raise ConfigError(
            f"--arrival: {text!r}: gamma needs a positive CV, e.g. gamma:2"
        )
    raise ConfigError(f"--arrival: {text!r}: expected constant, poisson or gamma:CV")


def parse_stages(text: str) -> list[Stage]:
    """``RPS:SECONDS,...`` such as ``2:30,4:30,8:30``."""
    stages: list[Stage] = []
    start = 0.0
    for i, part in enumerate(p.strip() for p in text.split(",")):
        rate_text, sep, seconds_text = part.partition(":")
        try:
            rate, seconds = float(rate_text), float(seconds_text)
        except ValueError:
            rate = seconds = -1.0
        if not sep or rate <= 0 or seconds <= 0:
            raise ConfigError(
                f"--stages: stage {i + 1} {part!r}: expected RPS:SECONDS with both > 0"
            )
        stages.append(Stage(i, rate, seconds, start))
        start += seconds
    return stages


def stages_text(stages: Sequence[Stage]) -> str:
    """Stages back in the ``--stages`` form."""
    return ",".join(f"{s.rate:g}:{s.duration_s:g}" for s in stages)


def parse_start_at(text: str) -> datetime:
    """``--start-at``: an ISO 8601 time; without a zone it is UTC."""
    try:
        at = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ConfigError(
            f"--start-at {text!r}: expected an ISO 8601 time, e.g. 2026-12-01T10:00:00Z"
        ) from None
    return at if at.tzinfo is not None else at.replace(tzinfo=UTC)


def linear_stages(start: float, end: float, step: float, seconds: float) -> list[Stage]:
    """Rates ``start, start+step, ... <= end``, each held ``seconds``."""
    if start <= 0 or end < start or step <= 0 or seconds <= 0:
        raise ConfigError(
            "--rps-start/--rps-end/--rps-step/--step-seconds: need 0 < start <= end, "
            "step > 0 and seconds > 0"
        )
    rates: list[float] = []
    rate = start
    while rate <= end + 1e-9 and len(rates) < 10_000:
        rates.append(round(rate, 9))
        rate += step
    return [Stage(i, r, seconds, i * seconds) for i, r in enumerate(rates)]


@dataclass(frozen=True, slots=True)
class Shard:
    """Shard ``index`` of ``count`` (0-based): it sends every ``count``-th arrival."""

    index: int = 0
    count: int = 1

    @classmethod
    def parse(cls, text: str) -> Shard:
        """``I/N`` with 0 <= I < N."""
        i, sep, n = text.partition("/")
        try:
            shard = cls(int(i), int(n))
        except ValueError:
            shard = cls(-1, 0)
        if not sep or not 0 <= shard.index < shard.count:
            raise ConfigError(
                f"--shard {text!r}: expected I/N with 0 <= I < N, e.g. 0/4"
            )
        return shard

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"


def schedule(
    stages: Sequence[Stage],
    arrival: Arrival,
    seed: int,
    *,
    limit: int | None = None,
    shard: Shard | None = None,
) -> Iterator[Due]:
    """Every request's offset from the run's start, in order; at most ``limit``.

    With ``shard``, only this shard's share: the same seeded schedule thinned to every
    N-th arrival, so N shards together send exactly the unsharded schedule (request
    indexes stay those of the whole schedule, so ids never clash across shards).
    """
    for due in _schedule(stages, arrival, seed, limit):
        if shard is None or due.index % shard.count == shard.index:
            yield due


def _schedule(
    stages: Sequence[Stage], arrival: Arrival, seed: int, limit: int | None
) -> Iterator[Due]:
    rng = random.Random(f"arrivals:{seed}")
    index = 0
    for stage in stages:
        if arrival.kind == "constant":
            # k / rate, not a running sum: no floating-point drift at the boundary.
            count = math.ceil(stage.duration_s * stage.rate - 1e-9)
            offsets: Iterator[float] = (
                stage.start_s + k / stage.rate for k in range(count)
            )
        else:
            offsets = _random_offsets(stage, arrival, rng)
        for at in offsets:
            if limit is not None and index >= limit:
                return
            yield Due(index, stage.index, at)
            index += 1


def _random_offsets(
    stage: Stage, arrival: Arrival, rng: random.Random
) -> Iterator[float]:
    at = stage.start_s + arrival.gap(rng, stage.rate)
    while at < stage.end_s:
        yield at
        at += arrival.gap(rng, stage.rate)
