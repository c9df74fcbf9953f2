"""A stage's energy: the counters' rise over its window, read between readings,
and the figures per token, per good request and per dollar made from it."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from typing import Any

import aiohttp
import pytest

from servemon.core.errors import ConfigError
from servemon.loadgen.record.energy import ENERGY_KEYS, Energy, EnergyCounters
from servemon.loadgen.record.summary import Summary
from servemon.loadgen.run.choices import parse_energy
from servemon.loadgen.run.energy import EnergyReading, EnergySampler, open_energy
from servemon.loadgen.run.flat import config_of
from servemon.loadgen.run.plan import make_plan
from servemon.monitor.fakegpu import FakeGpuReader

NO_PRICE = (None, None)


def counters(times: list[float], joules: list[float], gpus: int = 2) -> EnergyCounters:
    return EnergyCounters(
        "test", interval_s=1.0, times=list(times), joules=list(joules), gpus=gpus
    )


def test_a_linear_counter_gives_the_exact_rise_between_any_two_times() -> None:
    # 600 W from t=100: joules = 600 * (t - 100), read once a second.
    times = [100.0 + i for i in range(11)]
    s = counters(times, [600.0 * (t - 100.0) for t in times])
    energy = s.window((101.25, 107.5), NO_PRICE)
    assert energy is not None
    assert energy.joules == pytest.approx(600.0 * 6.25)
    assert energy.seconds == pytest.approx(6.25)
    assert energy.watts == pytest.approx(600.0)
    assert (energy.gpus, energy.source) == (2, "test")
    # Up to 1.5 intervals past the readings, from the nearest two.
    edge = s.window((99.0, 111.0), NO_PRICE)
    assert edge is not None
    assert edge.joules == pytest.approx(600.0 * 12.0)


@pytest.mark.parametrize(
    ("start", "end"),
    [(97.0, 105.0), (105.0, 112.0), (105.0, 104.0), (None, 105.0), (105.0, None)],
)
def test_a_window_the_readings_do_not_reach_has_no_energy(
    start: float | None, end: float | None
) -> None:
    times = [100.0 + i for i in range(11)]
    s = counters(times, [600.0 * (t - 100.0) for t in times])
    assert s.window((start, end), NO_PRICE) is None


def test_one_reading_is_not_enough() -> None:
    assert counters([100.0], [5.0]).window((99.5, 100.5), NO_PRICE) is None


@pytest.mark.asyncio
async def test_a_counter_reset_starts_the_readings_over() -> None:
    # Each reading a second younger than the last, so their times rise.
    queue: list[EnergyReading] = [(1000.0, 2, 2.0), (1600.0, 2, 1.0), (50.0, 2, 0.0)]

    async def read() -> EnergyReading:
        return queue.pop(0)

    s = EnergySampler(read, "test", lambda line: None)
    for _ in range(2):
        await s.sample_once()
    assert s.counters.joules == [1000.0, 1600.0]
    await s.sample_once()
    # The drop to 50 J is a reset (a driver reload): what came before is
    # forgotten, so no window can span it and come out negative.
    assert s.counters.joules == [50.0]
    assert len(s.counters.times) == 1
    first = s.counters.times[0]
    assert s.counters.window((first - 1.0, first), NO_PRICE) is None


@pytest.mark.asyncio
async def test_a_readings_age_moves_it_back_in_time_and_a_repeat_is_dropped() -> None:
    # An exporter's snapshot 3 s old was true 3 s ago; the same snapshot served
    # again (older by as much as time has passed) adds nothing.
    lines: list[Mapping[str, Any]] = []
    answers: list[EnergyReading] = [(500.0, 4, 3.0)]

    async def read() -> EnergyReading:
        return answers[0]

    s = EnergySampler(read, "test", lines.append)
    before = time.monotonic()
    await s.sample_once()
    after = time.monotonic()
    assert before - 3.0 <= s.counters.times[0] <= after - 3.0
    assert s.counters.gpus == 4
    assert lines == [
        {
            "mono_s": s.counters.times[0],
            "energy": {"joules": 500.0, "gpus": 4, "source": "test"},
        }
    ]
    answers[0] = (500.0, 4, 3.0 + (time.monotonic() - before) + 1.0)
    await s.sample_once()
    assert s.counters.times == [s.counters.times[0]]
    assert len(lines) == 1


@pytest.mark.asyncio
async def test_a_failed_reading_is_skipped() -> None:
    async def read() -> EnergyReading:
        raise TimeoutError

    s = EnergySampler(read, "test", lambda line: None)
    await s.sample_once()
    assert s.counters.times == []


def energy(**fields: Any) -> Energy:
    base: dict[str, Any] = {"joules": 7200.0, "seconds": 12.0, "gpus": 2}
    return Energy(source="test", **{**base, **fields})


def test_the_figures_per_token_and_per_good_request() -> None:
    e = energy()
    assert e.figure("watts", 3000.0, 40) == pytest.approx(600.0)
    assert e.figure("joules_per_token", 3000.0, 40) == pytest.approx(2.4)
    assert e.figure("joules_per_good", 3000.0, 40) == pytest.approx(180.0)
    # No price: no money figures, never a zero.
    assert e.cost is None
    assert e.figure("cost_per_mtok", 3000.0, 40) is None
    assert e.figure("cost_per_kgood", 3000.0, 40) is None
    with pytest.raises(KeyError):
        e.figure("watts_per_token", 3000.0, 40)


def test_a_gpu_price_counts_every_gpu_and_a_node_price_the_whole_target() -> None:
    per_gpu = energy(gpu_hour_cost=2.0)
    cost = 2.0 * 2 * 12.0 / 3600.0
    assert per_gpu.cost == pytest.approx(cost)
    assert per_gpu.figure("cost_per_mtok", 3000.0, 40) == pytest.approx(
        cost / 3000.0 * 1e6
    )
    assert per_gpu.figure("cost_per_kgood", 3000.0, 40) == pytest.approx(
        cost / 40 * 1e3
    )
    per_node = energy(node_hour_cost=9.0)
    assert per_node.cost == pytest.approx(9.0 * 12.0 / 3600.0)
    assert per_node.figure("cost_per_mtok", 3000.0, 40) == pytest.approx(
        9.0 * 12.0 / 3600.0 / 3000.0 * 1e6
    )


@pytest.mark.parametrize("key", ENERGY_KEYS[1:])
def test_nothing_produced_gives_no_figure_per_unit(key: str) -> None:
    e = energy(gpu_hour_cost=2.0)
    assert e.figure(key, 0.0, 0) is None


def test_a_window_of_no_length_has_no_power() -> None:
    assert energy(seconds=0.0).watts is None


def test_two_windows_add_joules_and_seconds() -> None:
    both = energy(gpus=1, gpu_hour_cost=2.0).plus(
        energy(joules=3600.0, seconds=6.0, gpus=2)
    )
    assert (both.joules, both.seconds, both.gpus) == (10800.0, 18.0, 2)
    assert both.gpu_hour_cost == 2.0
    assert both.watts == pytest.approx(600.0)


def test_energy_reads_back_from_its_json() -> None:
    e = energy(gpu_hour_cost=2.5)
    assert Energy.from_json(json.loads(json.dumps(e.to_json()))) == e
    assert Energy.from_json({**e.to_json(), "later_field": 1}) == e
    assert Energy.from_json(None) is None
    assert Energy.from_json({"joules": 1.0}) is None


def summary(energy_: Energy | None, goodput: float | None = None) -> Summary:
    return Summary(
        requests=50,
        outcomes={"ok": 40, "http_error": 10},
        duration_s=12.0,
        request_throughput=50 / 12.0,
        output_throughput=3000.0 / 12.0,
        mean_prompt_tokens=100.0,
        mean_output_tokens=75.0,
        goodput=goodput,
        energy=energy_,
    )


def test_a_summarys_energy_figures_use_its_ok_tokens_and_good_requests() -> None:
    s = summary(energy(gpu_hour_cost=2.0), goodput=30 / 12.0)
    # 40 ok requests x 75 output tokens; 30 good of them.
    assert s.value("joules_per_token") == pytest.approx(7200.0 / 3000.0)
    assert s.value("joules_per_good") == pytest.approx(7200.0 / 30)
    assert s.value("watts") == pytest.approx(600.0)
    assert s.value("cost_per_kgood") == pytest.approx(2 * 2 * 12 / 3600 / 30 * 1e3)
    # Without an SLO every ok request is good.
    assert summary(energy()).value("joules_per_good") == pytest.approx(7200.0 / 40)
    back = Summary.from_json(json.loads(json.dumps(s.to_json())))
    assert back.energy == s.energy
    assert back.value("cost_per_mtok") == s.value("cost_per_mtok")


@pytest.mark.parametrize("key", ENERGY_KEYS)
def test_a_summary_without_energy_has_none_of_its_figures(key: str) -> None:
    s = summary(None)
    assert s.value(key) is None
    assert json.loads(json.dumps(s.to_json()))["energy"] is None


@pytest.mark.parametrize(
    ("fields", "flag"),
    [
        ({"energy": "bogus"}, "--energy 'bogus'"),
        ({"energy": "ftp://host/metrics"}, "--energy"),
        ({"gpu_hour_cost": 2.0, "node_hour_cost": 9.0}, "--node-hour-cost"),
    ],
)
def test_a_bad_energy_flag_is_one_line_naming_it(
    fields: dict[str, Any], flag: str
) -> None:
    with pytest.raises(ConfigError) as info:
        make_plan("ramp", config_of("ramp", ("flags", fields)))
    message = str(info.value)
    assert message.startswith(flag)
    assert "\n" not in message


@pytest.mark.asyncio
async def test_the_same_snapshot_read_later_does_not_flatten_the_counter() -> None:
    # An exporter's snapshot read twice: the second time its age, measured a few
    # milliseconds apart from the read, puts it a little later. Kept, it would
    # make the counter flat there and the end of a stage past it read low.
    answers: list[EnergyReading] = [
        (1000.0, 2, 2.0),
        (1600.0, 2, 1.0),
        (1600.0, 2, 0.995),
    ]

    async def read() -> EnergyReading:
        return answers.pop(0)

    s = EnergySampler(read, "test", lambda line: None)
    for _ in range(3):
        await s.sample_once()
    assert s.counters.joules == [1000.0, 1600.0]
    last = s.counters.times[-1]
    energy = s.counters.window((last - 1.0, last + 0.5), NO_PRICE)
    assert energy is not None
    assert energy.watts == pytest.approx(600.0, rel=0.01)


@pytest.mark.asyncio
async def test_a_counter_that_stands_still_for_an_interval_is_a_new_reading() -> None:
    # A GPU at 0 W: the same total a whole interval later is news.
    answers: list[EnergyReading] = [(1000.0, 1, 2.0), (1000.0, 1, 1.0)]

    async def read() -> EnergyReading:
        return answers.pop(0)

    s = EnergySampler(read, "test", lambda line: None, interval_s=1.0)
    for _ in range(2):
        await s.sample_once()
    assert s.counters.joules == [1000.0, 1000.0]


async def _nvml_energy(reader: FakeGpuReader) -> tuple[EnergySampler | None, str]:
    async with aiohttp.ClientSession() as session:
        return await open_energy(
            parse_energy("nvml"),
            session=session,
            target_is_local=True,
            prometheus=None,
            select=(),
            prom_headers={},
            sink=lambda line: None,
            interval_s=1.0,
            nvml=lambda: reader,
        )


@pytest.mark.asyncio
async def test_an_nvml_read_that_fails_is_said_once_and_never_ends_the_run() -> None:
    """NVML that opens but cannot read (a driver gone away) is the one line at the
    start, and a read failing later is a skipped reading, not an exception out of
    the run."""
    broken = FakeGpuReader(power_watts=300.0, fail_read="driver gone")
    found, said = await _nvml_energy(broken)
    assert found is None
    assert said == "energy: not measured (nvml: driver gone)"

    flaky = FakeGpuReader(power_watts=300.0)
    found, said = await _nvml_energy(flaky)
    assert found is not None
    assert said == "energy: the target's GPU energy counters from nvml"
    kept = len(found.counters.times)
    flaky.fail_read = "driver gone"
    await found.sample_once()
    assert len(found.counters.times) == kept
