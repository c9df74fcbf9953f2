"""The overview's MFU and bandwidth panel under Prometheus' own evaluator.

The panel's queries, as the generated dashboard holds them (variables at their
defaults, as Grafana sends them), are evaluated by ``promtool test rules`` over the
engine's per-GPU estimates of two data-parallel ranks: the MFU over the
``peak_tflops`` variable, the bandwidth over NVML's peak where the exporter
publishes one and over the ``peak_bandwidth_gbps`` variable where it does not.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from servemon.core import names
from servemon.dashboards.build import dashboard_json
from servemon.dashboards.panels import PEAK_DEFAULTS

PROMTOOL = shutil.which("promtool")

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        PROMTOOL is None,
        reason="promtool not on PATH (Debian: apt-get install prometheus)",
    ),
]

TITLE = "MFU and memory-bandwidth utilization (engine estimates)"
#: Per GPU and second: FLOPs, bytes read, bytes written (both ranks alike).
FLOPS, READ, WRITE = 1e14, 3e11, 2e10


def panel_exprs() -> list[str]:
    """The panel's queries with the variables as Grafana fills them in."""
    data = json.loads(dashboard_json("servemon-overview"))
    (panel,) = [p for p in data["panels"] if p["title"] == TITLE]
    out = []
    for target in panel["targets"]:
        expr = target["expr"].replace("$__rate_interval", "30s")
        for name, value in PEAK_DEFAULTS.items():
            expr = expr.replace("$" + name, value)
        for name in ("target", "model", "gpu"):
            expr = expr.replace("$" + name, ".*")
        assert "$" not in expr, expr
        out.append(expr)
    return out


def estimates() -> list[dict[str, str]]:
    series = []
    for rank in ("0", "1"):
        labels = f'target="t",model="m",engine="vllm",rank="{rank}"'
        for s, per_s in (
            (names.ENGINE_ESTIMATED_FLOPS, FLOPS),
            (names.ENGINE_ESTIMATED_READ_BYTES, READ),
            (names.ENGINE_ESTIMATED_WRITE_BYTES, WRITE),
        ):
            series.append(
                {"series": f"{s.name}{{{labels}}}", "values": f"0+{per_s}x60"}
            )
    return series


def nvml_peak(bytes_per_second: float) -> dict[str, str]:
    labels = 'gpu="0",uuid="GPU-0",name="NVIDIA H100 80GB HBM3"'
    name = names.GPU_MEMORY_BANDWIDTH_PEAK.name
    return {"series": f"{name}{{{labels}}}", "values": f"{bytes_per_second}x60"}


def promtool(tmp_path: Path, series: list[dict[str, str]], tests: Any) -> None:
    assert PROMTOOL is not None
    test = {
        "rule_files": [],
        "evaluation_interval": "1s",
        "tests": [
            {"interval": "1s", "input_series": series, "promql_expr_test": tests}
        ],
    }
    path = tmp_path / "utilization_test.yaml"
    path.write_text(yaml.safe_dump(test, sort_keys=False), encoding="utf-8")
    done = subprocess.run(
        [PROMTOOL, "test", "rules", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def expect(expr: str, value: float) -> dict[str, Any]:
    return {
        "expr": expr,
        "eval_time": "60s",
        "exp_samples": [{"labels": '{target="t"}', "value": value}],
    }


@pytest.mark.parametrize("nvml", [True, False], ids=["nvml-peak", "variable-peak"])
def test_mfu_and_bandwidth_over_the_peaks(tmp_path: Path, nvml: bool) -> None:
    mfu, bandwidth = panel_exprs()
    peak_bandwidth = (
        3.2e12 if nvml else float(PEAK_DEFAULTS["peak_bandwidth_gbps"]) * 1e9
    )
    series = estimates() + ([nvml_peak(peak_bandwidth)] if nvml else [])
    peak_flops = float(PEAK_DEFAULTS["peak_tflops"]) * 1e12
    promtool(
        tmp_path,
        series,
        [
            expect(mfu, FLOPS / peak_flops),
            expect(bandwidth, (READ + WRITE) / peak_bandwidth),
        ],
    )
