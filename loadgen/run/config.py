"""Configuration of a load run: every flag of the load commands (``ramp``, ``sweep``,
``capacity``, ``replay``, ``control``) as a field of :class:`LoadConfig`, the flags
several of them read at its top level and a command's own in its section
(:mod:`servemon.loadgen.run.sections`, :data:`SECTIONS`).

YAML (``--config servemon.yaml``) uses the flag names with underscores, flat as the
flags are; flags win. :func:`servemon.loadgen.run.flat.config_of` is the one place flat
keys become the config, a command's own going into its section.
Secrets never live here: the API key comes from ``SERVEMON_API_KEY``, a header file
(``--header-file``) is named here but read only when the request headers are built
(:func:`config_headers`, once, by the plan), and header values are wrapped in
:class:`servemon.core.fields.Secret` there, so the config can be recorded with its
header values redacted (:func:`servemon.loadgen.run.plan.recorded_config`).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import typing
from collections.abc import Mapping, Sequence
from dataclasses import field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, TypeVar

from annotated_types import Ge, Gt, Le
from pydantic import BeforeValidator
from pydantic.dataclasses import dataclass

from servemon.core.errors import ConfigError
from servemon.core.fields import FORBID_EXTRA, Secret
from servemon.core.signals import parse_selector
from servemon.core.slo import SloTerm, SloTier, parse_tiers
from servemon.loadgen.run.choices import (
    EnergyChoice,
    ModelChoice,
    parse_energy,
    parse_model_choice,
)
from servemon.loadgen.run.sections import (
    HOLDABLE,
    PACED,
    PACED_BY_DEFAULT,
    PROMETHEUS_ONLY,
    SECTIONS,
    CapacityArgs,
    ControlArgs,
    Hold,
    Kind,
    Positive,
    RampArgs,
    ReplayArgs,
    Section,
    Signal,
    SweepArgs,
    check_sections,
    from_text,
    paces,
    parse_hold,
)
from servemon.loadgen.send.arrivals import (
    Arrival,
    Shard,
    parse_arrival,
    parse_start_at,
)
from servemon.loadgen.workloads.workload import WorkloadSpec, parse_workload

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

#: Words that mark a header name as a credential's (``Authorization``,
#: ``X-Api-Key``, ``X-Auth-Token``, ``Cookie``).
SECRET_WORDS = ("auth", "key", "token", "secret", "password", "cookie")

__all__ = [
    "HOLDABLE",
    "PACED",
    "PACED_BY_DEFAULT",
    "PROMETHEUS_ONLY",
    "SECTIONS",
    "CapacityArgs",
    "ControlArgs",
    "EnergyChoice",
    "Hold",
    "Kind",
    "LoadConfig",
    "ModelChoice",
    "RampArgs",
    "ReplayArgs",
    "Section",
    "Settings",
    "Signal",
    "SweepArgs",
    "auth_headers",
    "config_headers",
    "header_lines",
    "paces",
    "parse_extra_body",
    "parse_hold",
    "secret_header_names",
    "settings_of",
]


def _slo_tiers(value: Any) -> Any:
    """``--slo`` as tiers: none (``slo: null`` in YAML), one text, several (a
    repeated flag, a YAML list) or a YAML mapping of name to terms; terms already
    parsed are one unnamed tier."""
    if value is None:
        return ()
    if isinstance(value, str | Mapping):
        return parse_tiers(value)
    items = tuple(value)
    if items and all(isinstance(v, SloTerm) for v in items):
        return (SloTier("", items),)
    if items and all(isinstance(v, str) for v in items):
        return parse_tiers(items)
    return items


#: The SLO, as one or more tiers (several only for a capacity search).
Slo = Annotated[tuple[SloTier, ...], BeforeValidator(_slo_tiers)]
ArrivalSpec = Annotated[Arrival, from_text(parse_arrival)]
EnergyText = Annotated[EnergyChoice, from_text(parse_energy)]
ModelText = Annotated[ModelChoice, from_text(parse_model_choice)]
StartAt = Annotated[datetime, from_text(parse_start_at)]
WorkloadText = Annotated[WorkloadSpec, from_text(parse_workload)]
#: ``--select``'s label matchers (none: every series).
Selector = Annotated[
    tuple[str, ...],
    BeforeValidator(lambda v: () if v is None else v),
    from_text(parse_selector),
]


@functools.cache
def _default_workload() -> WorkloadSpec:
    """The default ``--workload``, parsed once however many configs are built (the
    CLI's help fills its defaults from a config of each command)."""
    return parse_workload("random:prompt=128,output=128")


@dataclass(frozen=True, slots=True, kw_only=True, config=FORBID_EXTRA)
class LoadConfig:
    """Everything a load run takes (see ``docs/loadgen.md``): the flags several load
    commands read, and the run's command's section, in the field named as the
    command (the others None; built from flat keys by
    :func:`~servemon.loadgen.run.flat.config_of`). Validated however it is built: the
    string flags (``slo``, ``arrival``, ``start_at``, ``workload``, ``select``,
    ``energy``, ``model``, the sections' ``stages``, ``shard`` and ``hold``) become
    their types here, once, and a bad one is a one-line :class:`ConfigError` naming
    the flag before anything starts."""

    target: str | None = None
    #: The ``target`` label of the live client series; by default host:port, as the
    #: exporter names the same target, so dashboards join the two.
    target_name: str | None = None
    #: One model, or a mix (``a=0.7,b=0.3``); None: the first the target lists.
    model: ModelText | None = None
    api: Literal["chat", "completions"] = "chat"
    stream: bool = True
    workload: WorkloadText = field(default_factory=lambda: _default_workload())
    tokenizer: str | None = None
    ignore_eos: bool = False
    extra_body: dict[str, Any] | None = None
    header: tuple[str, ...] = ()
    #: A file of ``Name: value`` lines, for headers that carry secrets.
    header_file: str | None = None
    timeout: Positive = 600.0
    out: str = "runs"
    #: Write ``report.html`` at the end (``--no-report``: ``servemon report DIR``
    #: writes it later, from the same files).
    report: bool = True
    metrics_port: Annotated[int, Ge(0), Le(65535)] = 9401
    metrics_host: str = "127.0.0.1"
    #: exporter-toolkit's web config for the live client /metrics
    #: (:mod:`servemon.core.wire.webconfig`).
    web_config_file: str | None = None
    seed: int = 0
    #: Where the target's GPU energy is read (:mod:`servemon.loadgen.run.energy`): auto,
    #: off, nvml, or the URL of an exporter's /metrics.
    energy: EnergyText = field(default_factory=lambda: EnergyChoice("auto"))
    #: The price of one of the target's GPUs per hour, or of the whole target
    #: (node) per hour: the cost per million output tokens and per good request.
    gpu_hour_cost: Positive | None = None
    node_hour_cost: Positive | None = None
    #: One SLO (a tier without a name), or several named tiers (capacity).
    slo: Slo = ()
    cancel_fraction: Annotated[float, Ge(0), Le(1)] = 0.0
    cancel_after: Positive | None = None
    cancel_after_tokens: Annotated[int, Ge(1)] | None = None
    grace: Annotated[float, Ge(0)] = 5.0
    max_connections: Annotated[int, Ge(1)] = 10_000
    sample_interval: Positive = 1.0
    #: A PM QoS bound on CPU wake-up latency held while the run sends, in
    #: microseconds (:mod:`servemon.loadgen.send.cpulatency`); None asks for nothing.
    cpu_dma_latency: Annotated[int, Ge(0)] | None = None
    # every open loop (ramp, replay, capacity, control): how it sends
    arrival: ArrivalSpec = field(default_factory=Arrival)
    max_inflight: Annotated[int, Ge(1)] = 1000
    #: Seconds the requests still in flight when the schedule ends get before they
    #: are cancelled; None: until they finish (each bounded by ``timeout``).
    drain: Annotated[float, Ge(0)] | None = None
    late: Literal["send", "skip"] = "send"
    late_tolerance: Annotated[float, Ge(0)] = 1.0
    #: When an open-loop schedule starts (ramp, replay, control); None: now.
    start_at: StartAt | None = None
    #: A workload's requests longer than the target's context (prompt plus output):
    #: refuse the run, leave them out, cut their prompts, or send them anyway.
    over_context: Literal["error", "skip", "truncate", "send"] = "error"
    #: Processes sending the run (a fleet over loopback; not a sweep's);
    #: ``auto`` (ramp): from the peak rate and the cost of a request
    #: (:mod:`servemon.loadgen.send.clientcost`).
    workers: Annotated[int, Ge(1), Le(64)] | Literal["auto"] = 1
    # server signals from Prometheus instead of the target's /metrics
    prometheus: str | None = None
    #: YAML with bearer_token or basic_auth for Prometheus (never logged).
    prometheus_auth_file: str | None = None
    #: Label matchers every signal query gets (``model="q",target=~"pool-a.*"``).
    select: Selector = ()
    #: Prometheus' scrape interval: a signal older than two of them is stale.
    #: None: asked of Prometheus (loadgen.run.promtargets), else 15 s.
    scrape_interval: Positive | None = None
    #: The range of rate() and histogram_quantile() in the signal queries.
    signal_window: Annotated[float, Ge(1)] = 30.0
    # guard rails (every load command)
    abort_error_rate: Annotated[float, Ge(0), Le(1)] = 0.2
    abort_waiting: Annotated[float, Gt(0)] = 5000.0
    #: The most an open loop may offer (ramp, replay, capacity, control).
    rps_max: Positive | None = None
    # a fleet of load machines (loadgen.fleet): this process coordinates
    #: HOST:PORT the coordinator takes its workers on; None: this process sends.
    fleet_listen: str | None = None
    #: Workers to wait for before the run starts.
    fleet_workers: Annotated[int, Ge(1), Le(1024)] | None = None
    #: The shared token's file (else ``$SERVEMON_FLEET_TOKEN``; never a flag).
    fleet_token_file: str | None = None
    #: Seconds to wait for the workers.
    fleet_wait: Positive = 120.0
    #: A worker lost: stop the run (exit 3), or go on with the others.
    on_worker_loss: Literal["abort", "continue"] = "abort"
    # the built-in simulator, when there is no target
    sim_profile: str = "qwen3-0.6b-eager"
    sim_args: tuple[str, ...] = field(default=())
    # each command's own flags: its section, None for any other command
    ramp: RampArgs | None = None
    sweep: SweepArgs | None = None
    capacity: CapacityArgs | None = None
    replay: ReplayArgs | None = None
    control: ControlArgs | None = None

    @property
    def slo_terms(self) -> tuple[SloTerm, ...]:
        """The terms goodput and each stage's pass/fail count by: the SLO's, or the
        first tier's where there are several."""
        return self.slo[0].terms if self.slo else ()

    def check_section(self, kind: Kind) -> None:
        """``kind``'s section is given, and no other command's is (what
        :func:`~servemon.loadgen.run.flat.config_of` makes of flat keys; a config built
        otherwise is checked here), in one line naming the flag."""
        check_sections({k: getattr(self, k) for k in SECTIONS}, kind)

    def section(self, kind: Kind) -> Section:
        """``kind``'s section (:meth:`check_section` first)."""
        self.check_section(kind)
        found: Section = getattr(self, kind)
        return found

    @property
    def shard(self) -> Shard | None:
        """The shard of the run's schedule (a ramp's, a replay's); None: all of it,
        or a command without a schedule of its own."""
        for section in (self.ramp, self.replay):
            if section is not None:
                return section.shard
        return None

    def check_tiers(self, kind: str) -> None:
        """Several SLO tiers are a capacity search's: any other command (``kind``)
        refuses them, in one line naming them."""
        if len(self.slo) > 1 and kind != "capacity":
            names = ", ".join(t.name for t in self.slo)
            raise ConfigError(
                f"--slo: several SLO tiers ({names}) are for capacity; {kind} takes one"
            )


def parse_extra_body(text: str) -> dict[str, Any]:
    """``--extra-body`` JSON: an object merged into every request body."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        msg = f"--extra-body: not JSON: {exc.msg} at column {exc.colno}"
        raise ConfigError(msg) from None
    if not isinstance(value, dict):
        raise ConfigError("--extra-body: expected a JSON object")
    return value


def header_lines(path: Path) -> tuple[str, ...]:
    """A header file's ``Name: value`` lines (blank lines and ``#`` comments
    skipped); a bad line is a one-line error that never shows a value."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(
            f"--header-file {path}: cannot read: {exc.strerror or exc}"
        ) from None
    lines = []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        name, sep, _ = line.partition(":")
        if not sep or not name.strip():
            raise ConfigError(
                f"--header-file {path}: line {number}: expected 'Name: value' "
                "(the line is not shown)"
            )
        lines.append(line)
    return tuple(lines)


#: A driver's settings: a dataclass of :class:`LoadConfig`'s fields.
Settings = TypeVar("Settings", bound="DataclassInstance")


def settings_of(kind: type[Settings], config: LoadConfig) -> Settings:
    """The part of ``config`` a driver reads: its command's section itself where
    ``kind`` is a section (:data:`SECTIONS`: every driver's own settings), else a
    view of the shared flags every driver gets (``Sending``, ``SignalSource``), a
    dataclass whose fields are named and typed as :class:`LoadConfig`'s
    (``tests/unit/loadgen/drivers/test_drive.py`` holds them to that), filled from
    the same-named fields, already validated."""
    for name, section in SECTIONS.items():
        if section is kind:
            value = getattr(config, name)
            if value is None:
                raise ConfigError(f"{name}: not a servemon {name} config")
            return typing.cast(Settings, value)
    values = {f.name: getattr(config, f.name) for f in dataclasses.fields(kind)}
    return kind(**values)


def secret_header_names(headers: Sequence[str]) -> list[str]:
    """The names of ``Name: value`` headers that look like credentials."""
    names = []
    for raw in headers:
        name = raw.partition(":")[0].strip()
        if any(word in name.lower() for word in SECRET_WORDS):
            names.append(name)
    return names


def config_headers(config: LoadConfig) -> dict[str, Secret]:
    """Request headers from ``--header-file`` and ``--header NAME: VALUE``, a flag
    winning over the file; the file is read here (the plan does it, once).

    Values are :class:`Secret`: they print as ``<redacted>`` anywhere but the request.
    """
    headers: dict[str, Secret] = {}
    if config.header_file is not None:
        for line in header_lines(Path(config.header_file)):
            name, _, value = line.partition(":")
            headers[name.strip()] = Secret(value.strip())
    for i, raw in enumerate(config.header):
        name, sep, value = raw.partition(":")
        if not sep or not name.strip():
            raise ConfigError(
                f"--header {i + 1}: expected 'Name: value' (the value is not shown)"
            )
        headers[name.strip()] = Secret(value.strip())
    return headers


def auth_headers(
    env: Mapping[str, str], configured: Mapping[str, Secret]
) -> dict[str, Secret]:
    """The request headers: ``SERVEMON_API_KEY``'s, then the ``configured`` ones
    (:func:`config_headers`), which win."""
    headers: dict[str, Secret] = {}
    key = env.get("SERVEMON_API_KEY")
    if key:
        headers["Authorization"] = Secret(f"Bearer {key}")
    return {**headers, **configured}
