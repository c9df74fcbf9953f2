"""Energy and cost per output token, live from Prometheus: one spelling for the
recording rules and the GPU dashboard's panels, so the two give the same figures.

The GPUs are a host's and the tokens a target's. One exporter reads both (its host's
GPUs through NVML, its targets' ``/metrics``), so the two meet on the scrape's own
labels, ``job`` and ``instance`` (:data:`HOST`). Per host:

- power, W: ``sum(servemon_gpu_power_watts)``, NVML's gauge as last sampled, and
  ``sum(rate(servemon_gpu_energy_joules_total[w]))``, the mean power over the
  window from the energy counter (every draw between two scrapes counts);
- GPUs: ``count(servemon_gpu_memory_total_bytes)``, what a GPU-hour price is paid on.

A host's figure is shared among the targets and models it serves in proportion to
their output tokens (``servemon_engine_generation_tokens_total``), and a target's
figures sum its shares over its hosts:

- J per output token = the target's share of energy per second / its output tokens
  per second (hosts without an energy counter left out of both);
- $ per million output tokens = its share of GPUs x price per GPU-hour / 3600 / its
  output tokens per second x 1e6.

Where there is no energy counter (no NVML, a GPU before Volta, no exporter) or no
output token in the window, the figures have no sample: never a zero. No price, no
cost figure.
"""

from __future__ import annotations

from servemon.core import names
from servemon.core.promql import aggregate, duration, number, on, rate, selector
from servemon.dashboards.rule_names import (
    ENERGY_PER_TOKEN,
    GPU_COST_PER_MTOK,
    HOST_ENERGY_RATE,
    HOST_POWER,
    TARGET_ENERGY_RATE,
    Rule,
    RuleGroup,
    energy_record_name,
)

__all__ = [
    "ENERGY_GROUP",
    "ENERGY_WINDOW",
    "HOST",
    "PER_TARGET",
    "cost_per_mtok",
    "energy_group",
    "energy_per_token",
    "host_energy_rate",
    "host_gpus",
    "host_power",
    "target_energy_rate",
]

#: The labels a scrape adds, which name the exporter and so the host of its GPUs.
HOST: tuple[str, ...] = ("job", "instance")
#: The labels a per-token figure keeps.
PER_TARGET: tuple[str, ...] = ("target", "model")
ENERGY_GROUP = "servemon-energy"
#: The window of the recording rules (the panels use ``$__rate_interval``).
ENERGY_WINDOW = 300


def host_power(*gpu: str) -> str:
    """Watts per host, NVML's power gauge summed over the GPUs."""
    return aggregate("sum", selector(names.GPU_POWER, *gpu), HOST)


def host_energy_rate(window: str, *gpu: str) -> str:
    """Watts per host, from the energy counter: mean power over ``window``."""
    return aggregate("sum", rate(selector(names.GPU_ENERGY, *gpu), window), HOST)


def host_gpus(*gpu: str) -> str:
    """GPUs per host."""
    return aggregate("count", selector(names.GPU_MEMORY_TOTAL, *gpu), HOST)


def _tokens(window: str, by: tuple[str, ...], *matchers: str) -> str:
    samples = rate(selector(names.ENGINE_GENERATION_TOKENS, *matchers), window)
    return aggregate("sum", samples, by)


def _shared(per_host: str, window: str, *tokens: str) -> str:
    """``per_host`` shared among each host's targets and models by their output
    tokens over ``window``, summed per target and model."""
    mine = _tokens(window, (*HOST, *PER_TARGET), *tokens)
    host = _tokens(window, HOST)  # every target's, whatever ``tokens`` picks
    share = f"{mine}\n  / {on(HOST)} group_left ()\n  ({host} > 0)"
    return aggregate(
        "sum",
        f"\n  {per_host}\n  * {on(HOST)} group_right ()\n  (\n  {share}\n  )\n",
        PER_TARGET,
    )


def _per_token(per_host: str, window: str, *tokens: str) -> str:
    """A target's share of ``per_host`` per output token per second; only hosts
    where ``per_host`` has a sample count the target's tokens."""
    mine = _tokens(window, (*HOST, *PER_TARGET), *tokens)
    counted = aggregate("sum", f"{mine}\n  and {on(HOST)}\n  {per_host}", PER_TARGET)
    return f"{_shared(per_host, window, *tokens)}\n/\n({counted} > 0)\n"


def target_energy_rate(window: str, gpu: tuple[str, ...] = (), *tokens: str) -> str:
    """Watts per target and model: its share of its hosts' energy per second."""
    return _shared(host_energy_rate(window, *gpu), window, *tokens)


def energy_per_token(window: str, gpu: tuple[str, ...] = (), *tokens: str) -> str:
    """Joules per output token, per target and model."""
    return _per_token(host_energy_rate(window, *gpu), window, *tokens)


def cost_per_mtok(
    gpu_hour_cost: float, window: str, gpu: tuple[str, ...] = (), *tokens: str
) -> str:
    """Dollars per million output tokens at ``gpu_hour_cost`` per GPU-hour."""
    gpu_seconds_per_token = _per_token(host_gpus(*gpu), window, *tokens)
    return f"(\n{gpu_seconds_per_token})\n* {number(gpu_hour_cost / 3600 * 1e6)}\n"


def energy_group(gpu_hour_cost: float | None, window: int = ENERGY_WINDOW) -> RuleGroup:
    """The ``servemon-energy`` group: power per host, and per target and model the
    energy per second and per output token, and (given a price) the cost per
    million output tokens."""
    w = duration(window)
    rules: list[Rule] = [
        {"record": energy_record_name(HOST_POWER), "expr": host_power()},
        {
            "record": energy_record_name(HOST_ENERGY_RATE, window),
            "expr": host_energy_rate(w),
        },
        {
            "record": energy_record_name(TARGET_ENERGY_RATE, window),
            "expr": target_energy_rate(w),
        },
        {
            "record": energy_record_name(ENERGY_PER_TOKEN, window),
            "expr": energy_per_token(w),
        },
    ]
    if gpu_hour_cost is not None:
        rules.append(
            {
                "record": energy_record_name(GPU_COST_PER_MTOK, window),
                "expr": cost_per_mtok(gpu_hour_cost, w),
                "labels": {"gpu_hour_cost": number(gpu_hour_cost)},
            }
        )
    return {"name": ENERGY_GROUP, "rules": rules}
