"""GPU statistics from NVML: the reader seam, its snapshots, and the collector.

This module owns everything servemon publishes about GPUs (the ``servemon_gpu_*``
series of :mod:`monitor.names`):

- :class:`GpuReader`, the one seam to NVML. :class:`NvmlReader` is the real one
  (``pynvml`` from nvidia-ml-py, loaded lazily so importing this module never fails);
  :class:`FakeGpuReader` serves fixed snapshots to tests and demos.
- :class:`GpuSnapshot` / :class:`GpuSample` / :class:`GpuProcess`: one reading of
  every GPU, already in base units (ratios, bytes, watts, hertz, bytes per second).
- :class:`GpuCollector`, a prometheus_client collector. Its :meth:`~GpuCollector.run`
  task reads the GPUs through ``asyncio.to_thread`` every few seconds;
  :meth:`~GpuCollector.collect` only serves the last snapshot and never blocks.

No NVML library or no GPU is not an error for the exporter: the collector logs one
line, publishes ``servemon_gpu_up 0`` and nothing else about GPUs.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import ParamSpec, Protocol, TypeVar

from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from monitor import names
from servemon.errors import ServemonError

__all__ = [
    "THROTTLE_REASONS",
    "FakeGpuReader",
    "GpuCollector",
    "GpuProcess",
    "GpuReader",
    "GpuSample",
    "GpuSnapshot",
    "GpuUnavailable",
    "NvmlModule",
    "NvmlReader",
]

P = ParamSpec("P")
T = TypeVar("T")

# nvml.h constants (stable ABI values), so a fake NVML module needs only functions.
_TEMPERATURE_GPU = 0
_CLOCK_SM, _CLOCK_MEM = 1, 2
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
#: Every throttle reason servemon names, in NVML's bit order.
THROTTLE_REASONS: tuple[str, ...] = tuple(_REASON_BITS)
_ALL_REASONS = sum(_REASON_BITS.values())
_KIB = 1024  # NVML's PCIe "KB/s" are KiB/s (as nvidia-smi and nvitop read them)


class GpuUnavailable(ServemonError):
    """NVML missing, no GPU, or NVML failed to start. ``str()`` is one line."""


@dataclass(frozen=True, slots=True)
class GpuProcess:
    """A compute process on one GPU and the GPU memory it uses (None: not known)."""

    pid: int
    name: str
    memory_bytes: int | None


@dataclass(frozen=True, slots=True)
class GpuSample:
    """One GPU at one moment, in base units; None where NVML gave no value."""

    index: int
    uuid: str
    name: str
    utilization_ratio: float | None
    memory_utilization_ratio: float | None
    memory_used_bytes: int | None
    memory_total_bytes: int | None
    power_watts: float | None
    power_limit_watts: float | None
    temperature_celsius: float | None
    sm_clock_hertz: float | None
    memory_clock_hertz: float | None
    throttle_reasons: Mapping[str, bool] | None
    pcie_rx_bytes_per_second: float | None
    pcie_tx_bytes_per_second: float | None
    ecc_corrected_total: int | None
    ecc_uncorrected_total: int | None
    processes: tuple[GpuProcess, ...]


@dataclass(frozen=True, slots=True)
class GpuSnapshot:
    """Every GPU read once; ``taken_s`` is ``time.monotonic()`` at the reading."""

    taken_s: float
    driver_version: str | None
    gpus: tuple[GpuSample, ...]


class GpuReader(Protocol):
    """The seam to NVML; every method may block, so call them in a thread.

    ``open`` starts reading or raises :class:`GpuUnavailable`; ``read`` reads every
    GPU once; ``close`` releases what ``open`` took (safe to call if not open).
    """

    def open(self) -> None: ...
    def read(self) -> GpuSnapshot: ...
    def close(self) -> None: ...


# -- NVML ---------------------------------------------------------------------------


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
    twins), since a module may lack either spelling.
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
    def nvmlDeviceGetTemperature(self, handle: object, sensor: int, /) -> int: ...
    def nvmlDeviceGetClockInfo(self, handle: object, clock: int, /) -> int: ...
    def nvmlDeviceGetPcieThroughput(self, handle: object, counter: int, /) -> int: ...
    def nvmlDeviceGetTotalEccErrors(
        self, handle: object, error_type: int, counter_type: int, /
    ) -> int: ...
    def nvmlDeviceGetComputeRunningProcesses(
        self, handle: object, /
    ) -> Sequence[_ProcessInfo]: ...


_Device = tuple[int, object, str, str]  # index, NVML handle, uuid, name


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    if isinstance(exc, ServemonError) and text:
        return text
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class NvmlReader:
    """The real :class:`GpuReader`: NVML through ``pynvml``.

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
                raise GpuUnavailable(f"NVML unavailable: {_one_line(exc)}") from None
            self._nvml, self._error = nvml, nvml.NVMLError
            try:
                count = nvml.nvmlDeviceGetCount()
                devices = [d for i in range(count) if (d := self._device(nvml, i))]
            except Exception as exc:
                self._shutdown()
                raise GpuUnavailable(f"NVML unavailable: {_one_line(exc)}") from None
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
        temperature = call(nvml.nvmlDeviceGetTemperature, h, _TEMPERATURE_GPU)
        sm_clock = call(nvml.nvmlDeviceGetClockInfo, h, _CLOCK_SM)
        mem_clock = call(nvml.nvmlDeviceGetClockInfo, h, _CLOCK_MEM)
        rx = call(nvml.nvmlDeviceGetPcieThroughput, h, _PCIE_RX_BYTES)
        tx = call(nvml.nvmlDeviceGetPcieThroughput, h, _PCIE_TX_BYTES)
        ecc = nvml.nvmlDeviceGetTotalEccErrors
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
            temperature_celsius=None if temperature is None else float(temperature),
            sm_clock_hertz=None if sm_clock is None else sm_clock * 1e6,
            memory_clock_hertz=None if mem_clock is None else mem_clock * 1e6,
            throttle_reasons=self._throttle(nvml, h),
            pcie_rx_bytes_per_second=None if rx is None else float(rx * _KIB),
            pcie_tx_bytes_per_second=None if tx is None else float(tx * _KIB),
            ecc_corrected_total=call(ecc, h, _ECC_CORRECTED, _VOLATILE_ECC),
            ecc_uncorrected_total=call(ecc, h, _ECC_UNCORRECTED, _VOLATILE_ECC),
            processes=self._processes(nvml, h),
        )

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


# -- fake ---------------------------------------------------------------------------


#: The one made-up GPU a ``FakeGpuReader()`` serves (demos).
_DEMO_GPU = GpuSample(
    0, "GPU-00000000-0000-0000-0000-000000000000", "Fake GPU", 0.5, 0.25,
    40 * 2**30, 80 * 2**30, 300.0, 700.0, 55.0, 1.98e9, 2.619e9,
    dict.fromkeys(THROTTLE_REASONS, False), 1e6, 2e6, 0, 0,
    (GpuProcess(1, "python3", 39 * 2**30),),
)  # fmt: skip


class FakeGpuReader:
    """A :class:`GpuReader` for tests and demos.

    Each ``read`` returns the next of ``snapshots`` (the last one repeatedly),
    stamped with ``time.monotonic()`` of the read; None gives one made-up GPU.
    ``fail_open`` / ``fail_read`` (attributes too, so a test can flip them) make
    ``open`` / ``read`` raise :class:`GpuUnavailable` with that message. ``opens``,
    ``reads`` and ``closes`` count the calls.
    """

    def __init__(
        self,
        snapshots: Sequence[GpuSnapshot] | None = None,
        *,
        fail_open: str | None = None,
        fail_read: str | None = None,
    ) -> None:
        if snapshots is not None and not snapshots:
            raise ValueError("FakeGpuReader needs at least one snapshot (or None)")
        self._snapshots = tuple(snapshots or (GpuSnapshot(0.0, None, (_DEMO_GPU,)),))
        self.fail_open = fail_open
        self.fail_read = fail_read
        self.opens = self.reads = self.closes = 0
        self._served = 0  # snapshots handed out (failed reads skip none)

    def open(self) -> None:
        """Count the call; raise if ``fail_open`` is set."""
        self.opens += 1
        if self.fail_open is not None:
            raise GpuUnavailable(self.fail_open)

    def read(self) -> GpuSnapshot:
        """The next snapshot, stamped now; raise if ``fail_read`` is set."""
        self.reads += 1
        if self.fail_read is not None:
            raise GpuUnavailable(self.fail_read)
        snapshot = self._snapshots[min(self._served, len(self._snapshots) - 1)]
        self._served += 1
        return dataclasses.replace(snapshot, taken_s=time.monotonic())

    def close(self) -> None:
        """Count the call."""
        self.closes += 1


# -- collector ----------------------------------------------------------------------

_GAUGES: tuple[tuple[names.Series, Callable[[GpuSample], float | None]], ...] = (
    (names.GPU_UTILIZATION, lambda g: g.utilization_ratio),
    (names.GPU_MEMORY_UTILIZATION, lambda g: g.memory_utilization_ratio),
    (names.GPU_MEMORY_USED, lambda g: g.memory_used_bytes),
    (names.GPU_MEMORY_TOTAL, lambda g: g.memory_total_bytes),
    (names.GPU_POWER, lambda g: g.power_watts),
    (names.GPU_POWER_LIMIT, lambda g: g.power_limit_watts),
    (names.GPU_TEMPERATURE, lambda g: g.temperature_celsius),
    (names.GPU_SM_CLOCK, lambda g: g.sm_clock_hertz),
    (names.GPU_MEMORY_CLOCK, lambda g: g.memory_clock_hertz),
    (names.GPU_PCIE_RX, lambda g: g.pcie_rx_bytes_per_second),
    (names.GPU_PCIE_TX, lambda g: g.pcie_tx_bytes_per_second),
)
_MAX_DISTINCT_ERRORS = 64  # read errors remembered for "log once per message"


class GpuCollector(Collector):
    """Publishes the last :class:`GpuSnapshot`; :meth:`run` keeps it fresh.

    ``reader`` None turns GPU stats off (``--no-gpu``): only ``servemon_gpu_up 0``.
    ``clock`` (monotonic seconds) gives the sample age; tests replace it.
    """

    def __init__(
        self,
        reader: GpuReader | None,
        *,
        interval_s: float = 2.0,
        log: logging.Logger | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not interval_s > 0:
            raise ValueError(f"interval_s must be > 0, got {interval_s}")
        self._reader = reader
        self._interval_s = interval_s
        self._log = log if log is not None else logging.getLogger(__name__)
        self._clock = clock
        self._snapshot: GpuSnapshot | None = None
        self._read_ok = False
        self._errors_seen: set[str] = set()

    async def run(self) -> None:
        """Open the reader, then poll every ``interval_s`` until cancelled.

        If the reader can't open, log one warning and return (``servemon_gpu_up``
        stays 0). The reader is closed on the way out.
        """
        reader = self._reader
        if reader is None:
            return
        try:
            await asyncio.to_thread(reader.open)
        except Exception as exc:  # GpuUnavailable, or a broken reader: GPU stats off
            self._log.warning("GPU metrics off: %s", _one_line(exc))
            return
        loop = asyncio.get_running_loop()
        try:
            next_at = loop.time()
            while True:
                await self.poll()
                next_at = max(next_at + self._interval_s, loop.time())
                await asyncio.sleep(next_at - loop.time())
        finally:
            try:
                await asyncio.to_thread(reader.close)
            except Exception as exc:
                self._log.warning("GPU reader did not close: %s", _one_line(exc))

    async def poll(self) -> None:
        """Read one snapshot in a thread; a failed read keeps the last one."""
        if self._reader is None:
            return
        try:
            snapshot = await asyncio.to_thread(self._reader.read)
        except Exception as exc:
            self._read_ok = False
            message = _one_line(exc)
            if message not in self._errors_seen:
                if len(self._errors_seen) < _MAX_DISTINCT_ERRORS:
                    self._errors_seen.add(message)
                self._log.warning("GPU read failed, serving the last one: %s", message)
            return
        self._snapshot, self._read_ok = snapshot, True

    def describe(self) -> Iterable[Metric]:
        """Nothing, so registering the collector never calls :meth:`collect`."""
        return []

    def collect(self) -> Iterable[Metric]:
        """The last snapshot as metric families (memory only, no I/O)."""
        snapshot = self._snapshot
        up = snapshot is not None and bool(snapshot.gpus) and self._read_ok
        yield names.GPU_UP.family([({}, 1.0 if up else 0.0)])
        if snapshot is None:
            return
        age = max(0.0, self._clock() - snapshot.taken_s)
        yield names.GPU_SAMPLE_AGE.family([({}, age)])
        yield from _gpu_families(snapshot.gpus)


Row = tuple[Mapping[str, str], float]


def _gpu_families(gpus: Sequence[GpuSample]) -> Iterator[Metric]:
    def ids(gpu: GpuSample) -> dict[str, str]:
        return {"gpu": str(gpu.index), "uuid": gpu.uuid, "name": gpu.name}

    families: list[tuple[names.Series, list[Row]]] = [
        (series, [(ids(g), float(v)) for g in gpus if (v := get(g)) is not None])
        for series, get in _GAUGES
    ]
    throttle: list[Row] = [
        ({**ids(g), "reason": reason}, 1.0 if active else 0.0)
        for g in gpus
        for reason, active in (g.throttle_reasons or {}).items()
    ]
    ecc: list[Row] = [
        ({**ids(g), "type": kind}, float(count))
        for g in gpus
        for kind, count in (
            ("corrected", g.ecc_corrected_total),
            ("uncorrected", g.ecc_uncorrected_total),
        )
        if count is not None
    ]
    processes: list[Row] = []
    for g in gpus:
        used: dict[tuple[int, str], int] = {}  # one series per pid and name
        for p in g.processes:
            if p.memory_bytes is not None:
                used[p.pid, p.name] = used.get((p.pid, p.name), 0) + p.memory_bytes
        processes += [
            ({**ids(g), "pid": str(pid), "process": name}, float(b))
            for (pid, name), b in used.items()
        ]
    families += [
        (names.GPU_THROTTLE, throttle),
        (names.GPU_ECC_ERRORS, ecc),
        (names.GPU_PROCESS_MEMORY, processes),
    ]
    for series, rows in families:
        if rows:
            yield series.family(rows)
