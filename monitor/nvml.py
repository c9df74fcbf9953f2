"""The real GPU reader: NVML through ``pynvml`` (nvidia-ml-py), loaded lazily so
that importing this module never fails. What it reads and how it is published are
:mod:`servemon.monitor.gpu`'s: this module only talks to NVML."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import ParamSpec, Protocol, TypeVar

from servemon.monitor.gpu import (
    THROTTLE_REASONS,
    GpuProcess,
    GpuSample,
    GpuSnapshot,
    GpuUnavailable,
    one_line,
)

__all__ = ["NvmlModule", "NvmlReader"]

P = ParamSpec("P")
T = TypeVar("T")

# nvml.h constants (stable ABI values), so a fake NVML module needs only functions.
_TEMPERATURE_GPU = 0
_CLOCK_SM, _CLOCK_MEM = 1, 2
#: Transfers per memory clock as NVML reports the clock: bus width x highest memory
#: clock x 2 is the data sheets' peak bandwidth for HBM2e/HBM3 (A100 1555 GB/s, H100
#: SXM 3352 GB/s) and GDDR6/6X (A10 600 GB/s, RTX 4090 1008 GB/s) alike.
_TRANSFERS_PER_CLOCK = 2
_PCIE_TX_BYTES, _PCIE_RX_BYTES = 0, 1
_ECC_CORRECTED, _ECC_UNCORRECTED = 0, 1
_VOLATILE_ECC = 0
#: nvmlClocksEventReason* bits (the same bits as the legacy ...ThrottleReason* ones).
_REASON_BITS: Mapping[str, int] = {
    "gpu_idle": 0x1,
    "applications_clocks_setting": 0x2,
    "sw_power_cap": 0x4,
    "hw_slowdown": 0x8,
    "sync_boost": 0x10,
    "sw_thermal": 0x20,
    "hw_thermal": 0x40,
    "hw_power_brake": 0x80,
    "display_clocks_setting": 0x100,
}
_ALL_REASONS = sum(_REASON_BITS.values())
_KIB = 1024  # NVML's PCIe "KB/s" are KiB/s (as nvidia-smi and nvitop read them)
if tuple(_REASON_BITS) != THROTTLE_REASONS:  # pragma: no cover - a broken edit
    raise ImportError("monitor.nvml: _REASON_BITS must name THROTTLE_REASONS in order")


class _Utilization(Protocol):
    gpu: int
    memory: int


class _MemoryInfo(Protocol):
    used: int
    total: int


class _ProcessInfo(Protocol):
    pid: int
    usedGpuMemory: int | None  # pynvml's spelling


class NvmlModule(Protocol):
    """The part of the ``pynvml`` module :class:`NvmlReader` uses.

    Throttle reasons are looked up by name (``nvmlDeviceGetCurrentClocksEventReasons``,
    legacy ``nvmlDeviceGetCurrentClocksThrottleReasons`` and their ``Supported``
    twins), since a module may lack either spelling; so is the energy counter
    (``nvmlDeviceGetTotalEnergyConsumption``, millijoules since the driver was last
    loaded, Volta and newer), which an old module may lack.
    """

    @property
    def NVMLError(self) -> type[Exception]: ...

    def nvmlInit(self) -> None: ...
    def nvmlShutdown(self) -> None: ...
    def nvmlSystemGetDriverVersion(self) -> str: ...
    def nvmlSystemGetProcessName(self, pid: int, /) -> str: ...
    def nvmlDeviceGetCount(self) -> int: ...
    def nvmlDeviceGetHandleByIndex(self, index: int, /) -> object: ...
    def nvmlDeviceGetName(self, handle: object, /) -> str: ...
    def nvmlDeviceGetUUID(self, handle: object, /) -> str: ...
    def nvmlDeviceGetUtilizationRates(self, handle: object, /) -> _Utilization: ...
    def nvmlDeviceGetMemoryInfo(self, handle: object, /) -> _MemoryInfo: ...
    def nvmlDeviceGetPowerUsage(self, handle: object, /) -> int: ...
    def nvmlDeviceGetEnforcedPowerLimit(self, handle: object, /) -> int: ...
    def nvmlDeviceGetTotalEnergyConsumption(self, handle: object, /) -> int: ...
    def nvmlDeviceGetTemperature(self, handle: object, sensor: int, /) -> int: ...
    def nvmlDeviceGetClockInfo(self, handle: object, clock: int, /) -> int: ...
    def nvmlDeviceGetMaxClockInfo(self, handle: object, clock: int, /) -> int: ...
    def nvmlDeviceGetMemoryBusWidth(self, handle: object, /) -> int: ...
    def nvmlDeviceGetPcieThroughput(self, handle: object, counter: int, /) -> int: ...
    def nvmlDeviceGetTotalEccErrors(
        self, handle: object, error_type: int, counter_type: int, /
    ) -> int: ...
    def nvmlDeviceGetComputeRunningProcesses(
        self, handle: object, /
    ) -> Sequence[_ProcessInfo]: ...


_Device = tuple[int, object, str, str]  # index, NVML handle, uuid, name


class NvmlReader:
    """The real :class:`~servemon.monitor.gpu.GpuReader`: NVML through ``pynvml``.

    ``nvml`` replaces the ``pynvml`` module (tests pass a fake one); ``proc_root``
    is where process names are read (``<proc_root>/<pid>/comm``). Any NVML error on
    one field leaves that field None; it never fails the sample.
    """

    def __init__(
        self, *, nvml: NvmlModule | None = None, proc_root: Path = Path("/proc")
    ) -> None:
        self._given = nvml
        self._proc_root = proc_root
        self._nvml: NvmlModule | None = None
        self._devices: tuple[_Device, ...] = ()
        self._driver: str | None = None
        self._error: type[Exception] = Exception  # set to nvml.NVMLError by open
        self._lock = threading.Lock()  # read and close never overlap

    def open(self) -> None:
        """Start NVML and find the GPUs; raise :class:`GpuUnavailable` if it can't."""
        with self._lock:
            nvml = self._given if self._given is not None else _load_pynvml()
            try:
                nvml.nvmlInit()
            except Exception as exc:
                raise GpuUnavailable(f"NVML unavailable: {one_line(exc)}") from None
            self._nvml, self._error = nvml, nvml.NVMLError
            try:
                count = nvml.nvmlDeviceGetCount()
                devices = [d for i in range(count) if (d := self._device(nvml, i))]
            except Exception as exc:
                self._shutdown()
                raise GpuUnavailable(f"NVML unavailable: {one_line(exc)}") from None
            if not devices:
                self._shutdown()
                raise GpuUnavailable("NVML found no GPU")
            self._devices = tuple(devices)
            self._driver = self._try(nvml.nvmlSystemGetDriverVersion)

    def read(self) -> GpuSnapshot:
        """Read every GPU found by ``open`` (blocking; call it in a thread)."""
        with self._lock:
            if self._nvml is None:
                raise GpuUnavailable("NVML reader is not open")
            taken_s = time.monotonic()
            gpus = tuple(self._sample(self._nvml, d) for d in self._devices)
            return GpuSnapshot(taken_s, self._driver, gpus)

    def close(self) -> None:
        """Shut NVML down; a no-op when not open."""
        with self._lock:
            self._shutdown()

    def _shutdown(self) -> None:
        nvml, self._nvml, self._devices = self._nvml, None, ()
        if nvml is not None:
            self._try(nvml.nvmlShutdown)

    def _try(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T | None:
        try:
            return fn(*args, **kwargs)
        except self._error:
            return None

    def _device(self, nvml: NvmlModule, i: int) -> _Device | None:
        handle = self._try(nvml.nvmlDeviceGetHandleByIndex, i)
        if handle is None:  # e.g. a GPU this process may not use
            return None
        uuid = self._try(nvml.nvmlDeviceGetUUID, handle) or ""
        return i, handle, uuid, self._try(nvml.nvmlDeviceGetName, handle) or ""

    def _sample(self, nvml: NvmlModule, device: _Device) -> GpuSample:
        index, h, uuid, name = device
        call = self._try
        util = call(nvml.nvmlDeviceGetUtilizationRates, h)
        memory = call(nvml.nvmlDeviceGetMemoryInfo, h)
        power = call(nvml.nvmlDeviceGetPowerUsage, h)
        limit = call(nvml.nvmlDeviceGetEnforcedPowerLimit, h)
        energy = self._energy(nvml, h)
        temperature = call(nvml.nvmlDeviceGetTemperature, h, _TEMPERATURE_GPU)
        sm_clock = call(nvml.nvmlDeviceGetClockInfo, h, _CLOCK_SM)
        mem_clock = call(nvml.nvmlDeviceGetClockInfo, h, _CLOCK_MEM)
        rx = call(nvml.nvmlDeviceGetPcieThroughput, h, _PCIE_RX_BYTES)
        tx = call(nvml.nvmlDeviceGetPcieThroughput, h, _PCIE_TX_BYTES)
        ecc = nvml.nvmlDeviceGetTotalEccErrors
        max_mem_clock = call(nvml.nvmlDeviceGetMaxClockInfo, h, _CLOCK_MEM)
        bus_bits = call(nvml.nvmlDeviceGetMemoryBusWidth, h)
        peak = (
            None
            if max_mem_clock is None or not bus_bits
            else max_mem_clock * 1e6 * _TRANSFERS_PER_CLOCK * bus_bits / 8
        )
        return GpuSample(
            index=index,
            uuid=uuid,
            name=name,
            utilization_ratio=None if util is None else util.gpu / 100,
            memory_utilization_ratio=None if util is None else util.memory / 100,
            memory_used_bytes=None if memory is None else int(memory.used),
            memory_total_bytes=None if memory is None else int(memory.total),
            power_watts=None if power is None else power / 1000,
            power_limit_watts=None if limit is None else limit / 1000,
            energy_joules=None if energy is None else energy / 1000,
            temperature_celsius=None if temperature is None else float(temperature),
            sm_clock_hertz=None if sm_clock is None else sm_clock * 1e6,
            memory_clock_hertz=None if mem_clock is None else mem_clock * 1e6,
            throttle_reasons=self._throttle(nvml, h),
            pcie_rx_bytes_per_second=None if rx is None else float(rx * _KIB),
            pcie_tx_bytes_per_second=None if tx is None else float(tx * _KIB),
            ecc_corrected_total=call(ecc, h, _ECC_CORRECTED, _VOLATILE_ECC),
            ecc_uncorrected_total=call(ecc, h, _ECC_UNCORRECTED, _VOLATILE_ECC),
            processes=self._processes(nvml, h),
            memory_bandwidth_peak_bytes_per_second=peak,
        )

    def _energy(self, nvml: NvmlModule, handle: object) -> int | None:
        """Millijoules since the driver loaded; None when the module lacks the
        call or the GPU does not support it (NVMLError_NotSupported)."""
        fn: Callable[[object], int] | None = getattr(
            nvml, "nvmlDeviceGetTotalEnergyConsumption", None
        )
        return None if fn is None else self._try(fn, handle)

    def _reasons(self, nvml: NvmlModule, handle: object, kind: str) -> int | None:
        """The first of the event/throttle spellings of ``kind`` that answers."""
        for spelling in ("Event", "Throttle"):
            fn: Callable[[object], int] | None = getattr(
                nvml, f"nvmlDeviceGet{kind}Clocks{spelling}Reasons", None
            )
            if fn is not None and (mask := self._try(fn, handle)) is not None:
                return int(mask)
        return None

    def _throttle(self, nvml: NvmlModule, handle: object) -> Mapping[str, bool] | None:
        active = self._reasons(nvml, handle, "Current")
        if active is None:
            return None
        supported = self._reasons(nvml, handle, "Supported")
        mask = _ALL_REASONS if supported is None else supported
        return {r: bool(active & bit) for r, bit in _REASON_BITS.items() if mask & bit}

    def _processes(self, nvml: NvmlModule, handle: object) -> tuple[GpuProcess, ...]:
        found = self._try(nvml.nvmlDeviceGetComputeRunningProcesses, handle) or ()
        return tuple(
            GpuProcess(
                pid=int(p.pid),
                name=self._process_name(nvml, int(p.pid)),
                memory_bytes=None if p.usedGpuMemory is None else int(p.usedGpuMemory),
            )
            for p in found
        )

    def _process_name(self, nvml: NvmlModule, pid: int) -> str:
        """Best effort: ``/proc/PID/comm``, else NVML's name; "" when neither."""
        try:
            return (self._proc_root / str(pid) / "comm").read_text().strip()
        except (OSError, UnicodeDecodeError):
            pass
        words = (self._try(nvml.nvmlSystemGetProcessName, pid) or "").split()
        return os.path.basename(words[0]) if words else ""


def _load_pynvml() -> NvmlModule:
    try:
        import pynvml
    except ImportError as exc:
        raise GpuUnavailable(f"NVML unavailable: no pynvml module ({exc})") from None
    module: NvmlModule = pynvml
    return module
