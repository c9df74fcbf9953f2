"""``servemon demo``: the main job on the embedded default, end to end.

It starts the simulator (a Qwen3-0.6B-like vLLM with a small batch, so that it
saturates within a minute), the exporter beside it, and Prometheus if it is installed
(scraping both the exporter and the load generator's live metrics), runs a short
capacity search against the simulator, writes the report, and prints where everything
is. With ``--keep`` everything stays up afterwards until Ctrl-C, so the ``/metrics``
URLs and Prometheus can be looked at.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from urllib.parse import urlsplit

import yaml
from rich.console import Console

from servemon.core.slo import parse_tiers
from servemon.embedded import (
    embedded_exporter,
    embedded_prometheus,
    embedded_simulator,
    free_port,
)
from servemon.lifecycle import stop_on_signals
from servemon.load import console_for, run_command
from servemon.loadgen.record.runrecord import RunResult
from servemon.loadgen.run.choices import parse_energy
from servemon.loadgen.run.config import CapacityArgs, LoadConfig
from servemon.loadgen.workloads.workload import parse_workload

__all__ = ["DEMO_SLO", "run_demo", "simulator_args"]

DEMO_SLO = "ttft_p95<=0.5,itl_p95<=0.05,error_rate<=0.01"
#: The made-up GPU's price per hour: the demo's cost per token (a round figure).
DEMO_GPU_HOUR_COST = 2.0


def simulator_args(max_num_seqs: int, seed: int) -> list[str]:
    """``servemon sim``'s flags in the demo: today's vLLM's metric names (every
    dashboard panel that is not about a GPU has data) with the MFU estimates on."""
    return [
        *("--max-num-seqs", str(max_num_seqs), "--seed", str(seed)),
        *("--metrics-dialect", "vllm-0.34", "--enable-mfu-metrics"),
    ]


def prometheus_config(exporter_url: str, client_port: int) -> dict[str, object]:
    """A Prometheus config scraping the exporter and the load generator every 1 s."""
    exporter = urlsplit(exporter_url).netloc
    return {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "scrape_configs": [
            {
                "job_name": "servemon-exporter",
                "static_configs": [{"targets": [exporter]}],
            },
            {
                "job_name": "servemon-loadgen",
                "static_configs": [{"targets": [f"127.0.0.1:{client_port}"]}],
            },
        ],
    }


async def run_demo(
    *,
    profile: str,
    max_num_seqs: int,
    out: Path,
    seed: int,
    max_duration: float,
    keep: bool,
    step_seconds: float = 10.0,
) -> RunResult:
    """Run the demo (see the module docstring)."""
    console = console_for()
    sim_args = simulator_args(max_num_seqs, seed)
    async with embedded_simulator(profile, sim_args) as sim_url:
        console.print(
            f"simulator ({profile}, --max-num-seqs {max_num_seqs}): {sim_url}"
        )
        async with embedded_exporter(
            [f"sim={sim_url}"], ["--probe-interval", "5", "--fake-gpu"]
        ) as exp:
            console.print(
                f"exporter: {exp}/metrics (with one made-up GPU at a steady 300 W "
                f"and ${DEMO_GPU_HOUR_COST:g} an hour: the energy and cost per token "
                "below are the demo's arithmetic, not a real GPU's)"
            )
            client_port = free_port()
            prom_dir = out / "demo-prometheus"
            prom_dir.mkdir(parents=True, exist_ok=True)
            config_file = prom_dir / "prometheus.yml"
            config_file.write_text(yaml.safe_dump(prometheus_config(exp, client_port)))
            async with embedded_prometheus(
                config_file, prom_dir / "data", free_port()
            ) as prom:
                console.print(
                    f"prometheus: {prom}"
                    if prom
                    else "prometheus: not installed (scripts/system-deps installs it)"
                )
                console.print(
                    f"load generator /metrics: http://127.0.0.1:{client_port}"
                    "/metrics (while the search runs)"
                )
                config = LoadConfig(
                    target=sim_url,
                    slo=parse_tiers(DEMO_SLO),
                    capacity=CapacityArgs(
                        rps_min=1.0,
                        step_seconds=step_seconds,
                        settle=min(3.0, step_seconds / 3),
                        precision=0.1,
                        max_duration=max_duration,
                    ),
                    workload=parse_workload("random:prompt=128,output=64"),
                    metrics_port=client_port,
                    energy=parse_energy(f"{exp}/metrics"),
                    gpu_hour_cost=DEMO_GPU_HOUR_COST,
                    out=str(out),
                    seed=seed,
                    grace=3.0,
                )
                result = await run_command(
                    "capacity", config, sys.argv, console=console
                )
                if keep:
                    await _until_interrupted(console, prom)
    return result


async def _until_interrupted(console: Console, prom: str | None) -> None:
    where = f" (Prometheus: {prom})" if prom else ""
    console.print(f"everything stays up until Ctrl-C{where}")
    stop = asyncio.Event()
    with stop_on_signals(stop):
        await stop.wait()
