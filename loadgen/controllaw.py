"""The control law of ``servemon control`` (see :mod:`loadgen.control` for why it
has this shape): what ``--hold`` can hold, the step from one control interval to the
next, and the cascade that holds TTFT through the queue."""

from __future__ import annotations

import math
from dataclasses import dataclass

from loadgen.config import LoadConfig
from servemon.errors import ConfigError

__all__ = [
    "HOLDABLE",
    "PROMETHEUS_ONLY",
    "TOLERANCE",
    "CascadeLaw",
    "ControlLaw",
    "control_interval",
    "parse_hold",
]

#: What ``--hold`` can hold.
HOLDABLE = ("waiting", "kv_cache_usage", "ttft_p95", "burn_rate", "gpu_utilization")
#: Signals only Prometheus has (the generated rules, the GPU exporter).
PROMETHEUS_ONLY = ("burn_rate", "gpu_utilization")
TOLERANCE = 0.15
#: Intervals at a bound, signal still off, before the setpoint is unreachable.
UNREACHABLE_AFTER = 3


def parse_hold(text: str) -> tuple[str, float]:
    """``SIGNAL=SETPOINT`` as (signal, setpoint); a one-line error naming the part
    at fault."""
    name, sep, value = text.partition("=")
    name = name.strip()
    if not sep or name not in HOLDABLE:
        raise ConfigError(
            f"--hold {text!r}: expected SIGNAL=SETPOINT with SIGNAL one of "
            f"{', '.join(HOLDABLE)}"
        )
    try:
        setpoint = float(value)
    except ValueError:
        setpoint = math.nan
    if not (setpoint > 0 and math.isfinite(setpoint)):
        raise ConfigError(f"--hold {name}: the setpoint must be a number > 0")
    if name in ("kv_cache_usage", "gpu_utilization") and setpoint >= 1:
        raise ConfigError(f"--hold {name}: a ratio below 1, got {setpoint:g}")
    return name, setpoint


@dataclass(slots=True)
class ControlLaw:
    """The law of :mod:`loadgen.control`; ``update`` gives the next rate.

    ``waiting`` is a queue, an integrator of (offered - served): the queue law
    offers what the server served plus the queue error spread over ``drain``
    intervals, which closes the error geometrically (half of it an interval) however
    fast the server is. Every other signal is a monotone function of the rate: an
    integral step on the logarithm of the rate, ``ki`` times the logarithmic error
    ``log(setpoint / measured)`` clamped to ±1 (a PI law in velocity form whose
    proportional gain ``kp`` is 0 by default: on a static map it only adds the
    noise of each reading to the rate).
    """

    signal: str
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

    def error(self, measured: float) -> float:
        """The logarithmic error, clamped (1 when the signal is at 0)."""
        if measured <= 0:
            return 1.0
        return max(-1.0, min(1.0, math.log(self.setpoint / measured)))

    def update(self, measured: float, served_rps: float) -> float:
        """The rate for the next interval, given the signal over the last one and
        the requests the server completed per second meanwhile."""
        low = math.log(1 - self.max_down)
        high = math.log(1 + self.max_up)
        if self.signal == "waiting":
            if measured < self.setpoint / 2 and served_rps >= 0.9 * self.rate:
                # Far below, and the server serves all it is offered: it has room.
                wanted = self.rate * (1 + self.max_up)
            else:
                spread = self.drain * self.interval_s
                wanted = served_rps + (self.setpoint - measured) / spread
            # Steps up are limited against what the server served, not only the
            # last rate: after a drain the rate may go straight back to it.
            high = math.log(max(1.0, served_rps / self.rate) * (1 + self.max_up))
            step = math.log(max(wanted, 1e-9) / self.rate)
        else:
            e = self.error(measured)
            step = self.kp * (e - self.last_error) + self.ki * e
            self.last_error = e
        step = max(low, min(high, step))
        rate = min(self.rps_max, max(self.rps_min, self.rate * math.exp(step)))
        off = abs(self.setpoint - measured) > TOLERANCE * self.setpoint
        pushing_up = rate >= self.rps_max and measured < self.setpoint
        pushing_down = rate <= self.rps_min and measured > self.setpoint
        self.at_bound = self.at_bound + 1 if off and (pushing_up or pushing_down) else 0
        self.rate = rate
        return rate

    @property
    def unreachable(self) -> bool:
        """At a bound for a while with the signal still off."""
        return self.at_bound >= UNREACHABLE_AFTER


@dataclass(slots=True)
class CascadeLaw:
    """``ttft_p95`` held through the queue that drives it.

    Past the knee a server's TTFT is mostly time spent waiting, and the queue is
    what the queue law holds well: every interval, and whatever the server's speed.
    So, once there is a queue (``mode == "queue"``), the queue law (``inner``) runs
    every interval towards a queue setpoint, and every ``outer_every`` intervals
    (once the TTFT window has seen the last change) that setpoint takes an integral
    step on its logarithm from TTFT's logarithmic error, at most x2 or x0.5. A TTFT
    p95 read over a window and steered directly is slow and noisy; through the
    queue the rate answers the arrivals' noise within an interval.

    Below the knee there is no queue to steer (``mode == "rate"``, where the law
    starts): every outer interval the rate itself takes the single law's step from
    TTFT's error. It hands over to the queue when TTFT is still below its setpoint
    with a queue formed, and takes back when the queue setpoint has come down to
    its floor with TTFT still too high.
    """

    setpoint: float
    inner: ControlLaw
    outer_every: int
    ki: float = 0.5
    queue_floor: float = 0.5
    queue_ceiling: float = 100_000.0
    mode: str = "rate"
    ticks: int = 0
    at_bound: int = 0
    signal: str = "ttft_p95"

    @property
    def rate(self) -> float:
        """The offered rate."""
        return self.inner.rate

    @property
    def rps_min(self) -> float:
        return self.inner.rps_min

    @property
    def rps_max(self) -> float:
        return self.inner.rps_max

    @property
    def queue_setpoint(self) -> float:
        """What the queue law holds the queue at (in ``queue`` mode)."""
        return self.inner.setpoint

    def update(
        self, measured: float, served_rps: float, waiting: float | None = None
    ) -> float:
        """The rate for the next interval, from TTFT over its window, the requests
        completed per second and the queue over the last interval (None: missing;
        the queue law then holds the rate)."""
        self.ticks += 1
        inner = self.inner
        outer = self.ticks % self.outer_every == 0
        e = 1.0 if measured <= 0 else math.log(self.setpoint / measured)
        e = max(-1.0, min(1.0, e))
        if self.mode == "rate":
            if waiting is not None and waiting >= self.queue_floor and e > 0:
                self.mode = "queue"  # a queue formed with TTFT still below
                inner.setpoint = max(self.queue_floor, waiting)
            elif measured < self.setpoint / 2 and served_rps >= 0.9 * inner.rate:
                # Far below, and the server serves all it is offered: it has room.
                inner.rate = min(inner.rps_max, inner.rate * (1 + inner.max_up))
            elif outer:
                step = max(
                    math.log(1 - inner.max_down),
                    min(math.log1p(inner.max_up), inner.ki * e),
                )
                inner.rate = min(
                    inner.rps_max, max(inner.rps_min, inner.rate * math.exp(step))
                )
        elif outer:
            step = max(-math.log(2.0), min(math.log(2.0), self.ki * e))
            wanted = inner.setpoint * math.exp(step)
            if wanted < self.queue_floor and e < 0:
                self.mode = "rate"  # no queue left to take away
                inner.setpoint = self.queue_floor
            else:
                inner.setpoint = min(self.queue_ceiling, max(self.queue_floor, wanted))
        if self.mode == "queue" and waiting is not None:
            inner.update(waiting, served_rps)
        if outer:
            off = abs(self.setpoint - measured) > TOLERANCE * self.setpoint
            pushing_up = self.rate >= self.rps_max and measured < self.setpoint
            pushing_down = self.rate <= self.rps_min and measured > self.setpoint
            bounded = off and (pushing_up or pushing_down)
            self.at_bound = self.at_bound + 1 if bounded else 0
        return self.rate

    @property
    def unreachable(self) -> bool:
        """At a rate bound for a while with TTFT still off."""
        return self.at_bound >= UNREACHABLE_AFTER


def cascade(config: LoadConfig, setpoint: float, rate: float) -> CascadeLaw:
    """The law that holds ``ttft_p95=setpoint``: the queue law every control
    interval, its setpoint (1 waiting at first) moved every TTFT interval."""
    rps_max = config.rps_max if config.rps_max is not None else 1000.0
    tick = control_interval(config, "ttft_p95")
    inner = ControlLaw(
        signal="waiting",
        setpoint=1.0,
        rps_min=config.rps_min,
        rps_max=rps_max,
        rate=rate,
        interval_s=tick,
    )
    outer = max(tick, signal_interval(config, "ttft_p95"))
    return CascadeLaw(setpoint, inner, outer_every=max(1, round(outer / tick)))


def control_interval(config: LoadConfig, signal: str) -> float:
    """Seconds between control ticks (rate changes): ``--control-interval``, else
    :func:`signal_interval` of the signal, of the queue for ``ttft_p95`` (held
    through the queue: :class:`CascadeLaw`)."""
    if config.control_interval is not None:
        return config.control_interval
    return signal_interval(config, "waiting" if signal == "ttft_p95" else signal)


def signal_interval(config: LoadConfig, signal: str) -> float:
    """Twice the signal's delay, and at least 1 s: a step is judged on a reading
    that saw the step before."""
    if config.prometheus is None:
        delay = config.sample_interval
        if signal == "ttft_p95":
            delay = max(delay, config.signal_window / 2)
    else:
        # A scrape, then servemon's own poll of Prometheus.
        delay = config.scrape_interval + config.sample_interval
        if signal in ("ttft_p95", "burn_rate"):
            delay += config.signal_window / 2
    return max(1.0, 2.0 * delay)
