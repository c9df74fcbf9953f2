"""The signal queries of ``--prometheus`` runs (:mod:`servemon.core.signals`) under
Prometheus' own evaluator (``promtool test rules``): a fleet's series summed over a
selector, and the error rate of a run without failures 0, not missing."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from servemon.core import names
from servemon.core.signals import parse_selector, queries

PROMTOOL = shutil.which("promtool")

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        PROMTOOL is None,
        reason="promtool not on PATH (Debian: apt-get install prometheus)",
    ),
]

REQUESTS = names.CLIENT_REQUESTS.name
WAITING = names.ENGINE_REQUESTS_WAITING.name
#: 10 requests a second for a minute, as counters of one load generator.
STEADY = "0+10x60"


def promtool_test(tmp_path: Path, series: list[dict[str, str]], exprs: Any) -> str:
    """Run one promtool test of ``exprs`` at 60 s over ``series``; its output."""
    assert PROMTOOL is not None
    test = {
        "rule_files": [],
        "evaluation_interval": "1s",
        "tests": [
            {"interval": "1s", "input_series": series, "promql_expr_test": exprs}
        ],
    }
    path = tmp_path / "signals_test.yaml"
    path.write_text(yaml.safe_dump(test, sort_keys=False), encoding="utf-8")
    done = subprocess.run(
        [PROMTOOL, "test", "rules", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    return output


def client(outcome: str, values: str = STEADY) -> dict[str, str]:
    return {
        "series": f'{REQUESTS}{{target="fleet",model="m",stage="0",'
        f'outcome="{outcome}"}}',
        "values": values,
    }


def test_the_error_rate_without_failures_is_zero_not_missing(tmp_path: Path) -> None:
    error_rate = queries((), 30)["error_rate"].value
    promtool_test(
        tmp_path,
        [client("ok")],
        [
            {
                "expr": error_rate,
                "eval_time": "60s",
                "exp_samples": [{"labels": "{}", "value": 0}],
            }
        ],
    )


def test_the_error_rate_is_the_failed_share_of_judged_requests(
    tmp_path: Path,
) -> None:
    error_rate = queries((), 30)["error_rate"].value
    promtool_test(
        tmp_path,
        # 10/s ok, 5/s failed, 5/s cancelled (not judged): a third failed.
        [client("ok"), client("http_error", "0+5x60"), client("cancelled", "0+5x60")],
        [
            {
                "expr": f"round({error_rate}, 0.001)",
                "eval_time": "60s",
                "exp_samples": [{"labels": "{}", "value": 0.333}],
            }
        ],
    )


def test_without_traffic_the_error_rate_is_missing(tmp_path: Path) -> None:
    # No client series at all, or counters that stand still: nothing to divide.
    error_rate = queries((), 30)["error_rate"].value
    promtool_test(
        tmp_path,
        [client("ok", "100x60")],
        [
            {
                "expr": f"({error_rate}) == ({error_rate})",  # drops NaN
                "eval_time": "60s",
                "exp_samples": [],
            },
            {
                "expr": queries(parse_selector('target="other"'), 30)[
                    "error_rate"
                ].value,
                "eval_time": "60s",
                "exp_samples": [],
            },
        ],
    )


def test_the_queue_is_summed_over_the_selected_replicas(tmp_path: Path) -> None:
    def waiting(target: str, value: int) -> dict[str, str]:
        return {
            "series": f'{WAITING}{{target="{target}",model="m",engine="vllm",'
            'rank="0"}',
            "values": f"{value}x60",
        }

    fleet = queries(parse_selector('target=~"sim-.*"'), 30)
    promtool_test(
        tmp_path,
        [waiting("sim-a", 3), waiting("sim-b", 7), waiting("other", 100)],
        [
            {
                "expr": fleet["waiting"].value,
                "eval_time": "60s",
                "exp_samples": [{"labels": "{}", "value": 10}],
            },
            {
                "expr": fleet["waiting"].age,
                "eval_time": "60s",
                "exp_samples": [{"labels": "{}", "value": 0}],
            },
        ],
    )


def test_the_burn_rate_is_the_fastest_burn_and_its_age_evaluates(
    tmp_path: Path,
) -> None:
    """Rules written at two windows: the signal is the higher burn, and its age
    query does not trip on two series that differ only in their name (Prometheus
    refuses such a vector once a function drops the name)."""

    def burn(window: str, value: float) -> dict[str, str]:
        return {
            "series": f"target_model:servemon_client_ttft_seconds:burn_rate{window}"
            f'{{target="fleet",model="m",slo="ttft"}}',
            "values": f"{value}x60",
        }

    signal = queries((), 30)["burn_rate"]
    promtool_test(
        tmp_path,
        [burn("5s", 3.0), burn("1m", 1.5)],
        [
            {
                "expr": signal.value,
                "eval_time": "60s",
                "exp_samples": [{"labels": "{}", "value": 3}],
            },
            {
                "expr": signal.age,
                "eval_time": "60s",
                "exp_samples": [{"labels": "{}", "value": 0}],
            },
        ],
    )
