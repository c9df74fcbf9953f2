"""The energy rules under promtool, with exact numbers: GPUs at known power and
engines at known output token rates give known watts, joules per token and dollars
per million tokens; where energy or tokens are missing there is no sample at all."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from servemon.core import names
from servemon.dashboards.rule_names import (
    ENERGY_PER_TOKEN,
    GPU_COST_PER_MTOK,
    HOST_ENERGY_RATE,
    HOST_POWER,
    TARGET_ENERGY_RATE,
    energy_record_name,
)
from servemon.dashboards.rules import load_slo_config, write_rules

PROMTOOL = shutil.which("promtool")

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        PROMTOOL is None,
        reason="promtool not on PATH (Debian: apt-get install prometheus)",
    ),
]

ROOT = Path(__file__).resolve().parents[2]
STEP_S = 60
W = 300  # the rules' window


def _series(series: names.Series, labels: dict[str, str]) -> str:
    inner = ",".join(f'{k}="{v}"' for k, v in labels.items())
    return f"{series.name}{{{inner}}}"


def _host(instance: str) -> dict[str, str]:
    return {"job": "servemon", "instance": instance}


def gpu(instance: str, index: int, watts: float, *, energy: bool = True) -> list[Any]:
    """One GPU's input series: power, memory total and (if it has one) its energy
    counter growing at ``watts``."""
    labels = {**_host(instance), "gpu": str(index), "uuid": f"GPU-{instance}-{index}"}
    labels["name"] = "NVIDIA H200"
    rows = [
        {"series": _series(names.GPU_POWER, labels), "values": f"{watts:g}x20"},
        {"series": _series(names.GPU_MEMORY_TOTAL, labels), "values": "1.5e11x20"},
    ]
    if energy:  # a counter from a non-zero start: energy since the driver loaded
        per_step = watts * STEP_S
        values = f"7000000+{per_step:g}x20"
        rows.append({"series": _series(names.GPU_ENERGY, labels), "values": values})
    return rows


def tokens(instance: str, target: str, per_s: float) -> dict[str, str]:
    labels = {**_host(instance), "target": target, "model": "m"}
    labels |= {"engine": "vllm", "rank": "0"}
    series = _series(names.ENGINE_GENERATION_TOKENS, labels)
    return {"series": series, "values": f"1000+{per_s * STEP_S:g}x20"}


INPUT = [
    # host a: 2 GPUs at 300 W, one target at 100 tok/s
    *gpu("a:9400", 0, 300),
    *gpu("a:9400", 1, 300),
    tokens("a:9400", "demo", 100),
    # host b: 1 GPU at 400 W shared by two targets, 30 and 10 tok/s
    *gpu("b:9400", 0, 400),
    tokens("b:9400", "x", 30),
    tokens("b:9400", "y", 10),
    # host c: a GPU without an energy counter (before Volta)
    *gpu("c:9400", 0, 250, energy=False),
    tokens("c:9400", "old", 50),
    # host d: energy, but nothing generated
    *gpu("d:9400", 0, 100),
    tokens("d:9400", "idle", 0),
]


def _record(rule: Any, window: int | None = W) -> str:
    """The rule to the thousandth: float division leaves a last bit here and
    there (400 W x 30/40 tok/s read 300.0000000000006 W), and promtool 2.42
    compares exactly."""
    return f"round({energy_record_name(rule, window)} * 1000) / 1000"


def _per_target(values: dict[str, float]) -> list[dict[str, Any]]:
    return [
        {"labels": f'{{model="m",target="{t}"}}', "value": round(v, 3)}
        for t, v in values.items()
    ]


def _per_host(values: dict[str, float], extra: str = "") -> list[dict[str, Any]]:
    return [
        {"labels": f'{{{extra}instance="{h}",job="servemon"}}', "value": v}
        for h, v in values.items()
    ]


def expected(price: float | None) -> list[dict[str, Any]]:
    checks = [
        {
            "expr": _record(HOST_POWER, None),
            "eval_time": "10m",
            "exp_samples": _per_host(
                {"a:9400": 600, "b:9400": 400, "c:9400": 250, "d:9400": 100}
            ),
        },
        {
            "expr": _record(HOST_ENERGY_RATE),
            "eval_time": "10m",
            "exp_samples": _per_host({"a:9400": 600, "b:9400": 400, "d:9400": 100}),
        },
        {
            "expr": _record(TARGET_ENERGY_RATE),
            "eval_time": "10m",
            "exp_samples": _per_target({"demo": 600, "x": 300, "y": 100}),
        },
        {
            # 600 W / 100 tok/s; 400 W / (30 + 10) tok/s; no energy or no tokens:
            # no sample, never 0
            "expr": _record(ENERGY_PER_TOKEN),
            "eval_time": "10m",
            "exp_samples": _per_target({"demo": 6, "x": 10, "y": 10}),
        },
    ]
    if price is not None:
        # 2 GPUs x price / 3600 s / 100 tok/s x 1e6; host b: 1 GPU / 40 tok/s;
        # host c has no energy counter but a GPU-hour price: it has a cost
        per_gpu_s = price / 3600 * 1e6
        checks.append(
            {
                "expr": _record(GPU_COST_PER_MTOK),
                "eval_time": "10m",
                "exp_samples": [
                    {
                        "labels": f'{{gpu_hour_cost="{price:g}",model="m",'
                        f'target="{t}"}}',
                        "value": round(v, 3),
                    }
                    for t, v in {
                        "demo": 2 / 100 * per_gpu_s,
                        "x": 1 / 40 * per_gpu_s,
                        "y": 1 / 40 * per_gpu_s,
                        "old": 1 / 50 * per_gpu_s,
                    }.items()
                ],
            }
        )
    return checks


def run(tmp_path: Path, price: float | None) -> subprocess.CompletedProcess[str]:
    assert PROMTOOL is not None
    config = load_slo_config(ROOT / "deploy" / "slos.example.yaml")
    (rule_file,) = write_rules(config, tmp_path / "rules", gpu_hour_cost=price)
    tests = {
        "rule_files": [str(rule_file)],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": INPUT,
                "promql_expr_test": expected(price),
            }
        ],
    }
    test_file = tmp_path / "energy_test.yaml"
    test_file.write_text(yaml.safe_dump(tests, sort_keys=False))
    check = subprocess.run(
        [PROMTOOL, "check", "rules", str(rule_file)],
        capture_output=True,
        text=True,
        timeout=100,
        check=False,
    )
    assert check.returncode == 0, check.stdout + check.stderr
    return subprocess.run(
        [PROMTOOL, "test", "rules", str(test_file)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=100,
        check=False,
    )


@pytest.mark.parametrize("price", [2.0, 3.6, None])
def test_power_energy_per_token_and_cost_are_exact(
    tmp_path: Path, price: float | None
) -> None:
    done = run(tmp_path, price)
    assert done.returncode == 0, (done.stdout + done.stderr)[-20_000:]
    assert "SUCCESS" in done.stdout


def test_the_example_numbers() -> None:
    """2 GPUs at 300 W, 100 tok/s: 6 J/token; at $2 per GPU-hour, $11.11 per
    million output tokens (and $20 at $3.6)."""
    assert 2 * 300 / 100 == 6
    assert round(2 * 2.0 / 3600 / 100 * 1e6, 2) == 11.11
    assert pytest.approx(20) == 2 * 3.6 / 3600 / 100 * 1e6
