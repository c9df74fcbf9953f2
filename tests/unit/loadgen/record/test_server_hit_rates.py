"""Each stage's prefix-cache hit rate by the server's own counters, and what the
end lines say of it against the rate a ``prefix:`` workload asked for."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from servemon.core import names
from servemon.loadgen.record.columns import prefix_lines
from servemon.loadgen.record.reading import Reading, reading_of, server_hit_rates
from servemon.loadgen.record.record import RunDirectory, rebuild_summary
from servemon.loadgen.record.runrecord import RunInfo, RunSummary, StageResult
from servemon.loadgen.record.sections import ClockOrigin, PrefixRecord, WorkloadRecord
from servemon.loadgen.record.summary import Summarizer
from servemon.loadgen.send.timing import Outcome, RequestTiming

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
    asked = WorkloadRecord(
        "prefix:hit=0.6", prefix=PrefixRecord(0.6, 0.59375, block_size=16)
    )
    shown, missed = prefix_lines(asked, stages(0.594, 0.41))
    assert "asked 0.6" in shown[0]
    assert "0.594 (4 rps), 0.410 (4 rps)" in shown[0]
    assert len(missed) == 1
    assert "stage 2" in missed[0]
    assert "hit 0.410" in missed[0]


def test_another_workload_shows_the_rates_without_judging_them() -> None:
    shown, missed = prefix_lines(WorkloadRecord("random"), stages(0.0, None))
    assert shown == ["prefix cache (the server's counters): 0.000 (4 rps), - (4 rps)"]
    assert missed == []
    assert prefix_lines(WorkloadRecord(), stages(None)) == ([], [])


def test_a_killed_runs_rebuilt_summary_reads_the_rate_and_energy_it_sampled(
    tmp_path: Path,
) -> None:
    # Two stages of ten requests, 0.5 s apart, each 0.5 s long: stage 0 is
    # scheduled from 10 s, stage 1 from 15 s; its last request ends at 20 s.
    run = RunDirectory(tmp_path / "run")
    for i in range(20):
        at = 10.0 + 0.5 * i
        run.append_request(
            RequestTiming(
                request_id=f"r{i}", stage=i // 10, scheduled_s=at, sent_s=at,
                end_s=at + 0.5, outcome=Outcome.OK, output_tokens=4,
            )
        )  # fmt: skip
    # The server's counters and the GPUs' energy (600 W) once a second, as the
    # run's samplers write them; hits a quarter of queries until 15 s, then half.
    for t in range(8, 23):
        hits = 100.0 * min(t, 15) + 200.0 * max(t - 15, 0)
        run.append_server_sample(
            {"mono_s": float(t), "samples": sample(hits, 400.0 * t)}
        )
        run.append_server_sample(
            {
                "mono_s": t + 0.5,
                "energy": {"joules": 600.0 * t, "gpus": 2, "source": "x"},
            }
        )
    run.close()
    info = RunInfo(
        kind="ramp",
        status="running",
        clock_origin=ClockOrigin(9.0, "2026-12-01T00:00:00+00:00"),
        config={"sample_interval": 1.0, "gpu_hour_cost": 2.0},
    )
    rebuilt = rebuild_summary(tmp_path / "run", info)
    # Stage 0 from 10 s to stage 1's first request (15 s), stage 1 to 20 s.
    assert [s.server_hit_rate for s in rebuilt.stages] == [0.25, 0.5]
    energies = [s.summary.energy for s in rebuilt.stages if s.summary is not None]
    assert [(e.seconds, e.joules) for e in energies if e is not None] == [
        pytest.approx((5.0, 3000.0)),
        pytest.approx((5.0, 3000.0)),
    ]
    whole = rebuilt.overall.energy
    assert whole is not None
    assert (whole.gpus, whole.source, whole.gpu_hour_cost) == (2, "x", 2.0)
    assert whole.seconds == pytest.approx(10.0)
