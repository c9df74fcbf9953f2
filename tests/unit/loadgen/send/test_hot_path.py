"""The load generator's hot path, made cheaper by hand: it must say the same.

Batched histogram updates against prometheus_client's own ``observe``; SSE event
parsing by orjson with the standard library behind it; the dispatcher's thread hop
that never sends early, on a kernel timer or a thread, and leaves nothing behind.
"""

from __future__ import annotations

import asyncio
import math
import os
import threading
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Histogram, generate_latest

from servemon.loadgen.run.live import observe_many
from servemon.loadgen.send.arrivals import Due
from servemon.loadgen.send.client import parse_event
from servemon.loadgen.send.dispatch import KernelTimer, OpenLoop

EDGES = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0]
gaps = st.lists(
    st.one_of(
        st.floats(min_value=0, max_value=2, allow_nan=False),
        st.sampled_from(EDGES),  # exactly on a bound: counted in that bucket
    ),
    max_size=200,
)


def _histogram() -> tuple[CollectorRegistry, Histogram]:
    registry = CollectorRegistry()
    h = Histogram("gap_seconds", "x", ["stage"], buckets=EDGES, registry=registry)
    return registry, h.labels("0")


@settings(max_examples=200, deadline=None)
@given(values=gaps)
def test_batched_observations_expose_what_one_at_a_time_does(
    values: list[float],
) -> None:
    one_reg, one = _histogram()
    many_reg, many = _histogram()
    for value in values:
        one.observe(value)
    observe_many(many, values)
    lines = [
        [x for x in generate_latest(r).decode().splitlines() if "_created" not in x]
        for r in (one_reg, many_reg)
    ]
    counts = [[x for x in ls if "_sum" not in x] for ls in lines]
    assert counts[0] == counts[1]
    sums = [float(next(x for x in ls if "_sum" in x).split()[-1]) for ls in lines]
    assert sums[1] == pytest.approx(sums[0], rel=1e-12, abs=1e-12)


def test_sse_events_parse_fast_and_still_read_what_orjson_refuses() -> None:
    assert parse_event('{"choices":[{"delta":{"content":"a"}}]}') == {
        "choices": [{"delta": {"content": "a"}}]
    }
    # Python's json writes NaN and Infinity (a logprob of -inf): still read.
    event = parse_event('{"logprob": -Infinity, "x": NaN, "n": 123456789012345678901}')
    assert event["logprob"] == -math.inf
    assert math.isnan(event["x"])
    assert event["n"] == 123456789012345678901
    with pytest.raises(ValueError, match="Expecting"):
        parse_event('{"choices": [')
    with pytest.raises(ValueError, match="nested too deeply"):
        parse_event("[" * 100_000 + "]" * 100_000)


@pytest.mark.parametrize("kernel_timer", [True, False])
@pytest.mark.parametrize("loop_name", ["asyncio", "uvloop"])
def test_the_dispatcher_never_sends_early_and_leaves_nothing_behind(
    loop_name: str, kernel_timer: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    if kernel_timer and not KernelTimer.available():
        pytest.skip("no timerfd here (not Linux)")
    if not kernel_timer:  # the thread that ends waits elsewhere
        monkeypatch.setattr(KernelTimer, "available", staticmethod(lambda: False))
    factory = asyncio.new_event_loop
    if loop_name == "uvloop":
        uvloop = pytest.importorskip("uvloop")
        factory = uvloop.new_event_loop
    with asyncio.Runner(loop_factory=factory) as warm:  # the loop's own fds, once
        warm.run(asyncio.sleep(0))
    fds = len(os.listdir("/proc/self/fd")) if os.path.isdir("/proc/self/fd") else 0
    sent: list[tuple[float, float]] = []
    ready: dict[int, float] = {}

    def prepare(due: Due) -> int:
        ready[due.index] = time.monotonic()
        return due.index * 10

    async def send(due: Due, at: float, prepared: object) -> None:
        sent.append((at, time.monotonic()))
        # Each request gets what its own prepare made, made before it is sent
        # (ahead of its time unless the loop was late: not asserted, a timing).
        assert prepared == due.index * 10
        assert ready[due.index] <= sent[-1][1]

    async def go() -> None:
        loop = OpenLoop(send, max_inflight=100, prepare=prepare)
        # gaps below and above the loop's millisecond timers, and two at once
        offsets = [0.0004, 0.0011, 0.0011, 0.004, 0.0093, 0.02, 0.0201, 0.05]
        schedule = [Due(i, 0, x) for i, x in enumerate(offsets)]
        await loop.run(schedule, time.monotonic() + 0.01)
        await asyncio.gather(*loop.tasks)

    with asyncio.Runner(loop_factory=factory) as runner:
        runner.run(go())
    assert len(sent) == 8
    assert all(actual >= at for at, actual in sent)  # never early
    if fds:
        assert len(os.listdir("/proc/self/fd")) == fds  # the timer's fd closed
    deadline = time.monotonic() + 5
    while any(t.name == "servemon-pacer" for t in threading.enumerate()):
        assert time.monotonic() < deadline, "the pacing thread outlived its run"
        time.sleep(0.01)
