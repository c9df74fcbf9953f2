"""GPU statistics from NVML: the reader seam, its snapshots, and the collector.

This module owns everything servemon publishes about GPUs (the ``servemon_gpu_*``
series of :mod:`servemon.core.names`):

- :class:`GpuReader`, the one seam to NVML. :class:`servemon.monitor.nvml.NvmlReader` is
  the real one (``pynvml`` from nvidia-ml-py, loaded lazily so importing it never
  fails); :class:`servemon.monitor.fakegpu.FakeGpuReader` serves made-up GPUs to tests
  and demos.
- :class:`GpuSnapshot` / :class:`GpuSample` / :class:`GpuProcess`: one reading of
  every GPU, already in base units (ratios, bytes, watts, joules, hertz, bytes per
  second).
- :class:`GpuCollector`, a prometheus_client collector. Its :meth:`~GpuCollector.run`
  task reads the GPUs through ``asyncio.to_thread`` every few seconds;
  :meth:`~GpuCollector.collect` only serves the last snapshot and never blocks.

No NVML library or no GPU is not an error for the exporter: the collector logs one
line, publishes ``servemon_gpu_up 0`` and nothing else about GPUs. A GPU without an
energy counter (before Volta) is said once, and gets no energy series (never a 0).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import ParamSpec, Protocol, TypeVar

from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from servemon.core import names
from servemon.core.errors import ServemonError

__all__ = [
    "THROTTLE_REASONS",
    "GpuCollector",
    "GpuProcess",
    "GpuReader",
    "GpuSample",
    "GpuSnapshot",
    "GpuUnavailable",
    "one_line",
]

P = ParamSpec("P")
T = TypeVar("T")

#: Every throttle reason servemon names, in NVML's bit order
#: (:mod:`servemon.monitor.nvml` maps them to NVML's bits).
THROTTLE_REASONS: tuple[str, ...] = (
    "gpu_idle",
    "applications_clocks_setting",
    "sw_power_cap",
    "hw_slowdown",
    "sync_boost",
    "sw_thermal",
    "hw_thermal",
    "hw_power_brake",
    "display_clocks_setting",
)


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
    memory_bandwidth_peak_bytes_per_second: float | None = None
    #: Energy used since the driver was last loaded (a counter); None where the
    #: GPU cannot tell it (before Volta, or NVML says not supported).
    energy_joules: float | None = None


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
    (
        names.GPU_MEMORY_BANDWIDTH_PEAK,
        lambda g: g.memory_bandwidth_peak_bytes_per_second,
    ),
    (names.GPU_PCIE_RX, lambda g: g.pcie_rx_bytes_per_second),
    (names.GPU_PCIE_TX, lambda g: g.pcie_tx_bytes_per_second),
)
_MAX_DISTINCT_ERRORS = 64  # read errors remembered for "log once per message"


def one_line(exc: BaseException) -> str:
    """An exception as one line (its own text for a ServemonError)."""
    text = " ".join(str(exc).split())
    if isinstance(exc, ServemonError) and text:
        return text
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


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
        self._told_no_energy = False

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
            self._log.warning("GPU metrics off: %s", one_line(exc))
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
                self._log.warning("GPU reader did not close: %s", one_line(exc))

    async def poll(self) -> None:
        """Read one snapshot in a thread; a failed read keeps the last one."""
        if self._reader is None:
            return
        try:
            snapshot = await asyncio.to_thread(self._reader.read)
        except Exception as exc:
            self._read_ok = False
            message = one_line(exc)
            if message not in self._errors_seen:
                if len(self._errors_seen) < _MAX_DISTINCT_ERRORS:
                    self._errors_seen.add(message)
                self._log.warning("GPU read failed, serving the last one: %s", message)
            return
        self._snapshot, self._read_ok = snapshot, True
        blind = [
            f"{g.index} ({g.name})" for g in snapshot.gpus if g.energy_joules is None
        ]
        if blind and not self._told_no_energy:
            self._told_no_energy = True
            self._log.warning(
                "GPU energy not readable on GPU %s: no %s for it, and no energy "
                "per token or cost figures from it",
                ", ".join(blind),
                names.GPU_ENERGY.name,
            )

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
    energy: list[Row] = [
        (ids(g), g.energy_joules) for g in gpus if g.energy_joules is not None
    ]
    families += [
        (names.GPU_ENERGY, energy),
        (names.GPU_THROTTLE, throttle),
        (names.GPU_ECC_ERRORS, ecc),
        (names.GPU_PROCESS_MEMORY, processes),
    ]
    for series, rows in families:
        if rows:
            yield series.family(rows)
