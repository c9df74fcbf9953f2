"""``servemon control``: hold a server signal at a setpoint by steering the offered
open-loop rate.

The run is one stage of ``--duration`` seconds. Requests go out open loop (the
seeded ``--arrival`` process) at a rate the controller sets every control interval
from the measured signal (``--hold waiting=8``, ``kv_cache_usage=0.8``,
``ttft_p95=0.4``, ``burn_rate=1``, ``gpu_utilization=0.9``).

The control law (:class:`servemon.loadgen.drivers.control.law.ControlLaw`) is a PI
controller in velocity form on the logarithm of the rate::

    e[k] = clamp(log(setpoint / measured[k]), -1, 1)
    log r[k+1] = log r[k] + kp * (e[k] - e[k-1]) + ki * e[k]      (step-limited)
    r[k+1] = clamp(r[k+1], rps_min, rps_max)

except for ``waiting``, a queue, held by the queue law ``r[k+1] = served[k] +
(setpoint - waiting[k]) / (2 T)``, and for a ratio at its ceiling (KV usage or GPU
utilization at 0.95 or more), which drains the queue behind it: ``r[k+1] <=
served[k] - waiting[k] / (2 T)`` (see
:class:`~servemon.loadgen.drivers.control.law.ControlLaw`).

Why this shape:

- **Logarithm of the rate.** A deployment's sensible rates span orders of
  magnitude; a step of 10 % means the same at 1 and at 100 requests/s, so one
  tuning fits every deployment, and the rate can never go negative.
- **Logarithmic error, clamped.** Signals have different units (requests, a
  ratio, seconds); the error as a log ratio to the setpoint makes the gains
  unit-free.
  Clamping to ±1 keeps a signal far off (a queue of 200 for a setpoint of 8) from
  producing a huge step: the step limit (``max_up``, ``max_down`` per interval) then
  bounds how fast the rate moves.
- **Velocity form: no windup.** The controller's state is the rate itself, which
  is clamped to its bounds; there is no separate integral to wind up while the rate
  sits at ``--rps-max`` with the signal still below, so it leaves the bound at once
  when the signal comes back.
- **Aware of the signal's delay.** A change of the rate shows in the signal only
  after the signal's delay: the sample interval (direct) or the scrape interval plus
  half the rate window (Prometheus). The control interval is twice that delay (at
  least 1 s), so each step is judged on a signal that saw the previous one. The
  scrape interval is Prometheus' own, read from its targets API
  (:mod:`servemon.loadgen.run.promtargets`): assumed at 15 s, a Prometheus scraping
  every second got a change every 32 s. A queue read from Prometheus and KV usage are
  steered on counts of the client's own instead, which have no delay (below):
  every two samples, at least 2 s.
- **A queue through Prometheus: the client's count, calibrated.** A queued request
  has no first token yet, so the client's prompts with no answer are the server's
  queue (plus those in prefill) without the scrape's delay
  (:class:`~servemon.loadgen.drivers.control.signal.QueueEstimate`). The gauge, a scrape
  late, only gives the offset between them (other clients' traffic, requests in
  prefill, answers not streamed), averaged over intervals; the queue law steers
  the count plus the offset, which each tick records as ``steered``. On the real
  vLLM with a 1-s scrape, the gauge alone at 4-s intervals swung a queue of 96
  from 78 to 130 (59-71 % of ticks within ±15 %); the count at 2-s intervals held
  it at 94-97 %.
- **A cold start doubles (``waiting``, ``kv_cache_usage``).** From 1 req/s the
  careful step (x1.25 an interval) needs 14 intervals to reach 16 req/s: a
  minute at 4-s intervals, which is a user's whole first run. A queue and a cache
  fill stay near 0 until the rate is near what the server takes, so while the
  signal is under half the setpoint nothing is lost by doubling the rate each
  tick (``phase: start`` in each tick); the first reading at half the setpoint
  or more (a queue: the first of a mean of one, the server taking no more; or a
  mean of one of the client's own prompts with no answer yet, which shows the
  queue without the scrape's delay) hands over to the careful law for good
  (``hold``). The start's ticks are two samples long (at least 1 s) whatever the
  interval, since the client's count ends it in time. The careful law may undo
  the last
  doubling at once (down is safe), and ``--rps-max`` and the guard rails
  bound both. Doubling was chosen over a start from Little's law (the rate that
  would make the queue, from the measured service rate) because the service rate
  is not measurable until the server is saturated, which is what the start is
  looking for. Without the client's model of what its requests hold, KV usage
  doubles only while its requests live less than an interval (the gauge would
  show a doubling a lifetime late, after several more); with it, the model's step
  is taken, within x2. A TTFT or a burn rate has a floor well above 0 and a knee
  that doubling would jump past: no start phase.
- **Saturation.** A full cache reads 1.0 whether the backlog behind it is one
  request or a thousand: the integral step, at most ``0.15 x log(setpoint)`` a tick,
  would take tens of intervals to drain it and then overshoot the other way once
  the backlog is gone. While the ratio is at its ceiling the queue says how far over
  the rate is, so the queue law (towards no queue) sets an upper bound, and the
  integral step takes over from that rate when the ratio comes off its ceiling
  (the state is the rate, so the hand-over has no bump).
- **KV usage: the count in flight that holds it, held like a queue.** KV usage
  is what the running requests hold, so it answers a change of rate only as they
  are replaced, over about their lifetime, with the noise of how many happen to be
  in flight on top; and where the server's speed falls with its batch (a CPU, a
  GPU past its knee), each request sent makes the others live longer, so the usage
  a rate gives has no fixed gain: on vLLM's CPU build a law that predicted from the
  rate swung between an empty and a full cache (17 % of ticks within ±15 %,
  ``benchmarks/RESULTS.md``). The client knows the population without lag
  (:mod:`servemon.loadgen.drivers.control.held`): what each request in flight holds
  now, at
  the decode speed of the last seconds of recent streams. The law scales that
  model to the gauge (the ratio of their averages), turns the setpoint into the
  number of requests in flight that holds it (each holding its prompt and half its
  output), and holds that number with the queue law: what the server served (its
  mean over about two lifetimes, since completions echo the sends of a lifetime
  ago; at the start's hand-over, when that mean still lags the doublings, what the
  requests in flight complete a second by Little's law, at most the rate sent and
  twice the last interval's completions) plus the count's error spread over two
  intervals or half a lifetime, whichever is longer (faster re-forms cohorts of
  requests of one age). The count has no delay and the gauge only weighs it, so
  the interval is two of servemon's
  samples (at least 2 s) even through Prometheus, and the rate may double an
  interval, as in the start. Until a few requests have finished, the
  integral step with the proportional gain ``kp = ki * a / (1 - a)``,
  ``a = exp(-T / L)``, stands in. Tried before and measured short of it (on the
  simulator): a proportional gain for a single lag; a cascade whose outer loop
  integrated the gauge's error into the count's target (the count then overshot
  while the young requests' usage lagged); a receding-horizon predictor of the
  usage half a lifetime ahead (94 % on the simulator, 17 % on vLLM's CPU build).
- **TTFT far over: a backlog to drain.** Past twice the setpoint the p95 is a
  backlog of prompts that grows faster than the clamped integral step cuts (a
  server that got slower). The client knows that backlog without lag
  (:mod:`servemon.loadgen.drivers.control.backlog`: the prompts it sent with no
  first token yet), and the
  law drains it like a queue, at no less than half of what was served.
- **TTFT's bursts: a pace on the sends (``--pace``, off by default).** Poisson
  arrivals bunch, a bunch queues, and the window's p95 is the top few requests of
  the bunches: a law on the p95 hears of a bunch a window later, when it is over,
  and at a fixed rate the 30-s p95 is within ±15 % of its median only 67-80 % of
  the time. With ``--pace`` each gap is drawn at the law's rate times
  ``exp(-(b - b̄) / b̄)`` of the backlog ``b`` against its average over an
  interval, times ``exp(d / 2 s of sends)`` of the sends ``d`` owed to the law's
  rate (clamped to [0.25, 2]; not while draining): a bunch slows the sends behind
  it, a lull speeds them, what goes out is the law's rate within seconds, and the
  law on the p95 still sets the level. The sends stay open loop
  (none waits for an answer) but are less bursty than the ``--arrival`` asked
  for, which is why it is not the default. Every tick records ``pace`` (what went
  out over what was drawn at) and ``backlog``. KV usage is paced by default
  (``--no-pace`` turns it off), by the count of requests in flight after the start
  phase (:class:`~servemon.loadgen.drivers.control.backlog.InFlightPace`): Poisson
  arrivals swing
  that count, and the usage with it, by more than the ±15 % band. ``--pace`` with
  ``--hold waiting`` paces on the same prefill backlog as TTFT's (off by default:
  on vLLM it overshoots a short run's queue after the hand-over, docs/capacity.md).
- **Unreachable.** When the rate has sat at a bound for three intervals with the
  signal still off by more than the tolerance, the setpoint cannot be reached with
  these bounds; the run says so (once, and in every tick's ``state``) and holds the
  bound.
- **Blind.** A missing signal (no data, stale, Prometheus down) is never read as
  zero: the rate holds, the tick says ``blind``, and after ``--blind-timeout``
  seconds the run stops.

Every tick is a line of ``control.jsonl`` and the live ``servemon_client_control_*``
gauges; the result (share of ticks within ±15 % after the settle time) is in
``summary.json``.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import random
import time
from collections import deque
from collections.abc import Iterator

from servemon.loadgen.drivers.control.backlog import InFlightPace, Paced, PrefillBacklog
from servemon.loadgen.drivers.control.held import HeldTokens
from servemon.loadgen.drivers.control.law import (
    FAST_START,
    SATURATING,
    ControlLaw,
    control_interval,
)
from servemon.loadgen.drivers.control.signal import (
    ClientWindow,
    QueueEstimate,
    held_model,
    idle_floor,
    measure,
    window_mean,
)
from servemon.loadgen.drivers.openloop import open_loop, wait_for_start
from servemon.loadgen.record.runrecord import ControlResult
from servemon.loadgen.run.context import Drive, Driven
from servemon.loadgen.run.live import ControlGauges
from servemon.loadgen.run.plan import LOOPBACK_RPS_MAX
from servemon.loadgen.run.promtargets import DEFAULT_S as SCRAPE_DEFAULT_S
from servemon.loadgen.run.sections import ControlArgs, Signal, paces
from servemon.loadgen.send.arrivals import WAKE, Arrival, Due, Stage

__all__ = ["WAKE_EVERY_S", "drive_control"]

#: The longest wait between sends before the schedule reads the law's rate again.
WAKE_EVERY_S = 1.0


def _arrivals(
    law: ControlLaw,
    arrival: Arrival,
    seed: int,
    duration_s: float,
    paced: Paced | None = None,
) -> Iterator[Due]:
    """Open-loop sends at the law's current rate, for ``duration_s``: each gap is
    drawn at the rate of the moment it is drawn (times the pace, where there is
    one). A gap longer than :data:`WAKE_EVERY_S` is not waited out: the schedule
    wakes then (:data:`~servemon.loadgen.send.arrivals.WAKE`, nothing sent) and draws
    again at the rate of that moment. A vLLM run through Prometheus drew a gap at 0.125
    req/s (the hand-over's cut to ``--rps-min`` times the pace's least) and sent
    nothing for 22 s while the law raised the rate to 200 req/s."""
    rng = random.Random(f"{seed}:control")
    offset = 0.0
    for index in itertools.count():
        while True:
            rate, pacing = law.rate, False
            if paced is not None:
                if law.draining or (law.starting and not paced.paces_start):
                    paced.pacer.unpaced(time.monotonic())
                else:
                    rate *= paced.pace(time.monotonic(), rate)
                    pacing = True
            gap = arrival.gap(rng, rate)
            if gap <= WAKE_EVERY_S:
                break
            if pacing:
                assert paced is not None
                paced.pacer.woke()
            offset += WAKE_EVERY_S
            if offset > duration_s:
                return
            yield Due(WAKE, 0, offset)
        offset += gap
        if offset > duration_s:
            return
        yield Due(index, 0, offset)


async def drive_control(run: Drive[ControlArgs], found: Driven) -> None:
    """Hold the signal for ``--duration`` (see the module docstring)."""
    c, source, hooks = run.settings, run.source, run.sender.hooks
    signal, setpoint = c.hold.signal, c.hold.setpoint
    rps_max = run.sending.rps_max or LOOPBACK_RPS_MAX["control"]
    start_rate = c.rps_start if c.rps_start is not None else max(c.rps_min, 1.0)
    interval = control_interval(c.control_interval, source, signal)
    law = ControlLaw(
        signal=signal,
        setpoint=setpoint,
        rps_min=c.rps_min,
        rps_max=rps_max,
        rate=min(rps_max, max(c.rps_min, start_rate)),
        interval_s=interval,
    )
    window = ClientWindow(source.signal_window)
    hooks.sinks.append(window)
    held = None
    if signal == "kv_cache_usage":
        held = HeldTokens()
        hooks.sinks.append(held)
        hooks.starters.append(held.started)
    backlog = None
    if signal in ("ttft_p95", "waiting"):
        backlog = PrefillBacklog(tau_s=interval)
        hooks.starters.append(backlog.started)
        hooks.first_tokens.append(backlog.first_token)
        hooks.sinks.append(backlog)
    paced: Paced | None = None
    if paces(c.pace, signal):
        paced = backlog if held is None else InFlightPace.every(interval, held.inflight)
    record = run.board.stages[0]
    if held is not None:
        # What the cache holds before this run sends anything (other clients,
        # the server's own blocks), at most half the setpoint.
        idle = await idle_floor(run, signal, 2.0 * max(source.sample_interval, 1.0))
        law.floor = min(idle, setpoint / 2)
    start = await wait_for_start(run, found)
    if start is None:
        return
    gauges = run.board.control_gauges(signal)
    gauges.setpoint.set(setpoint)
    result = ControlResult(
        signal=signal,
        setpoint=setpoint,
        interval_s=interval,
        source="prometheus" if source.prometheus else "direct",
        settle_s=ControlResult.settle_for(c.duration, interval),
        paced=paced is not None,
    )
    found.control = result
    ticking = asyncio.create_task(
        _ticks(
            run,
            law,
            signal,
            interval,
            start,
            window,
            held,
            backlog,
            paced,
            result,
            gauges,
        )
    )
    try:
        found.interrupted = await open_loop(
            run,
            [Stage(0, law.rate, c.duration, 0.0)],
            seed=run.sending.seed,
            start_s=start,
            sends=_arrivals(law, run.arrival, run.sending.seed, c.duration, paced),
        )
    finally:
        ticking.cancel()
        await asyncio.gather(ticking, return_exceptions=True)
    mean = result.mean_offered_rps()
    record.target_rate = None if mean is None else round(mean, 2)


async def _ticks(
    run: Drive[ControlArgs],
    law: ControlLaw,
    signal: Signal,
    interval: float,
    start: float,
    window: ClientWindow,
    held: HeldTokens | None,
    backlog: PrefillBacklog | None,
    paced: Paced | None,
    result: ControlResult,
    gauges: ControlGauges,
) -> None:
    c, source = run.settings, run.source
    # The model of what the requests hold, sampled as often as the gauge, over the
    # window the gauge's samples of an interval describe (Prometheus: a scrape ago).
    modelled: deque[tuple[float, float]] = deque(maxlen=4096)
    # The start steps every two samples (at least 1 s), sooner than an interval
    # through Prometheus: it ends on the client's own count of unanswered prompts
    # too, which has no delay.
    start_every = interval
    if signal in FAST_START:
        start_every = min(interval, max(1.0, 2.0 * source.sample_interval))
    every = min(source.sample_interval, start_every / 4)
    # The client's prompts with no answer yet, sampled like the model.
    unanswered: deque[tuple[float, float]] = deque(maxlen=4096)
    estimate = QueueEstimate() if signal == "waiting" and source.prometheus else None
    # A value read from Prometheus was scraped half a scrape interval ago, on
    # average (a whole one biased the model's scale high while the gauge rose).
    scrape = source.scrape_interval or SCRAPE_DEFAULT_S
    lag = 0.0 if source.prometheus is None else scrape / 2
    blind_since: float | None = None
    warned = False
    tick_start = start
    sent_before = served_before = 0
    due = start
    while True:
        due += start_every if law.starting else interval
        if due > start + c.duration + 1e-6:
            return  # the schedule is over: the requests in flight drain unsteered
        while (now := time.monotonic()) < due:
            if held is not None and (tokens := held.held(now)) is not None:
                modelled.append((now, tokens))
            if backlog is not None and signal == "waiting":
                unanswered.append((now, backlog.count()))
            await asyncio.sleep(min(every, due - now))
        sent, served = run.sender.sent, window.served
        span = max(now - tick_start, 1e-9)
        achieved = (sent - sent_before) / span
        served_rps = (served - served_before) / span
        sent_before, served_before, tick_start = sent, served, now
        measured = measure(run, signal, now - span, now, window)
        lifetime = window.lifetime()
        offered = law.rate
        steered: float | None = None  # what the law steered, where not measured
        if measured is None:
            blind_since = blind_since if blind_since is not None else now
            state = "blind"
            if now - blind_since >= c.blind_timeout:
                run.abort(
                    f"blind: no fresh {signal} for {now - blind_since:.0f} s "
                    f"(--blind-timeout {c.blind_timeout:g})"
                )
        else:
            blind_since = None
            queue = None
            if signal in SATURATING:
                queue = measure(run, "waiting", now - interval, now, window)
            elif signal == "waiting":
                # The client's prompts with no answer yet, over the tick: a
                # queue the server's gauge shows a scrape later (ends the start).
                queue = window_mean(unanswered, now - span, now)
            elif backlog is not None:
                queue = backlog.count()  # the client's prompts with no answer yet
            model = None
            if held is not None:
                model = held_model(held, modelled, now, interval, lag)
            value = measured
            if estimate is not None and queue is not None:
                # Through Prometheus the law steers the queue now, not a scrape
                # ago: the client's count then (``seen``) calibrates the gauge.
                seen = window_mean(unanswered, now - span - lag, now - lag)
                if seen is not None:
                    value = steered = estimate.update(measured, seen, queue)
            offered = law.update(value, served_rps, queue, lifetime, model)
            state = "unreachable" if law.unreachable else "tracking"
            state = "draining" if law.draining else state
            if law.unreachable and not warned:
                warned = True
                bound = "--rps-max" if offered >= law.rps_max else "--rps-min"
                run.board.say(
                    f"servemon: warning: --hold {signal}={law.setpoint:g} is "
                    f"unreachable: at {bound} {offered:g} rps the {signal} is "
                    f"{measured:.3g}"
                )
                result.unreachable = (
                    f"at {bound} {offered:g} rps the {signal} stayed at {measured:.3g}"
                )
        gauges.measured.set(math.nan if measured is None else measured)
        gauges.offered.set(offered)
        gauges.achieved.set(achieved)
        line = {
            "t_s": round(now - run.board.origin_s, 3),
            "signal": signal,
            "setpoint": law.setpoint,
            "measured": measured,
            "offered_rps": offered,
            "achieved_rps": achieved,
            "served_rps": served_rps,
            "lifetime_s": lifetime,
            "gain": law.gain,
            "scale": law.scale,
            "in_flight": None if held is None else len(held.inflight),
            "in_flight_wanted": law.wanted_count,
            "floor": None if held is None else law.floor,
            "steered": steered,
            "pace": None if paced is None else paced.pacer.mean_pace(),
            "backlog": None if backlog is None else backlog.count(),
            "state": state,
            "phase": law.phase,
        }
        result.add(line, now - start)
        run.board.control_tick(line, offered)
