"""``servemon control`` without a server: the control law against simple plants
(a queue, a monotone map), the ``--hold`` and ``--select`` languages, the signal
queries, and the Prometheus sampler against a stand-in for Prometheus' HTTP API
over a real socket (missing, stale and failing answers are never zero)."""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import Callable, Mapping
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from servemon.core.errors import ConfigError
from servemon.core.signals import SIGNALS, parse_selector, queries
from servemon.loadgen.drivers.control.driver import _arrivals
from servemon.loadgen.drivers.control.law import (
    KP_MAX,
    ControlLaw,
    control_interval,
)
from servemon.loadgen.drivers.control.signal import QueueEstimate
from servemon.loadgen.run.config import (
    Kind,
    LoadConfig,
    paces,
    parse_hold,
    settings_of,
)
from servemon.loadgen.run.context import SignalSource
from servemon.loadgen.run.flat import config_of
from servemon.loadgen.run.plan import make_plan
from servemon.loadgen.run.promsource import PrometheusSampler
from servemon.loadgen.send.arrivals import WAKE, Arrival, Due
from servemon.loadgen.send.dispatch import OpenLoop


def test_the_queue_law_holds_a_queue_whatever_the_servers_speed() -> None:
    """A fluid queue served at ``capacity`` a second: the law brings it to the
    setpoint from below and from above, for a slow and for a fast server alike
    (the gain does not depend on the server's speed)."""
    for capacity in (5.0, 50.0, 500.0):
        law = ControlLaw("waiting", 20.0, 0.5, 10_000.0, rate=1.0, interval_s=2.0)
        queue = 0.0
        for _ in range(60):
            served = min(capacity, law.rate + queue / law.interval_s)
            queue = max(0.0, queue + (law.rate - served) * law.interval_s)
            law.update(queue, served)
        assert queue == pytest.approx(20.0, rel=0.05), capacity
        assert law.rate == pytest.approx(capacity, rel=0.05)
        queue = 20.0 + 20 * capacity  # a burst of 20 s of work: back down
        for _ in range(30):
            served = min(capacity, law.rate + queue / law.interval_s)
            queue = max(0.0, queue + (law.rate - served) * law.interval_s)
            law.update(queue, served)
        assert queue == pytest.approx(20.0, rel=0.1), capacity


def _settle(
    law: ControlLaw, plant: Callable[[float], float], ticks: int = 80
) -> list[float]:
    seen = []
    for _ in range(ticks):
        measured = plant(law.rate)
        seen.append(measured)
        law.update(measured, law.rate)
    return seen


def test_the_log_pi_law_settles_on_a_monotone_signal_without_oscillating() -> None:
    """KV usage proportional to the rate, TTFT that climbs steeply past a knee."""
    kv = ControlLaw("kv_cache_usage", 0.7, 0.5, 1000.0, rate=1.0, interval_s=4.0)
    seen = _settle(kv, lambda r: min(1.0, r / 40.0))
    assert seen[-1] == pytest.approx(0.7, rel=0.02)
    assert max(seen[-20:]) - min(seen[-20:]) < 0.01
    ttft = ControlLaw("ttft_p95", 0.4, 0.5, 1000.0, rate=1.0, interval_s=10.0)
    knee = lambda r: 0.05 + 0.05 * r / max(1e-3, 30.0 - r) if r < 30 else 60.0  # noqa: E731
    seen = _settle(ttft, knee)
    assert seen[-1] == pytest.approx(0.4, rel=0.05)


def _lagged_kv(law: ControlLaw, lifetime_s: float, tell: bool) -> list[float]:
    """KV usage that follows ``rate / 40`` with the requests' lifetime as its lag."""
    a = math.exp(-law.interval_s / lifetime_s)
    kv, seen = 0.0, []
    for _ in range(120):
        kv = a * kv + (1 - a) * min(1.0, law.rate / 40.0)
        seen.append(kv)
        law.update(kv, law.rate, 0.0, lifetime_s if tell else None)
    return seen


def test_kv_usage_behind_long_lived_requests_settles_without_overshoot() -> None:
    """Requests living ten intervals: the integral step alone overshoots out of
    the ±15 % band; with the lifetime the lag is cancelled, and requests shorter
    than an interval get (almost) no proportional gain."""
    blind = _lagged_kv(
        ControlLaw("kv_cache_usage", 0.7, 0.5, 1000.0, rate=1.0, interval_s=4.0),
        40.0,
        tell=False,
    )
    assert max(blind) > 0.7 * 1.15
    law = ControlLaw("kv_cache_usage", 0.7, 0.5, 1000.0, rate=1.0, interval_s=4.0)
    told = _lagged_kv(law, 40.0, tell=True)
    assert max(told) < 0.7 * 1.05
    assert all(abs(x - 0.7) <= 0.7 * 0.15 for x in told[40:])
    assert law.gain == KP_MAX
    assert law.proportional_gain(2.0) < 0.03
    ttft = ControlLaw("ttft_p95", 0.4, 0.5, 1000.0, rate=1.0, interval_s=4.0)
    assert ttft.proportional_gain(40.0) == 0.0


def _full_cache(law: ControlLaw, queue: float, know_queue: bool) -> list[float]:
    """A server that completes at most 40 requests/s, each holding the cache for 3 s
    (120 requests fill it): KV usage is rate / 40 below that and 1.0 while a backlog
    waits; returns KV usage tick by tick."""
    seen = []
    for _ in range(60):
        served = min(40.0, law.rate + queue / law.interval_s)
        queue = max(0.0, queue + (law.rate - served) * law.interval_s)
        kv = 1.0 if queue > 0 else min(1.0, served * 3.0 / 120.0)
        seen.append(kv)
        law.update(kv, served, queue if know_queue else None)
    return seen


def test_a_full_cache_drains_its_backlog_on_the_queue_then_holds_kv() -> None:
    """At the ceiling KV usage hides the backlog: the law steers on the queue
    (towards none) while the cache is full, then on KV usage, and gets there far
    sooner than with the integral step alone."""
    law = ControlLaw("kv_cache_usage", 0.7, 0.5, 1000.0, rate=60.0, interval_s=4.0)
    seen = _full_cache(law, queue=400.0, know_queue=True)
    full = sum(kv >= 0.95 for kv in seen)
    assert full <= 12  # 400 requests of backlog, drained at 40 - 0.7 x 40 a second
    assert all(kv >= 0.95 for kv in seen[:full])
    # Handed over where the ratio sits by Little's law: no undershoot, no collapse.
    assert min(seen[full:]) >= 0.6
    assert seen[-1] == pytest.approx(0.7, rel=0.03)
    blind = ControlLaw("kv_cache_usage", 0.7, 0.5, 1000.0, rate=60.0, interval_s=4.0)
    slow = _full_cache(blind, 400.0, know_queue=False)  # no queue series
    assert sum(kv >= 0.95 for kv in slow) > full
    assert slow[-1] == pytest.approx(0.7, rel=0.05)
    # Below the ceiling the queue is not read: the integral step alone.
    calm = ControlLaw("kv_cache_usage", 0.7, 0.5, 1000.0, rate=10.0, interval_s=4.0)
    calm.update(0.3, 10.0, 50.0)
    assert not calm.draining
    assert calm.rate > 10.0


def _slower_prefill(law: ControlLaw, know_backlog: bool) -> list[float]:
    """A server whose prefill serves 10 prompts a second, offered 14 (it was
    faster): TTFT is the wait at the knee plus the backlog's, its p95 read over
    the last three intervals (a 30-s window at 10-s intervals)."""
    capacity, backlog, recent, seen = 10.0, 0.0, [], []
    for _ in range(60):
        served = min(law.rate + backlog / law.interval_s, capacity)
        backlog = max(0.0, backlog + (law.rate - served) * law.interval_s)
        r = min(law.rate, 0.99 * capacity)
        recent = [*recent[-2:], 0.05 + 0.05 * r / (capacity - r) + backlog / capacity]
        p95 = max(recent)
        seen.append(p95)
        law.update(p95, served, backlog if know_backlog else None)
    return seen


def test_a_ttft_far_over_drains_the_clients_backlog_then_holds() -> None:
    """Past twice its setpoint TTFT is a queue of prompts: the law drains the
    client's backlog (towards none, at no less than half of what was served),
    where the clamped integral step alone lets it grow for minutes."""
    drained = _slower_prefill(
        ControlLaw("ttft_p95", 0.4, 0.5, 1000.0, rate=14.0, interval_s=10.0), True
    )
    stepped = _slower_prefill(
        ControlLaw("ttft_p95", 0.4, 0.5, 1000.0, rate=14.0, interval_s=10.0), False
    )
    over = [sum(v > 0.8 for v in seen) for seen in (drained, stepped)]
    assert over[0] < over[1]
    # ...and it drains no deeper than it must: no undershoot once it is gone.
    assert min(drained[over[0] :]) > 0.6 * 0.4 > min(stepped[over[1] :])

    def back(seen: list[float]) -> int:
        return next(i for i, v in enumerate(seen) if i > 3 and abs(v - 0.4) <= 0.06)

    assert back(drained) < back(stepped)
    assert drained[-1] == pytest.approx(0.4, rel=0.1)
    assert all(abs(v - 0.4) <= 0.06 for v in drained[-20:])


def test_the_rate_stays_in_its_bounds_and_an_unreachable_setpoint_is_said() -> None:
    law = ControlLaw("kv_cache_usage", 0.9, 1.0, 10.0, rate=5.0, interval_s=2.0)
    for _ in range(10):
        law.update(0.1, law.rate)  # however little KV the server uses
    assert law.rate == 10.0
    assert law.unreachable
    law.update(0.95, law.rate)  # the signal came back: no windup to unwind
    assert law.rate < 10.0
    assert not law.unreachable
    up = ControlLaw("waiting", 8.0, 1.0, 100.0, rate=4.0, interval_s=2.0)
    up.starting = False  # past the start: the careful law
    before = up.rate
    up.update(0.0, 4.0)
    assert up.rate <= before * 1.5  # rate-limited steps
    start = ControlLaw("waiting", 8.0, 1.0, 10.0, rate=4.0, interval_s=2.0)
    start.update(0.0, 4.0)
    assert start.rate == 8.0  # the start doubles, within --rps-max
    start.update(0.0, 8.0)
    assert start.rate == 10.0
    start.update(0.0, 10.0)
    assert start.phase == "hold"  # at --rps-max: nothing left to start
    assert start.rate == 10.0


def _queue_from_cold(law: ControlLaw, capacity: float) -> int:
    """Intervals until a fluid queue served at ``capacity`` reaches half the
    setpoint."""
    queue, ticks = 0.0, 0
    while queue < law.setpoint / 2 and ticks < 100:
        ticks += 1
        served = min(capacity, law.rate + queue / law.interval_s)
        queue = max(0.0, queue + (law.rate - served) * law.interval_s)
        law.update(queue, served)
    return ticks


def test_a_cold_start_doubles_until_the_signal_is_near_then_holds() -> None:
    """From 1 req/s to a server that takes 50: the careful step (x1.25) needs 18
    intervals to get there; the start's doublings 6, then the queue law takes over
    and settles on the setpoint without a lasting overshoot."""
    careful = ControlLaw("waiting", 6.0, 0.5, 1000.0, rate=1.0, interval_s=4.0)
    careful.starting = False
    fast = ControlLaw("waiting", 6.0, 0.5, 1000.0, rate=1.0, interval_s=4.0)
    assert fast.phase == "start"
    slow_ticks = _queue_from_cold(careful, 50.0)
    fast_ticks = _queue_from_cold(fast, 50.0)
    assert fast_ticks <= 7 < slow_ticks
    assert fast.phase == "hold"
    queue = 3.0
    for _ in range(30):
        served = min(50.0, fast.rate + queue / fast.interval_s)
        queue = max(0.0, queue + (fast.rate - served) * fast.interval_s)
        fast.update(queue, served)
        assert fast.phase == "hold"  # the start never comes back
    assert queue == pytest.approx(6.0, rel=0.1)


def test_the_hand_over_may_undo_the_last_doubling_at_once() -> None:
    """The start doubled past what the server takes: the first careful step goes
    straight to the queue law's rate; a law that never doubled steps down x0.5."""
    law = ControlLaw("waiting", 8.0, 0.5, 1000.0, rate=1.0, interval_s=4.0)
    law.update(0.0, 1.0)
    law.update(0.0, 2.0)
    assert law.rate == 4.0
    law.update(10.0, 1.0)  # served 1/s, a queue of 10: the queue law wants 0.75
    assert law.phase == "hold"
    assert law.rate == pytest.approx(0.75)
    busy = ControlLaw("waiting", 8.0, 0.5, 1000.0, rate=4.0, interval_s=4.0)
    busy.update(10.0, 1.0)  # a server busy before the run: no doubling to undo
    assert busy.rate == 2.0


def test_the_first_queue_ends_the_start() -> None:
    """A queue forms only once the server takes no more: a mean of one waiting
    hands over however far the setpoint is (one doubling more went to 80 req/s
    on a fleet that takes 41, and the queue overshot to 2.7 times 48)."""
    law = ControlLaw("waiting", 48.0, 0.5, 1000.0, rate=40.0, interval_s=4.0)
    law.update(0.5, 40.0)
    assert law.phase == "start"
    assert law.rate == 80.0
    law = ControlLaw("waiting", 48.0, 0.5, 1000.0, rate=40.0, interval_s=4.0)
    law.update(2.5, 39.5)
    assert law.phase == "hold"
    assert law.rate <= 50.0  # the careful law: x1.25 at most, not x2
    # Through Prometheus the gauge is a scrape late; the client's own prompts
    # with no answer yet (a mean of one over the tick) end the start as well.
    law = ControlLaw("waiting", 48.0, 0.5, 1000.0, rate=40.0, interval_s=4.0)
    law.update(0.0, 39.5, 1.5)
    assert law.phase == "hold"
    law = ControlLaw("waiting", 48.0, 0.5, 1000.0, rate=40.0, interval_s=4.0)
    law.update(0.0, 40.0, 0.4)
    assert law.phase == "start"


def test_kv_usage_starts_fast_only_where_the_gauge_keeps_up() -> None:
    """Without the client's model, a cache fill doubles while requests live less
    than an interval; with long-lived ones (the gauge a lifetime late) the start
    keeps the careful step, so it cannot double past the setpoint unseen."""
    short = ControlLaw("kv_cache_usage", 0.7, 0.5, 1000.0, rate=1.0, interval_s=4.0)
    short.update(0.01, 1.0, 0.0, 2.0)
    assert short.rate == 2.0
    long = ControlLaw("kv_cache_usage", 0.7, 0.5, 1000.0, rate=1.0, interval_s=4.0)
    long.update(0.01, 1.0, 0.0, 25.0)
    assert long.rate == pytest.approx(1.25)
    unknown = ControlLaw("kv_cache_usage", 0.7, 0.5, 1000.0, rate=1.0, interval_s=4.0)
    unknown.update(0.01, 1.0)
    assert unknown.rate == pytest.approx(math.exp(0.15))  # the integral step
    assert short.phase == long.phase == "start"
    short.update(0.4, 2.0, 0.0, 2.0)  # past half the setpoint: the careful law
    assert short.phase == "hold"
    assert short.rate <= 2.0 * 1.25


def test_the_start_is_only_for_a_queue_and_a_cache_fill() -> None:
    ttft = ControlLaw("ttft_p95", 0.4, 0.5, 1000.0, rate=1.0, interval_s=10.0)
    ttft.update(0.05, 1.0)
    assert ttft.phase == "hold"
    assert ttft.rate == pytest.approx(math.exp(0.15))


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("waiting", "expected SIGNAL=SETPOINT"),
        ("queue=8", "expected SIGNAL=SETPOINT"),
        ("waiting=-1", "must be a number > 0"),
        ("waiting=x", "must be a number > 0"),
        ("kv_cache_usage=1.2", "a ratio below 1"),
    ],
)
def test_a_bad_hold_is_one_line_naming_it(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_hold(text)


def test_control_checks_its_settings_before_anything_starts() -> None:
    def check(kind: Kind, **fields: Any) -> None:
        make_plan(kind, config_of(kind, ("flags", fields)))

    check("control", hold="waiting=8")
    with pytest.raises(ConfigError, match="--hold: control needs"):
        check("control")
    with pytest.raises(ConfigError, match="give --prometheus"):
        check("control", hold="gpu_utilization=0.9")
    with pytest.raises(ConfigError, match="--select: picks series in Prometheus"):
        check("ramp", select='model="q"')
    with pytest.raises(
        ConfigError, match="flags: --hold: only servemon control takes it, not ramp"
    ):
        check("ramp", hold="waiting=8")
    check("control", hold="ttft_p95=0.4", pace=True)
    check("control", hold="kv_cache_usage=0.5", pace=True)
    check("control", hold="waiting=8", pace=True)
    with pytest.raises(ConfigError, match="--pace: paces the sends of --hold ttft_p95"):
        check("control", hold="burn_rate=2", prometheus="http://p:9090", pace=True)
    with pytest.raises(
        ConfigError, match="--pace: only servemon control takes it, not ramp"
    ):
        check("ramp", pace=True)
    check("control", hold="waiting=8", pace=False)  # --no-pace: nothing to refuse
    # KV usage is paced unless --no-pace; TTFT only with --pace.
    assert paces(None, "kv_cache_usage")
    assert not paces(False, "kv_cache_usage")
    assert not paces(None, "ttft_p95")
    assert paces(True, "ttft_p95")
    assert not paces(None, "waiting")
    with pytest.raises(ConfigError, match="expected an http"):
        check("capacity", slo="ttft_p95<=1", prometheus="localhost:9090")

    # The interval follows the signal's delay: a scrape and half the rate window.
    def source(**values: Any) -> SignalSource:
        return settings_of(SignalSource, LoadConfig(**values))

    direct = source()
    assert control_interval(None, direct, "waiting") == 2.0
    assert control_interval(5.0, direct, "waiting") == 5.0  # --control-interval
    prom = source(prometheus="http://p:9090", scrape_interval=15.0)
    assert control_interval(None, prom, "ttft_p95") == 62.0  # scrape, poll, window
    # A queue through Prometheus and KV usage steer counts of the client's own:
    # two samples, however late the gauge.
    assert control_interval(None, prom, "waiting") == 2.0
    assert control_interval(None, prom, "kv_cache_usage") == 2.0
    slow = source(sample_interval=1.5)
    assert control_interval(None, slow, "kv_cache_usage") == 3.0


def test_a_selector_is_label_matchers_or_a_one_line_error() -> None:
    assert parse_selector('model="qwen", target=~"pool-a.*"') == (
        'model="qwen"',
        'target=~"pool-a.*"',
    )
    assert parse_selector('{job!="x",a!~"b c"}') == ('job!="x"', 'a!~"b c"')
    assert parse_selector(None) == ()
    for bad in ("model=qwen", 'model="q" target="t"', "up"):
        with pytest.raises(ConfigError, match="--select"):
            parse_selector(bad)


def test_every_signal_query_carries_the_selector_and_a_freshness_query() -> None:
    found = queries(('target=~"pool-a.*"',), 30)
    assert tuple(found) == SIGNALS
    for query in found.values():
        assert 'target=~"pool-a.*"' in query.value
        assert 'target=~"pool-a.*"' in query.age
        assert query.age.startswith("time() - max (timestamp(")
    assert found["ttft_p95"].value.startswith("histogram_quantile(0.95, ")
    assert "[30s]" in found["error_rate"].value


def test_the_burn_rate_signal_reads_the_generated_rules() -> None:
    import re

    from servemon.core.signals import BURN_RATE_RECORDS
    from servemon.dashboards.rule_names import burn_rate_name
    from servemon.dashboards.slos import LatencySlo

    slo = LatencySlo(name="ttft", objective=0.99, figure="ttft", threshold=0.5)
    for window in (300, 3600, 5):  # whatever windows the rules were written with
        assert re.fullmatch(BURN_RATE_RECORDS, burn_rate_name(slo, window))


class FakePrometheus:
    """Answers ``/api/v1/query`` from a table of query -> value (None: no series),
    or fails every query when ``down`` is set."""

    def __init__(self) -> None:
        self.values: dict[str, float | None] = {}
        self.ages: float | None = 1.0
        self.down = False
        self.refused: set[str] = set()  # queries answered 422, as a bad one is
        self.auth: list[str | None] = []

    async def handle(self, request: web.Request) -> web.Response:
        self.auth.append(request.headers.get("Authorization"))
        if self.down:
            return web.json_response(
                {"status": "error", "error": "queries are failing"}, status=503
            )
        query = request.query["query"]
        if any(part in query for part in self.refused):
            return web.json_response(
                {"status": "error", "errorType": "execution", "error": "bad"},
                status=422,
            )
        if query.startswith("time() - "):
            value = self.ages
        else:
            value = next((v for k, v in self.values.items() if k in query), None)
        result = [] if value is None else [{"metric": {}, "value": [0, str(value)]}]
        return web.json_response(
            {"status": "success", "data": {"resultType": "vector", "result": result}}
        )


def test_prometheus_signals_missing_stale_or_down_are_never_zero() -> None:
    fake = FakePrometheus()
    fake.refused = {"burn_rate"}
    fake.values = {
        "servemon_engine_requests_waiting": 7.0,
        "servemon_engine_kv_cache_usage_ratio": 0.5,
        "servemon_engine_ttft_seconds_bucket": float("nan"),
    }
    lines: list[Mapping[str, Any]] = []

    async def go() -> list[dict[str, float | None] | None]:
        app = web.Application()
        app.router.add_get("/api/v1/query", fake.handle)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        got = []
        try:
            async with aiohttp.ClientSession() as session:
                sampler = PrometheusSampler(
                    session,
                    f"http://127.0.0.1:{port}",
                    queries(('model="q"',), 30),
                    lines.append,
                    stale_after_s=30.0,
                    headers={"Authorization": "Bearer s3cret"},
                )
                got.append(await sampler.sample_once())
                fake.ages = 90.0  # every series stopped being scraped
                got.append(await sampler.sample_once())
                fake.down = True
                got.append(await sampler.sample_once())
        finally:
            await runner.cleanup()
        return got

    fresh, stale, down = asyncio.run(asyncio.wait_for(go(), 20))
    assert fresh is not None
    assert fresh["waiting"] == 7.0
    assert fresh["kv_cache_usage"] == 0.5
    assert fresh["gpu_utilization"] is None  # no series: missing, not 0
    assert fresh["ttft_p95"] is None  # NaN (no requests in the window): missing
    assert lines[0]["missing"]["gpu_utilization"] == "no data"
    # A query Prometheus refuses loses its own signal, not the others.
    assert lines[0]["missing"]["burn_rate"] == "query refused: HTTP 422: bad"
    assert lines[0]["samples"] == [
        ["servemon_engine_requests_waiting", {}, 7.0],
        ["servemon_engine_kv_cache_usage_ratio", {}, 0.5],
    ]
    assert stale is not None
    assert stale["waiting"] is None
    assert lines[1]["missing"]["waiting"] == "stale: 90 s old"
    assert lines[1]["samples"] == []
    assert down is None
    assert "queries are failing" in lines[2]["error"]
    assert set(fake.auth) == {"Bearer s3cret"}
    assert "s3cret" not in json.dumps(lines)


def test_without_a_queue_the_law_grows_from_the_rate_not_the_noisy_count() -> None:
    """No queue: the server took all it was sent, so an interval that counted fewer
    completions (Poisson, a 2-s interval) does not pull the rate down."""
    law = ControlLaw("waiting", 4.0, 0.5, 1000.0, rate=8.0, interval_s=2.0)
    law.starting = False
    law.update(0.0, 6.0)  # 0.75 of the rate completed, no queue
    assert law.rate == pytest.approx(8.0 + 4.0 / 4.0)
    queued = ControlLaw("waiting", 4.0, 0.5, 1000.0, rate=8.0, interval_s=2.0)
    queued.starting = False
    queued.update(2.0, 6.0)  # a queue: the server's count is its rate
    assert queued.rate == pytest.approx(6.0 + 2.0 / 4.0)


def test_a_queue_through_prometheus_is_the_clients_count_and_the_gauges_offset() -> (
    None
):
    """The gauge a scrape late read 40 while the client had 45 prompts with no
    answer (5 in prefill): the queue now is the client's count less 5; traffic of
    other clients, 20 more than the count, is learnt over a few intervals."""
    estimate = QueueEstimate()
    assert estimate.update(40.0, 45.0, 80.0) == 75.0
    for _ in range(20):
        queue = estimate.update(65.0, 45.0, 45.0)
    assert queue == pytest.approx(65.0, abs=0.1)
    assert estimate.update(0.0, 90.0, 0.0) == 0.0  # never below an empty queue


def test_a_gap_drawn_at_a_low_rate_is_not_waited_out() -> None:
    """``servemon control`` draws each gap at the rate of the moment; one drawn at
    0.05 req/s is 20 s on average, and a law that raises the rate meanwhile must
    not wait for it: the schedule wakes every second (sending nothing, using no
    request index) and draws again at the rate then."""
    law = ControlLaw("waiting", 8.0, 0.05, 1000.0, rate=0.05, interval_s=2.0)
    dues = _arrivals(law, Arrival("poisson"), seed=1, duration_s=60.0)
    woken = [next(dues) for _ in range(3)]
    assert [(d.index, d.offset_s) for d in woken] == [
        (WAKE, 1.0),
        (WAKE, 2.0),
        (WAKE, 3.0),
    ]
    law.rate = 100.0
    sent = [next(dues) for _ in range(50)]
    assert [d.index for d in sent] == list(range(50))
    assert 3.0 < sent[0].offset_s < 3.2
    assert 40 < 50 / (sent[-1].offset_s - 3.0) < 160  # sent at about the new rate


@pytest.mark.asyncio
async def test_the_dispatcher_sends_nothing_at_a_wake_up() -> None:
    sent: list[int] = []

    async def send(due: Due, at: float, _: object) -> None:
        sent.append(due.index)

    loop = OpenLoop(send, max_inflight=10)
    schedule = [Due(WAKE, 0, 0.0), Due(0, 0, 0.01), Due(WAKE, 0, 0.02), Due(1, 0, 0.03)]
    await loop.run(schedule, time.monotonic())
    await asyncio.gather(*loop.tasks)
    assert sent == [0, 1]
    assert loop.counts.sent[0] == 2
