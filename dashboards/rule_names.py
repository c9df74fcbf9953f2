"""The names ``servemon rules`` gives its recording rules and alerts.

The rules generator names every rule through this module, and the dashboards find
the rules through it too (:func:`burn_rate_regex`), so a rename reaches both.

Recording rules are named ``level:metric:operations``. The level is ``target_model``,
the labels every SLO rule keeps (:data:`LEVEL_LABELS`): it sums ``by (target,
model)``, dropping the load stage, the engine's data-parallel rank and the scrape's
instance. The metric is the servemon series the rule reads (a counter without
``_total``), the operations say what was done to it, newest first, with the window
last:

- ``target_model:servemon_client_requests:rate5m`` (and the engine's
  ``servemon_engine_requests_finished``): finished requests per second, at each short
  window; the traffic guard of the burn alerts.
- ``target_model:<metric>:error_ratio_rate<W>{slo="<name>"}``: the share of bad events
  over W. W is every window of the burn pairs and the SLO period itself
  (``rate30d``).
- ``target_model:<metric>:burn_rate<W>{slo="<name>"}``: that ratio over the error
  budget (1 - objective).

``servemon autoscale`` (:mod:`servemon.dashboards.autoscale`) names its rule for one
scaled workload, the labels its rule sets:

- ``namespace_workload:<metric>:per_pod_avg<W>``: an engine gauge (the waiting queue
  or KV-cache usage) per replica: each pod's engines combined, averaged over W, then
  averaged over the pods. An engine's own name (``vllm:num_requests_waiting``) is
  written with ``_`` for ``:``.

The energy rules (:mod:`servemon.dashboards.energy`) keep other levels:
``job_instance``, the scrape of one exporter and so the host of its GPUs, and
``target_model``:

- ``job_instance:servemon_gpu_power_watts:sum``: the host's power gauge, W;
- ``job_instance:servemon_gpu_energy_joules:rate5m``: its mean power from the
  energy counter, W;
- ``target_model:servemon_gpu_energy_joules:rate5m``: a target's share of it, W;
- ``target_model:servemon_gpu_energy_joules_per_generation_token:ratio_rate5m``:
  joules per output token;
- ``target_model:servemon_gpu_cost_usd_per_million_generation_tokens:ratio_rate5m``
  (with ``--gpu-hour-cost``): dollars per million output tokens.
"""

from __future__ import annotations

from typing import TypedDict

from servemon.core import names
from servemon.core.names import Series
from servemon.core.promql import DURATION_REGEX, duration
from servemon.dashboards.sli import REQUESTS, SourceName, slo_series
from servemon.dashboards.slos import LatencySlo, Slo

__all__ = [
    "ALERT_BURN",
    "ALERT_CLIENT_STALLED",
    "ALERT_ENGINE_ABSENT",
    "ALERT_EXPORTER_ABSENT",
    "ALERT_GPU_MEMORY",
    "ALERT_KV_CACHE",
    "ALERT_PREEMPTIONS",
    "ALERT_QUEUE",
    "ALERT_TARGET_DOWN",
    "AUTOSCALE_LEVEL",
    "BURN_RATE",
    "ENERGY_PER_TOKEN",
    "ENERGY_RULES",
    "ERROR_RATIO",
    "GPU_COST_PER_MTOK",
    "HOST_ENERGY_RATE",
    "HOST_POWER",
    "LEVEL",
    "LEVEL_LABELS",
    "TARGET_ENERGY_RATE",
    "TRAFFIC",
    "EnergyRule",
    "Rule",
    "RuleFile",
    "RuleGroup",
    "autoscale_record_name",
    "burn_rate_name",
    "burn_rate_regex",
    "energy_record_name",
    "error_ratio_name",
    "metric_of",
    "record_name",
    "traffic_name",
]

#: One rule of a group, recording or alerting, as the rule file writes it.
Rule = dict[str, object]


class RuleGroup(TypedDict):
    """One group of the rule file: its name and its rules."""

    name: str
    rules: list[Rule]


class RuleFile(TypedDict):
    """The rule file: ``{"groups": [...]}``."""

    groups: list[RuleGroup]


ALERT_BURN = "ServemonErrorBudgetBurn"
ALERT_QUEUE = "ServemonQueueBacklog"
ALERT_KV_CACHE = "ServemonKvCacheHigh"
ALERT_PREEMPTIONS = "ServemonPreemptions"
ALERT_GPU_MEMORY = "ServemonGpuMemoryHigh"
ALERT_TARGET_DOWN = "ServemonTargetDown"
ALERT_EXPORTER_ABSENT = "ServemonExporterAbsent"
ALERT_ENGINE_ABSENT = "ServemonEngineMetricsAbsent"
ALERT_CLIENT_STALLED = "ServemonClientStalled"

#: The labels every SLO recording rule keeps, and the level they name.
LEVEL_LABELS: tuple[str, ...] = ("target", "model")
LEVEL = "_".join(LEVEL_LABELS)

#: The level of the autoscaling rule: one workload, by its namespace and name.
AUTOSCALE_LEVEL = "namespace_workload"

#: The operations of the recording rules (each followed by its window).
TRAFFIC = "rate"
ERROR_RATIO = "error_ratio_rate"
BURN_RATE = "burn_rate"


#: An energy rule: its level, its metric (a series' base name, or a name made of
#: them with ``_per_``) and its operation; a windowed operation ends in ``rate``.
EnergyRule = tuple[str, str, str]
_GPU_ENERGY = names.GPU_ENERGY.base
HOST_POWER: EnergyRule = ("job_instance", names.GPU_POWER.base, "sum")
HOST_ENERGY_RATE: EnergyRule = ("job_instance", _GPU_ENERGY, "rate")
TARGET_ENERGY_RATE: EnergyRule = (LEVEL, _GPU_ENERGY, "rate")
ENERGY_PER_TOKEN: EnergyRule = (
    LEVEL,
    "servemon_gpu_energy_joules_per_generation_token",
    "ratio_rate",
)
GPU_COST_PER_MTOK: EnergyRule = (
    LEVEL,
    "servemon_gpu_cost_usd_per_million_generation_tokens",
    "ratio_rate",
)

#: Every energy rule, in the order of the rule file.
ENERGY_RULES = (
    HOST_POWER,
    HOST_ENERGY_RATE,
    TARGET_ENERGY_RATE,
    ENERGY_PER_TOKEN,
    GPU_COST_PER_MTOK,
)


def energy_record_name(rule: EnergyRule, window: int | None = None) -> str:
    """``level:metric:operation`` with the window after a rate."""
    level, metric, operation = rule
    return f"{level}:{metric}:{operation}{'' if window is None else duration(window)}"


def autoscale_record_name(metric: str, window: int) -> str:
    """``namespace_workload:<metric>:per_pod_avg<W>``."""
    return f"{AUTOSCALE_LEVEL}:{metric.replace(':', '_')}:per_pod_avg{duration(window)}"


def record_name(series: Series, operation: str, window: int) -> str:
    """``target_model:<metric>:<operation><window>``."""
    return f"{LEVEL}:{series.base}:{operation}{duration(window)}"


def metric_of(slo: Slo) -> Series:
    """The series an SLO reads: its histogram, or its requests counter."""
    return slo.histogram.series if isinstance(slo, LatencySlo) else REQUESTS[slo.source]


def error_ratio_name(slo: Slo, window: int) -> str:
    """``target_model:<metric>:error_ratio_rate<W>``."""
    return record_name(metric_of(slo), ERROR_RATIO, window)


def burn_rate_name(slo: Slo, window: int) -> str:
    """``target_model:<metric>:burn_rate<W>``."""
    return record_name(metric_of(slo), BURN_RATE, window)


def traffic_name(source: SourceName, window: int) -> str:
    """``target_model:<requests counter>:rate<W>``: the traffic guard."""
    return record_name(REQUESTS[source], TRAFFIC, window)


def burn_rate_regex() -> str:
    """A regular expression matching the name of every burn-rate rule, whatever
    the SLO file: every series an SLO can read, at any window."""
    metrics = "|".join(series.base for series in slo_series())
    return f"{LEVEL}:({metrics}):{BURN_RATE}{DURATION_REGEX}"
