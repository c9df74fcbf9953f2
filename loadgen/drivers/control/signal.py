"""What ``servemon control`` measures each tick
(:mod:`servemon.loadgen.drivers.control.driver`): the signal over the last interval,
and what the client knows of it without lag.

- :func:`measure`: the mean of the signal's fresh readings over an interval
  (Prometheus' or the target's ``/metrics``), or the client's own TTFT p95;
- :class:`ClientWindow`: the requests finished (served, lifetimes, TTFTs);
- :func:`held_model`: the KV model's mean over what the gauge saw, the requests
  in flight and what one holds (:mod:`servemon.loadgen.drivers.control.held`);
- :class:`QueueEstimate`: the server's queue now, from the client's prompts with
  no answer yet and the gauge's offset to them (``waiting`` through Prometheus).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from dataclasses import dataclass, field

from servemon.loadgen.drivers.control.held import Held, HeldTokens
from servemon.loadgen.record.figures import exact_quantile
from servemon.loadgen.run.context import Drive
from servemon.loadgen.run.sections import ControlArgs, Signal
from servemon.loadgen.send.timing import Outcome, RequestTiming

__all__ = [
    "ClientWindow",
    "QueueEstimate",
    "held_model",
    "idle_floor",
    "measure",
    "window_mean",
]

#: How fast the queue estimate's offset follows the gauge (per interval).
OFFSET_ALPHA = 0.3


@dataclass(slots=True)
class ClientWindow:
    """The client's own TTFTs of the last ``window_s`` (``ttft_p95`` without
    Prometheus) and the requests' lifetimes: a sink of finished requests."""

    window_s: float
    ttfts: deque[tuple[float, float]] = field(default_factory=deque)
    #: Requests completed (ok) so far.
    served: int = 0
    #: Requests finished, whatever their outcome.
    finished: int = 0
    #: End-to-end seconds of the requests completed since :meth:`lifetime`.
    e2e_sum: float = 0.0
    e2e_count: int = 0
    #: The last interval's mean lifetime (kept through an interval with none).
    mean_lifetime: float | None = None

    def __call__(self, timing: RequestTiming) -> None:
        self.finished += 1
        if timing.outcome is Outcome.OK:
            self.served += 1
            self.e2e_sum += timing.e2e
            self.e2e_count += 1
            if timing.ttft is not None:
                self.ttfts.append((timing.end_s, timing.ttft))

    def lifetime(self) -> float | None:
        """The mean end-to-end latency of the requests completed since the last
        call (the last known one if none completed)."""
        if self.e2e_count:
            self.mean_lifetime = self.e2e_sum / self.e2e_count
        self.e2e_sum, self.e2e_count = 0.0, 0
        return self.mean_lifetime

    def p95(self, now: float) -> float | None:
        while self.ttfts and self.ttfts[0][0] < now - self.window_s:
            self.ttfts.popleft()
        if len(self.ttfts) < 5:
            return None
        return exact_quantile(sorted(v for _, v in self.ttfts), 0.95)


def measure(
    run: Drive[ControlArgs],
    signal: Signal,
    since: float,
    now: float,
    window: ClientWindow,
) -> float | None:
    """The signal over the last interval: the mean of its fresh samples (direct or
    Prometheus), or the client's TTFT p95 without Prometheus; None when missing."""
    if signal == "ttft_p95" and run.source.prometheus is None:
        return window.p95(now)
    values = []
    for reading in reversed(run.signals):
        if reading.at < since:
            break
        value = reading.signal(signal)
        if value is not None:
            values.append(value)
    return sum(values) / len(values) if values else None


async def idle_floor(run: Drive[ControlArgs], signal: Signal, wait_s: float) -> float:
    """The signal's latest reading before the first send (waiting up to ``wait_s``
    for one; 0 without): what the server shows with none of this run's requests."""
    deadline = time.monotonic() + wait_s
    while True:
        for reading in reversed(run.signals):
            value = reading.signal(signal)
            if value is not None:
                return value
        if time.monotonic() >= deadline:
            return 0.0
        await asyncio.sleep(min(0.05, wait_s))


def held_model(
    held: HeldTokens,
    modelled: deque[tuple[float, float]],
    now: float,
    interval: float,
    lag: float,
) -> Held | None:
    """The model's mean over the interval the gauge saw, the requests in flight
    and what one holds over its life; None until the model has a shape and
    samples."""
    shape = held.shape()
    if shape is None:
        return None
    seen = window_mean(modelled, now - interval - lag, now - lag)
    if seen is None:
        return None
    return Held(seen, len(held.inflight), shape.mean_held)


def window_mean(
    samples: deque[tuple[float, float]], since: float, until: float
) -> float | None:
    """The mean of the samples taken in ``[since, until]`` (None: none)."""
    seen = [v for at, v in samples if since <= at <= until]
    return sum(seen) / len(seen) if seen else None


@dataclass(slots=True)
class QueueEstimate:
    """The server's queue without the scrape's delay: what the client has sent and
    not yet had a first token for (a queued request has none; so has one in
    prefill), plus the gauge's offset to that count over the window the gauge
    saw (other clients' requests, requests not streamed), averaged
    :data:`OFFSET_ALPHA` of the way each interval."""

    offset: float | None = None

    def update(self, measured: float, seen: float, count: float) -> float:
        """The queue now, given the gauge over its window, the client's count over
        the same window (``seen``) and over the last interval (``count``)."""
        gap = measured - seen
        if self.offset is None:
            self.offset = gap
        else:
            self.offset += OFFSET_ALPHA * (gap - self.offset)
        return max(0.0, count + self.offset)
