"""The control law of ``servemon control`` (see
:mod:`servemon.loadgen.drivers.control.driver` for why it has this shape): the PI
step from one control interval to the next."""

from __future__ import annotations

import math
from dataclasses import dataclass

from servemon.loadgen.drivers.control.held import Held
from servemon.loadgen.run.context import SignalSource
from servemon.loadgen.run.promtargets import DEFAULT_S as SCRAPE_DEFAULT_S
from servemon.loadgen.run.sections import Signal

__all__ = [
    "FAST_START",
    "HANDOVER_SERVED",
    "KP_MAX",
    "LAGGED_BY_LIFETIME",
    "SATURATING",
    "START_UNTIL",
    "TOLERANCE",
    "TTFT_DRAIN_OVER",
    "ControlLaw",
    "control_interval",
]


#: Ratios that stop at 1: at their ceiling they no longer say how far over the
#: rate is (a full cache hides the backlog behind it).
SATURATING = ("kv_cache_usage", "gpu_utilization")
#: Ratios of what the running requests hold: they follow a change of rate over
#: about a request's lifetime.
LAGGED_BY_LIFETIME = ("kv_cache_usage",)
TOLERANCE = 0.15
#: The largest proportional gain the lag of a long lifetime gets (a lifetime of
#: about 7 intervals).
KP_MAX = 1.0
#: KV usage's law closes the count's error over two intervals or this share of a
#: lifetime, whichever is longer (faster re-forms cohorts of one age).
SPREAD_LIFETIMES = 0.5
#: KV usage's law averages what the server served over this many lifetimes:
#: completions echo the sends of a lifetime ago, and a mean over one lifetime
#: (an average that forgets a lifetime's worth) passed a swing of the rate on to
#: the next lifetime on the simulator's fixed-length requests (31-55 % of ticks
#: within through Prometheus, 57-61 % over two lifetimes; 2026-12-05).
SERVED_LIFETIMES = 2.0
#: How fast the scale of the KV model follows the measured gauge (per interval).
SCALE_ALPHA = 0.3
#: How far over its setpoint a TTFT p95 is read as a queue to drain: past twice
#: it, the clamped integral step (-14 % an interval) lets a server that got
#: slower build a backlog faster than the step cuts.
TTFT_DRAIN_OVER = 2.0
#: Intervals at a bound, signal still off, before the setpoint is unreachable.
UNREACHABLE_AFTER = 3
#: Signals whose cold start doubles the rate while they are far below the
#: setpoint: a queue and a cache fill, which stay near 0 until the rate is close
#: to what the server can take (a TTFT or a burn rate has a floor well above 0 and
#: a knee that doubling jumps past).
FAST_START = ("waiting", "kv_cache_usage")
#: The start ends at the first reading at or above this share of the setpoint.
START_UNTIL = 0.5
#: ... or, for ``waiting``, at the first queue of this mean: a queue forms only
#: once the server takes no more, so the rate is at or past its capacity (a
#: transient queue below it only hands over to the careful law early).
START_QUEUE = 1.0
#: At the start's hand-over, KV usage's law goes on from what the requests in
#: flight complete a second by Little's law, but at most this many times what was
#: served over the last interval: where each request slows the others (a CPU), the
#: lifetime measured at the start's light load is a fraction of the one to come,
#: and Little's rate alone overshot a toy CPU server's cache to 0.99.
HANDOVER_SERVED = 2.0
#: How much the start may grow the rate an interval (x2).
START_UP = 1.0


@dataclass(slots=True)
class ControlLaw:
    """The law of :mod:`servemon.loadgen.drivers.control.driver`; ``update`` gives
    the next rate.

    ``waiting`` is a queue, an integrator of (offered - served): the queue law
    offers what the server served plus the queue error spread over ``drain``
    intervals, which closes the error geometrically (half of it an interval) however
    fast the server is (with no queue, from the rate sent where that is higher than
    what was served). Every other signal is a monotone function of the rate: an
    integral step on the logarithm of the rate, ``ki`` times the logarithmic error
    ``log(setpoint / measured)`` clamped to ±1 (a PI law in velocity form whose
    proportional gain ``kp`` is 0 by default: on a static map it only adds the
    noise of each reading to the rate).

    A saturating signal (:data:`SATURATING`) at its ceiling (0.95, or halfway from
    the setpoint to 1) is read with the queue behind it: the law offers what the
    server served less the queue spread over ``drain`` intervals (the queue law with
    a setpoint of no queue), but not below ``setpoint`` times what it served (where
    the ratio would sit, by Little's law) and never more than the last rate, until
    the signal leaves the ceiling; then the integral step goes on from that rate.
    Without the queue (no series) it offers no more than was served, and the
    integral step's cut where that is deeper. A TTFT p95 past
    :data:`TTFT_DRAIN_OVER` times its setpoint, given the client's backlog of
    prompts not yet answered (``waiting``), drains it the same way, at no less than
    half of what was served.

    KV usage is not a static map when requests live longer than an interval: it is
    what the requests running hold, so it follows a change of rate with a lag of
    about their lifetime ``L``, and carries the noise of how many happen to be in
    flight; and where the server's speed falls with its batch (a CPU, a GPU past its
    knee) each request sent makes every other one live longer, so the usage a rate
    gives has no fixed gain. Given the client's model of what its requests hold
    (``held``, see :mod:`servemon.loadgen.drivers.control.held`), the law holds the
    number of
    requests in flight that holds the setpoint, like a queue: ``scale``, the measured
    usage per modelled token above what the server holds idle (``floor``), follows
    the gauge (an average, :data:`SCALE_ALPHA` of the way each interval); the
    setpoint less the floor, over the scale, over what a request holds
    on average over its life, is the count wanted; and the law offers what the
    server served (its mean over :data:`SERVED_LIFETIMES` lifetimes: completions
    an interval echo the sends of a lifetime ago; in the start, the rate sent where
    that is higher; at the hand-over, at least the count in flight over the
    lifetime, within :data:`HANDOVER_SERVED`) plus the count's error spread over
    ``drain`` intervals or :data:`SPREAD_LIFETIMES` of a lifetime. The count
    is the client's own, without lag, so a bunch of arrivals is answered when it
    happens, and how fast the server then serves does not matter. Until the model
    has a shape (a few requests finished), the integral step with the proportional
    gain that cancels the lag, ``ki * a / (1 - a)`` with ``a = exp(-T / L)`` (at
    most :data:`KP_MAX`), given ``lifetime_s``.
    """

    signal: Signal
    setpoint: float
    rps_min: float
    rps_max: float
    rate: float
    interval_s: float
    kp: float = 0.0
    ki: float = 0.15
    max_up: float = 0.25  # at most x1.25 an interval
    max_down: float = 0.5  # at most x0.5 an interval
    drain: float = 2.0
    last_error: float = 0.0
    at_bound: int = 0
    #: The last step drained a backlog behind a saturated signal.
    draining: bool = False
    #: The proportional gain of the last step (``kp``, or the lag's, see above).
    gain: float = 0.0
    #: Measured KV usage per token of the client's model (None: not used yet):
    #: the ratio of the averages of the usage (above ``floor``) and of the tokens
    #: modelled, not the average of their ratios. A tick with a handful of
    #: requests in flight (a 1-s scrape catching requests of 0.3 s, block rounding
    #: on young requests) gave a ratio twice the truth, which an average of
    #: ratios carried for a dozen ticks; a ratio of averages weighs each tick by
    #: how much it saw.
    scale: float | None = None
    #: The averages behind ``scale``.
    usage_mean: float = 0.0
    tokens_mean: float = 0.0
    #: KV usage the server shows with none of the client's requests (read before
    #: the first send): vLLM's CPU build reads 0.004 idle, as much as a request
    #: of 512 tokens, so a scale taken through it began 20 times too high and the
    #: count wanted grew only as the load drowned it out (6 wanted at 4 s, 135 at
    #: the setpoint; benchmarks/results/control.md). The scale is of what is above it.
    floor: float = 0.0
    #: Completions a second, averaged over two lifetimes (KV usage's law).
    served: float | None = None
    #: The requests in flight that hold the setpoint (KV usage's law; None: not
    #: used yet).
    wanted_count: float | None = None
    #: In the start phase (:data:`FAST_START` signals, until the signal first
    #: reaches :data:`START_UNTIL` of the setpoint).
    starting: bool = True
    #: The start grew the rate faster than the careful law would have.
    doubled: bool = False

    @property
    def phase(self) -> str:
        """``start`` or ``hold``: the phase the last step was taken in."""
        return "start" if self.starting else "hold"

    @property
    def ceiling(self) -> float:
        """Where a saturating signal stops telling the rate apart."""
        return max(0.95, (1.0 + self.setpoint) / 2)

    def error(self, measured: float) -> float:
        """The logarithmic error, clamped (1 when the signal is at 0)."""
        if measured <= 0:
            return 1.0
        return max(-1.0, min(1.0, math.log(self.setpoint / measured)))

    def proportional_gain(self, lifetime_s: float | None) -> float:
        """``kp``, or for a signal :data:`LAGGED_BY_LIFETIME` the gain that cancels
        a lag of ``lifetime_s``."""
        if self.signal not in LAGGED_BY_LIFETIME or not lifetime_s or lifetime_s < 0:
            return self.kp
        a = math.exp(-self.interval_s / lifetime_s)
        return max(self.kp, min(KP_MAX, self.ki * a / (1 - a)))

    def update(
        self,
        measured: float,
        served_rps: float,
        waiting: float | None = None,
        lifetime_s: float | None = None,
        held: Held | None = None,
    ) -> float:
        """The rate for the next interval, given the signal over the last one, the
        requests the server completed per second meanwhile, for a saturating
        signal the queue over the last interval (None: not known, read as none;
        for ``waiting`` and a TTFT, the client's prompts with no answer yet),
        the requests' mean lifetime (end-to-end latency; None: not known), and for
        KV usage the client's model of what its requests hold (None: no model
        yet)."""
        low = math.log(1 - self.max_down)
        high = math.log(1 + self.max_up)
        started = self.starting
        self.starting = (
            self.starting
            and self.signal in FAST_START
            and measured < START_UNTIL * self.setpoint
            and not (
                self.signal == "waiting"
                and max(measured, waiting or 0.0) >= START_QUEUE
            )
            and self.rate < self.rps_max
        )
        if started and not self.starting and self.doubled:
            # The hand-over: the last doubling may have gone far past what the
            # server takes; the careful law may undo it at once (down is safe).
            low = math.log(1e-6)
        predicted = False
        if self.signal == "waiting":
            if measured < self.setpoint / 2 and served_rps >= 0.9 * self.rate:
                # Far below, and the server serves all it is offered: it has room.
                wanted = self.rate * (1 + self.max_up)
            else:
                # Without a queue the server took all it was sent: the rate sent,
                # not one interval's noisy count of completions, is where to
                # grow from (from the count, vLLM's queue of 4 at 2-s intervals
                # sank to a mean of 0.14 while the server had room).
                spread = self.drain * self.interval_s
                base = (
                    served_rps
                    if measured >= START_QUEUE
                    else max(served_rps, self.rate)
                )
                wanted = base + (self.setpoint - measured) / spread
            # Steps up are limited against what the server served, not only the
            # last rate: after a drain the rate may go straight back to it.
            high = math.log(max(1.0, served_rps / self.rate) * (1 + self.max_up))
            step = math.log(max(wanted, 1e-9) / self.rate)
        elif self.signal == "kv_cache_usage" and held and held.seen > 0 < measured:
            served = self._served(served_rps, lifetime_s)
            if started and not self.starting and lifetime_s:
                # The hand-over: the mean of what was served lags the start's
                # doublings by a lifetime or two (on the simulator a third of
                # what the count in flight needed, which then sank for 10 s).
                little = min(
                    held.count / lifetime_s,
                    self.rate,
                    HANDOVER_SERVED * served_rps,
                )
                self.served = served = max(served, little)
            # In the start, far below the setpoint, the server takes all it is
            # sent, and what it served lags the rate by a lifetime: the rate sent
            # is the base (as the queue law's without a queue).
            base = max(served, self.rate) if self.starting else served
            wanted = self._count_law(measured, held, base, lifetime_s)
            step = math.log(max(wanted, 1e-9) / self.rate)
            # From what the server served at once, then as the start may (the
            # count has no lag and is bounded by its error).
            high = math.log(max(1.0, served / self.rate) * (1 + START_UP))
            self.gain = 0.0
            predicted = True
        else:
            e = self.error(measured)
            self.gain = self.proportional_gain(lifetime_s)
            step = self.gain * (e - self.last_error) + self.ki * e
            self.last_error = e
        if self.starting:
            step, high = self._start(step, lifetime_s, predicted)
            self.doubled = self.doubled or step > math.log(1 + self.max_up)
        saturated = self.signal in SATURATING and measured >= self.ceiling
        queued = (
            self.signal == "ttft_p95"
            and waiting is not None
            and measured >= TTFT_DRAIN_OVER * self.setpoint
        )
        self.draining = saturated or queued
        if self.draining:
            # What a full cache serves is what the server can do; the ratio grows
            # with the requests held, the rate times their latency (Little), so
            # ``setpoint x served`` is about where it would sit: drain no lower.
            # A TTFT far over is a backlog of prompts: drain it at no less than
            # half of what was served. Without the queue, no more than served,
            # and the integral step.
            wanted = served_rps
            if waiting is not None:
                spread = self.drain * self.interval_s
                floor = self.setpoint if saturated else 1 - self.max_down
                wanted = max(floor * wanted, wanted - waiting / spread)
            drain = math.log(max(wanted, 1e-9) / self.rate)
            step = drain if waiting is not None else min(step, drain)
            high = 0.0
        step = max(low, min(high, step))
        rate = min(self.rps_max, max(self.rps_min, self.rate * math.exp(step)))
        off = abs(self.setpoint - measured) > TOLERANCE * self.setpoint
        pushing_up = rate >= self.rps_max and measured < self.setpoint
        pushing_down = rate <= self.rps_min and measured > self.setpoint
        self.at_bound = self.at_bound + 1 if off and (pushing_up or pushing_down) else 0
        self.rate = rate
        return rate

    def _served(self, served_rps: float, lifetime_s: float | None) -> float:
        """What the server served, averaged over :data:`SERVED_LIFETIMES`
        lifetimes (at least an interval)."""
        mean = self.served if self.served is not None else served_rps
        span = SERVED_LIFETIMES * (lifetime_s or 0.0)
        weight = self.interval_s / max(self.interval_s, span)
        self.served = mean + weight * (served_rps - mean)
        return self.served

    def _count_law(
        self, measured: float, held: Held, served: float, lifetime_s: float | None
    ) -> float:
        """KV usage on the client's model: the queue law on the requests in flight,
        towards the count whose mean hold is the setpoint."""
        own = measured - self.floor
        if own > 0 or self.scale is None:
            own = max(own, measured / 2)
            if self.scale is None:
                self.usage_mean, self.tokens_mean = own, held.seen
            else:
                self.usage_mean += SCALE_ALPHA * (own - self.usage_mean)
                self.tokens_mean += SCALE_ALPHA * (held.seen - self.tokens_mean)
            self.scale = self.usage_mean / self.tokens_mean
        wanted = max(self.setpoint - self.floor, 0.0) / self.scale / held.each
        self.wanted_count = wanted
        life = SPREAD_LIFETIMES * (lifetime_s or 0.0)
        return served + (wanted - held.count) / max(self.drain * self.interval_s, life)

    def _start(
        self, step: float, lifetime_s: float | None, predicted: bool
    ) -> tuple[float, float]:
        """The step of the start phase and its limit: double the rate an interval;
        KV usage on the client's model takes the model's step within that limit,
        and without a model only doubles when its requests live less than an
        interval (else the gauge would show a doubling a lifetime late, after
        several more)."""
        up = math.log(1 + START_UP)
        if self.signal == "kv_cache_usage":
            if predicted:
                return step, up
            if lifetime_s is None or lifetime_s > self.interval_s:
                return step, math.log(1 + self.max_up)
        return up, up

    @property
    def unreachable(self) -> bool:
        """At a bound for a while with the signal still off."""
        return self.at_bound >= UNREACHABLE_AFTER


def control_interval(
    given: float | None, source: SignalSource, signal: Signal
) -> float:
    """Seconds between rate changes: ``--control-interval``, else twice the
    signal's delay, and at least 1 s. KV usage, and a queue read from
    Prometheus: two of servemon's samples and at least 2 s, since the law steers a
    count of the client's own, which has no delay (the gauge, read as late as it
    was scraped, only calibrates it)."""
    if given is not None:
        return given
    if signal == "kv_cache_usage" or (
        signal == "waiting" and source.prometheus is not None
    ):
        return max(2.0, 2.0 * source.sample_interval)
    if source.prometheus is None:
        delay = source.sample_interval
        if signal == "ttft_p95":
            delay = max(delay, source.signal_window / 2)
    else:
        # A scrape, then servemon's own poll of Prometheus.
        scrape = source.scrape_interval or SCRAPE_DEFAULT_S
        delay = scrape + source.sample_interval
        if signal in ("ttft_p95", "burn_rate"):
            delay += source.signal_window / 2
    return max(1.0, 2.0 * delay)
