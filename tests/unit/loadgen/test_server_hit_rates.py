"""Each stage's prefix-cache hit rate by the server's own counters, and what the
end lines say of it against the rate a ``prefix:`` workload asked for."""

from __future__ import annotations

from typing import Any

from servemon.core import names
from servemon.loadgen.record.columns import prefix_lines
from servemon.loadgen.record.runrecord import RunSummary, StageResult
from servemon.loadgen.record.summary import Summarizer
from servemon.loadgen.run.prefixcache import server_hit_rates
from servemon.loadgen.run.reading import Reading, reading_of

HITS, QUERIES = names.ENGINE_PREFIX_HITS.name, names.ENGINE_PREFIX_QUERIES.name


def sample(hits: float, queries: float) -> list[list[Any]]:
    """Two ranks' counters, as the sampler keeps them."""
    return [
        [HITS, {"rank": "0"}, hits / 2],
        [HITS, {"rank": "1"}, hits / 2],
        [QUERIES, {"rank": "0"}, queries / 2],
        [QUERIES, {"rank": "1"}, queries / 2],
    ]


def read(*lines: tuple[float, list[list[Any]]]) -> list[Reading]:
    """The readings of ``/metrics`` lines of these samples (an empty one is
    none)."""
    readings = (reading_of({"mono_s": at, "samples": s}) for at, s in lines)
    return [r for r in readings if r is not None]


def test_a_stage_rate_is_the_rise_of_hits_over_the_rise_of_queries() -> None:
    history = read(
        (0.0, sample(0, 0)),
        (1.0, sample(100, 1000)),  # warm prompts and an earlier stage
        (2.0, sample(700, 2000)),
        (3.0, sample(1300, 3000)),
        (4.0, sample(1500, 4000)),
    )
    rates = server_hit_rates(history, [(1.0, 3.0), (3.0, 4.0), (None, 2.0)])
    assert rates == [1200 / 2000, 200 / 1000, None]


def test_no_counters_or_no_queries_is_none_never_zero() -> None:
    assert server_hit_rates(read((0.0, [])), [(0.0, 1.0)]) == [None]
    flat = read((0.0, sample(5, 50)), (1.0, sample(5, 50)))
    assert server_hit_rates(flat, [(0.0, 1.0)]) == [None]


def stages(*rates: float | None) -> RunSummary:
    empty = Summarizer().summary()
    return RunSummary(
        kind="ramp",
        status="completed",
        stages=[
            StageResult(i, "4 rps", 4.0, summary=empty, server_hit_rate=rate)
            for i, rate in enumerate(rates)
        ],
        overall=empty,
    )


def test_a_stage_that_misses_the_asked_rate_is_a_warning() -> None:
    asked = {"asked_hit": 0.6, "expected_hit": 0.59375, "block_size": 16}
    shown, missed = prefix_lines(asked, stages(0.594, 0.41))
    assert "asked 0.6" in shown[0]
    assert "0.594 (4 rps), 0.410 (4 rps)" in shown[0]
    assert len(missed) == 1
    assert "stage 2" in missed[0]
    assert "hit 0.410" in missed[0]


def test_another_workload_shows_the_rates_without_judging_them() -> None:
    shown, missed = prefix_lines({"spec": "random"}, stages(0.0, None))
    assert shown == ["prefix cache (the server's counters): 0.000 (4 rps), - (4 rps)"]
    assert missed == []
    assert prefix_lines({}, stages(None)) == ([], [])
