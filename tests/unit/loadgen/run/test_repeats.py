"""``--repeats N``: the plan runs each level N times in a row, the commands that
cannot repeat say why, and the record pools each level's repeats (summary.json's
``by_level``, the report's pooled table) and keeps them through a read-back and a
rebuild."""

from __future__ import annotations

from pathlib import Path

import pytest

from servemon.core.errors import ConfigError
from servemon.loadgen.drivers.sweep import stage_numbers
from servemon.loadgen.record.columns import repeat_header, repeat_rows
from servemon.loadgen.record.record import RunDirectory, rebuild_summary
from servemon.loadgen.record.runrecord import (
    RunInfo,
    RunSummary,
    StageResult,
    read_record,
    write_record,
)
from servemon.loadgen.record.sections import ClockOrigin
from servemon.loadgen.record.tally import Tally
from servemon.loadgen.reports.compare import verdict_text
from servemon.loadgen.reports.significance import Difference, Verdict
from servemon.loadgen.run.config import Kind, LoadConfig
from servemon.loadgen.run.flat import config_of
from servemon.loadgen.run.plan import make_plan
from servemon.loadgen.send.timing import Outcome, RequestTiming


def timing(i: int, stage: int, itl: float = 0.1) -> RequestTiming:
    sent = 10.0 + i * 0.1
    return RequestTiming(
        request_id=f"r{i}",
        stage=stage,
        scheduled_s=sent,
        sent_s=sent,
        end_s=sent + 0.5,
        outcome=Outcome.OK,
        first_chunk_s=sent + 0.05,
        content_s=(sent + 0.05, sent + 0.05 + itl, sent + 0.05 + 2 * itl),
        output_tokens=3,
        prompt_tokens=8,
    )


# -- the plan ---------------------------------------------------------------------


def flat(kind: Kind, **keys: object) -> LoadConfig:
    """``kind``'s config from flat keys, as the flags give them."""
    return config_of(kind, ("flags", keys))


def test_a_ramp_runs_each_stage_n_times_in_a_row_under_its_own_label() -> None:
    stages = make_plan("ramp", flat("ramp", stages="4:8,8:5", repeats=3)).stages
    assert [s.index for s in stages] == [0, 1, 2, 3, 4, 5]
    assert [s.label for s in stages] == ["4 rps"] * 3 + ["8 rps"] * 3
    assert [s.repeat for s in stages] == [1, 2, 3, 1, 2, 3]
    assert [s.target_rate for s in stages] == [4.0] * 3 + [8.0] * 3
    assert [s.planned_s for s in stages] == [8.0] * 3 + [5.0] * 3


def test_without_repeats_no_stage_is_numbered_as_a_repeat() -> None:
    stages = make_plan("ramp", flat("ramp", stages="4:8,8:5")).stages
    assert [(s.index, s.repeat) for s in stages] == [(0, None), (1, None)]


@pytest.mark.parametrize(
    ("number", "expected"),
    [((10,), [10, 10, 10, 10]), ((10, 20), [10, 10, 20, 20])],
)
def test_a_sweeps_number_is_its_levels_for_every_repeat(
    number: tuple[int, ...], expected: list[int]
) -> None:
    config = flat("sweep", parallel=(1, 4), number=number, repeats=2)
    stages = make_plan("sweep", config).stages
    assert [(s.label, s.parallel, s.repeat) for s in stages] == [
        ("parallel 1", 1, 1),
        ("parallel 1", 1, 2),
        ("parallel 4", 4, 1),
        ("parallel 4", 4, 2),
    ]
    assert config.sweep is not None
    sweep = config.sweep
    assert stage_numbers(sweep.number, sweep.repeats, len(stages)) == expected


def test_a_sweeps_numbers_must_still_fit_its_levels() -> None:
    config = flat("sweep", parallel=(1, 4), number=(10, 20, 30), repeats=2)
    with pytest.raises(ConfigError, match="3 values for 2 --parallel levels"):
        make_plan("sweep", config)


@pytest.mark.parametrize(
    ("kind", "why"),
    [
        ("capacity", "picks its next step from the last one"),
        ("control", "holds one setpoint"),
        # Refused before the trace is even looked for.
        ("replay", "prefix cache"),
    ],
)
def test_commands_that_cannot_repeat_refuse_in_one_line(kind: Kind, why: str) -> None:
    # --repeats is a ramp's and a sweep's (their sections'): the others refuse
    # it where the config is built, each saying why.
    hold = {"hold": "waiting=8"} if kind == "control" else {}
    with pytest.raises(ConfigError) as caught:
        config_of(kind, ("flags", {"repeats": 3, "slo": "ttft_p95<=0.5", **hold}))
    text = str(caught.value)
    assert text.startswith(
        f"flags: --repeats: only servemon ramp and sweep take it, not {kind}: "
    )
    assert why in text
    assert "\n" not in text


# -- the record -------------------------------------------------------------------

#: Two levels, two repeats each: 5 requests a repeat; the first level's repeats
#: last 5 s and 2.5 s, the second level's requests have a slower token gap.
PLAN = [
    StageResult(0, "1 rps", 1.0, planned_s=5.0, sent=5, repeat=1),
    StageResult(1, "1 rps", 1.0, planned_s=2.5, sent=5, repeat=2),
    StageResult(2, "2 rps", 2.0, planned_s=5.0, sent=5, repeat=1),
    StageResult(3, "2 rps", 2.0, planned_s=5.0, sent=5, repeat=2),
]
DURATIONS: list[float | None] = [5.0, 2.5, 5.0, 5.0]


def tallied(plan: list[StageResult] = PLAN) -> Tally:
    tally = Tally()
    for i in range(20):
        tally.add(timing(i, i // 5, itl=0.1 if i < 10 else 0.2))
    return tally


def repeated_summary() -> RunSummary:
    tally = tallied()
    stages, overall = tally.results(PLAN, DURATIONS)
    return RunSummary(
        kind="ramp",
        status="completed",
        stages=stages,
        overall=overall,
        **tally.groups(stages, DURATIONS),
    )


def test_a_levels_repeats_pool_with_throughput_over_their_summed_durations() -> None:
    levels = tallied().levels(PLAN, DURATIONS)
    assert levels is not None
    assert list(levels) == ["1 rps", "2 rps"]
    first, second = levels["1 rps"], levels["2 rps"]
    assert (first.requests, second.requests) == (10, 10)
    assert first.duration_s == pytest.approx(7.5)
    assert first.request_throughput == pytest.approx(10 / 7.5)
    assert first.output_throughput == pytest.approx(30 / 7.5)
    assert second.request_throughput == pytest.approx(10 / 10.0)
    itl = second.figure("itl")
    assert itl is not None
    assert itl.count == 20  # two gaps a request, both repeats


def test_a_run_without_repeats_has_no_levels() -> None:
    plain = [
        StageResult(0, "1 rps", 1.0, planned_s=5.0, sent=10),
        StageResult(1, "2 rps", 2.0, planned_s=5.0, sent=10),
    ]
    tally = Tally()
    for i in range(20):
        tally.add(timing(i, i // 10))
    assert tally.levels(plain, [5.0, 5.0]) is None
    assert tally.groups(plain, [5.0, 5.0])["by_level"] is None


def test_the_pooled_table_shows_each_figure_with_its_lowest_and_highest_repeat() -> (
    None
):
    rows = repeat_rows(repeated_summary())
    assert repeat_header()[:4] == ["level", "repeats", "requests", "output tok/s"]
    # Output tok/s: 15 tokens over 5 s and over 2.5 s, pooled 30 over 7.5 s.
    assert rows[0][:4] == ["1 rps", "2", "10", "4 [3-6]"]
    assert rows[1][:4] == ["2 rps", "2", "10", "3 [3-3]"]
    itl = repeat_header().index("ITL p95 ms")
    assert rows[0][itl] == "100 [100-100]"
    assert rows[1][itl] == "200 [200-200]"


def test_by_level_reads_back_from_summary_json_with_its_figures(
    tmp_path: Path,
) -> None:
    summary = repeated_summary()
    info = RunInfo(
        kind="ramp",
        status="completed",
        clock_origin=ClockOrigin(9.0, "2026-12-01T00:00:00+00:00"),
        stages=summary.stages,
    )
    write_record(tmp_path, info, summary)
    _, back = read_record(tmp_path)
    assert back is not None
    assert back.by_level == summary.by_level
    assert back.by_level is not None
    itl = back.by_level["2 rps"].figure("itl")
    assert itl is not None
    assert itl.count == 20
    assert [s.repeat for s in back.stages] == [1, 2, 1, 2]
    rows = (tmp_path / "summary.csv").read_text().splitlines()
    assert [r.split(",")[0] for r in rows[1:]] == [
        "0",
        "1",
        "2",
        "3",
        "all",
        "level 1 rps",
        "level 2 rps",
    ]


def test_a_killed_runs_rebuilt_summary_keeps_its_repeats(tmp_path: Path) -> None:
    run = RunDirectory(tmp_path / "run")
    for i in range(20):
        run.append_request(timing(i, i // 5))
    run.close()
    info = RunInfo(
        kind="ramp",
        status="running",
        clock_origin=ClockOrigin(9.0, "2026-12-01T00:00:00+00:00"),
        stages=PLAN,
    )
    rebuilt = rebuild_summary(tmp_path / "run", info)
    assert [s.repeat for s in rebuilt.stages] == [1, 2, 1, 2]
    assert rebuilt.by_level is not None
    assert {k: v.requests for k, v in rebuilt.by_level.items()} == {
        "1 rps": 10,
        "2 rps": 10,
    }


# -- how a verdict reads ----------------------------------------------------------


def difference(low: float, high: float, verdict: Verdict) -> Difference:
    return Difference(
        "1 rps",
        "TPOT mean ms",
        1.0,
        1.0,
        1.0,
        low,
        high,
        verdict,
        "repeats",
        0.99,
        None,
    )


@pytest.mark.parametrize(
    ("low", "high", "verdict", "text"),
    [
        (1.174, 1.318, "slower", "[1.17-1.32] slower"),
        (0.951, 1.047, "no difference", "[0.95-1.05] no difference"),
        # A narrow interval next to 1 keeps the digits that show it excludes 1.
        (0.9936, 0.9979, "faster", "[0.994-0.998] faster"),
        (1.0004, 1.0042, "slower", "[1.0004-1.0042] slower"),
    ],
)
def test_a_verdicts_interval_shows_which_side_of_1_it_lies(
    low: float, high: float, verdict: Verdict, text: str
) -> None:
    assert verdict_text(difference(low, high, verdict)) == text
