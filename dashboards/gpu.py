"""The GPU dashboard, and the GPU panels the serving overview shares with it."""

from __future__ import annotations

from grafanalib import core as g

from servemon.core import names as n
from servemon.dashboards.panels import Layout, dashboard, stat, timeseries
from servemon.dashboards.queries import current, increase

__all__ = ["gpu", "gpu_panels"]


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


def gpu() -> g.Dashboard:
    """Per GPU and per process."""
    lay = Layout()
    gpu_panels(lay)
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
