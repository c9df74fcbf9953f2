"""The energy the target's GPUs use while a run sends (``--energy``).

An :class:`EnergySampler` reads the total of the target's GPU energy counters
(``servemon_gpu_energy_joules_total``: NVML's energy since the driver loaded) every
``interval_s``, keeps the readings, and appends each one to
``server_metrics.jsonl`` as ``{"mono_s", "energy": {"joules", "gpus", "source"}}``.
A stage's :class:`~servemon.loadgen.record.energy.Energy` is the counters' rise between
its start and its end, each end interpolated between the two readings around it.

Where the counters are read (``--energy``):

- ``auto`` (the default): Prometheus when the run has ``--prometheus`` (the
  exporters it scrapes, over ``--select``); else NVML on this machine when the
  target is on it; else nowhere;
- ``nvml``: this machine's GPUs (the target must run here);
- an ``http(s)://`` URL: an exporter's ``/metrics`` (``servemon exporter``);
- ``off``.

A source that cannot be read at the start but may answer later (Prometheus not
yet scraping, an exporter still starting: anything but NVML) is tried again at
every round; the run says so at the start, and again when it is first read
(``energy: read from 12.3 s on (...)``). Its first reading is marked
``starts_late``: a stage that started before it has no energy, never a guess.
Where the counters are never read, the run says why and records no energy: never
a zero. Nothing from the network raises out of a reading: a failed one is
skipped. ``run.json``'s ``energy`` says where they came from and from when
(:meth:`EnergySampler.record`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from servemon.core import names, promql
from servemon.core.signals import SignalQuery, freshness
from servemon.core.wire.limits import read_body
from servemon.loadgen.record.energy import EnergyCounters
from servemon.loadgen.record.runrecord import StageResult
from servemon.loadgen.record.sections import EnergyRecord
from servemon.loadgen.record.summary import Summary
from servemon.loadgen.record.tally import with_energy
from servemon.loadgen.run.choices import EnergyChoice
from servemon.loadgen.run.firstread import FirstRead
from servemon.loadgen.run.promsource import PrometheusSampler
from servemon.loadgen.run.stages import StageRecord
from servemon.monitor.gpu import GpuReader, GpuSnapshot, GpuUnavailable, one_line

__all__ = [
    "EnergyReading",
    "EnergySampler",
    "late_line",
    "never_line",
    "open_energy",
]

#: The joules of every GPU summed, how many GPUs they are, and how old the
#: reading is (seconds: an exporter serves its last NVML read; Prometheus its
#: last scrape of it).
EnergyReading = tuple[float, int, float]


class EnergyUnavailable(Exception):
    """The counters cannot be read from this source (``str()``: why, one line)."""


@dataclass(slots=True)
class EnergySampler:
    """Reads the counters every ``interval_s`` into :attr:`counters` and
    ``sink``."""

    read: Callable[[], Awaitable[EnergyReading]]
    source: str
    sink: Callable[[Mapping[str, object]], None]
    interval_s: float = 1.0
    close: Callable[[], Awaitable[None]] | None = None
    #: Called once at the first reading of a source that was not there at the
    #: start (the runner says so).
    on_late_start: Callable[[EnergySampler], None] | None = None
    #: Its first try (at the start) failed: its readings start late.
    late: bool = False
    #: Why the last try failed (one line).
    why: str = ""
    #: The readings, and the energy of any window between them.
    counters: EnergyCounters = field(init=False)
    #: When a reading first worked, after how many tries.
    first: FirstRead = field(init=False, default_factory=FirstRead)

    def __post_init__(self) -> None:
        self.counters = EnergyCounters(self.source, self.interval_s)

    async def sample_once(self) -> None:
        """One reading (a failed one is skipped: the stage ends interpolate)."""
        try:
            joules, gpus, age = await self.read()
        except EnergyUnavailable as exc:
            self._failed(str(exc))
            return
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            self._failed(one_line(exc))
            return
        read_at = time.monotonic()
        now = read_at - max(0.0, age)
        starts_late = self.first.tried(read_at, ok=True) and self.late
        if self.counters.add(now, joules, gpus, starts_late=starts_late):
            energy: dict[str, object] = {
                "joules": joules,
                "gpus": gpus,
                "source": self.source,
            }
            if starts_late:
                energy["starts_late"] = True
            self.sink({"mono_s": now, "energy": energy})
        if starts_late and self.on_late_start is not None:
            self.on_late_start(self)

    async def read_past(self, end_s: float, within_s: float) -> None:
        """Read until a reading's time is at or after ``end_s`` (the run's end),
        for at most ``within_s``. A reading is as old as its source's sample (an
        exporter's snapshot; Prometheus's last scrape of it, up to its scrape
        interval and the snapshot's age): one read at the end may lie further back
        than the windows' slack, and the last stage would have no energy. A
        source never read gets one try: a first reading at the end completes no
        stage (a run with Prometheus but no energy series in it ended 3 s late)."""
        deadline = time.monotonic() + within_s
        while True:
            await self.sample_once()
            times = self.counters.times
            if not times or times[-1] >= end_s or time.monotonic() >= deadline:
                return
            await asyncio.sleep(min(0.25, self.interval_s / 4))

    def _failed(self, why: str) -> None:
        self.why = why
        self.first.tried(time.monotonic(), ok=False)

    def record(self, origin_s: float, said: str) -> EnergyRecord:
        """``run.json``'s ``energy``: the source, ``first_read_s`` (the run's
        clock; None where never read), ``tries`` and the line ``said``."""
        return EnergyRecord(
            self.source, self.first.first_read_s(origin_s), self.first.tries, said
        )

    async def run(self) -> None:
        """Read until cancelled, on a fixed cadence (missed rounds skipped)."""
        loop = asyncio.get_running_loop()
        next_at = loop.time()
        try:
            while True:
                await self.sample_once()
                next_at = max(next_at + self.interval_s, loop.time())
                await asyncio.sleep(next_at - loop.time())
        finally:
            if self.close is not None:
                await self.close()

    def annotate(
        self,
        records: Sequence[StageRecord],
        stages: list[StageResult],
        overall: Summary,
        prices: tuple[float | None, float | None],
    ) -> tuple[list[StageResult], Summary]:
        """Each stage's summary with the energy of its window (its start to its
        end), and the whole run's (the first stage's start to the last one's
        end)."""
        windows = [(r.start_s, r.until_s()) for r in records]
        return with_energy(self.counters, windows, stages, overall, prices)


async def open_energy(
    choice: EnergyChoice,
    *,
    session: aiohttp.ClientSession,
    target_is_local: bool,
    prometheus: str | None,
    select: tuple[str, ...],
    prom_headers: Mapping[str, str],
    sink: Callable[[Mapping[str, object]], None],
    interval_s: float,
    nvml: Callable[[], GpuReader] | None = None,
) -> tuple[EnergySampler | None, str]:
    """The sampler ``--energy`` asks for, read once to know it works, and a line
    that says where energy comes from, or why it is not measured.

    A source other than NVML that fails that first read is tried again during the
    run (:attr:`EnergySampler.late`) where no other option works now."""
    if choice.source == "off":
        return None, "energy: not measured (--energy off)"
    tried: list[str] = []
    if choice.source == "auto":
        options = (["prometheus"] if prometheus else []) + (
            ["nvml"] if target_is_local else []
        )
        if not options:
            return None, (
                "energy: not measured (the target is not on this machine and there "
                "is no --prometheus; give --energy URL of its exporter's /metrics)"
            )
    else:
        options = [str(choice)]  # nvml, or the exporter's URL
    waiting: EnergySampler | None = None
    for option in options:
        try:
            if option == "nvml":
                sampler = await _open_nvml(nvml, sink)
            else:
                sampler = _make(option, session, prometheus, select, prom_headers, sink)
        except EnergyUnavailable as exc:
            tried.append(f"{_name(option)}: {exc}")
            continue
        sampler.interval_s = sampler.counters.interval_s = interval_s
        await sampler.sample_once()
        if sampler.first.at is not None:
            return (
                sampler,
                f"energy: the target's GPU energy counters from {sampler.source}",
            )
        tried.append(f"{_name(option)}: {sampler.why}")
        if option == "nvml":  # a machine without it does not grow one
            if sampler.close is not None:
                await sampler.close()
        elif waiting is None:
            waiting = sampler
    if waiting is None:
        return None, "energy: not measured (" + "; ".join(tried) + ")"
    waiting.late = True
    return waiting, (
        "energy: not read yet (" + "; ".join(tried) + f"); trying {waiting.source} "
        f"again every {interval_s:g} s while the run sends"
    )


def late_line(sampler: EnergySampler, origin_s: float) -> str:
    """What the run says when a late source is first read."""
    first_s = sampler.first.first_read_s(origin_s) or 0.0
    return (
        f"energy: read from {first_s:.1f} s on (the target's GPU "
        f"energy counters from {sampler.source}, after {sampler.first.tries} tries; "
        "a stage that started before has no energy)"
    )


def never_line(sampler: EnergySampler) -> str:
    """What the run says at its end of a late source never read."""
    return (
        f"energy: not measured ({sampler.source}: not read in "
        f"{sampler.first.tries} tries; the last: {sampler.why})"
    )


def _name(option: str) -> str:
    return f"exporter {option}" if option.startswith("http") else option


def _make(
    option: str,
    session: aiohttp.ClientSession,
    prometheus: str | None,
    select: tuple[str, ...],
    prom_headers: Mapping[str, str],
    sink: Callable[[Mapping[str, object]], None],
) -> EnergySampler:
    """A sampler of Prometheus or of an exporter, not read yet."""
    if option == "prometheus":
        if prometheus is None:
            raise EnergyUnavailable("no --prometheus")
        return EnergySampler(
            _prometheus_reader(session, prometheus, select, prom_headers),
            "prometheus",
            sink,
        )
    return EnergySampler(_exporter_reader(session, option), _name(option), sink)


async def _open_nvml(
    make: Callable[[], GpuReader] | None, sink: Callable[[Mapping[str, object]], None]
) -> EnergySampler:
    """A sampler of this machine's GPUs, NVML opened (else
    :class:`EnergyUnavailable`)."""
    reader = await _nvml_reader(make)

    async def read_nvml() -> EnergyReading:
        try:
            snapshot = await asyncio.to_thread(reader.read)
        except GpuUnavailable as exc:  # the driver's: a reading skipped
            raise EnergyUnavailable(one_line(exc)) from None
        return _sum_nvml(snapshot)

    async def close() -> None:
        await asyncio.to_thread(reader.close)

    return EnergySampler(read_nvml, "nvml", sink, close=close)


async def _nvml_reader(make: Callable[[], GpuReader] | None) -> GpuReader:
    if make is None:
        from servemon.monitor.nvml import NvmlReader

        make = NvmlReader
    reader = make()
    try:
        await asyncio.to_thread(reader.open)
    except GpuUnavailable as exc:
        raise EnergyUnavailable(one_line(exc)) from None
    return reader


def _sum_nvml(snapshot: GpuSnapshot) -> EnergyReading:
    values = [g.energy_joules for g in snapshot.gpus]
    known = [v for v in values if v is not None]
    if not known or len(known) < len(values):
        raise EnergyUnavailable("NVML gives no energy counter for these GPUs")
    return float(sum(known)), len(known), 0.0


def _exporter_reader(
    session: aiohttp.ClientSession, url: str
) -> Callable[[], Awaitable[EnergyReading]]:
    timeout = aiohttp.ClientTimeout(total=2.0)

    async def read() -> EnergyReading:
        async with session.get(url, timeout=timeout) as resp:
            if resp.status != 200:
                raise EnergyUnavailable(f"HTTP {resp.status}")
            text = (await read_body(resp)).decode("utf-8", "replace")
        got = time.monotonic()
        joules, gpus, age = await asyncio.to_thread(_sum_exposition, text)
        # Its age when the caller stamps it: the parse's wait for a thread (tens
        # of ms on a busy machine) is not the counter's.
        return joules, gpus, age + (time.monotonic() - got)

    return read


def _sum_exposition(text: str) -> EnergyReading:
    wanted, age_name = names.GPU_ENERGY.name, names.GPU_SAMPLE_AGE.name
    values, ages = [], []
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == wanted:
                values.append(sample.value)
            elif sample.name == age_name:
                ages.append(sample.value)
    if not values:
        raise EnergyUnavailable(f"no {wanted} in its /metrics")
    return float(sum(values)), len(values), max(ages, default=0.0)


def _prometheus_reader(
    session: aiohttp.ClientSession,
    url: str,
    select: tuple[str, ...],
    headers: Mapping[str, str],
) -> Callable[[], Awaitable[EnergyReading]]:
    samples = promql.selector(names.GPU_ENERGY, *select)
    age = freshness(samples)
    # The reading's age: since Prometheus scraped it, plus the exporter's NVML
    # snapshot's age at that scrape.
    snapshot = promql.aggregate("max", promql.selector(names.GPU_SAMPLE_AGE, *select))
    queries = {
        "joules": SignalQuery("joules", "", promql.aggregate("sum", samples), age),
        "gpus": SignalQuery("gpus", "", promql.aggregate("count", samples), age),
        "age": SignalQuery("age", "", f"{age} + {snapshot}", age),
    }
    prom = PrometheusSampler(
        session, url, queries, lambda line: None, headers=headers, stale_after_s=60.0
    )

    async def read() -> EnergyReading:
        await prom.sample_once()
        joules, gpus = prom.signals.get("joules"), prom.signals.get("gpus")
        if joules is None or not gpus:
            raise EnergyUnavailable(
                f"Prometheus has no fresh {names.GPU_ENERGY.name}"
                + (f" behind --select {','.join(select)}" if select else "")
            )
        return joules, round(gpus), prom.signals.get("age") or 0.0

    return read
