"""The fake GPUs' power model: energy is exactly the integral of the power they
report, and the collector publishes it as a counter in joules."""

from __future__ import annotations

import logging
from dataclasses import replace

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from servemon.core import names
from servemon.monitor.fakegpu import DEMO_WATTS, FakeGpuReader, PowerSteps, SteadyPower
from servemon.monitor.gpu import GpuCollector, GpuSnapshot


class Clock:
    """Seconds a test sets."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_steady_power_counts_power_times_elapsed_exactly() -> None:
    clock = Clock()
    reader = FakeGpuReader(power_watts=300.0, gpus=2, clock=clock)
    first = reader.read()
    assert [g.energy_joules for g in first.gpus] == [0.0, 0.0]
    clock.now += 12.5
    snapshot = reader.read()
    assert snapshot.taken_s == clock.now
    assert [g.index for g in snapshot.gpus] == [0, 1]
    assert len({g.uuid for g in snapshot.gpus}) == 2
    for g in snapshot.gpus:
        assert g.power_watts == 300.0
        assert g.energy_joules == 300.0 * 12.5


def test_the_demo_gpu_draws_300_watts_and_counts_its_energy() -> None:
    clock = Clock()
    reader = FakeGpuReader(clock=clock)
    clock.now += 4
    (gpu,) = reader.read().gpus
    assert DEMO_WATTS == 300.0
    assert (gpu.power_watts, gpu.energy_joules) == (300.0, 1200.0)


def test_power_steps_integrate_exactly_across_steps() -> None:
    model = PowerSteps(((0.0, 100.0), (10.0, 400.0), (15.0, 50.0)))
    assert [model.watts(t) for t in (0, 9.5, 10, 14, 15, 100)] == [
        100.0,
        100.0,
        400.0,
        400.0,
        50.0,
        50.0,
    ]
    assert model.joules(0) == 0
    assert model.joules(10) == 1000.0
    assert model.joules(12) == 1000.0 + 800.0
    assert model.joules(20) == 1000.0 + 2000.0 + 250.0
    clock = Clock()
    reader = FakeGpuReader(power_watts=model, clock=clock)
    clock.now += 12
    (gpu,) = reader.read().gpus
    assert (gpu.power_watts, gpu.energy_joules) == (400.0, 1800.0)


def test_bad_power_steps_and_gpu_counts_are_refused() -> None:
    for steps in (
        (),
        ((1.0, 5.0),),
        ((0.0, 5.0), (0.0, 6.0)),
        ((0.0, 1), (5, 1), (2, 1)),
    ):
        with pytest.raises(ValueError, match="PowerSteps"):
            PowerSteps(steps)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="gpus"):
        FakeGpuReader(gpus=0)
    with pytest.raises(ValueError, match="gpus"):
        FakeGpuReader([GpuSnapshot(0.0, None, ())], gpus=2)


def test_given_snapshots_keep_their_values_without_a_power_model() -> None:
    reader = FakeGpuReader()
    (demo,) = reader.read().gpus
    fixed = FakeGpuReader([GpuSnapshot(0.0, None, (demo,))])
    clock = Clock()
    modelled = FakeGpuReader(
        [GpuSnapshot(0.0, None, (demo,))], power_watts=SteadyPower(50), clock=clock
    )
    clock.now += 2
    assert fixed.read().gpus == (demo,)
    (gpu,) = modelled.read().gpus
    assert (gpu.power_watts, gpu.energy_joules) == (50, 100)


@pytest.mark.asyncio
async def test_the_collector_publishes_the_fake_energy_as_a_joules_counter() -> None:
    clock = Clock()
    reader = FakeGpuReader(power_watts=250.0, gpus=2, clock=clock)
    collector = GpuCollector(reader)
    registry = CollectorRegistry(auto_describe=True)
    registry.register(collector)
    reader.open()
    clock.now += 8
    await collector.poll()
    for index in ("0", "1"):
        labels = {"gpu": index, "uuid": reader.read().gpus[int(index)].uuid}
        labels["name"] = "Fake GPU"
        assert registry.get_sample_value(names.GPU_ENERGY.name, labels) == 2000.0
        assert registry.get_sample_value(names.GPU_POWER.name, labels) == 250.0
    text = generate_latest(registry).decode()
    assert "# TYPE servemon_gpu_energy_joules_total counter" in text
    assert names.GPU_ENERGY.name == "servemon_gpu_energy_joules_total"


@pytest.mark.asyncio
async def test_a_gpu_without_energy_is_said_once_and_gets_no_series(
    caplog: pytest.LogCaptureFixture,
) -> None:
    (demo,) = FakeGpuReader().read().gpus
    old = replace(demo, index=1, uuid="GPU-old", name="Tesla P100", energy_joules=None)
    reader = FakeGpuReader([GpuSnapshot(0.0, None, (demo, old))])
    collector = GpuCollector(reader)
    registry = CollectorRegistry(auto_describe=True)
    registry.register(collector)
    with caplog.at_level(logging.WARNING):
        for _ in range(3):
            await collector.poll()
    assert [r.getMessage() for r in caplog.records] == [
        "GPU energy not readable on GPU 1 (Tesla P100): no "
        "servemon_gpu_energy_joules_total for it, and no energy per token or cost "
        "figures from it"
    ]
    ids = {"gpu": "1", "uuid": "GPU-old", "name": "Tesla P100"}
    assert registry.get_sample_value(names.GPU_ENERGY.name, ids) is None
    assert registry.get_sample_value(names.GPU_POWER.name, ids) == DEMO_WATTS
