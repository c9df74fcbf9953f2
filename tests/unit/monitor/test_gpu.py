"""The GPU collector over a FakeGpuReader, and NvmlReader over a fake pynvml module."""

from __future__ import annotations

import asyncio
import ctypes
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.openmetrics.exposition import (
    generate_latest as generate_openmetrics,
)
from prometheus_client.openmetrics.parser import (
    text_string_to_metric_families as parse_openmetrics,
)
from prometheus_client.parser import text_string_to_metric_families

from servemon.core import names
from servemon.monitor.fakegpu import FakeGpuReader
from servemon.monitor.gpu import (
    THROTTLE_REASONS,
    GpuCollector,
    GpuProcess,
    GpuSample,
    GpuSnapshot,
    GpuUnavailable,
)
from servemon.monitor.nvml import NvmlReader

Poll = Callable[..., Awaitable[Any]]
GiB = 2**30


def gpu(index: int, **fields: Any) -> GpuSample:
    """A GPU with every field set; ``fields`` override."""
    values: dict[str, Any] = {
        "index": index,
        "uuid": f"GPU-{index}",
        "name": "NVIDIA H100 80GB HBM3",
        "utilization_ratio": 0.87,
        "memory_utilization_ratio": 0.4,
        "memory_used_bytes": 70 * GiB,
        "memory_total_bytes": 80 * GiB,
        "power_watts": 512.5,
        "power_limit_watts": 700.0,
        "temperature_celsius": 61.0,
        "sm_clock_hertz": 1.98e9,
        "memory_clock_hertz": 2.619e9,
        "throttle_reasons": {"gpu_idle": False, "sw_power_cap": True},
        "pcie_rx_bytes_per_second": 1024.0 * 1000,
        "pcie_tx_bytes_per_second": 1024.0 * 2000,
        "ecc_corrected_total": 3,
        "ecc_uncorrected_total": 0,
        "processes": (GpuProcess(4242, "python3", 68 * GiB),),
        "memory_bandwidth_peak_bytes_per_second": 3.35232e12,
        "energy_joules": 1_234_567.891,
    }
    return GpuSample(**{**values, **fields})


TWO_GPUS = GpuSnapshot(
    taken_s=0.0,
    driver_version="570.86.15",
    gpus=(
        gpu(0),
        gpu(  # an older board: no PCIe counters, no ECC, throttle reasons unknown
            1,
            uuid="GPU-1",
            name="NVIDIA A10",
            utilization_ratio=0.0,
            pcie_rx_bytes_per_second=None,
            pcie_tx_bytes_per_second=None,
            ecc_corrected_total=None,
            ecc_uncorrected_total=None,
            throttle_reasons=None,
            energy_joules=None,  # before Volta: no energy counter
            processes=(
                GpuProcess(7, "vllm", 10 * GiB),
                GpuProcess(8, "ghost", None),  # memory unknown: no series
            ),
        ),
    ),
)


class Clock:
    """``time.monotonic()`` plus an offset a test moves forward."""

    def __init__(self) -> None:
        self.offset = 0.0

    def __call__(self) -> float:
        return time.monotonic() + self.offset


def registry_of(collector: GpuCollector) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=True)
    registry.register(collector)
    return registry


def value(registry: CollectorRegistry, series: names.Series, **labels: str) -> Any:
    return registry.get_sample_value(series.name, labels)


def sample_names(registry: CollectorRegistry) -> set[str]:
    return {s.name for family in registry.collect() for s in family.samples}


async def polled(
    snapshots: Sequence[GpuSnapshot] = (TWO_GPUS,), **kwargs: Any
) -> tuple[GpuCollector, FakeGpuReader, CollectorRegistry]:
    """A collector over a fake reader after one poll step."""
    reader = FakeGpuReader(snapshots)
    collector = GpuCollector(reader, **kwargs)
    reader.open()
    await collector.poll()
    return collector, reader, registry_of(collector)


# -- the collector ------------------------------------------------------------------


@pytest.mark.asyncio
async def test_every_family_from_two_gpus_with_values_and_labels() -> None:
    _, _, registry = await polled()
    h100 = {"gpu": "0", "uuid": "GPU-0", "name": "NVIDIA H100 80GB HBM3"}
    a10 = {"gpu": "1", "uuid": "GPU-1", "name": "NVIDIA A10"}
    assert value(registry, names.GPU_UP) == 1
    assert 0 <= value(registry, names.GPU_SAMPLE_AGE) < 60
    for ids in (h100, a10):
        assert value(registry, names.GPU_MEMORY_UTILIZATION, **ids) == 0.4
        assert value(registry, names.GPU_MEMORY_USED, **ids) == 70 * GiB
        assert value(registry, names.GPU_MEMORY_TOTAL, **ids) == 80 * GiB
        assert value(registry, names.GPU_POWER, **ids) == 512.5
        assert value(registry, names.GPU_POWER_LIMIT, **ids) == 700
        assert value(registry, names.GPU_TEMPERATURE, **ids) == 61
        assert value(registry, names.GPU_SM_CLOCK, **ids) == 1.98e9
        assert value(registry, names.GPU_MEMORY_CLOCK, **ids) == 2.619e9
    assert value(registry, names.GPU_UTILIZATION, **h100) == 0.87
    assert value(registry, names.GPU_UTILIZATION, **a10) == 0.0
    assert value(registry, names.GPU_PCIE_RX, **h100) == 1_024_000
    assert value(registry, names.GPU_PCIE_TX, **h100) == 2_048_000
    assert value(registry, names.GPU_THROTTLE, **h100, reason="sw_power_cap") == 1
    assert value(registry, names.GPU_THROTTLE, **h100, reason="gpu_idle") == 0
    assert value(registry, names.GPU_ECC_ERRORS, **h100, type="corrected") == 3
    assert value(registry, names.GPU_ECC_ERRORS, **h100, type="uncorrected") == 0
    assert value(registry, names.GPU_ENERGY, **h100) == 1_234_567.891
    assert value(registry, names.GPU_ENERGY, **a10) is None  # never a made-up 0
    process = names.GPU_PROCESS_MEMORY
    assert value(registry, process, **h100, pid="4242", process="python3") == 68 * GiB
    assert value(registry, process, **a10, pid="7", process="vllm") == 10 * GiB
    # None values publish nothing: the A10 has no PCIe, ECC, throttle or ghost series.
    for series in (names.GPU_PCIE_RX, names.GPU_PCIE_TX, names.GPU_THROTTLE):
        families = [f for f in registry.collect() if f.name == series.base]
        assert {s.labels["gpu"] for f in families for s in f.samples} == {"0"}
    assert value(registry, names.GPU_ECC_ERRORS, **a10, type="corrected") is None
    assert value(registry, process, **a10, pid="8", process="ghost") is None


@pytest.mark.asyncio
async def test_every_name_type_and_label_set_comes_from_the_table() -> None:
    _, _, registry = await polled()
    table = {series.base: series for series in names.GPU_SERIES}
    seen = set()
    for family in registry.collect():
        series = table[family.name]
        assert family.type == series.kind
        assert family.documentation == series.doc
        for sample in family.samples:
            assert sample.name == series.name
            assert tuple(sample.labels) == series.labels
        seen.add(series)
    assert seen == set(names.GPU_SERIES)


@pytest.mark.asyncio
async def test_exposition_parses_in_both_formats() -> None:
    _, _, registry = await polled()
    text = generate_latest(registry).decode()
    parsed = {s.name for f in text_string_to_metric_families(text) for s in f.samples}
    assert parsed == sample_names(registry)
    assert "servemon_gpu_ecc_errors_total{" in text
    assert "# TYPE servemon_gpu_energy_joules_total counter" in text
    assert 'servemon_gpu_energy_joules_total{gpu="0",' in text
    openmetrics = generate_openmetrics(registry).decode()
    assert {f.name for f in parse_openmetrics(openmetrics)} == {
        s.base.removesuffix("_total") for s in names.GPU_SERIES
    }


@pytest.mark.asyncio
async def test_reader_none_publishes_only_gpu_up_zero() -> None:
    collector = GpuCollector(None)
    await asyncio.wait_for(collector.run(), timeout=5)  # returns at once
    await collector.poll()
    registry = registry_of(collector)
    assert sample_names(registry) == {names.GPU_UP.name}
    assert value(registry, names.GPU_UP) == 0


@pytest.mark.asyncio
async def test_open_failure_logs_one_warning_and_keeps_gpu_up_zero(
    caplog: pytest.LogCaptureFixture,
) -> None:
    reader = FakeGpuReader(fail_open="NVML unavailable: NVML Shared Library Not Found")
    collector = GpuCollector(reader, interval_s=0.001)
    registry = registry_of(collector)
    with caplog.at_level(logging.DEBUG):
        await asyncio.wait_for(collector.run(), timeout=5)  # gives up, returns
        for _ in range(3):
            assert sample_names(registry) == {names.GPU_UP.name}
            assert value(registry, names.GPU_UP) == 0
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1
    message = warnings[0].getMessage()
    assert "NVML Shared Library Not Found" in message
    assert "\n" not in message
    assert (reader.opens, reader.reads) == (1, 0)


@pytest.mark.asyncio
async def test_open_that_raises_anything_is_also_gpu_up_zero(
    caplog: pytest.LogCaptureFixture,
) -> None:
    class Broken(FakeGpuReader):
        def open(self) -> None:
            raise OSError("permission denied\n(second line)")

    collector = GpuCollector(Broken())
    with caplog.at_level(logging.WARNING):
        await asyncio.wait_for(collector.run(), timeout=5)
    assert [r.getMessage() for r in caplog.records] == [
        "GPU metrics off: OSError: permission denied (second line)"
    ]
    assert value(registry_of(collector), names.GPU_UP) == 0


@pytest.mark.asyncio
async def test_read_failure_keeps_last_values_with_growing_age(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Clock()
    collector, reader, registry = await polled(clock=clock)
    h100 = {"gpu": "0", "uuid": "GPU-0", "name": "NVIDIA H100 80GB HBM3"}
    caplog.clear()  # the first poll said the A10 has no energy counter
    with caplog.at_level(logging.WARNING):
        reader.fail_read = "GPU is lost"
        await collector.poll()
        await collector.poll()  # the same message: not logged again
        assert value(registry, names.GPU_UP) == 0
        assert value(registry, names.GPU_POWER, **h100) == 512.5
        first = value(registry, names.GPU_SAMPLE_AGE)
        clock.offset += 30
        assert value(registry, names.GPU_SAMPLE_AGE) >= first + 30
        reader.fail_read = "Timeout"
        await collector.poll()  # a new message: logged
    assert [r.getMessage() for r in caplog.records] == [
        "GPU read failed, serving the last one: GPU is lost",
        "GPU read failed, serving the last one: Timeout",
    ]
    stale = value(registry, names.GPU_SAMPLE_AGE)
    reader.fail_read = None
    await collector.poll()
    assert value(registry, names.GPU_UP) == 1
    assert value(registry, names.GPU_SAMPLE_AGE) < stale  # a fresh snapshot


@pytest.mark.asyncio
async def test_snapshot_without_gpus_is_gpu_up_zero() -> None:
    _, _, registry = await polled([GpuSnapshot(0.0, None, ())])
    assert sample_names(registry) == {names.GPU_UP.name, names.GPU_SAMPLE_AGE.name}
    assert value(registry, names.GPU_UP) == 0


@pytest.mark.asyncio
async def test_collect_does_no_io_and_registering_does_not_collect() -> None:
    reader = FakeGpuReader([TWO_GPUS])
    collector = GpuCollector(reader)
    assert list(collector.describe()) == []
    registry = registry_of(collector)  # auto_describe: would collect if describe did
    assert value(registry, names.GPU_UP) == 0
    reader.open()
    await collector.poll()
    for _ in range(5):
        assert value(registry, names.GPU_UP) == 1
        generate_latest(registry)
    assert reader.reads == 1


@pytest.mark.asyncio
async def test_run_polls_off_the_loop_until_cancelled_then_closes(
    poll_until: Poll,
) -> None:
    threads: set[int] = set()

    class Recording(FakeGpuReader):
        def read(self) -> GpuSnapshot:
            threads.add(threading.get_ident())
            return super().read()

    later = replace(TWO_GPUS, gpus=(gpu(0, temperature_celsius=75.0),))
    reader = Recording([TWO_GPUS, later])
    collector = GpuCollector(reader, interval_s=0.005)
    registry = registry_of(collector)
    h100 = {"gpu": "0", "uuid": "GPU-0", "name": "NVIDIA H100 80GB HBM3"}
    task = asyncio.create_task(collector.run())
    await poll_until(lambda: reader.reads >= 3, timeout=5, what="three reads")
    assert value(registry, names.GPU_TEMPERATURE, **h100) == 75
    assert value(registry, names.GPU_UP) == 1
    assert value(registry, names.GPU_SAMPLE_AGE) < 5  # the fake stamps each read
    assert threading.get_ident() not in threads
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert (reader.opens, reader.closes) == (1, 1)


def test_bad_interval_and_empty_fake_are_refused() -> None:
    with pytest.raises(ValueError, match="interval_s"):
        GpuCollector(None, interval_s=0)
    with pytest.raises(ValueError, match="snapshot"):
        FakeGpuReader([])


def test_fake_reader_default_serves_one_made_up_gpu() -> None:
    reader = FakeGpuReader()
    snapshot = reader.read()
    assert [g.name for g in snapshot.gpus] == ["Fake GPU"]
    assert snapshot.taken_s <= time.monotonic()


# -- NvmlReader over a fake pynvml ---------------------------------------------------


class NVMLError(Exception):
    """Stands for pynvml.NVMLError; the subclasses for its generated ones."""


class NotSupported(NVMLError):
    pass


class FunctionNotFound(NVMLError):
    pass


class FakeNvml:
    """The pynvml functions NvmlReader calls, over ``devices`` (one dict per GPU).

    A key missing from a device's dict makes its call raise NotSupported; an
    exception instance as a value is raised.
    """

    NVMLError = NVMLError

    def __init__(self, devices: list[dict[str, Any]], **module: Any) -> None:
        self.devices = devices
        self.init_error: Exception | None = None
        self.calls: list[str] = []
        self.process_names = {99: "/opt/bin/trtllm-serve --port 8000"}
        self.__dict__.update(module)  # extra or replaced module functions

    def _get(self, handle: Any, key: str) -> Any:
        found = self.devices[handle].get(key, NotSupported())
        if isinstance(found, Exception):
            raise found
        return found

    def nvmlInit(self) -> None:
        self.calls.append("init")
        if self.init_error is not None:
            raise self.init_error

    def nvmlShutdown(self) -> None:
        self.calls.append("shutdown")

    def nvmlSystemGetDriverVersion(self) -> str:
        return "570.86.15"

    def nvmlSystemGetProcessName(self, pid: int) -> str:
        if pid not in self.process_names:
            raise NVMLError("Not Found")
        return self.process_names[pid]

    def nvmlDeviceGetCount(self) -> int:
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def nvmlDeviceGetName(self, h: Any) -> str:
        return str(self._get(h, "name"))

    def nvmlDeviceGetUUID(self, h: Any) -> str:
        return str(self._get(h, "uuid"))

    def nvmlDeviceGetUtilizationRates(self, h: Any) -> Any:
        gpu, memory = self._get(h, "util")
        return SimpleNamespace(gpu=gpu, memory=memory)

    def nvmlDeviceGetMemoryInfo(self, h: Any) -> Any:
        used, total = self._get(h, "memory")
        return SimpleNamespace(used=used, total=total, free=total - used)

    def nvmlDeviceGetPowerUsage(self, h: Any) -> int:
        return int(self._get(h, "power_mw"))

    def nvmlDeviceGetEnforcedPowerLimit(self, h: Any) -> int:
        return int(self._get(h, "limit_mw"))

    def nvmlDeviceGetTotalEnergyConsumption(self, h: Any) -> int:
        return int(self._get(h, "energy_mj"))

    def nvmlDeviceGetTemperature(self, h: Any, sensor: int) -> int:
        assert sensor == 0  # NVML_TEMPERATURE_GPU
        return int(self._get(h, "temperature"))

    def nvmlDeviceGetClockInfo(self, h: Any, clock: int) -> int:
        return int(self._get(h, {1: "sm_mhz", 2: "mem_mhz"}[clock]))

    def nvmlDeviceGetMaxClockInfo(self, h: Any, clock: int) -> int:
        return int(self._get(h, {1: "max_sm_mhz", 2: "max_mem_mhz"}[clock]))

    def nvmlDeviceGetMemoryBusWidth(self, h: Any) -> int:
        return int(self._get(h, "bus_bits"))

    def nvmlDeviceGetPcieThroughput(self, h: Any, counter: int) -> int:
        return int(self._get(h, {0: "tx_kb", 1: "rx_kb"}[counter]))

    def nvmlDeviceGetTotalEccErrors(self, h: Any, kind: int, counter: int) -> int:
        assert counter == 0  # NVML_VOLATILE_ECC
        return int(self._get(h, {0: "ecc_corrected", 1: "ecc_uncorrected"}[kind]))

    def nvmlDeviceGetComputeRunningProcesses(self, h: Any) -> list[Any]:
        return [
            SimpleNamespace(pid=pid, usedGpuMemory=used)
            for pid, used in self._get(h, "processes")
        ]

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: Any) -> int:
        return int(self._get(h, "reasons"))

    def nvmlDeviceGetSupportedClocksEventReasons(self, h: Any) -> int:
        return int(self._get(h, "supported"))


H100 = {
    "name": "NVIDIA H100 80GB HBM3",
    "uuid": "GPU-5f3e",
    "util": (87, 40),
    "memory": (70 * GiB, 80 * GiB),
    "power_mw": 512_500,
    "limit_mw": 700_000,
    "energy_mj": 9_876_543_210,
    "temperature": 61,
    "sm_mhz": 1980,
    "mem_mhz": 2619,
    "max_mem_mhz": 2619,
    "bus_bits": 5120,
    "rx_kb": 1000,
    "tx_kb": 2000,
    "ecc_corrected": 3,
    "ecc_uncorrected": 0,
    "processes": [(4242, 68 * GiB), (99, None)],
    "reasons": 0x4 | 0x1,  # sw_power_cap, gpu_idle
    "supported": 0x1FF,
}


def read_one(nvml: FakeNvml, proc_root: Path = Path("/nonexistent")) -> GpuSnapshot:
    reader = NvmlReader(nvml=nvml, proc_root=proc_root)
    reader.open()
    try:
        return reader.read()
    finally:
        reader.close()


def test_nvml_values_are_converted_to_base_units(tmp_path: Path) -> None:
    (tmp_path / "4242").mkdir()
    (tmp_path / "4242" / "comm").write_text("python3\n")
    before = time.monotonic()
    snapshot = read_one(FakeNvml([H100]), proc_root=tmp_path)
    assert before <= snapshot.taken_s <= time.monotonic()
    assert snapshot.driver_version == "570.86.15"
    (sample,) = snapshot.gpus
    assert (sample.index, sample.uuid, sample.name) == (0, "GPU-5f3e", H100["name"])
    assert sample.utilization_ratio == pytest.approx(0.87)  # %
    assert sample.memory_utilization_ratio == pytest.approx(0.40)
    assert (sample.memory_used_bytes, sample.memory_total_bytes) == (70 * GiB, 80 * GiB)
    assert sample.power_watts == 512.5  # mW
    assert sample.power_limit_watts == 700.0
    assert sample.energy_joules == 9_876_543.21  # mJ since the driver loaded
    assert sample.temperature_celsius == 61.0
    assert sample.sm_clock_hertz == 1.98e9  # MHz
    assert sample.memory_clock_hertz == 2.619e9
    # 5120 bits x 2619 MHz x 2: the H100 SXM's 3.35 TB/s.
    assert sample.memory_bandwidth_peak_bytes_per_second == pytest.approx(3.35232e12)
    assert sample.pcie_rx_bytes_per_second == 1_024_000  # KiB/s
    assert sample.pcie_tx_bytes_per_second == 2_048_000
    assert (sample.ecc_corrected_total, sample.ecc_uncorrected_total) == (3, 0)
    assert sample.throttle_reasons == {
        reason: reason in ("gpu_idle", "sw_power_cap") for reason in THROTTLE_REASONS
    }
    assert sample.processes == (
        GpuProcess(4242, "python3", 68 * GiB),  # /proc/4242/comm
        GpuProcess(99, "trtllm-serve", None),  # NVML's process name
    )


def test_unsupported_or_failing_fields_are_none_and_the_rest_is_read() -> None:
    partial = {
        k: v
        for k, v in H100.items()
        if k not in ("rx_kb", "ecc_corrected", "util", "bus_bits")
    }
    partial["tx_kb"] = NVMLError("GPU is lost")  # any NVML error, not only NotSupported
    partial["processes"] = [(5, 1 * GiB)]
    (sample,) = read_one(FakeNvml([partial])).gpus
    assert sample.utilization_ratio is sample.memory_utilization_ratio is None
    assert sample.pcie_rx_bytes_per_second is sample.pcie_tx_bytes_per_second is None
    assert sample.ecc_corrected_total is None
    assert sample.ecc_uncorrected_total == 0
    assert sample.memory_bandwidth_peak_bytes_per_second is None  # no bus width
    assert sample.power_watts == 512.5
    assert sample.processes == (GpuProcess(5, "", 1 * GiB),)  # no name anywhere


def test_throttle_reasons_prefer_the_event_name_and_fall_back_to_legacy() -> None:
    legacy = {"nvmlDeviceGetCurrentClocksThrottleReasons": lambda h: 0x20}
    newer = FakeNvml([H100], **legacy)
    assert read_one(newer).gpus[0].throttle_reasons == {
        r: r in ("gpu_idle", "sw_power_cap") for r in THROTTLE_REASONS
    }
    for missing in (None, FunctionNotFound()):  # old module, or old driver
        nvml = FakeNvml([{**H100, "supported": 0x20 | 0x40}], **legacy)
        if missing is None:
            nvml.nvmlDeviceGetCurrentClocksEventReasons = None  # type: ignore[assignment,method-assign]
        else:
            nvml.devices[0]["reasons"] = missing
        reasons = read_one(nvml).gpus[0].throttle_reasons
        assert reasons == {"sw_thermal": True, "hw_thermal": False}


def test_energy_is_none_when_unsupported_or_the_module_lacks_the_call() -> None:
    no_counter = {k: v for k, v in H100.items() if k != "energy_mj"}  # NotSupported
    (sample,) = read_one(FakeNvml([no_counter])).gpus
    assert sample.energy_joules is None
    assert sample.power_watts == 512.5
    old = FakeNvml([H100])
    old.nvmlDeviceGetTotalEnergyConsumption = None  # type: ignore[assignment,method-assign]
    (sample,) = read_one(old).gpus
    assert sample.energy_joules is None
    assert sample.power_watts == 512.5


def test_throttle_reasons_without_any_answer_are_none() -> None:
    no_reasons = {k: v for k, v in H100.items() if k not in ("reasons", "supported")}
    assert read_one(FakeNvml([no_reasons])).gpus[0].throttle_reasons is None
    only_current = {k: v for k, v in H100.items() if k != "supported"}
    reasons = read_one(FakeNvml([only_current])).gpus[0].throttle_reasons
    assert reasons is not None
    assert set(reasons) == set(THROTTLE_REASONS)


def test_nvml_init_failure_is_one_line_gpu_unavailable() -> None:
    nvml = FakeNvml([H100])
    nvml.init_error = NVMLError("NVML Shared Library\nNot Found")
    reader = NvmlReader(nvml=nvml)
    with pytest.raises(GpuUnavailable) as info:
        reader.open()
    assert (
        str(info.value) == "NVML unavailable: NVMLError: NVML Shared Library Not Found"
    )
    with pytest.raises(GpuUnavailable, match="not open"):
        reader.read()
    reader.close()  # safe when not open
    assert nvml.calls == ["init"]


def test_no_usable_gpu_is_gpu_unavailable_and_shuts_nvml_down() -> None:
    for devices in ([], [{**H100, "uuid": NotSupported()}]):
        nvml = FakeNvml(devices)
        if devices:  # a GPU whose handle can't be had is skipped
            nvml.nvmlDeviceGetHandleByIndex = _raise_not_supported  # type: ignore[method-assign]
        with pytest.raises(GpuUnavailable, match="no GPU"):
            NvmlReader(nvml=nvml).open()
        assert nvml.calls == ["init", "shutdown"]


def _raise_not_supported(index: int) -> int:
    raise NotSupported()


def test_close_shuts_nvml_down_once() -> None:
    nvml = FakeNvml([H100, {**H100, "uuid": "GPU-2"}])
    reader = NvmlReader(nvml=nvml)
    reader.open()
    assert [g.uuid for g in reader.read().gpus] == ["GPU-5f3e", "GPU-2"]
    reader.close()
    reader.close()
    assert nvml.calls == ["init", "shutdown"]


def _nvml_library_loads() -> bool:
    try:
        ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return False
    return True


@pytest.mark.skipif(_nvml_library_loads(), reason="an NVML library is present here")
def test_real_reader_without_nvml_raises_gpu_unavailable_in_one_line() -> None:
    reader = NvmlReader()
    with pytest.raises(GpuUnavailable) as info:
        reader.open()
    message = str(info.value)
    assert message.startswith("NVML unavailable: ")
    assert "\n" not in message
    reader.close()
