"""``servemon control``: hold a server signal at a setpoint by steering the offered
open-loop rate.

The run is one stage of ``--duration`` seconds. Requests go out open loop (the
seeded ``--arrival`` process) at a rate the law
(:class:`~servemon.loadgen.drivers.control.law.ControlLaw`) sets every control
interval from the measured signal (``--hold waiting=8``, ``kv_cache_usage=0.8``,
``ttft_p95=0.4``, ``burn_rate=1``, ``gpu_utilization=0.9``). This module owns the
run around the law: it reads the signal, ticks the law, paces the sends, stops a
blind or unreachable hold, and writes every tick as a line of ``control.jsonl`` and
the live ``servemon_client_control_*`` gauges; the result (share of ticks within
±15 % after the settle time) is in ``summary.json``.

Why the law has its shape, and the measurements that chose it: docs/capacity.md,
"Why the law has this shape"; the runs: benchmarks/results/control.md.
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
