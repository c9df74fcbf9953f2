"""The energy rules and panels: one spelling for both, a cost only given a price."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from servemon.cli import cli
from servemon.dashboards.build import dashboard_json
from servemon.dashboards.energy import (
    ENERGY_GROUP,
    cost_per_mtok,
    energy_group,
    energy_per_token,
)
from servemon.dashboards.rule_names import (
    ENERGY_RULES,
    GPU_COST_PER_MTOK,
    energy_record_name,
)
from servemon.dashboards.rules import RULES_FILE

ROOT = Path(__file__).resolve().parents[3]
EXAMPLE = ROOT / "deploy" / "slos.example.yaml"
COST = energy_record_name(GPU_COST_PER_MTOK, 300)


def _records(price: float | None) -> list[str]:
    return [r["record"] for r in energy_group(price)["rules"]]


def test_no_price_no_cost_rule_never_a_zero() -> None:
    assert COST not in _records(None)
    assert COST in _records(2.0)
    (cost,) = [r for r in energy_group(2.0)["rules"] if r["record"] == COST]
    assert cost["labels"] == {"gpu_hour_cost": "2"}
    # $2 per GPU-hour is 2 / 3600 * 1e6 dollars per GPU-second per million tokens
    assert cost["expr"].endswith("* 555.555555555556\n")


def test_every_energy_rule_is_named_in_rule_names() -> None:
    names = {
        energy_record_name(r, None if r[2] == "sum" else 300) for r in ENERGY_RULES
    }
    assert set(_records(3.0)) == names
    assert energy_group(None)["name"] == ENERGY_GROUP


def test_a_per_token_figure_drops_hosts_without_the_figure_and_idle_hosts() -> None:
    expr = energy_per_token("5m")
    assert "> 0)" in expr  # no tokens: no sample, not a division by zero
    assert "and on (job, instance)" in expr  # tokens counted only where energy is
    assert "servemon_gpu_energy_joules_total" in expr
    assert "servemon_gpu_memory_total_bytes" in cost_per_mtok(1.0, "5m")


def _gpu_panels(price: float | None) -> dict[str, list[str]]:
    board = json.loads(dashboard_json("servemon-gpu", gpu_hour_cost=price))
    return {
        p["title"]: [t["expr"] for t in p.get("targets", [])] for p in board["panels"]
    }


def test_the_gpu_dashboard_shows_energy_and_a_cost_only_with_a_price() -> None:
    panels = _gpu_panels(None)
    assert any("rate(servemon_gpu_energy_joules_total" in q for q in panels["Power"])
    assert "Energy per output token" in panels
    assert "GPU power per target (from energy)" in panels
    assert "Cost per million output tokens" not in panels
    priced = _gpu_panels(2.5)
    (query,) = priced["Cost per million output tokens"]
    assert query == cost_per_mtok(
        2.5,
        "$__rate_interval",
        ('gpu=~"$gpu"',),
        'target=~"$target"',
        'model=~"$model"',
    )


def test_rules_and_dashboards_take_a_gpu_hour_cost(tmp_path: Path) -> None:
    runner = CliRunner()
    done = runner.invoke(
        cli,
        [
            "rules",
            "--slo-config",
            str(EXAMPLE),
            "--out",
            str(tmp_path),
            "--gpu-hour-cost",
            "2",
        ],
    )
    assert done.exit_code == 0, done.output
    text = (tmp_path / RULES_FILE).read_text()
    assert COST in text
    assert "--gpu-hour-cost 2\n" in text
    done = runner.invoke(
        cli, ["dashboards", "--out", str(tmp_path), "--gpu-hour-cost", "2"]
    )
    assert done.exit_code == 0, done.output
    assert "Cost per million" in (tmp_path / "servemon-gpu.json").read_text()
    for bad in ("0", "-1", "two"):
        done = runner.invoke(
            cli, ["rules", "--slo-config", str(EXAMPLE), "--gpu-hour-cost", bad]
        )
        assert done.exit_code == 2, done.output
