"""Whether a difference between two runs is real: the error rate over a family of
figures when nothing differs, detection of a 25 % slowdown with an interval that holds
the truth, the direction of throughput figures, one run each, too short, and the edges
(a value of 0, no spread, no requests)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from servemon.loadgen.record.figures import exact_quantile
from servemon.loadgen.reports.significance import (
    Difference,
    FigureQuestion,
    Samples,
    judge,
    needed_requests,
)

#: A run's figures, as compare lines them up: (label, higher is better, quantile).
FIGURES = (
    ("output tok/s", True, None),
    ("requests/s", True, None),
    ("TTFT mean ms", False, None),
    ("TTFT p95 ms", False, 0.95),
    ("TPOT mean ms", False, None),
    ("ITL p95 ms", False, 0.95),
    ("E2E mean s", False, None),
    ("E2E p95 s", False, 0.95),
)
LEVELS = ("1 rps", "2 rps")  # 16 figures in a family
#: Between-run spread (sd of the log): a run's shared drift, each figure's own.
RUN_SPREAD, FIGURE_SPREAD = 0.02, 0.015


def repeated_run(
    rng: np.random.Generator, base: float, repeats: int
) -> list[tuple[float, ...]]:
    """Each figure's value on each repeat: figures of one repeat drift together."""
    drift = rng.normal(0.0, RUN_SPREAD, repeats)
    return [
        tuple(float(base * math.exp(d + rng.normal(0.0, FIGURE_SPREAD))) for d in drift)
        for _ in FIGURES
    ]


def family(
    rng: np.random.Generator, latency: float = 1.0, throughput: float = 1.0
) -> list[FigureQuestion]:
    """Two configurations, 3 repeats each; B's latencies and throughputs are A's
    times the factors given."""
    questions = []
    for level in LEVELS:
        a, b = repeated_run(rng, 100.0, 3), repeated_run(rng, 100.0, 3)
        for (label, higher, quantile), ra, rb in zip(FIGURES, a, b, strict=True):
            factor = throughput if higher else latency
            questions.append(
                FigureQuestion(
                    level,
                    label,
                    higher,
                    quantile,
                    Samples(ra, None, 6000),
                    Samples(tuple(v * factor for v in rb), None, 6000),
                )
            )
    return questions


def called(differences: list[Difference]) -> int:
    return sum(d.verdict in ("faster", "slower") for d in differences)


def test_the_same_configuration_is_called_different_in_at_most_1_of_20() -> None:
    """The issue's criterion, on the first seed. At a family-wise 5 % (what it is
    asked for), a batch of 20 trials holds two false calls or more about a quarter
    of the time (31 of seeds 0-39 pass): the rate itself is the next test's."""
    rng = np.random.default_rng(0)
    trials = [judge(family(rng)) for _ in range(20)]
    assert all(d.basis == "repeats" for t in trials for d in t)
    assert sum(called(t) == 0 for t in trials) >= 19


def test_the_family_wise_error_rate_holds_over_many_trials() -> None:
    rng = np.random.default_rng(7)
    trials = 300
    wrong = sum(called(judge(family(rng))) > 0 for _ in range(trials))
    assert wrong / trials <= 0.07  # 0.05 asked; the figures' drift is shared


def test_a_25_percent_slower_configuration_is_called_slower_and_covered() -> None:
    rng = np.random.default_rng(25)
    results = [
        d for _ in range(50) for d in judge(family(rng, latency=1.25, throughput=0.8))
    ]
    slower = sum(d.verdict == "slower" for d in results) / len(results)
    covered = sum(
        d.low is not None
        and d.high is not None
        and d.low <= (0.8 if d.figure.endswith("/s") else 1.25) <= d.high
        for d in results
    ) / len(results)
    # About 0.98 over many trials at this spread (0.955 on this seed); 3 repeats and
    # 16 figures leave an interval of about +-13 %, so a 25 % slowdown is sometimes
    # inside it. Coverage: the corrected intervals are at 99.7 % each.
    assert slower >= 0.93
    assert covered >= 0.95
    assert all(d.verdict != "faster" for d in results)


def question(
    a: tuple[float, ...],
    b: tuple[float, ...],
    *,
    higher: bool = False,
    quantile: float | None = None,
    n: int = 3000,
) -> FigureQuestion:
    return FigureQuestion(
        "1 rps", "figure", higher, quantile, Samples(a, None, n), Samples(b, None, n)
    )


A = (100.0, 102.0, 98.5)


@pytest.mark.parametrize(
    ("higher", "factor", "verdict"),
    [
        (False, 1.25, "slower"),  # B takes longer
        (False, 0.8, "faster"),
        (True, 1.25, "faster"),  # B serves more
        (True, 0.8, "slower"),
        (True, 1.0, "no difference"),
    ],
)
def test_the_verdict_is_from_bs_side_and_flips_for_throughput(
    higher: bool, factor: float, verdict: str
) -> None:
    (d,) = judge([question(A, tuple(v * factor for v in A[::-1]), higher=higher)])
    assert d.verdict == verdict
    assert d.ratio == pytest.approx(factor)
    assert d.low is not None
    assert d.high is not None
    assert d.low <= factor <= d.high
    assert (d.verdict == "no difference") == (d.low <= 1.0 <= d.high)


def test_the_interval_is_corrected_for_the_family() -> None:
    alone = judge([question(A, (101.0, 99.0, 103.0))])[0]
    among = judge([question(A, (101.0, 99.0, 103.0))] * 10)[0]
    assert alone.confidence == pytest.approx(0.95)
    assert among.confidence == pytest.approx(0.995)
    assert among.low is not None
    assert alone.low is not None
    assert among.high is not None
    assert alone.high is not None
    assert among.low < alone.low < alone.high < among.high


def one_run(values: np.ndarray, quantile: float | None) -> Samples:
    listed = tuple(float(v) for v in values)
    figure = (
        float(np.mean(values))
        if quantile is None
        else exact_quantile(sorted(listed), quantile)
    )
    return Samples((figure,), listed, len(listed))


@pytest.mark.parametrize("quantile", [0.95, 0.5, None])
def test_one_run_each_rests_on_the_requests_and_says_so(
    quantile: float | None,
) -> None:
    rng = np.random.default_rng(1)

    def width(n: int) -> tuple[Difference, float]:
        a, b = rng.lognormal(0.0, 0.5, n), 1.25 * rng.lognormal(0.0, 0.5, n)
        q = FigureQuestion(
            "1 rps", "TTFT", False, quantile, one_run(a, quantile), one_run(b, quantile)
        )
        (d,) = judge([q])
        assert d.low is not None
        assert d.high is not None
        assert d.ratio is not None
        assert math.log(d.ratio) == pytest.approx(
            (math.log(d.low) + math.log(d.high)) / 2
        )
        return d, math.log(d.high / d.low)

    d, narrow = width(16000)
    assert d.basis == "one run each"
    assert d.note is not None
    assert "one run each" in d.note
    assert d.verdict == "slower"
    assert d.low is not None
    assert d.high is not None
    assert d.low <= 1.25 <= d.high
    # From the requests: 16 times as many give an interval a quarter as wide.
    _, wide = width(1000)
    assert narrow / wide == pytest.approx(0.25, rel=0.3)


def test_one_run_each_matches_a_plain_bootstrap_of_the_quantile() -> None:
    rng = np.random.default_rng(2)
    a, b = rng.lognormal(0.0, 0.5, 2000), rng.lognormal(0.0, 0.5, 2000)
    (d,) = judge(
        [FigureQuestion("l", "p95", False, 0.95, one_run(a, 0.95), one_run(b, 0.95))]
    )
    assert d.low is not None
    assert d.high is not None
    half = math.log(d.high / d.low) / 2

    def replicates(values: np.ndarray) -> np.ndarray:
        drawn = np.sort(rng.choice(values, (1500, values.size)), axis=1)
        return np.log([exact_quantile(row.tolist(), 0.95) for row in drawn])

    spread = math.hypot(replicates(a).std(), replicates(b).std())
    assert half == pytest.approx(1.959964 * spread, rel=0.1)


def test_one_run_each_without_requests_cannot_tell_and_leaves_the_family() -> None:
    rate = FigureQuestion(
        "1 rps",
        "requests/s",
        True,
        None,
        Samples((5.0,), None, 900),
        Samples((4.0,), None, 900),
    )
    other = question(A, (101.0, 99.0, 103.0))
    d, o = judge([rate, other])
    assert d.verdict == "cannot tell"
    assert d.low is None
    assert d.high is None
    assert d.confidence is None
    assert d.note is not None
    assert "--repeats" in d.note
    assert o.confidence == pytest.approx(0.95)


def test_one_side_repeated_takes_the_spread_of_the_repeated_side() -> None:
    (d,) = judge([question(A, (125.0,))])
    assert d.basis == "one side repeated"
    assert d.note is not None
    assert "B has one run" in d.note
    assert d.verdict == "slower"
    logs = np.log(A)
    assert d.low is not None
    assert d.high is not None
    assert math.log(d.high / d.low) / 2 == pytest.approx(
        4.302653 * logs.std(ddof=1) * math.sqrt(1 + 1 / 3)  # t(0.975, 2 freedoms)
    )


def test_a_p99_from_16_requests_is_too_short_and_leaves_the_family() -> None:
    short = question(A, (130.0, 131.0, 129.0), quantile=0.99, n=16 * 3)
    other = question(A, (101.0, 99.0, 103.0))
    s, o = judge([short, other])
    assert s.verdict == "too short"
    assert s.note is not None
    assert "16 requests per run" in s.note
    assert ">= 1000" in s.note
    assert s.low is None
    assert s.confidence is None
    assert o.confidence == pytest.approx(0.95)


@pytest.mark.parametrize(
    ("quantile", "needed"), [(0.99, 1000), (0.95, 200), (0.5, 20), (None, 10)]
)
def test_requests_needed(quantile: float | None, needed: int) -> None:
    assert needed_requests(quantile) == needed
    ok = question(A, A, quantile=quantile, n=3 * needed)
    short = question(A, A, quantile=quantile, n=3 * needed - 1)
    assert [d.verdict for d in judge([ok, short])] == ["no difference", "too short"]


def test_a_zero_on_one_side_judges_the_difference_of_values() -> None:
    d, both = judge(
        [
            question((0.0, 0.0, 0.0), (5.0, 5.5, 4.5), higher=True),
            question((0.0, 0.0, 0.0), (0.0, 0.0, 0.0), higher=True),
        ]
    )
    assert d.ratio is None
    assert d.low is None
    assert d.high is None
    assert d.verdict == "faster"
    assert d.note is not None
    assert "B - A is 5" in d.note
    assert both.verdict == "no difference"


def test_no_spread_gives_a_point_interval() -> None:
    same, apart = judge(
        [question((2.0,) * 3, (2.0,) * 3), question((2.0,) * 3, (3.0,) * 3)]
    )
    assert same.low == same.high == 1.0
    assert same.verdict == "no difference"
    assert apart.low == apart.high == pytest.approx(1.5)
    assert apart.verdict == "slower"  # runs that never vary do differ
    assert apart.note is not None
    assert "point" in apart.note


def test_no_requests_is_too_short_or_cannot_tell() -> None:
    empty = Samples((0.1,), (), 0)
    counted = Samples((0.1,), (), 500)
    d, e = judge(
        [
            FigureQuestion("l", "TTFT mean", False, None, empty, empty),
            FigureQuestion("l", "TTFT mean", False, None, counted, counted),
        ]
    )
    assert d.verdict == "too short"
    assert e.verdict == "cannot tell"


def test_the_same_seed_gives_the_same_answer() -> None:
    rng = np.random.default_rng(4)
    a, b = rng.lognormal(0.0, 0.5, 500), rng.lognormal(0.0, 0.5, 500)
    q = FigureQuestion("l", "p95", False, 0.95, one_run(a, 0.95), one_run(b, 0.95))
    assert judge([q], seed=3) == judge([q], seed=3)
    assert judge([q], seed=3) != judge([q], seed=4)


def test_bad_questions_are_refused() -> None:
    with pytest.raises(ValueError, match="at least one run"):
        Samples((), None, 0)
    with pytest.raises(ValueError, match="quantile"):
        question(A, A, quantile=1.0)
    with pytest.raises(ValueError, match="confidence"):
        judge([], confidence=1.0)
    assert judge([]) == []


values = st.floats(min_value=0.0, max_value=1e6, allow_nan=False)


@given(
    st.lists(values, min_size=1, max_size=5),
    st.lists(values, min_size=1, max_size=5),
    st.booleans(),
)
def test_the_verdict_always_agrees_with_the_interval(
    a: list[float], b: list[float], higher: bool
) -> None:
    (d,) = judge([question(tuple(a), tuple(b), higher=higher)])
    if d.low is None or d.high is None:
        assert d.verdict == "no difference" or d.note is not None
        return
    assert d.low <= d.high
    if d.low > 1.0:
        assert d.verdict == ("faster" if higher else "slower")
    elif d.high < 1.0:
        assert d.verdict == ("slower" if higher else "faster")
    else:
        assert d.verdict == "no difference"
