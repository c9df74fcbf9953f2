"""The prefill backlog as the client sees it, and the pace that answers it: the
inner loop of ``servemon control --hold ttft_p95 --pace``; the same pace on the
requests in flight for ``--hold kv_cache_usage --pace`` (:class:`InFlightPace`).

A request's time to first token is mostly its wait behind the prompts sent before
it that the server has not started answering yet. The client knows that backlog
without lag: the prompt tokens of every request it sent that has no first token
yet. A p95 over a window of seconds answers a burst of Poisson arrivals only after
the burst has filled the window's top 5 %, so a law on the p95 alone, however
tuned, holds it no steadier than a fixed rate does (``benchmarks/results/control.md``).

:class:`PrefillBacklog` is the backlog; :meth:`PrefillBacklog.pace` is the factor on
the rate of the next gap: ``exp(-k (b - b̄) / b̄) * exp(d / (r T))``, clamped to
[:data:`PACE_MIN`, :data:`PACE_MAX`], where ``b`` is the backlog now, ``b̄`` its
average over the last ``tau_s`` seconds (at least one prompt), ``r`` the outer law's
rate and ``d`` the sends owed: ``r`` integrated over time, less the gaps drawn. A
burst that has piled up prompts slows the sends behind it, a lull speeds them, and
the sends owed (or sent ahead) bring what goes out back to ``r`` within about
:data:`PACE_CATCH_UP_S`: the law on the measured p95 still sets the level. (An
earlier pace multiplied by the mean stretch of the last ``tau_s``'s gaps instead:
on the simulator its 10-s intervals sent 0.96-0.97 of the law's rate on average,
spread 0.12-0.14, against 0.99 and 0.09 with the sends owed; see
``benchmarks/results/control.md``.) The sends stay open loop (none waits for an
answer), but less bursty than the process they are drawn from: each interval
records what went out over what was drawn at (:meth:`Pace.mean_pace`).
The law does not pace while it drains a backlog (a TTFT far over its setpoint,
:data:`servemon.loadgen.drivers.control.law.TTFT_DRAIN_OVER`; :meth:`Pace.unpaced`); it
drains the count of requests here.
"""

from __future__ import annotations

import math
from collections.abc import Sized
from dataclasses import dataclass, field
from typing import ClassVar, Protocol

from servemon.loadgen.send.timing import RequestTiming

__all__ = [
    "PACE_CATCH_UP_S",
    "PACE_GAIN",
    "PACE_MAX",
    "PACE_MIN",
    "InFlightPace",
    "Pace",
    "Paced",
    "PrefillBacklog",
]

#: How hard the pace answers the backlog (``k``: e^-1 at twice its average).
PACE_GAIN = 1.0
PACE_MIN = 0.25
PACE_MAX = 2.0
#: How soon the sends owed bring the rate sent back to the law's (``T``: a deficit
#: of ``T`` seconds of sends multiplies the rate by e). A toy prefill queue
#: (``tests/unit/loadgen/drivers/control/test_backlog.py``, ten seeds) picked it:
#: 1 s, 2 s and 3 s held 89, 93 and 95 % of the 30-s p95s within ±15 % with 10-s
#: send counts spread 0.065, 0.082 and 0.095 (Poisson: 0.093).
PACE_CATCH_UP_S = 2.0
#: The most sends owed (or ahead), in catch-up times.
OWED_MAX = 3.0
#: KV usage's pace (:class:`InFlightPace`): its average over this many control
#: intervals, and its gain. On the simulator's cold start through Prometheus
#: (``tests/e2e/test_control_cold_start.py`` with ``--pace``; one to five runs each,
#: the start paced too): 1 interval and gain 1: reached at 22-24 s, then 71-76 % of
#: ticks within ±15 %; gain 3: 26 s, 76-79 %; 2 intervals: 40-48 s, 92-100 %. The
#: start not paced: 1 interval, 34-40 s, 92-93 %; 1.5 intervals (kept): 34-40 s,
#: 86-100 % (benchmarks/results/control.md).
#: Against the law's wanted count instead of the average the law and the pace
#: both answered the count's error and the rate swung every other tick (28-32 s,
#: 62-87 %); against the law's rate times the lifetime, every tick (13 %).
IN_FLIGHT_TAU = 1.5
IN_FLIGHT_GAIN = 3.0


class Paced(Protocol):
    """What paces the sends of ``servemon control`` (never while it drains): a
    :class:`Pace` (what was drawn, owed and sent) on a level of its own."""

    #: Whether the start phase is paced too.
    paces_start: ClassVar[bool]
    pacer: Pace

    def pace(self, now: float, rate: float) -> float:
        """The factor on ``rate`` (the law's) of a gap drawn at ``now``."""
        ...


@dataclass(slots=True)
class Pace:
    """The factor on the law's rate of each gap drawn, from a level the client
    knows without lag (the prefill backlog; for KV usage, the count of its
    requests in flight): see the module docstring."""

    tau_s: float
    gain: float = PACE_GAIN
    #: The level's average and when it was last brought up to date.
    average: float | None = None
    averaged_s: float = 0.0
    #: The sends owed to the law's rate (negative: sent ahead), and when.
    owed: float = 0.0
    owed_s: float | None = None
    #: Sum and count of the stretches (1 / factor) given since :meth:`mean_pace`.
    paced_sum: float = 0.0
    paced_count: int = 0
    #: The stretch of the last gap drawn.
    last_stretch: float = 0.0

    def factor(self, now: float, rate: float, level: float, unit: float) -> float:
        """The factor on ``rate`` (the law's) of a gap drawn at ``now`` with the
        level at ``level`` (``unit``: one request's share of it, the least its
        average is taken to be)."""
        if self.average is None:
            self.average, self.averaged_s = level, now
        else:
            a = 1.0 - math.exp(-max(0.0, now - self.averaged_s) / self.tau_s)
            self.average += a * (level - self.average)
            self.averaged_s = now
        raw = math.exp(-self.gain * (level - self.average) / max(self.average, unit))
        if self.owed_s is not None:
            self.owed += rate * max(0.0, now - self.owed_s)
        self.owed_s = now
        scale = max(rate * PACE_CATCH_UP_S, 1e-9)
        self.owed = max(-OWED_MAX * scale, min(OWED_MAX * scale, self.owed))
        factor = raw * math.exp(self.owed / scale)
        factor = max(PACE_MIN, min(PACE_MAX, factor))
        self.owed -= 1.0  # the gap drawn now ends in a send
        self.last_stretch = 1.0 / factor
        self.paced_sum += self.last_stretch
        self.paced_count += 1
        return factor

    def woke(self) -> None:
        """The gap last drawn was longer than the schedule waits: it ended in a
        wake-up (:data:`~servemon.loadgen.send.arrivals.WAKE`), with nothing sent for
        it."""
        if self.paced_count:
            self.owed += 1.0
            self.paced_sum -= self.last_stretch
            self.paced_count -= 1

    def unpaced(self, now: float) -> None:
        """A gap drawn at ``now`` without the pace (a drain): nothing is owed for
        the time unpaced."""
        self.owed, self.owed_s = 0.0, now

    def mean_pace(self) -> float | None:
        """The rate sent over the rate drawn at since the last call: the inverse
        of the mean stretch (None: no gap drawn)."""
        if not self.paced_count:
            return None
        mean = self.paced_count / self.paced_sum
        self.paced_sum, self.paced_count = 0.0, 0
        return mean


@dataclass(slots=True)
class PrefillBacklog:
    """Prompt tokens sent and not yet answered with a first token (a starter,
    first-token listener and sink of the sender's
    :class:`~servemon.loadgen.run.sender.Hooks`)."""

    tau_s: float
    gain: float = PACE_GAIN
    paces_start: ClassVar[bool] = True
    #: request id -> its prompt tokens (None: the workload does not say).
    pending: dict[str, int | None] = field(default_factory=dict)
    #: Prompt tokens of the requests sent whose prompt is known, and how many.
    known_tokens: int = 0
    known: int = 0
    #: The pending requests' known prompt tokens, and how many are unknown.
    pending_tokens: int = 0
    pending_unknown: int = 0
    #: The pace of the sends (``--pace``) from this backlog.
    pacer: Pace = field(init=False)

    def __post_init__(self) -> None:
        self.pacer = Pace(self.tau_s, self.gain)

    def started(
        self, request_id: str, sent_s: float, prompt_tokens: int | None
    ) -> None:
        if request_id in self.pending:
            return
        self.pending[request_id] = prompt_tokens
        if prompt_tokens is None:
            self.pending_unknown += 1
        else:
            self.pending_tokens += prompt_tokens
            self.known_tokens += prompt_tokens
            self.known += 1

    def first_token(self, request_id: str, at_s: float) -> None:
        if request_id not in self.pending:
            return
        prompt = self.pending.pop(request_id)
        if prompt is None:
            self.pending_unknown -= 1
        else:
            self.pending_tokens -= prompt

    def __call__(self, timing: RequestTiming) -> None:
        # Not streamed, failed, or no content: the answer is the end of it.
        self.first_token(timing.request_id, timing.end_s)

    def prompt_size(self) -> float:
        """A prompt's tokens: the mean of those sent that are known (1: none)."""
        return self.known_tokens / self.known if self.known else 1.0

    def count(self) -> int:
        """Requests sent and not yet answered."""
        return len(self.pending)

    def tokens(self) -> float:
        """The backlog now, in prompt tokens."""
        return self.pending_tokens + self.pending_unknown * self.prompt_size()

    def pace(self, now: float, rate: float) -> float:
        """The factor on ``rate`` (the law's) of a gap drawn at ``now`` (see the
        module)."""
        return self.pacer.factor(now, rate, self.tokens(), self.prompt_size())


@dataclass(slots=True)
class InFlightPace:
    """``--pace`` for KV usage: each gap paced by the count of requests in flight,
    which the client knows without lag (what the cache holds is about that count
    times what one holds; Poisson arrivals alone swing it, and with it the
    usage, by more than a law on the delayed gauge can answer)."""

    inflight: Sized
    pacer: Pace
    #: The start grows the rate as fast as it may: paced too (over two
    #: intervals), the setpoint was reached at 40-48 s, not 34-40.
    paces_start: ClassVar[bool] = False

    @classmethod
    def every(cls, interval_s: float, inflight: Sized) -> InFlightPace:
        """The pace of a law that changes the rate every ``interval_s``."""
        return cls(inflight, Pace(IN_FLIGHT_TAU * interval_s, IN_FLIGHT_GAIN))

    def pace(self, now: float, rate: float) -> float:
        return self.pacer.factor(now, rate, float(len(self.inflight)), 1.0)
