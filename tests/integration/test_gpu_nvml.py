"""The real NvmlReader and GpuCollector on a machine with NVML and a GPU.

Skipped where NVML can't start (no library, no driver or no GPU).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from servemon.core import names
from servemon.monitor.gpu import THROTTLE_REASONS, GpuCollector, GpuUnavailable
from servemon.monitor.nvml import NvmlReader

pytestmark = pytest.mark.gpu


@pytest.fixture
def nvml() -> Iterator[NvmlReader]:
    """An open NvmlReader, or a skip saying why there is none."""
    reader = NvmlReader()
    try:
        reader.open()
    except GpuUnavailable as exc:
        pytest.skip(str(exc))
    yield reader
    reader.close()


def test_real_read_is_in_base_units(nvml: NvmlReader) -> None:
    snapshot = nvml.read()
    assert snapshot.gpus
    assert snapshot.driver_version
    for index, gpu in enumerate(snapshot.gpus):
        assert gpu.index == index
        assert gpu.uuid.startswith(("GPU-", "MIG-"))
        assert gpu.name
        for ratio in (gpu.utilization_ratio, gpu.memory_utilization_ratio):
            assert ratio is None or 0 <= ratio <= 1
        assert gpu.memory_total_bytes is not None
        assert gpu.memory_total_bytes > 2**30  # bytes, not MiB
        assert gpu.memory_used_bytes is not None
        assert 0 <= gpu.memory_used_bytes <= gpu.memory_total_bytes
        if gpu.power_watts is not None:
            assert 1 < gpu.power_watts < 2000  # watts, not mW
        if gpu.power_limit_watts is not None:
            assert 10 < gpu.power_limit_watts < 2000
        if gpu.sm_clock_hertz is not None:
            assert gpu.sm_clock_hertz == 0 or gpu.sm_clock_hertz > 1e7  # Hz, not MHz
        if gpu.temperature_celsius is not None:
            assert 0 < gpu.temperature_celsius < 120
        if gpu.throttle_reasons is not None:
            assert set(gpu.throttle_reasons) <= set(THROTTLE_REASONS)
        for process in gpu.processes:
            assert process.pid > 0


def test_real_energy_counter_is_joules_and_grows_with_power(nvml: NvmlReader) -> None:
    """On Volta and newer NVML counts energy since the driver loaded (mJ): in joules
    it grows over two seconds by about the power the GPU draws (an idle GPU too)."""
    first = nvml.read()
    time.sleep(2.0)
    second = nvml.read()
    counted = [
        (a, b)
        for a, b in zip(first.gpus, second.gpus, strict=True)
        if a.energy_joules is not None and b.energy_joules is not None
    ]
    if not counted:
        pytest.skip("no GPU here has an energy counter (before Volta)")
    for a, b in counted:
        assert a.energy_joules is not None
        assert b.energy_joules is not None
        assert b.energy_joules >= a.energy_joules >= 0
        seconds = second.taken_s - first.taken_s
        mean_watts = (b.energy_joules - a.energy_joules) / seconds
        assert 1 < mean_watts < 2000, mean_watts  # watts: not mJ/s, not kJ/s
        if a.power_watts is not None and b.power_watts is not None:
            low, high = sorted((a.power_watts, b.power_watts))
            assert low / 3 < mean_watts < high * 3, (mean_watts, low, high)


@pytest.mark.asyncio
async def test_collector_serves_real_gpus(
    nvml: NvmlReader, poll_until: Callable[..., Awaitable[Any]]
) -> None:
    has_energy = any(g.energy_joules is not None for g in nvml.read().gpus)
    nvml.close()  # the collector opens its own
    collector = GpuCollector(NvmlReader(), interval_s=0.1)
    registry = CollectorRegistry()
    registry.register(collector)

    def up() -> bool:
        return registry.get_sample_value(names.GPU_UP.name) == 1

    task = asyncio.create_task(collector.run())
    try:
        await poll_until(up, timeout=20, what="servemon_gpu_up 1")
        families = {family.name for family in registry.collect()}
        assert names.GPU_MEMORY_TOTAL.name in families
        assert names.GPU_SAMPLE_AGE.name in families
        if has_energy:
            assert names.GPU_ENERGY.base in families  # a counter: no _total here
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
