"""The energy the target's GPUs use while a run sends (``--energy``).

An :class:`EnergySampler` reads the total of the target's GPU energy counters
(``servemon_gpu_energy_joules_total``: NVML's energy since the driver loaded) every
``interval_s``, keeps the readings, and appends each one to
``server_metrics.jsonl`` as ``{"mono_s", "energy": {"joules", "gpus", "source"}}``.
A stage's :class:`~loadgen.record.energy.Energy` is the counters' rise between
its start and its end, each end interpolated between the two readings around it.

Where the counters are read (``--energy``):

- ``auto`` (the default): Prometheus when the run has ``--prometheus`` (the
  exporters it scrapes, over ``--select``); else NVML on this machine when the
  target is on it; else nowhere;
- ``nvml``: this machine's GPUs (the target must run here);
- an ``http(s)://`` URL: an exporter's ``/metrics`` (``servemon exporter``);
- ``off``.

Where they cannot be read, the run says so once and records no energy: never a
zero. Nothing from the network raises out of a reading: a failed one is skipped.
"""

from __future__ import annotations

import asyncio
import bisect
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from servemon.core import names, promql
from servemon.core.signals import SignalQuery, freshness
from servemon.core.wire.limits import read_body
from servemon.loadgen.record.energy import Energy
from servemon.loadgen.record.runrecord import StageResult
from servemon.loadgen.record.summary import Summary
from servemon.loadgen.run.plan import StageRecord
from servemon.loadgen.run.promsource import PrometheusSampler
from servemon.monitor.gpu import GpuReader, GpuSnapshot, GpuUnavailable, one_line

__all__ = ["EnergyReading", "EnergySampler", "open_energy"]

#: The joules of every GPU summed, how many GPUs they are, and how old the
#: reading is (seconds: an exporter serves its last NVML read; Prometheus its
#: last scrape of it).
EnergyReading = tuple[float, int, float]


class EnergyUnavailable(Exception):
    """The counters cannot be read from this source (``str()``: why, one line)."""


@dataclass(slots=True)
class EnergySampler:
    """Reads the counters every ``interval_s`` into memory and ``sink``."""

    read: Callable[[], Awaitable[EnergyReading]]
    source: str
    sink: Callable[[Mapping[str, Any]], None]
    interval_s: float = 1.0
    close: Callable[[], Awaitable[None]] | None = None
    #: The readings: when (monotonic), the total, and the most GPUs seen.
    times: list[float] = field(default_factory=list)
    joules: list[float] = field(default_factory=list)
    gpus: int = 0

    async def sample_once(self) -> None:
        """One reading (a failed one is skipped: the stage ends interpolate)."""
        try:
            joules, gpus, age = await self.read()
        except (EnergyUnavailable, aiohttp.ClientError, TimeoutError, ValueError):
            return
        now = time.monotonic() - max(0.0, age)
        if self.times and (
            now <= self.times[-1]
            or (
                joules == self.joules[-1] and now - self.times[-1] < self.interval_s / 2
            )
        ):
            # The same snapshot again: its age moves its time by the jitter of
            # the read (milliseconds), and a second point that close with the same
            # total would make the counter look flat around it.
            return
        if self.joules and joules < self.joules[-1]:  # a reset: start over
            self.times.clear()
            self.joules.clear()
        self.times.append(now)
        self.joules.append(joules)
        self.gpus = max(self.gpus, gpus)
        self.sink(
            {
                "mono_s": now,
                "energy": {"joules": joules, "gpus": gpus, "source": self.source},
            }
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

    def at(self, mono_s: float) -> float | None:
        """The counters' total at ``mono_s``, between the readings around it (or
        from the nearest two, at most one interval outside them); None where no
        reading is near."""
        times, joules = self.times, self.joules
        if len(times) < 2:
            return None
        slack = 1.5 * self.interval_s
        if mono_s < times[0] - slack or mono_s > times[-1] + slack:
            return None
        i = min(max(bisect.bisect_left(times, mono_s), 1), len(times) - 1)
        t0, t1, j0, j1 = times[i - 1], times[i], joules[i - 1], joules[i]
        if t1 <= t0:
            return j1
        return j0 + (j1 - j0) * (mono_s - t0) / (t1 - t0)

    def window(
        self,
        start_s: float | None,
        end_s: float | None,
        prices: tuple[float | None, float | None],
    ) -> Energy | None:
        """The energy between two monotonic times, at ``prices`` (per GPU-hour,
        per node-hour); None where the readings do not cover them."""
        if start_s is None or end_s is None or end_s <= start_s:
            return None
        first, last = self.at(start_s), self.at(end_s)
        if first is None or last is None or last < first:
            return None
        return Energy(
            joules=last - first,
            seconds=end_s - start_s,
            gpus=self.gpus,
            source=self.source,
            gpu_hour_cost=prices[0],
            node_hour_cost=prices[1],
        )

    def annotate(
        self,
        records: Sequence[StageRecord],
        stages: list[StageResult],
        overall: Summary,
        prices: tuple[float | None, float | None],
    ) -> tuple[list[StageResult], Summary]:
        """Each stage's summary with the energy of its window, and the whole
        run's with the energy from the first stage's start to the last one's
        end."""
        out = []
        for record, stage in zip(records, stages, strict=True):
            window = self.window(record.start_s, record.until_s(), prices)
            if window is not None and stage.summary is not None:
                stage = replace(stage, summary=replace(stage.summary, energy=window))
            out.append(stage)
        began = [r.start_s for r in records if r.start_s is not None]
        ended = [e for r in records if (e := r.until_s()) is not None]
        whole = self.window(min(began, default=None), max(ended, default=None), prices)
        return out, replace(overall, energy=whole)


async def open_energy(
    choice: str,
    *,
    session: aiohttp.ClientSession,
    target_is_local: bool,
    prometheus: str | None,
    select: tuple[str, ...],
    prom_headers: Mapping[str, str],
    sink: Callable[[Mapping[str, Any]], None],
    interval_s: float,
    nvml: Callable[[], GpuReader] | None = None,
) -> tuple[EnergySampler | None, str]:
    """The sampler ``--energy`` asks for, read once to know it works, and a line
    that says where energy comes from, or why it is not measured."""
    if choice == "off":
        return None, "energy: not measured (--energy off)"
    tried: list[str] = []
    if choice == "auto":
        options = (["prometheus"] if prometheus else []) + (
            ["nvml"] if target_is_local else []
        )
        if not options:
            return None, (
                "energy: not measured (the target is not on this machine and there "
                "is no --prometheus; give --energy URL of its exporter's /metrics)"
            )
    else:
        options = [choice]
    for option in options:
        try:
            sampler = await _open(
                option, session, prometheus, select, prom_headers, sink, nvml
            )
        except EnergyUnavailable as exc:
            tried.append(f"{_name(option)}: {exc}")
            continue
        sampler.interval_s = interval_s
        await sampler.sample_once()
        return (
            sampler,
            f"energy: the target's GPU energy counters from {sampler.source}",
        )
    return None, "energy: not measured (" + "; ".join(tried) + ")"


def _name(option: str) -> str:
    return f"exporter {option}" if option.startswith("http") else option


async def _open(
    option: str,
    session: aiohttp.ClientSession,
    prometheus: str | None,
    select: tuple[str, ...],
    prom_headers: Mapping[str, str],
    sink: Callable[[Mapping[str, Any]], None],
    nvml: Callable[[], GpuReader] | None,
) -> EnergySampler:
    """A sampler for one source whose first reading worked (else
    :class:`EnergyUnavailable`)."""
    if option == "nvml":
        reader = await _nvml_reader(nvml)

        async def read_nvml() -> EnergyReading:
            try:
                snapshot = await asyncio.to_thread(reader.read)
            except GpuUnavailable as exc:  # the driver's: a reading skipped
                raise EnergyUnavailable(one_line(exc)) from None
            return _sum_nvml(snapshot)

        async def close() -> None:
            await asyncio.to_thread(reader.close)

        sampler = EnergySampler(read_nvml, "nvml", sink, close=close)
    elif option == "prometheus":
        if prometheus is None:
            raise EnergyUnavailable("no --prometheus")
        sampler = EnergySampler(
            _prometheus_reader(session, prometheus, select, prom_headers),
            "prometheus",
            sink,
        )
    else:
        sampler = EnergySampler(_exporter_reader(session, option), _name(option), sink)
    try:
        await sampler.read()
    except EnergyUnavailable:
        if sampler.close is not None:
            await sampler.close()
        raise
    except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
        raise EnergyUnavailable(one_line(exc)) from None
    return sampler


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
        return await asyncio.to_thread(_sum_exposition, text)

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
