"""The SLO file behind ``servemon rules``: its schema, validation and bucket edges.

An SLO file is YAML (``deploy/slos.example.yaml`` documents every key)::

    window: 30d              # the SLO period: 28d or 30d
    min_request_rate: 0.1    # requests/s per (target, model) below which burn
                             # alerts stay silent
    burn_windows:            # optional; the SRE workbook's pairs by default
      scale: 1               # multiplies every window and the period (tests)
      page:   [{long: 1h, short: 5m, factor: 14.4}, {long: 6h, short: 30m, factor: 6}]
      ticket: [{long: 1d, short: 2h, factor: 3}, {long: 3d, short: 6h, factor: 1}]
    loadgen_slo: "ttft_p99<=0.3"   # the --slo the load generator runs with
    runbook_url: ""          # optional; alerts link <url>#<alertname in lower case>
    slos:
      - {name: ttft, type: latency, figure: ttft, source: client,
         threshold: 0.5, objective: 0.99}
      - {name: availability, type: availability, source: client, objective: 0.999}
    saturation:              # each entry optional; null drops the alert
      waiting_requests: {above: 10, for: 5m, severity: ticket}
      kv_cache_usage: {above: 0.95, for: 10m}
      preemptions: {window: 5m, for: 5m}
      gpu_memory: {above: 0.97, for: 10m}
    health:
      target_down: {for: 2m, severity: page}
      exporter_absent: {for: 5m}
      engine_metrics_absent: {for: 10m}
      client_stalled: {for: 5m}

A latency SLO counts the events of a classic histogram above ``threshold`` as bad,
so the threshold must be one of the histogram's bucket edges
(:data:`servemon.dashboards.sli.HISTOGRAMS` keeps every edge list in one place): the
client's edges are :data:`servemon.core.buckets.LATENCY_BUCKETS` plus every threshold of
``loadgen_slo`` (the load generator adds a bucket at each ``--slo`` threshold); the
engine's are vLLM's (:mod:`servemon.core.buckets`; the simulator serves them as vLLM
does). An availability SLO counts the errors :data:`servemon.dashboards.sli.ERRORS`
defines per source: the client's failed outcomes (:mod:`servemon.core.outcomes`), or,
with ``source: engine``, the engine's error finish reasons.

Every problem is one :class:`~servemon.core.errors.ConfigError` line naming the file and
the field.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal

import pydantic
from annotated_types import Ge, Gt, Lt

from servemon.core.errors import ConfigError
from servemon.core.fields import FORBID_EXTRA, load, read_yaml
from servemon.core.promql import duration
from servemon.core.slo import parse_slo
from servemon.dashboards.sli import HISTOGRAMS, Figure, Histogram, SourceName

__all__ = [
    "SEVERITIES",
    "AvailabilitySlo",
    "BurnWindows",
    "DurationAlert",
    "Health",
    "LatencySlo",
    "RateAlert",
    "Saturation",
    "Severity",
    "Slo",
    "SloConfig",
    "ThresholdAlert",
    "WindowPair",
    "edges_of",
    "load_slo_config",
    "parse_duration",
]

Severity = Literal["page", "ticket"]

_DURATION = re.compile(r"^(?:(\d+)w)?(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?$")


def parse_duration(value: object) -> int:
    """Seconds in a Prometheus duration such as ``5m``, ``1h30m`` or ``3d``."""
    match = _DURATION.match(value) if isinstance(value, str) and value else None
    if match is None:
        raise ValueError("expected a duration such as 30s, 5m, 1h or 3d")
    weeks, days, hours, minutes, seconds = (int(g or 0) for g in match.groups())
    total = (((weeks * 7 + days) * 24 + hours) * 60 + minutes) * 60 + seconds
    if total <= 0:
        raise ValueError("expected a duration above zero")
    return total


Duration = Annotated[int, pydantic.BeforeValidator(parse_duration)]
For = Annotated[Duration, pydantic.Field(alias="for")]
Objective = Annotated[float, Gt(0), Lt(1)]
SloName = Annotated[str, pydantic.StringConstraints(pattern=r"^[a-z][a-z0-9_-]*$")]


@dataclass(frozen=True, slots=True, kw_only=True)
class WindowPair:
    """A long and a short window that must both burn faster than ``factor``."""

    __pydantic_config__ = FORBID_EXTRA

    long: Duration
    short: Duration
    factor: Annotated[float, Gt(0)]


_PAGE = (
    WindowPair(long=3600, short=300, factor=14.4),
    WindowPair(long=6 * 3600, short=1800, factor=6.0),
)
_TICKET = (
    WindowPair(long=86400, short=2 * 3600, factor=3.0),
    WindowPair(long=3 * 86400, short=6 * 3600, factor=1.0),
)


@dataclass(frozen=True, slots=True, kw_only=True)
class BurnWindows:
    """The multi-window pairs per severity; ``scale`` multiplies every window."""

    __pydantic_config__ = FORBID_EXTRA

    scale: Annotated[float, Gt(0)] = 1.0
    page: Annotated[tuple[WindowPair, ...], pydantic.Field(min_length=1)] = _PAGE
    ticket: Annotated[tuple[WindowPair, ...], pydantic.Field(min_length=1)] = _TICKET


@dataclass(frozen=True, slots=True, kw_only=True)
class LatencySlo:
    """``objective`` of the events of ``figure`` at or below ``threshold`` seconds."""

    __pydantic_config__ = FORBID_EXTRA

    type: Literal["latency"] = "latency"
    name: SloName
    figure: Figure
    source: SourceName = "client"
    threshold: Annotated[float, Gt(0)]
    objective: Objective
    description: str = ""

    @property
    def histogram(self) -> Histogram:
        """The histogram this SLO reads."""
        return HISTOGRAMS[self.source, self.figure]


@dataclass(frozen=True, slots=True, kw_only=True)
class AvailabilitySlo:
    """``objective`` of the finished requests without an error."""

    __pydantic_config__ = FORBID_EXTRA

    type: Literal["availability"] = "availability"
    name: SloName
    source: SourceName = "client"
    objective: Objective
    description: str = ""


Slo = Annotated[LatencySlo | AvailabilitySlo, pydantic.Field(discriminator="type")]


@dataclass(frozen=True, slots=True, kw_only=True)
class ThresholdAlert:
    """A gauge above ``above`` for ``for``."""

    __pydantic_config__ = FORBID_EXTRA

    above: Annotated[float, Ge(0)]
    for_: For
    severity: Severity = "ticket"


@dataclass(frozen=True, slots=True, kw_only=True)
class RateAlert:
    """A counter rising (its rate over ``window`` above 0) for ``for``."""

    __pydantic_config__ = FORBID_EXTRA

    window: Duration = 300
    for_: For
    severity: Severity = "ticket"


@dataclass(frozen=True, slots=True, kw_only=True)
class DurationAlert:
    """A condition that holds for ``for``."""

    __pydantic_config__ = FORBID_EXTRA

    for_: For
    severity: Severity = "ticket"


@dataclass(frozen=True, slots=True, kw_only=True)
class Saturation:
    """Engine and GPU pressure alerts; ``None`` drops one."""

    __pydantic_config__ = FORBID_EXTRA

    waiting_requests: ThresholdAlert | None = ThresholdAlert(above=10, for_=300)
    kv_cache_usage: ThresholdAlert | None = ThresholdAlert(above=0.95, for_=600)
    preemptions: RateAlert | None = RateAlert(for_=300)
    gpu_memory: ThresholdAlert | None = ThresholdAlert(above=0.97, for_=600)


@dataclass(frozen=True, slots=True, kw_only=True)
class Health:
    """Alerts on servemon's own view: targets down, series missing."""

    __pydantic_config__ = FORBID_EXTRA

    target_down: DurationAlert | None = DurationAlert(for_=120, severity="page")
    exporter_absent: DurationAlert | None = DurationAlert(for_=300)
    engine_metrics_absent: DurationAlert | None = DurationAlert(for_=600)
    client_stalled: DurationAlert | None = DurationAlert(for_=300)


@dataclass(frozen=True, slots=True, kw_only=True)
class SloConfig:
    """A validated SLO file; ``source`` is the path it was read from (not a key)."""

    __pydantic_config__ = FORBID_EXTRA

    window: Literal["28d", "30d"] = "30d"
    min_request_rate: Annotated[float, Ge(0)] = 0.1
    burn_windows: BurnWindows = BurnWindows()
    loadgen_slo: str = ""
    runbook_url: str = ""
    slos: tuple[Slo, ...]
    saturation: Saturation = Saturation()
    health: Health = Health()
    source: str = ""

    @property
    def period(self) -> int:
        """The SLO period in seconds, scaled."""
        return _scaled(parse_duration(self.window), self.burn_windows.scale)

    def pairs(self, severity: Severity) -> tuple[WindowPair, ...]:
        """The window pairs of ``severity``, scaled."""
        windows = self.burn_windows
        pairs = windows.page if severity == "page" else windows.ticket
        scale = self.burn_windows.scale
        return tuple(
            WindowPair(
                long=_scaled(p.long, scale),
                short=_scaled(p.short, scale),
                factor=p.factor,
            )
            for p in pairs
        )

    @property
    def windows(self) -> tuple[int, ...]:
        """Every rate window an SLO needs (pairs and period), shortest first."""
        found = {self.period}
        for severity in SEVERITIES:
            for pair in self.pairs(severity):
                found.update((pair.long, pair.short))
        return tuple(sorted(found))

    @property
    def guard_windows(self) -> tuple[int, ...]:
        """The short windows, where the traffic guard is taken."""
        return tuple(
            sorted({p.short for s in SEVERITIES for p in self.pairs(s)}),
        )


SEVERITIES: tuple[Severity, ...] = ("page", "ticket")


def _scaled(seconds: int, scale: float) -> int:
    return round(seconds * scale)


def load_slo_config(path: Path) -> SloConfig:
    """Read and check an SLO file; any problem is one ConfigError line."""
    data = read_yaml(path)
    if "source" in data:
        raise ConfigError(f"{path}: source: unknown field")
    config = load(SloConfig, {**data, "source": str(path)}, str(path))
    _check(config, str(path))
    return config


def _check(config: SloConfig, where: str) -> None:
    for severity in SEVERITIES:
        for index, pair in enumerate(config.pairs(severity)):
            field = f"burn_windows.{severity}.{index}"
            if min(pair.long, pair.short) < 1:
                raise ConfigError(
                    f"{where}: burn_windows.scale: {config.burn_windows.scale:g} "
                    f"makes a window of {field} shorter than 1s"
                )
            if pair.short >= pair.long:
                raise ConfigError(
                    f"{where}: {field}.short: {duration(pair.short)} must be "
                    f"shorter than the long window {duration(pair.long)}"
                )
    extra = _loadgen_edges(config.loadgen_slo, where)
    top = max(p.factor for s in SEVERITIES for p in config.pairs(s))
    seen: set[str] = set()
    for index, slo in enumerate(config.slos):
        field = f"slos.{index}"
        if slo.name in seen:
            raise ConfigError(f"{where}: {field}.name: {slo.name!r} is used twice")
        seen.add(slo.name)
        budget = 1 - slo.objective
        if top * budget >= 1:
            raise ConfigError(
                f"{where}: {field}.objective: SLO {slo.name!r}: {slo.objective:g} "
                f"leaves an error budget of {budget:.6g}, so the {top:g}x burn alert "
                f"would need an error ratio of {top * budget:.3g}, above 1 "
                "(raise the objective or lower the burn factor)"
            )
        if isinstance(slo, LatencySlo):
            _check_edge(slo, extra, f"{where}: {field}.threshold")


def _loadgen_edges(text: str, where: str) -> Mapping[str, tuple[float, ...]]:
    if not text.strip():
        return {}
    try:
        terms = parse_slo(text)
    except ConfigError as exc:
        raise ConfigError(f"{where}: loadgen_slo: {exc}") from None
    edges: dict[str, tuple[float, ...]] = {}
    for term in terms:
        if term.threshold > 0:
            edges[term.figure] = (*edges.get(term.figure, ()), term.threshold)
    return edges


def edges_of(slo: LatencySlo, loadgen_slo: str = "") -> tuple[float, ...]:
    """The bucket edges ``slo``'s histogram is published with, sorted."""
    extra = _loadgen_edges(loadgen_slo, "loadgen_slo") if slo.source == "client" else {}
    return _merged(slo, extra)


def _merged(
    slo: LatencySlo, extra: Mapping[str, tuple[float, ...]]
) -> tuple[float, ...]:
    added = extra.get(slo.figure, ()) if slo.source == "client" else ()
    return tuple(sorted({*slo.histogram.edges, *added}))


def _check_edge(
    slo: LatencySlo, extra: Mapping[str, tuple[float, ...]], field: str
) -> None:
    edges = _merged(slo, extra)
    if slo.threshold in edges:
        return
    below = [e for e in edges if e < slo.threshold][-1:]
    above = [e for e in edges if e > slo.threshold][:1]
    nearest = ", ".join(f"{e:g}" for e in (*below, *above))
    hint = (
        f" (or add {slo.figure}_p99<={slo.threshold:g} to loadgen_slo, the --slo the "
        "load generator runs with)"
        if slo.source == "client"
        else ""
    )
    raise ConfigError(
        f"{field}: SLO {slo.name!r}: {slo.threshold:g} s is not a bucket edge of "
        f"{slo.histogram.series.name}; nearest edges: {nearest}{hint}"
    )
