"""The client's model of what its requests in flight hold in the KV cache, and the
predictive law for ``--hold kv_cache_usage`` that steers on it."""

from __future__ import annotations

import math
import random

import pytest

from servemon.loadgen.drivers.controllaw import HORIZON_LIFETIMES, TOLERANCE, ControlLaw
from servemon.loadgen.drivers.heldtokens import (
    MIN_FINISHED,
    Forecast,
    HeldTokens,
    tail_speed,
)
from servemon.loadgen.send.timing import Outcome, RequestTiming


def _done(
    request_id: str,
    sent: float,
    ttft: float,
    e2e: float,
    output: int,
    prompt: int | None = 100,
    outcome: Outcome = Outcome.OK,
    chunks: tuple[float, ...] | None = None,
) -> RequestTiming:
    """A finished request; its chunks evenly from the first token to the end
    unless given."""
    if chunks is None:
        gap = (e2e - ttft) / max(1, output - 1)
        chunks = tuple(sent + ttft + i * gap for i in range(output))
    return RequestTiming(
        request_id=request_id,
        scheduled_s=sent,
        sent_s=sent,
        end_s=sent + e2e,
        outcome=outcome,
        content_s=chunks,
        output_tokens=output,
        prompt_tokens=prompt,
    )


def test_the_decode_speed_is_the_streams_last_seconds() -> None:
    """20 tokens a second for 5 s, then 10: a server that slowed shows in the
    last seconds of the stream, not in its mean."""
    chunks = [i / 20 for i in range(100)] + [5 + i / 10 for i in range(1, 51)]
    timing = _done("r", 0.0, 0.0, 10.0, 150, chunks=tuple(chunks))
    assert tail_speed(timing, 4.0) == pytest.approx(10.0, rel=0.03)
    assert tail_speed(timing, 60.0) == pytest.approx(149 / 10.0)
    assert tail_speed(_done("one", 0.0, 0.1, 0.1, 1), 4.0) is None


def test_the_model_learns_the_requests_shape_and_forecasts_what_they_hold() -> None:
    held = HeldTokens(tail_s=20.0)
    # 0.5 s to the first token, then 100 more at 10 a second: 10.5 s each.
    for i in range(MIN_FINISHED - 1):
        held.started(f"d{i}", 0.0, 100)
        held(_done(f"d{i}", 0.0, 0.5, 10.5, 101))
    held(_done("x", 0.0, 0.1, 0.2, 0, outcome=Outcome.HTTP_ERROR))  # learns nothing
    assert held.shape() is None
    assert held.held(20.0) is None
    held(_done(f"d{MIN_FINISHED}", 0.0, 0.5, 10.5, 101))
    shape = held.shape()
    assert shape is not None
    assert shape.decode_tps == pytest.approx(10.0)
    assert shape.lifetime_s == pytest.approx(0.5 + 101 / 10.0)
    assert not held.inflight  # the finished ones are gone
    now = 100.0
    held.started("new", now, 100)  # its prompt only
    held.started("mid", now - 5.5, None)  # prompt unknown: the mean, and 50 made
    held.started("old", now - 10.0, 300)  # 300 + 95 made
    assert held.held(now) == pytest.approx(100 + 150 + 395)
    forecast = held.forecast(now, 2.0)
    assert forecast is not None
    # In 2 s: 115 and 170; the old one will have finished.
    assert forecast.at_horizon == pytest.approx(115 + 170)
    # Sent at 1/s over 2 s: the integral of 100 + 10 (a - 0.5) past 0.5 s.
    assert forecast.per_rps == pytest.approx(200 + 10 * 1.5**2 / 2, rel=1e-3)
    assert forecast.rate_for(285 + 2 * forecast.per_rps) == pytest.approx(2.0)


def test_the_predictive_law_acts_before_the_gauge_moves() -> None:
    """The gauge reads the setpoint, but the young requests in flight will hold
    half as much again: the law cuts now; on the gauge alone it would not move."""
    law = ControlLaw("kv_cache_usage", 0.7, 0.5, 1000.0, rate=10.0, interval_s=4.0)
    tokens_per_usage = 100_000.0
    modelled = 0.7 * tokens_per_usage
    growing = Forecast(12.0, at_horizon=1.5 * modelled, per_rps=1000.0)
    assert law.update(0.7, 10.0, None, 25.0, (modelled, growing)) == 5.0
    assert law.scale == pytest.approx(1 / tokens_per_usage)
    blind = ControlLaw("kv_cache_usage", 0.7, 0.5, 1000.0, rate=10.0, interval_s=4.0)
    assert blind.update(0.7, 10.0, None, 25.0) == pytest.approx(10.0)
    # Steady: what is held ahead plus what the rate adds is the setpoint.
    steady = Forecast(12.0, at_horizon=modelled - 5.0 * 1000.0, per_rps=1000.0)
    assert law.update(0.7, 5.0, None, 25.0, (modelled, steady)) == pytest.approx(5.0)


def _population(seed: int, predictive: bool) -> list[float]:
    """Poisson arrivals of 256-token prompts decoding 512 tokens (about 26 s each)
    into a cache of 80,000 tokens in 16-token blocks, decoding 30 % slower from
    half time; KV usage sampled every 0.5 s, steered every 4 s to 0.7
    (``predictive``) or sent at the fixed rate that holds 0.7 before the change.
    Returns each interval's mean usage."""
    rng = random.Random(seed)
    interval, sample, duration = 4.0, 0.5, 600.0
    law = ControlLaw("kv_cache_usage", 0.7, 0.1, 100.0, rate=2.0, interval_s=interval)
    held = HeldTokens()
    # id -> [sent, first token, tokens made], and its chunks' times
    running: dict[str, list[float]] = {}
    chunks: dict[str, list[float]] = {}
    prompt, output = 256, 512
    t, arrive, n = 0.0, rng.expovariate(law.rate), 0
    gauge: list[float] = []
    model: list[float] = []
    means = []
    while t < duration:
        t += sample
        decode = 20.0 if t < duration / 2 else 14.0
        while arrive <= t:
            running[f"r{n}"] = [arrive, arrive + 0.2, 0.0]
            chunks[f"r{n}"] = []
            held.started(f"r{n}", arrive, prompt)
            n += 1
            arrive += rng.expovariate(law.rate if predictive else 4.2)
        for rid, r in list(running.items()):
            # Each token at its own time, at the speed of the moment.
            begin, old = max(t - sample, r[1]), r[2]
            made = min(output, old + max(0.0, t - begin) * decode)
            times = chunks[rid]
            times += [
                begin + (k - old) / decode for k in range(len(times) + 1, int(made) + 1)
            ]
            r[2] = made
            if made >= output:
                del running[rid]
                done = tuple(chunks.pop(rid))
                e2e = done[-1] - r[0]
                held(_done(rid, r[0], r[1] - r[0], e2e, output, prompt, chunks=done))
        blocks = sum(math.ceil((prompt + r[2]) / 16) for r in running.values())
        gauge.append(blocks * 16 / 80_000)
        model.append(held.held(t) or 0.0)
        if round(t / sample) % round(interval / sample):
            continue
        measured = sum(gauge) / len(gauge)
        means.append(measured)
        shape = held.shape()
        forecast = None
        if shape is not None:
            horizon = max(interval, HORIZON_LIFETIMES * shape.lifetime_s)
            forecast = held.forecast(t, horizon)
        mean_model = sum(model) / len(model)
        law.update(
            measured,
            law.rate,
            None,
            None if shape is None else shape.lifetime_s,
            None if forecast is None else (mean_model, forecast),
        )
        gauge, model = [], []
    return means


def test_the_model_holds_kv_usage_through_the_noise_of_arrivals_and_a_slowdown() -> (
    None
):
    """A fixed rate holds the mean but not the noise of how many requests are in
    flight (nor a slower server); the predictive law holds both."""
    for seed in range(3):
        judged = [m for i, m in enumerate(_population(seed, True)) if i >= 20]
        within = sum(abs(m - 0.7) <= TOLERANCE * 0.7 for m in judged) / len(judged)
        assert within >= 0.9, seed
        fixed = [m for i, m in enumerate(_population(seed, False)) if i >= 20]
        open_loop = sum(abs(m - 0.7) <= TOLERANCE * 0.7 for m in fixed) / len(fixed)
        assert open_loop < within - 0.2, seed
