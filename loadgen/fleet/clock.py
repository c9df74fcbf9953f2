"""How far a worker's clock is from the coordinator's, measured, with no NTP.

The coordinator pings; the worker answers at once with its own monotonic time. One
exchange gives the offset between the two monotonic clocks, ``delta = (t1 + t3) / 2
- t2`` (coordinator minus worker), to within half its round trip: the worker read its
clock somewhere between the ping's departure ``t1`` and the answer's arrival ``t3``.
The exchanges with the smallest round trips are the least biased (a queue on either
way delays one half only), so the estimate is the one of smallest round trip among
the recent ones (:data:`WINDOW`): the rule NTP uses (RFC 5905's clock filter). It is
measured again all run long, so that a clock that drifts is followed.

Each side's clock, as reported, is its wall clock read once and counted on from there
with its monotonic clock (:class:`Frame`): what a worker's offset means to a person
("this machine is 1.5 s ahead"), while every duration stays monotonic.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass

__all__ = ["WINDOW", "ClockFilter", "Estimate", "Frame", "Sample"]

#: Exchanges the estimate is chosen among (the newest ones).
WINDOW = 16


@dataclass(frozen=True, slots=True)
class Frame:
    """A process's clock as it reports it: the wall clock at one instant, counted on
    with the monotonic clock (``anchor_s`` is wall minus monotonic)."""

    anchor_s: float

    @classmethod
    def here(cls) -> Frame:
        """This process's frame, read now."""
        return cls(time.time() - time.monotonic())


@dataclass(frozen=True, slots=True)
class Sample:
    """One ping/pong: the coordinator's send and receive times and the worker's
    reading in between (each on its own monotonic clock)."""

    sent_s: float
    worker_s: float
    received_s: float

    @property
    def rtt_s(self) -> float:
        return self.received_s - self.sent_s

    @property
    def delta_s(self) -> float:
        """Coordinator's monotonic clock minus the worker's."""
        return (self.sent_s + self.received_s) / 2 - self.worker_s


@dataclass(frozen=True, slots=True)
class Estimate:
    """The offset between the two clocks, and how sure it is."""

    #: Coordinator's monotonic time minus the worker's, at the same instant: a
    #: worker's time plus this is the coordinator's.
    delta_s: float
    #: Half the round trip of the exchange it came from: the true delta lies
    #: within ``delta_s ± uncertainty_s``.
    uncertainty_s: float
    rtt_s: float
    #: Worker's wall-anchored clock minus the coordinator's (positive: the worker's
    #: clock is ahead), as a person reads an offset.
    offset_s: float


class ClockFilter:
    """The exchanges with one worker, and the estimate they give."""

    def __init__(self, coordinator: Frame, worker: Frame) -> None:
        self._coordinator = coordinator
        self._worker = worker
        self._samples: deque[Sample] = deque(maxlen=WINDOW)
        #: Exchanges taken in all.
        self.count = 0
        #: The first estimate (after the start's exchanges) and the latest: the
        #: drift over the run is their difference.
        self.first: Estimate | None = None
        #: The estimate of the samples as they are (every credit asks for it; the
        #: samples change four times a second).
        self._estimate: Estimate | None = None

    def add(self, sample: Sample) -> None:
        """One exchange more (an answer that came back)."""
        if sample.rtt_s < 0:
            return
        self._samples.append(sample)
        self.count += 1
        self._estimate = None

    def settle(self) -> None:
        """The start's exchanges are in: what they give is the first estimate."""
        self.first = self.estimate()

    def estimate(self) -> Estimate | None:
        """The estimate from the exchange of smallest round trip among the newest
        (None before any)."""
        if self._estimate is not None or not self._samples:
            return self._estimate
        best = min(self._samples, key=lambda s: s.rtt_s)
        delta = best.delta_s
        self._estimate = Estimate(
            delta_s=delta,
            uncertainty_s=best.rtt_s / 2,
            rtt_s=best.rtt_s,
            offset_s=self._worker.anchor_s - self._coordinator.anchor_s - delta,
        )
        return self._estimate
