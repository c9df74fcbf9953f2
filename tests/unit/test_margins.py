"""tests/support/margins.py: bounds that record their figures, and the script that
reads them back from the JUnit XML of several runs (``scripts/margins``)."""

from __future__ import annotations

import math
from pathlib import Path
from xml.sax.saxutils import quoteattr

import pytest

from tests.support.margins import PREFIX, Bound, Seen, bound, main, read_runs, verdict


@pytest.mark.parametrize(
    ("limit", "figure", "holds"),
    [
        (bound(low=0.3), 0.3, True),
        (bound(above=0.3), 0.3, False),
        (bound(high=0.7), 0.7, True),
        (bound(below=0.7), 0.7, False),
        (bound(above=0.3, below=0.7), 0.5, True),
        (bound(low=0.3, high=0.7), 0.71, False),
        (bound(low=0.3), math.nan, False),
    ],
)
def test_a_bound_holds_what_its_sides_say(
    limit: Bound, figure: float, holds: bool
) -> None:
    assert limit.holds(figure) is holds


def test_a_bound_needs_one_limit_a_side() -> None:
    with pytest.raises(TypeError):
        bound()
    with pytest.raises(TypeError):
        bound(low=1, above=1)
    with pytest.raises(TypeError):
        bound(high=1, below=1)


def test_the_margin_is_the_bounds_distance_over_the_worst_seen() -> None:
    # Usual 0.8; the worst toward the bound 0.7 (0.1 away); the bound 0.5 is 0.3
    # away: a margin of 3.
    seen = Seen(bound(low=0.5), [0.8, 0.7, 0.9, 0.8, 0.85])
    assert seen.usual() == 0.8
    assert seen.worst() == 0.7
    assert seen.margin() == pytest.approx(3.0)
    assert verdict(seen, runs=5) == "yes"
    # A high bound: the usual 0.2, the worst 0.3, the bound 0.35: 1.5.
    high = Seen(bound(below=0.35), [0.2, 0.1, 0.3, 0.2, 0.2])
    assert high.margin() == pytest.approx(1.5)
    assert verdict(high, runs=5) == "NO"
    assert verdict(high, runs=6) == "no (runs < 6)"
    # Both sides: the nearer one counts.
    both = Seen(bound(low=0.0, high=1.0), [0.5, 0.4, 0.8])
    assert both.margin() == pytest.approx(0.5 / 0.3)
    # Nothing seen toward the bound: no finite margin.
    assert Seen(bound(low=0.0), [1.0, 1.0]).margin() == math.inf


def test_a_figure_outside_and_a_causal_bound_are_said_so() -> None:
    assert verdict(Seen(bound(low=1.0), [0.9, 1.2]), runs=1) == "FAILED"
    assert verdict(Seen(bound(low=0.3, causal=True), [0.301, 0.31]), runs=1) == (
        "causal"
    )


def junit(folder: Path, figures: dict[str, float]) -> Path:
    """One run's JUnit XML, a test per figure, the bound ``< 1``."""
    folder.mkdir()
    cases = "".join(
        f'<testcase classname="tests.x" name="{test}"><properties>'
        f"<property name={quoteattr(PREFIX + 'lag s')} "
        f"value={quoteattr(bound(below=1.0).as_json(figure))}/>"
        '<property name="other" value="1"/></properties></testcase>'
        for test, figure in figures.items()
    )
    (folder / "rest.xml").write_text(
        f'<?xml version="1.0"?><testsuites><testsuite name="pytest">{cases}'
        "</testsuite></testsuites>"
    )
    return folder


def test_the_runs_are_read_back_by_test_and_bound(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    runs = [
        junit(tmp_path / f"run{i}", {"test_a": 0.1 + i / 100, "test_b": 0.6 + i / 10})
        for i in range(5)
    ]
    seen = read_runs(runs)
    assert list(seen) == [("x::test_a", "lag s"), ("x::test_b", "lag s")]
    assert seen["x::test_a", "lag s"].figures == pytest.approx(
        [0.10, 0.11, 0.12, 0.13, 0.14]
    )
    # test_b: usual 0.8, worst 1.0 (its bound, strict: a failure).
    assert main([str(r) for r in runs]) == 0
    assert main(["--check", *map(str, runs)]) == 1
    out = capsys.readouterr().out
    assert "x::test_a" in out
    assert "FAILED" in out
    assert main(["--check", str(runs[0])]) == 0  # one run: no verdict yet
