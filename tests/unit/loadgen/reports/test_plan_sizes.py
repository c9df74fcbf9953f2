"""``servemon plan RUN@N ...``: capacity runs at several sizes. The runs are written
through the record's one writer (``tests/support/capacityruns.py``); the replicas,
costs, efficiencies and warnings the command prints are recomputed here by the
formulas of docs/capacity.md (*Replicas for a forecast*, several sizes)."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from servemon.cli import cli
from servemon.loadgen.reports.scaling import Curve, parse_run_size
from tests.support.capacityruns import write_tier_run

#: Capacity (req/s) of each tier at each size.
TWO = {
    1: {"interactive": 10.0, "batch": 40.0},
    4: {"interactive": 36.0, "batch": 120.0},
}
THREE = {
    1: {"interactive": 10.0, "batch": 40.0},
    2: {"interactive": 19.0, "batch": 76.0},
    4: {"interactive": 34.0, "batch": 136.0},
}


def runs(tmp_path: Path, sizes: dict[int, dict[str, float]]) -> list[str]:
    """A run directory per size (2 GPUs a replica), as ``RUN@N``."""
    return [
        f"{write_tier_run(tmp_path / f'run{n}', caps, gpus=2 * n)}@{n}"
        for n, caps in sizes.items()
    ]


def plan(*args: str) -> tuple[int, str]:
    done = CliRunner().invoke(cli, ["plan", *args])
    return done.exit_code, done.output


def capacity(points: dict[int, float], n: int) -> float:
    """C(N), as the docs write it: N x C_1/n_1 below the smallest size, linear
    between sizes, N x C_K/n_K past the largest."""
    sizes = sorted(points)
    first, last = sizes[0], sizes[-1]
    if n <= first:
        return n * points[first] / first
    if n >= last:
        return n * points[last] / last
    a = max(s for s in sizes if s <= n)
    b = min(s for s in sizes if s >= n)
    if a == b:
        return points[a]
    return points[a] + (n - a) * (points[b] - points[a]) / (b - a)


def needed(points: dict[int, float], rate: float, headroom: float) -> int:
    """The fewest replicas (from 1) whose C(N) x (1 - h) carries ``rate``."""
    n = 1
    while capacity(points, n) * (1 - headroom) < rate - 1e-9:
        n += 1
    return n


def test_two_sizes_read_capacity_from_the_points_not_a_line(tmp_path: Path) -> None:
    out = tmp_path / "plan.html"
    code, text = plan(*runs(tmp_path, TWO), "--peak-rps", "100",
                      "--replica-hour-cost", "3", "--out", str(out),
                      "--json")  # fmt: skip
    assert code == 0, text
    found = json.loads(text)
    assert [s["replicas"] for s in found["sizes"]] == [1, 4]
    assert found["gpus_per_replica"] == 2  # the smallest size's 2 GPUs over 1
    warned = " ".join(found["warnings"])
    for tier in found["tiers"]:
        points = {n: caps[tier["name"]] for n, caps in TWO.items()}
        peak = needed(points, 100.0, 0.2)
        assert tier["peak_replicas"] == peak
        assert tier["cost_per_hour"] == pytest.approx(peak * 3)
        assert tier["sizes"] == [[n, c] for n, c in points.items()]
        assert tier["efficiency"] == [
            [n, pytest.approx(c / (n * points[1]))] for n, c in points.items()
        ]
        assert (
            f"tier {tier['name']}: the forecast needs {peak} replicas" in warned
        ) is (peak > 4)
    interactive, batch = found["tiers"]
    # interactive: past 4, 9 req/s a replica: 125 req/s of capacity take 14.
    assert interactive["peak_replicas"] == 14
    # batch: 120 at 4 carries 96 < 100; 5 take 150 x 0.8 = 120. Linear said 4.
    assert batch["peak_replicas"] == 5
    assert math.ceil(100 / (40 * 0.8)) == 4
    said = " ".join(found["assumptions"])
    assert "capacity measured at 1 and 4 replicas" in said
    assert "tier batch: 40, 120 req/s at 1 and 4 replicas" in said
    assert "scaling efficiency 1.00, 0.75" in said
    assert "linearly behind" not in said
    page = out.read_text()
    assert "Capacity against replicas" in page
    assert page.count("<svg") == 1  # a peak rate: no plot over time
    assert not re.search(r"https?://(?!www\.w3\.org/)", page), "an external URL"


def test_three_sizes_interpolate_a_trace_bin_by_bin(tmp_path: Path) -> None:
    trace = tmp_path / "trace.csv"
    bins = [600, 1200, 60, 2400]  # per 60 s: 10, 20, 1 and 40 req/s
    rows = ["timestamp,prompt_tokens,output_tokens"]
    for b, n in enumerate(bins):
        rows += [f"{60 * b + 60 * i / n:.4f},510,110" for i in range(n)]
    trace.write_text("\n".join(rows) + "\n")
    code, text = plan(*runs(tmp_path, THREE), "--trace", str(trace), "--bin", "60",
                      "--gpu-hour-cost", "2", "--out", str(tmp_path / "p.html"),
                      "--json")  # fmt: skip
    assert code == 0, text
    found = json.loads(text)
    price = 2 * 2
    for tier in found["tiers"]:
        points = {n: caps[tier["name"]] for n, caps in THREE.items()}
        each = [needed(points, n / 60, 0.2) for n in bins]
        assert tier["replicas"] == each
        assert tier["trace_cost"] == pytest.approx(sum(each) * 60 / 3600 * price)
    interactive = found["tiers"][0]
    # 10 req/s: 2 (19 x 0.8); 20: 3 (26.5 x 0.8 = 21.2); 1: 1; 40: 6 (8.5 x 6 x 0.8).
    assert interactive["replicas"] == [2, 3, 1, 6]
    assert interactive["efficiency"][1:] == [
        [2, pytest.approx(0.95)],
        [4, pytest.approx(0.85)],
    ]
    assert "tier interactive: the forecast needs 6 replicas, more than the 4" in (
        " ".join(found["warnings"])
    )
    assert not any("batch: the forecast needs" in w for w in found["warnings"])


def test_one_run_at_a_size_scales_linearly_from_it(tmp_path: Path) -> None:
    (run,) = runs(tmp_path, {4: {"interactive": 36.0}})
    code, text = plan(run, "--peak-rps", "20", "--gpu-hour-cost", "1",
                      "--out", str(tmp_path / "p.html"), "--json")  # fmt: skip
    assert code == 0, text
    found = json.loads(text)
    (tier,) = found["tiers"]
    assert tier["capacity_rps"] == pytest.approx(9.0)  # a replica's: 36 / 4
    assert tier["peak_replicas"] == math.ceil(20 / (9 * 0.8))
    assert found["gpus_per_replica"] == 2  # 8 GPUs over 4 replicas
    assert "N/4 of the 4 measured together" in found["assumptions"][0]


def test_the_curve_is_piecewise_linear_and_conservative_past_the_last() -> None:
    curve = Curve(((2, 18.0), (4, 32.0)))
    assert curve.capacity(1) == pytest.approx(9.0)  # the smallest's per replica
    assert curve.capacity(3) == pytest.approx(25.0)
    assert curve.capacity(8) == pytest.approx(64.0)  # 8 x 32 / 4
    assert curve.efficiency(4) == pytest.approx(32 / 36)
    assert curve.replicas(25.0, 0.0) == 3
    assert curve.replicas(25.000001, 0.0) == 4
    assert curve.replicas(0.0, 0.0, minimum=0) == 0
    linear = Curve(((1, 8.0),))
    assert [linear.replicas(r, 0.0) for r in (0.0, 8.0, 16.0, 16.01)] == [1, 1, 2, 3]


def test_run_at_n_is_parsed_from_the_last_at() -> None:
    assert parse_run_size("runs/a@4") == (Path("runs/a"), 4)
    assert parse_run_size("runs/a") == (Path("runs/a"), None)
    assert parse_run_size("runs/x@y@2") == (Path("runs/x@y"), 2)
    assert parse_run_size("runs/me@host") == (Path("runs/me@host"), None)


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ("no size", "run4: how many replicas did it measure?"),
        ("same size", "run4@1: "),
        ("zero", "run4@0: expected RUN@N with N replicas of 1 or more"),
        ("tiers", "its tiers (interactive: ttft_p95<=0.3) are not"),
        ("workload", "its workload (random:prompt=2000,output=110) is not"),
    ],
)
def test_runs_that_do_not_fit_together_are_one_line_naming_the_run(
    tmp_path: Path, change: str, says: str
) -> None:
    one, four = runs(tmp_path, TWO)
    if change == "no size":
        four = four.removesuffix("@4")
    elif change in ("same size", "zero"):
        four = four.replace("@4", "@1" if change == "same size" else "@0")
    elif change == "tiers":
        four = f"{write_tier_run(tmp_path / 'other', {'interactive': 30.0})}@4"
    else:
        spec = "random:prompt=2000,output=110"
        four = f"{write_tier_run(tmp_path / 'other', TWO[4], workload=spec)}@4"
    code, text = plan(one, four, "--peak-rps", "5", "--out", str(tmp_path / "p.html"))
    assert code == 2, text
    assert says in text
    assert len(text.strip().splitlines()) == 1, text
