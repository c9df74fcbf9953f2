"""Arrival schedules: parsing stages and processes, determinism, and the statistics of
the gaps (Kolmogorov-Smirnov against the exponential, the asked coefficient of
variation for gamma, exact spacing for constant), with stage boundaries respected."""

from __future__ import annotations

import itertools
import math
import statistics

import pytest
from scipy import stats

from servemon.core.errors import ConfigError
from servemon.loadgen.send.arrivals import (
    Arrival,
    Due,
    Stage,
    linear_stages,
    parse_arrival,
    parse_stages,
    schedule,
)


def gaps_per_stage(stages: list[Stage], due: list[Due]) -> dict[int, list[float]]:
    """Each stage's inter-arrival gaps, the first measured from the stage's start."""
    by_stage: dict[int, list[float]] = {}
    for stage in stages:
        offsets = [d.offset_s for d in due if d.stage == stage.index]
        times = [stage.start_s, *offsets]
        by_stage[stage.index] = [b - a for a, b in itertools.pairwise(times)]
    return by_stage


def assert_one_line_naming(exc: pytest.ExceptionInfo[ConfigError], flag: str) -> None:
    message = str(exc.value)
    assert "\n" not in message, message
    assert message.startswith(flag), message


# -- parsing ----------------------------------------------------------------------


def test_parse_stages_lays_stages_end_to_end() -> None:
    stages = parse_stages("2:30, 4:15,8.5:0.5")
    assert stages == [
        Stage(0, 2.0, 30.0, 0.0),
        Stage(1, 4.0, 15.0, 30.0),
        Stage(2, 8.5, 0.5, 45.0),
    ]
    assert stages[-1].end_s == 45.5


@pytest.mark.parametrize(
    "text",
    ["", "2", "2:", ":30", "two:30", "2:thirty", "0:30", "2:0", "-1:30", "2:30,4",
     "2:30,,4:30", "2:30:4"],
)  # fmt: skip
def test_parse_stages_errors_are_one_line_naming_the_flag(text: str) -> None:
    with pytest.raises(ConfigError) as exc:
        parse_stages(text)
    assert_one_line_naming(exc, "--stages")


def test_parse_stages_error_names_the_bad_stage() -> None:
    with pytest.raises(ConfigError, match=r"stage 3 '8:x'"):
        parse_stages("2:30,4:30,8:x")


def test_linear_stages_steps_up_to_and_including_the_end() -> None:
    stages = linear_stages(1.0, 3.0, 0.5, 10.0)
    assert [s.rate for s in stages] == [1.0, 1.5, 2.0, 2.5, 3.0]
    assert [s.start_s for s in stages] == [0.0, 10.0, 20.0, 30.0, 40.0]
    assert all(s.duration_s == 10.0 for s in stages)
    # Steps that are not exact in binary still reach the end.
    assert [s.rate for s in linear_stages(0.1, 0.3, 0.1, 1.0)] == [0.1, 0.2, 0.3]


@pytest.mark.parametrize(
    ("start", "end", "step", "seconds"),
    [(0, 4, 1, 10), (-1, 4, 1, 10), (5, 4, 1, 10), (1, 4, 0, 10), (1, 4, -1, 10),
     (1, 4, 1, 0)],
)  # fmt: skip
def test_linear_stages_errors_are_one_line_naming_the_flags(
    start: float, end: float, step: float, seconds: float
) -> None:
    with pytest.raises(ConfigError) as exc:
        linear_stages(start, end, step, seconds)
    assert_one_line_naming(exc, "--rps-start")
    for flag in ("--rps-end", "--rps-step", "--step-seconds"):
        assert flag in str(exc.value)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("constant", Arrival("constant")),
        ("poisson", Arrival("poisson")),
        ("gamma:2", Arrival("gamma", 2.0)),
        ("gamma:0.25", Arrival("gamma", 0.25)),
    ],
)
def test_parse_arrival(text: str, expected: Arrival) -> None:
    arrival = parse_arrival(text)
    assert arrival == expected
    assert parse_arrival(str(arrival)) == arrival


@pytest.mark.parametrize(
    "text",
    ["", "Poisson", "uniform", "gamma", "gamma:", "gamma:0", "gamma:-1", "gamma:x",
     "gamma:nan", "constant:1"],
)  # fmt: skip
def test_parse_arrival_errors_are_one_line_naming_the_flag(text: str) -> None:
    with pytest.raises(ConfigError) as exc:
        parse_arrival(text)
    assert_one_line_naming(exc, "--arrival")


# -- schedules --------------------------------------------------------------------


@pytest.mark.parametrize("arrival", ["poisson", "gamma:2", "constant"])
def test_schedule_is_deterministic_per_seed(arrival: str) -> None:
    stages = parse_stages("5:10,20:10")
    process = parse_arrival(arrival)
    first = list(schedule(stages, process, seed=42))
    again = list(schedule(stages, process, seed=42))
    assert first == again
    assert len(first) > 100
    other = list(schedule(stages, process, seed=43))
    if arrival == "constant":
        assert other == first  # nothing random to seed
    else:
        assert [d.offset_s for d in other] != [d.offset_s for d in first]


@pytest.mark.parametrize("arrival", ["poisson", "gamma:3", "constant"])
def test_schedule_respects_stage_boundaries(arrival: str) -> None:
    stages = parse_stages("3:2,40:1.5,8:4,25:1")
    due = list(schedule(stages, parse_arrival(arrival), seed=1))
    assert [d.index for d in due] == list(range(len(due)))
    offsets = [d.offset_s for d in due]
    assert offsets == sorted(offsets)
    for d in due:
        stage = stages[d.stage]
        assert stage.start_s <= d.offset_s < stage.end_s, d
    # Every stage gets its requests, in stage order.
    assert [d.stage for d in due] == sorted(d.stage for d in due)
    assert {d.stage for d in due} == {0, 1, 2, 3}


def test_schedule_stops_at_the_limit() -> None:
    stages = parse_stages("50:10")
    due = list(schedule(stages, Arrival("poisson"), seed=3, limit=17))
    assert len(due) == 17
    assert due == list(schedule(stages, Arrival("poisson"), seed=3))[:17]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_poisson_gaps_are_exponential_at_the_stage_rate(seed: int) -> None:
    stages = parse_stages("50:100")
    due = list(schedule(stages, Arrival("poisson"), seed))
    gaps = gaps_per_stage(stages, due)[0]
    expected = 50 * 100
    assert abs(len(due) - expected) <= 4 * math.sqrt(expected), len(due)
    result = stats.kstest(gaps, stats.expon(scale=1 / 50).cdf)
    assert result.pvalue > 0.01, result
    # ... and not against a process at another rate (the test has power).
    wrong = stats.kstest(gaps, stats.expon(scale=1 / 45).cdf)
    assert wrong.pvalue < 0.01, wrong


def test_poisson_rate_changes_at_each_stage_boundary() -> None:
    stages = parse_stages("10:200,80:30,30:60")
    due = list(schedule(stages, Arrival("poisson"), seed=5))
    per_stage = gaps_per_stage(stages, due)
    for stage in stages:
        gaps = per_stage[stage.index]
        expected = stage.rate * stage.duration_s
        assert abs(len(gaps) - expected) <= 4 * math.sqrt(expected), stage
        result = stats.kstest(gaps, stats.expon(scale=1 / stage.rate).cdf)
        assert result.pvalue > 0.01, (stage, result)


@pytest.mark.parametrize("cv", [0.5, 2.0, 3.0])
def test_gamma_gaps_have_the_asked_coefficient_of_variation(cv: float) -> None:
    stages = parse_stages("100:100")
    due = list(schedule(stages, parse_arrival(f"gamma:{cv:g}"), seed=0))
    gaps = gaps_per_stage(stages, due)[0]
    mean = statistics.fmean(gaps)
    assert mean == pytest.approx(1 / 100, rel=0.05)
    assert statistics.pstdev(gaps) / mean == pytest.approx(cv, rel=0.10)
    assert abs(len(due) - 10_000) <= 0.05 * 10_000


def test_constant_gives_exact_spacing() -> None:
    stages = parse_stages("4:2.5,8:1,5:2")
    due = list(schedule(stages, Arrival("constant"), seed=0))
    for stage in stages:
        offsets = [d.offset_s for d in due if d.stage == stage.index]
        assert len(offsets) == round(stage.rate * stage.duration_s)
        expected = [stage.start_s + k / stage.rate for k in range(len(offsets))]
        assert offsets == pytest.approx(expected, abs=1e-9)


@pytest.mark.parametrize(
    ("rate", "seconds"), [(10.0, 1.0), (7.0, 2.0), (0.1, 30.0), (3.0, 1.0)]
)
def test_constant_stage_holds_exactly_rate_times_duration(
    rate: float, seconds: float
) -> None:
    stages = parse_stages(f"{rate:g}:{seconds:g},{rate:g}:{seconds:g}")
    due = list(schedule(stages, Arrival("constant"), seed=0))
    assert len(due) == round(2 * rate * seconds)
    gaps = [b.offset_s - a.offset_s for a, b in itertools.pairwise(due)]
    assert min(gaps) == pytest.approx(1 / rate, abs=1e-9)
