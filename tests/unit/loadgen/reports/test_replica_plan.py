"""``servemon plan``: replicas for a forecast. A capacity run directory written
through the record's one writer and a small trace file; the figures the command
prints are recomputed here by the formulas of docs/capacity.md (*Replicas for a
forecast*)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from click.testing import CliRunner

from servemon.cli import cli
from servemon.loadgen.reports.measured import measure
from servemon.loadgen.reports.replicas import (
    Forecast,
    Pricing,
    plan_replicas,
    replicas_for,
)
from tests.support.capacityruns import write_tier_run

GPUS = 2
HIT = 0.3


def capacity_run(
    run_dir: Path, *, energy: bool = True, url: str = "http://10.0.0.5:8000"
) -> Path:
    """A two-tier capacity run: interactive 10 req/s, batch 40 req/s; steps at 10,
    20, 40 and 80 req/s, their requests' outputs 100, 110, 120 and 130 tokens."""
    return write_tier_run(
        run_dir,
        {"interactive": 10.0, "batch": 40.0},
        rates=(10.0, 20.0, 40.0, 80.0),
        gpus=GPUS if energy else None,
        hit_rate=HIT,
        url=url,
    )


#: Per 60-s bin: requests, and their prompt and output tokens.
BINS = [(600, 510, 100), (1200, 2000, 120), (60, 510, 100)]


def trace_file(path: Path) -> Path:
    rows = ["timestamp,prompt_tokens,output_tokens"]
    for b, (n, prompt, output) in enumerate(BINS):
        rows += [f"{60 * b + 60 * i / n:.4f},{prompt},{output}" for i in range(n)]
    path.write_text("\n".join(rows) + "\n")
    return path


def plan(*args: str) -> tuple[int, str]:
    done = CliRunner().invoke(cli, ["plan", *args])
    return done.exit_code, done.output


def test_a_trace_plan_is_the_formulas_over_its_bins(tmp_path: Path) -> None:
    run = capacity_run(tmp_path / "run")
    trace = trace_file(tmp_path / "trace.csv")
    out = tmp_path / "plan.html"
    code, text = plan(str(run), "--trace", str(trace), "--bin", "60",
                      "--headroom", "0.2", "--gpu-hour-cost", "2.5",
                      "--out", str(out), "--json")  # fmt: skip
    assert code == 0, text
    found = json.loads(text)
    price = 2.5 * GPUS  # a replica's hour: --gpu-hour-cost x GPUs of the record
    assert found["replica_hour_cost"] == price
    assert found["gpus_per_replica"] == GPUS
    rates = [n / 60 for n, _, _ in BINS]
    assert found["forecast"]["rates"] == pytest.approx(rates)
    assert found["forecast"]["peak_rps"] == pytest.approx(20.0)
    requests = sum(n for n, _, _ in BINS)
    tokens = sum(n * o for n, _, o in BINS) / requests  # the trace's own outputs
    for tier, capacity in zip(found["tiers"], (10.0, 40.0), strict=True):
        r = capacity * (1 - 0.2)
        assert tier["planned_rps"] == pytest.approx(r)
        each = [max(1, math.ceil(rate / r - 1e-9)) for rate in rates]
        assert tier["replicas"] == each
        peak = math.ceil(20.0 / r)
        assert tier["peak_replicas"] == peak
        assert tier["cost_per_hour"] == pytest.approx(peak * price)
        assert tier["output_tokens"] == pytest.approx(tokens)
        assert tier["cost_per_mtok"] == pytest.approx(
            peak * price / (20.0 * 3600 * tokens) * 1e6
        )
        cost = sum(each) * 60 / 3600 * price
        assert tier["trace_cost"] == pytest.approx(cost)
        assert tier["static_cost"] == pytest.approx(
            peak * len(BINS) * 60 / 3600 * price
        )
        assert tier["trace_cost_per_mtok"] == pytest.approx(
            cost / (requests * tokens) * 1e6
        )
    # interactive: 8 req/s a replica, so 10, 20 and 1 req/s take 2, 3 and 1.
    assert found["tiers"][0]["replicas"] == [2, 3, 1]
    said = " ".join(found["assumptions"])
    assert "linearly" in said
    assert f"{HIT:.3f} in the capacity run" in said
    assert "unknown in the forecast (it has no hash_ids)" in said
    warned = " ".join(found["warnings"])
    # 1200 of 1860 prompts (2000 tokens) lie past the 500-520 the run sent.
    assert "64.5% of the forecast's prompt lengths (1,200 of 1,860)" in warned
    assert "output lengths" not in warned  # 100-120: inside the run's 100-130
    page = out.read_text()
    assert "<svg" in page
    assert "interactive" in page
    assert "<script" not in page


def test_a_peak_rate_takes_its_tokens_from_the_capacity_step(tmp_path: Path) -> None:
    run = capacity_run(tmp_path / "run")
    code, text = plan(str(run), "--peak-rps", "100", "--replica-hour-cost", "4",
                      "--out", str(tmp_path / "p.html"), "--json")  # fmt: skip
    assert code == 0, text
    found = json.loads(text)
    interactive, batch = found["tiers"]
    assert interactive["peak_replicas"] == math.ceil(100 / 8)  # 13
    assert batch["peak_replicas"] == math.ceil(100 / 32)  # 4
    # The outputs of the step at each tier's capacity: 100 at 10, 120 at 40.
    assert interactive["output_tokens"] == pytest.approx(100)
    assert batch["output_tokens"] == pytest.approx(120)
    assert interactive["cost_per_mtok"] == pytest.approx(
        13 * 4 / (100 * 3600 * 100) * 1e6
    )
    assert interactive["replicas"] == []


def test_the_terminal_shows_the_table_and_what_it_assumed(tmp_path: Path) -> None:
    run = capacity_run(tmp_path / "run")
    code, text = plan(str(run), "--peak-rps", "100",
                      "--out", str(tmp_path / "p.html"))  # fmt: skip
    assert code == 0, text
    assert "replicas at peak" in text
    assert "assumed: replicas scale linearly" in text
    assert (tmp_path / "p.html").exists()


def test_replicas_round_up_but_not_a_hair_over() -> None:
    assert replicas_for(16.0, 8.0) == 2
    assert replicas_for(16.000001, 8.0) == 3
    assert replicas_for(0.0, 8.0) == 1
    assert replicas_for(0.0, 8.0, min_replicas=0) == 0


def test_a_trace_is_cut_in_whole_bins_from_its_start() -> None:
    f = Forecast.of_trace("t", [0.0, 10.0, 59.9, 60.0, 130.0], 60.0)
    assert f.counts == (3, 1, 1)
    assert f.peak_rps == pytest.approx(3 / 60)
    assert f.hours == pytest.approx(3 * 60 / 3600)


@pytest.mark.parametrize(
    ("args", "says"),
    [
        ([], "--peak-rps or --trace: give one forecast"),
        (["--peak-rps", "5", "--trace", "x.csv"], "--peak-rps or --trace"),
        (["--peak-rps", "5", "--headroom", "1"], "--headroom: expected a fraction"),
        (["--peak-rps", "0"], "--peak-rps: expected a rate above 0"),
        (["--peak-rps", "5", "--bin", "0"], "--bin: expected seconds above 0"),
        (["--trace", "nowhere.csv"], "--trace: nowhere.csv"),
        (
            ["--peak-rps", "5", "--gpu-hour-cost", "1", "--replica-hour-cost", "1"],
            "--gpu-hour-cost and --replica-hour-cost: give one",
        ),
    ],
)
def test_a_bad_flag_is_one_line_naming_it(
    tmp_path: Path, args: list[str], says: str
) -> None:
    run = capacity_run(tmp_path / "run")
    code, text = plan(str(run), *args, "--out", str(tmp_path / "p.html"))
    assert code == 2
    assert says in text
    assert len(text.strip().splitlines()) == 1, text


def test_a_gpu_price_needs_a_gpu_count(tmp_path: Path) -> None:
    run = capacity_run(tmp_path / "run", energy=False)
    code, text = plan(str(run), "--peak-rps", "5", "--gpu-hour-cost", "2",
                      "--out", str(tmp_path / "p.html"))  # fmt: skip
    assert code == 2
    assert "--gpu-hour-cost:" in text
    assert "--gpus-per-replica" in text
    code, text = plan(str(run), "--peak-rps", "5", "--gpu-hour-cost", "2",
                      "--gpus-per-replica", "8", "--json",
                      "--out", str(tmp_path / "p.html"))  # fmt: skip
    assert code == 0, text
    assert json.loads(text)["replica_hour_cost"] == pytest.approx(16.0)


def test_a_run_that_is_not_a_capacity_search_is_refused(tmp_path: Path) -> None:
    run = capacity_run(tmp_path / "run")
    data = json.loads((run / "run.json").read_text())
    (run / "run.json").write_text(json.dumps({**data, "kind": "ramp"}))
    code, text = plan(str(run), "--peak-rps", "5", "--out", str(tmp_path / "p.html"))
    assert code == 2
    assert "not a capacity search" in text


@pytest.mark.parametrize(
    ("hit", "warned", "noted"),
    [(0.05, "so the plan may be short", None), (0.9, None, "room to spare")],
)
def test_the_prefix_cache_of_the_run_is_held_against_the_forecasts(
    tmp_path: Path, hit: float, warned: str | None, noted: str | None
) -> None:
    measured = measure(capacity_run(tmp_path / "run"))  # its hit rate: 0.3
    forecast = Forecast.of_trace("t", [0.0, 1.0], 60.0, hit_rate=hit)
    found = plan_replicas(
        measured, forecast, headroom=0.2, pricing=Pricing(None, "no price given")
    )
    said = " ".join(found.warnings)
    assert (warned is not None and warned in said) or "short" not in said
    assert any("room to spare" in a for a in found.assumptions) is (noted is not None)
    assert found.tiers[0].cost_per_hour is None
