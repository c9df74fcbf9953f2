"""The GPU dashboard, and the GPU panels the serving overview shares with it.

The energy row's figures are :mod:`servemon.dashboards.energy`'s, the recording rules'
spelling at ``$__rate_interval``; the cost panel is there when the dashboards are
built with a price per GPU-hour (``servemon dashboards --gpu-hour-cost USD``).
"""

from __future__ import annotations

from grafanalib import core as g

from servemon.core import names as n
from servemon.dashboards.energy import (
    cost_per_mtok,
    energy_per_token,
    target_energy_rate,
)
from servemon.dashboards.panels import Layout, dashboard, stat, timeseries
from servemon.dashboards.queries import (
    GPU,
    MODEL,
    RATE_INTERVAL,
    TARGET,
    current,
    increase,
    rate,
)

__all__ = ["energy_panels", "gpu", "gpu_panels"]


def gpu_panels(lay: Layout) -> None:
    """Utilization, memory, power, temperature, clocks and throttling, per GPU."""
    lay.add(
        timeseries(
            "GPU utilization",
            "percentunit",
            (current(n.GPU_UTILIZATION, agg="max", by=("gpu",)), "gpu {{gpu}}"),
            (
                current(n.GPU_MEMORY_UTILIZATION, agg="max", by=("gpu",)),
                "memory {{gpu}}",
            ),
        )
    )
    lay.add(
        timeseries(
            "GPU memory",
            "bytes",
            (current(n.GPU_MEMORY_USED, by=("gpu",)), "used {{gpu}}"),
            (current(n.GPU_MEMORY_TOTAL, by=("gpu",)), "total {{gpu}}"),
        )
    )
    lay.add(
        timeseries(
            "Power",
            "watt",
            (current(n.GPU_POWER, by=("gpu",)), "draw {{gpu}}"),
            (rate(n.GPU_ENERGY, by=("gpu",)), "from energy {{gpu}}"),
            (current(n.GPU_POWER_LIMIT, by=("gpu",)), "limit {{gpu}}"),
        ),
        width=8,
    )
    lay.add(
        timeseries(
            "Temperature",
            "celsius",
            (current(n.GPU_TEMPERATURE, agg="max", by=("gpu",)), "{{gpu}}"),
        ),
        width=8,
    )
    lay.add(
        timeseries(
            "Clocks",
            "hertz",
            (current(n.GPU_SM_CLOCK, agg="max", by=("gpu",)), "SM {{gpu}}"),
            (current(n.GPU_MEMORY_CLOCK, agg="max", by=("gpu",)), "memory {{gpu}}"),
        ),
        width=8,
    )
    lay.add(
        timeseries(
            "Clock throttling (active reasons)",
            "short",
            (
                current(n.GPU_THROTTLE, 'reason!="gpu_idle"', by=("gpu", "reason")),
                "{{gpu}} {{reason}}",
            ),
        ),
        width=24,
        height=6,
    )


def energy_panels(lay: Layout, gpu_hour_cost: float | None = None) -> None:
    """Power and energy per output token per target, and cost per million output
    tokens at ``gpu_hour_cost`` dollars per GPU-hour (no panel without a price)."""
    width = 12 if gpu_hour_cost is None else 8
    picked = ((GPU,), TARGET, MODEL)
    lay.add(
        timeseries(
            "GPU power per target (from energy)",
            "watt",
            (target_energy_rate(RATE_INTERVAL, *picked), "{{target}} {{model}}"),
            description="Mean power from the GPUs' energy counters, each host's "
            "shared among its targets by their output tokens. Empty where NVML "
            "has no energy counter (before Volta) or nothing is generated.",
        ),
        width=width,
    )
    lay.add(
        timeseries(
            "Energy per output token",
            "joule",
            (energy_per_token(RATE_INTERVAL, *picked), "{{target}} {{model}}"),
            description="GPU energy per second over output tokens per second "
            "(servemon_engine_generation_tokens_total). Empty, never 0, without "
            "an energy counter or output tokens.",
        ),
        width=width,
    )
    if gpu_hour_cost is not None:
        lay.add(
            timeseries(
                "Cost per million output tokens",
                "currencyUSD",
                (
                    cost_per_mtok(gpu_hour_cost, RATE_INTERVAL, *picked),
                    "{{target}} {{model}}",
                ),
                description=f"GPUs x ${gpu_hour_cost:g} per GPU-hour / 3600 / "
                "output tokens per second x 1e6.",
            ),
            width=width,
        )


def gpu(gpu_hour_cost: float | None = None) -> g.Dashboard:
    """Per GPU and per process, and energy and cost per output token."""
    lay = Layout()
    gpu_panels(lay)
    energy_panels(lay, gpu_hour_cost)
    lay.add(
        timeseries(
            "GPU memory per process",
            "bytes",
            (
                current(n.GPU_PROCESS_MEMORY, by=("gpu", "pid", "process")),
                "{{gpu}} {{process}} ({{pid}})",
            ),
        ),
        width=12,
    )
    lay.add(
        timeseries(
            "PCIe throughput",
            "Bps",
            (current(n.GPU_PCIE_RX, by=("gpu",)), "rx {{gpu}}"),
            (current(n.GPU_PCIE_TX, by=("gpu",)), "tx {{gpu}}"),
        ),
        width=12,
    )
    lay.add(
        timeseries(
            "ECC errors",
            "short",
            (increase(n.GPU_ECC_ERRORS, by=("gpu", "type")), "{{gpu}} {{type}}"),
        ),
        width=12,
    )
    lay.add(stat("NVML readable", "short", current(n.GPU_UP, agg="min")), width=6)
    lay.add(stat("GPU sample age", "s", current(n.GPU_SAMPLE_AGE, agg="max")), width=6)
    return dashboard("servemon: GPU", "servemon-gpu", lay, gpu=True)
