"""A source that is missing at the start of a run (a fresh Prometheus, an exporter
still starting) is tried again every round; the record says from when it was read,
and no stage that started before its first reading gets an energy figure."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Mapping
from types import SimpleNamespace
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
from aiohttp import web

from servemon.embedded import free_port
from servemon.loadgen.record.energy import EnergyCounters
from servemon.loadgen.record.sections import EnergyRecord
from servemon.loadgen.run import energy
from servemon.loadgen.run.choices import parse_energy
from servemon.loadgen.run.energy import (
    EnergyReading,
    EnergySampler,
    late_line,
    never_line,
    open_energy,
)
from servemon.loadgen.run.firstread import FirstRead
from servemon.loadgen.run.sampler import ServerSampler

NO_PRICE = (None, None)


def test_the_first_read_counts_tries_up_to_the_first_that_worked() -> None:
    first = FirstRead()
    assert (first.first_read_s(100.0), first.tries) == (None, 0)
    assert not first.tried(101.0, ok=False)
    assert not first.tried(102.0, ok=False)
    assert first.tried(103.25, ok=True)
    # Later tries, failed or not, change nothing.
    assert not first.tried(104.0, ok=True)
    assert not first.tried(105.0, ok=False)
    assert (first.first_read_s(100.0), first.tries) == (3.25, 3)


def late_counters() -> EnergyCounters:
    """600 W read every second from t=110, a source that came late."""
    c = EnergyCounters("test", interval_s=1.0)
    for i in range(11):
        t = 110.0 + i
        c.add(t, 600.0 * (t - 100.0), 2, starts_late=i == 0)
    return c


def test_no_window_that_starts_before_a_late_sources_first_reading_has_energy() -> None:
    c = late_counters()
    assert c.known_from == 110.0
    # A second before it is within the 1.5 intervals a window's end may lie
    # outside the readings, but nothing was read there: not measured.
    assert c.window((109.0, 115.0), NO_PRICE) is None
    assert c.window((100.0, 120.0), NO_PRICE) is None
    # From it on, as ever (the end may still lie past the last reading).
    energy = c.window((110.0, 121.0), NO_PRICE)
    assert energy is not None
    assert energy.watts == pytest.approx(600.0)
    assert energy.joules == pytest.approx(600.0 * 11.0)


def test_a_rebuilt_summary_reads_the_late_start_from_the_lines() -> None:
    lines: list[Mapping[str, Any]] = [
        {"mono_s": 110.0, "energy": {"joules": 6000.0, "gpus": 2, "source": "x"}},
        {"mono_s": 111.0, "energy": {"joules": 6600.0, "gpus": 2, "source": "x"}},
        {"mono_s": 112.0, "energy": {"joules": 7200.0, "gpus": 2, "source": "x"}},
    ]
    on_time = EnergyCounters.from_lines(lines, 1.0)
    assert on_time is not None
    assert on_time.known_from is None  # an older record: as it always read
    assert on_time.window((109.0, 112.0), NO_PRICE) is not None
    first = {**lines[0], "energy": {**lines[0]["energy"], "starts_late": True}}
    late = EnergyCounters.from_lines([first, *lines[1:]], 1.0)
    assert late is not None
    assert late.known_from == 110.0
    assert late.window((109.0, 112.0), NO_PRICE) is None
    assert late.window((110.5, 112.0), NO_PRICE) is not None


@pytest.mark.asyncio
async def test_a_source_that_answers_later_is_read_from_then_on() -> None:
    answers: list[EnergyReading | str] = ["no data yet", "no data yet"]
    answers += [(1000.0, 2, 0.0), (1600.0, 2, 0.0)]

    async def read() -> EnergyReading:
        answer = answers.pop(0)
        if isinstance(answer, str):
            raise aiohttp.ClientConnectionError(answer)
        return answer

    lines: list[Mapping[str, Any]] = []
    called: list[EnergySampler] = []
    s = EnergySampler(read, "test", lines.append, on_late_start=called.append)
    s.late = True
    for _ in range(2):
        await s.sample_once()
    assert s.first.at is None
    assert s.why == "ClientConnectionError: no data yet"
    assert never_line(s) == (
        "energy: not measured (test: not read in 2 tries; the last: "
        "ClientConnectionError: no data yet)"
    )
    await s.sample_once()
    await s.sample_once()
    assert called == [s]  # once, at the first reading
    assert s.first.tries == 3
    assert [line["energy"].get("starts_late") for line in lines] == [True, None]
    assert s.counters.known_from == lines[0]["mono_s"]
    assert s.record(s.first.at or 0.0, "said") == EnergyRecord("test", 0.0, 3, "said")
    assert late_line(s, s.first.at or 0.0).startswith(
        "energy: read from 0.0 s on (the target's GPU energy counters from test, "
        "after 3 tries"
    )


EXPOSITION = (
    "# TYPE servemon_gpu_energy_joules_total counter\n"
    'servemon_gpu_energy_joules_total{gpu="0"} 1000\n'
    'servemon_gpu_energy_joules_total{gpu="1"} 1000\n'
)


@pytest_asyncio.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(trust_env=False) as s:
        yield s


async def serve(port: int, handler: Any) -> web.AppRunner:
    app = web.Application()
    app.router.add_get("/metrics", handler)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner


@pytest.mark.asyncio
async def test_an_exporter_not_up_at_the_start_is_tried_again(
    session: aiohttp.ClientSession,
) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}/metrics"
    sampler, said = await open_energy(
        parse_energy(url),
        session=session,
        target_is_local=False,
        prometheus=None,
        select=(),
        prom_headers={},
        sink=lambda line: None,
        interval_s=1.0,
    )
    assert sampler is not None
    assert sampler.late
    assert said.startswith(f"energy: not read yet (exporter {url}: Client")
    assert said.endswith(f"trying exporter {url} again every 1 s while the run sends")
    assert sampler.first.tries == 1

    async def metrics(request: web.Request) -> web.Response:
        return web.Response(text=EXPOSITION)

    runner = await serve(port, metrics)
    try:
        await sampler.sample_once()
    finally:
        await runner.cleanup()
    assert sampler.first.tries == 2
    assert sampler.counters.joules == [2000.0]
    assert sampler.counters.known_from == sampler.counters.times[0]


@pytest.mark.asyncio
async def test_a_source_there_at_the_start_is_not_late(
    session: aiohttp.ClientSession,
) -> None:
    async def metrics(request: web.Request) -> web.Response:
        return web.Response(text=EXPOSITION)

    port = free_port()
    runner = await serve(port, metrics)
    lines: list[Mapping[str, Any]] = []
    try:
        sampler, said = await open_energy(
            parse_energy(f"http://127.0.0.1:{port}/metrics"),
            session=session,
            target_is_local=False,
            prometheus=None,
            select=(),
            prom_headers={},
            sink=lines.append,
            interval_s=1.0,
        )
    finally:
        await runner.cleanup()
    assert sampler is not None
    assert not sampler.late
    assert said == (
        "energy: the target's GPU energy counters from exporter "
        f"http://127.0.0.1:{port}/metrics"
    )
    assert sampler.first.tries == 1
    assert "starts_late" not in lines[0]["energy"]
    assert sampler.counters.known_from is None


@pytest.mark.asyncio
async def test_the_server_sampler_says_when_its_first_scrape_worked(
    session: aiohttp.ClientSession,
) -> None:
    statuses = [503, 200]

    async def metrics(request: web.Request) -> web.Response:
        return web.Response(
            status=statuses.pop(0), text="vllm:num_requests_running 1\n"
        )

    port = free_port()
    runner = await serve(port, metrics)
    try:
        sampler = ServerSampler(
            session, f"http://127.0.0.1:{port}/metrics", lambda line: None
        )
        assert await sampler.sample_once() is None
        assert sampler.first.at is None
        assert await sampler.sample_once() is not None
    finally:
        await runner.cleanup()
    assert sampler.first.tries == 2
    assert sampler.first.at is not None


@pytest.mark.asyncio
async def test_the_end_is_read_until_a_reading_is_past_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A source whose samples are 1.5 s old (Prometheus's last scrape and the
    exporter's snapshot): the run's last read lies before its end, so the sampler
    reads on until one is past it, and no longer."""
    clock = {"now": 100.0}
    reads: list[float] = []

    async def read() -> EnergyReading:
        reads.append(clock["now"])
        clock["now"] += 1.0  # each read (and the wait before the next) moves it on
        return 600.0 * clock["now"], 2, 1.5

    monkeypatch.setattr(energy, "time", SimpleNamespace(monotonic=lambda: clock["now"]))
    s = EnergySampler(read, "test", lambda _: None, interval_s=0.04)
    await s.read_past(101.0, within_s=10.0)
    # Readings stamped 99.5 and 100.5 (short of 101), then 101.5: three, no more.
    assert reads == [100.0, 101.0, 102.0]
    assert s.counters.times == [99.5, 100.5, 101.5]


@pytest.mark.asyncio
async def test_a_source_that_stops_answering_is_read_at_the_end_for_a_bound() -> None:
    answered: list[float] = []
    tries = []

    async def read() -> EnergyReading:
        tries.append(time.monotonic())
        if answered:
            raise aiohttp.ClientConnectionError("gone")
        answered.append(time.monotonic())
        return 600.0, 2, 0.0

    s = EnergySampler(read, "test", lambda _: None, interval_s=0.04)
    await s.sample_once()
    began = time.monotonic()
    await s.read_past(began + 60, within_s=0.2)
    assert time.monotonic() - began >= 0.2
    assert len(tries) >= 3
    assert len(s.counters.times) == len(answered) == 1


@pytest.mark.asyncio
async def test_a_source_never_read_gets_one_try_at_the_end() -> None:
    """Prometheus without the energy series: a first reading at the end would
    complete no stage, so the run does not wait for one."""

    async def read() -> EnergyReading:
        raise aiohttp.ClientConnectionError("no series")

    s = EnergySampler(read, "test", lambda _: None, interval_s=1.0)
    await s.read_past(time.monotonic() + 60, within_s=3.0)
    assert s.first.tries == 1
    assert s.counters.times == []
