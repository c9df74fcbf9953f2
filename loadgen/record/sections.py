"""The sections of ``run.json`` that say what a run ran against and with: its
clock origin, target, workload, client, environment, the server's signals and the
GPUs' energy.

Each is a small value built by the module that knows its data (the run directory,
:mod:`servemon.loadgen.run.target`, :mod:`servemon.loadgen.run.prefixcache`,
:mod:`servemon.loadgen.run.sources`, :mod:`servemon.loadgen.run.energy`) and read back
through :func:`~servemon.loadgen.record.runrecord.read_record` into the same type. Their
JSON keeps the keys servemon always wrote (a ``jq`` line keeps working), so where a
section's keys depend on the run (a trace's, a ``prefix:`` workload's, Prometheus'), the
part is its own type, written flat into its section and gathered back from it
when read. Every field a record of an older servemon may lack has a default.
"""

from __future__ import annotations

import platform
import sys
from dataclasses import dataclass, field, fields, is_dataclass
from typing import Annotated

import pydantic

from servemon.core.wire.limits import DEFAULT_LIMITS, ResponseLimits
from servemon.loadgen.send.client import ClientSettings

__all__ = [
    "ClientRecord",
    "ClockOrigin",
    "EmbeddedSimulator",
    "EnergyRecord",
    "EnvironmentRecord",
    "GpuRecord",
    "MergedShard",
    "PrefixRecord",
    "PromSource",
    "QueryRecord",
    "ScrapeIntervalRecord",
    "ServerMetricsRecord",
    "ServerMetricsSection",
    "SignalsRead",
    "TargetRecord",
    "TraceRecord",
    "TraceSource",
    "WorkloadRecord",
    "WorkloadSection",
    "as_json",
    "flat",
]

_LENIENT = pydantic.ConfigDict(extra="ignore")
#: A JSON value as a server sent it (``/v1/models``): recorded, never read.
Json = pydantic.JsonValue


def flat(value: object) -> dict[str, object]:
    """A section's JSON: its fields by name, a part's fields written in its place
    (a field whose metadata names its ``part`` type; :func:`_gathered` reads
    them back; a part that is None writes nothing)."""
    out: dict[str, object] = {}
    for f in fields(value):  # type: ignore[arg-type]
        item = getattr(value, f.name)
        if "part" in f.metadata:
            out.update({} if item is None else flat(item))
        elif f.metadata.get("omit_empty") and item in (None, ""):
            continue
        else:
            out[f.name] = as_json(item)
    return out


def as_json(item: object) -> object:
    """The JSON form of a value of the record (a dataclass: :func:`flat`)."""
    if is_dataclass(item) and not isinstance(item, type):
        return flat(item)
    if isinstance(item, list):
        return [as_json(x) for x in item]
    if isinstance(item, dict):
        return {k: as_json(v) for k, v in item.items()}
    return item


def _keys(cls: type[object]) -> list[str]:
    """The keys ``cls`` writes, its parts' included."""
    keys: list[str] = []
    for f in fields(cls):  # type: ignore[arg-type]
        keys += _keys(f.metadata["part"]) if "part" in f.metadata else [f.name]
    return keys


def _gathered(cls: type[object], data: object) -> object:
    """``data`` with each part of ``cls`` gathered under its field's name: a part
    is there where its first key is."""
    if not isinstance(data, dict):
        return data
    out = dict(data)
    for f in fields(cls):  # type: ignore[arg-type]
        part = f.metadata.get("part")
        if part is None or f.name in data:
            continue
        keys = _keys(part)
        if keys[0] in data:
            out[f.name] = _gathered(part, {k: data[k] for k in keys if k in data})
    return out


def _reads_flat(cls: type[object]) -> pydantic.BeforeValidator:
    """The validator that reads ``cls``'s parts back from its flat JSON."""
    return pydantic.BeforeValidator(lambda data: _gathered(cls, data))


@dataclass(frozen=True, slots=True)
class ClockOrigin:
    """``clock_origin``: the run's start on the monotonic clock (request times
    are absolute on it) and in UTC."""

    __pydantic_config__ = _LENIENT

    monotonic_s: float = 0.0
    utc: str | None = None
    clock: str = "CLOCK_MONOTONIC (time.monotonic)"


@dataclass(frozen=True, slots=True)
class EmbeddedSimulator:
    """The built-in simulator a run started where no ``--target`` was given."""

    __pydantic_config__ = _LENIENT

    profile: str
    args: list[str] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class TargetRecord:
    """``target``: the base URL, the model asked for (a mix: its names joined by
    commas), the target's ``/v1/models`` answer as it came, and the simulator
    started for the run, if one was."""

    __pydantic_config__ = _LENIENT

    url: str = ""
    model: str = ""
    models: Json = None
    embedded_simulator: EmbeddedSimulator | None = None


@dataclass(frozen=True, slots=True)
class TraceSource:
    """A trace file's format and its failed lines (skipped or kept)."""

    __pydantic_config__ = _LENIENT

    trace_format: str
    failed_lines: int = 0
    failed_lines_policy: str = "skip"


@dataclass(frozen=True, slots=True)
class TraceRecord:
    """How a trace's entries fit the target's context, and its file."""

    __pydantic_config__ = _LENIENT

    over_context: str
    entries_over_context: int = 0
    source: TraceSource | None = field(default=None, metadata={"part": TraceSource})


@dataclass(frozen=True, slots=True)
class PrefixRecord:
    """A ``prefix:`` workload: the hit rate asked, the rate its whole blocks make,
    and the engine's facts they rest on (and where each came from)."""

    __pydantic_config__ = _LENIENT

    asked_hit: float
    expected_hit: float
    shared_tokens: int | None = None
    groups: int | None = None
    block_size: int | None = None
    cache_tokens: int | None = None
    overhead_tokens: int | None = None
    tail_tokens: int | None = None
    block_source: str | None = None
    overhead_source: str | None = None


@dataclass(frozen=True, slots=True)
class WorkloadRecord:
    """``workload``: the spec as given, where prompt lengths were counted, the
    target's context, and what a trace or a ``prefix:`` workload adds."""

    __pydantic_config__ = _LENIENT

    spec: str = ""
    token_source: str | None = None
    context_tokens: int | None = None
    trace: TraceRecord | None = field(default=None, metadata={"part": TraceRecord})
    prefix: PrefixRecord | None = field(default=None, metadata={"part": PrefixRecord})


@dataclass(frozen=True, slots=True)
class ClientRecord:
    """``client``: the load generator's connection limits and timeouts
    (:class:`~servemon.loadgen.send.client.ClientSettings`), its event loop, its CPU
    latency hold and where its live metrics were served."""

    __pydantic_config__ = _LENIENT

    max_connections: int | None = None
    timeout_s: float | None = None
    connect_timeout_s: float | None = None
    limits: ResponseLimits = DEFAULT_LIMITS
    trust_env: bool = False
    loop: str | None = None
    cpu_dma_latency_us: int | None = None
    live_metrics: str | None = None

    @classmethod
    def of(
        cls,
        settings: ClientSettings,
        *,
        loop: str,
        cpu_dma_latency_us: int | None,
        live_metrics: str | None,
    ) -> ClientRecord:
        """The record of a session made with ``settings``."""
        return cls(
            max_connections=settings.max_connections,
            timeout_s=settings.timeout_s,
            connect_timeout_s=settings.connect_timeout_s,
            limits=settings.limits,
            loop=loop,
            cpu_dma_latency_us=cpu_dma_latency_us,
            live_metrics=live_metrics,
        )


@dataclass(frozen=True, slots=True)
class GpuRecord:
    """One GPU where the load generator ran, from NVML."""

    __pydantic_config__ = _LENIENT

    index: int
    name: str = ""
    uuid: str = ""
    driver: str | None = None
    memory_total_bytes: int | None = None


@dataclass(frozen=True, slots=True)
class EnvironmentRecord:
    """``environment``: the load generator's Python, platform, host, and its GPUs
    (or why it has none)."""

    __pydantic_config__ = _LENIENT

    python: str = ""
    platform: str = ""
    host: str = ""
    gpus: list[GpuRecord] | str = "none"

    @classmethod
    def here(cls, gpus: list[GpuRecord] | str) -> EnvironmentRecord:
        """This process's environment, with the ``gpus`` found."""
        return cls(
            python=sys.version.split()[0],
            platform=platform.platform(),
            host=platform.node(),
            gpus=gpus,
        )


@dataclass(frozen=True, slots=True)
class QueryRecord:
    """One signal's PromQL: its value and (where it has one) its age."""

    __pydantic_config__ = _LENIENT

    value: str
    age: str | None = None


@dataclass(frozen=True, slots=True)
class PromSource:
    """Where a ``--prometheus`` run read the server's signals."""

    __pydantic_config__ = _LENIENT

    prometheus: str
    select: str | None = None
    stale_after_s: float | None = None
    queries: dict[str, QueryRecord] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class SignalsRead:
    """When each of a ``--prometheus`` run's signals first had a value, on the
    run's clock (None: never)."""

    __pydantic_config__ = _LENIENT

    signals_first_read_s: dict[str, float | None]


@dataclass(frozen=True, slots=True)
class ScrapeIntervalRecord:
    """``server_metrics.scrape_interval``: Prometheus' scrape interval the run
    went by, where it came from and which targets it was read of."""

    __pydantic_config__ = _LENIENT

    seconds: float
    source: str
    matched_by: str | None = None
    targets: dict[str, float] | None = None
    why: str | None = None


@dataclass(frozen=True, slots=True)
class ServerMetricsRecord:
    """``server_metrics``: the server's signals as read, and from where: scrapes
    and failures, the engine's own description, the source, when it was first
    read and after how many tries (Prometheus: each signal's first value)."""

    __pydantic_config__ = _LENIENT

    scrapes: int = 0
    errors: int = 0
    engine_info: dict[str, str] | None = None
    source: str = "target /metrics"
    prom_source: PromSource | None = field(default=None, metadata={"part": PromSource})
    first_read_s: float | None = None
    tries: int = 0
    signals: SignalsRead | None = field(default=None, metadata={"part": SignalsRead})
    scrape_interval: ScrapeIntervalRecord | None = None


@dataclass(frozen=True, slots=True)
class EnergyRecord:
    """``energy``: where the GPUs' energy was read (None: nowhere), from when on
    the run's clock, after how many tries, and the line the run said of it."""

    __pydantic_config__ = _LENIENT

    source: str | None = None
    first_read_s: float | None = None
    tries: int = 0
    said: str | None = None


@dataclass(frozen=True, slots=True)
class MergedShard:
    """One shard of a merged run."""

    __pydantic_config__ = _LENIENT

    #: The shard's run directory, or a fleet worker's spool taken in (``servemon
    #: merge RUN --spool``) with its worker, the records it added and those it
    #: put in place of cancelled ones (what an entry does not have, it omits).
    path: str
    shard: str | None = field(default=None, metadata={"omit_empty": True})
    status: str = field(default="", metadata={"omit_empty": True})
    worker: int | None = field(default=None, metadata={"omit_empty": True})
    recovered: int | None = field(default=None, metadata={"omit_empty": True})
    replaced: int | None = field(default=None, metadata={"omit_empty": True})


#: The sections with parts, as ``RunInfo`` reads them.
WorkloadSection = Annotated[WorkloadRecord, _reads_flat(WorkloadRecord)]
ServerMetricsSection = Annotated[ServerMetricsRecord, _reads_flat(ServerMetricsRecord)]
