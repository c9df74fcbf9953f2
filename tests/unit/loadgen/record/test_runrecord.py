"""The typed run record: what is written reads back the same, and a damaged file
is one line naming the file and the field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from servemon.core.errors import ConfigError
from servemon.core.slo import parse_slo
from servemon.loadgen.record.runrecord import (
    RunInfo,
    RunSummary,
    StageResult,
    read_record,
    write_record,
)
from servemon.loadgen.record.sections import ClockOrigin
from servemon.loadgen.record.tally import Tally
from servemon.loadgen.send.timing import Outcome, RequestTiming


def timing(i: int, stage: int, outcome: Outcome = Outcome.OK) -> RequestTiming:
    sent = 10.0 + i * 0.1
    return RequestTiming(
        request_id=str(i),
        stage=stage,
        scheduled_s=sent,
        sent_s=sent,
        end_s=sent + 0.5,
        outcome=outcome,
        first_chunk_s=sent + 0.05,
        content_s=(sent + 0.1, sent + 0.2, sent + 0.3),
        output_tokens=3,
        prompt_tokens=8,
    )


def record(tmp_path: Path) -> tuple[RunInfo, RunSummary]:
    tally = Tally(parse_slo("ttft_p95<=0.5"))
    for i in range(20):
        tally.add(timing(i, i % 2, Outcome.TIMEOUT if i == 7 else Outcome.OK))
    plan = [
        StageResult(0, "1 rps", 1.0, planned_s=5.0, sent=10),
        StageResult(1, "2 rps", 2.0, sent=10),
    ]
    stages, overall = tally.results(plan, [5.0, None])
    info = RunInfo(
        kind="ramp",
        status="completed",
        clock_origin=ClockOrigin(9.0, "2026-12-01T00:00:00+00:00"),
        stages=stages,
        slo_terms=parse_slo("ttft_p95<=0.5"),
    )
    summary = RunSummary(
        kind="ramp", status="completed", stages=stages, overall=overall, slo=info.slo
    )
    return info, summary


def test_the_record_reads_back_as_written(tmp_path: Path) -> None:
    info, summary = record(tmp_path)
    write_record(tmp_path, info, summary)
    info2, summary2 = read_record(tmp_path)
    assert summary2 == summary
    assert [s.stage for s in info2.stages] == [0, 1]
    assert [s.summary for s in info2.stages] == [None, None]  # run.json: no summaries
    assert summary2.stages[0].summary is not None
    assert summary2.stages[0].summary.figure("ttft") is not None
    assert summary2.overall.error_rate == pytest.approx(1 / 20)
    assert summary2.stages[0].achieved_rate == pytest.approx(10 / 5.0)
    rows = (tmp_path / "summary.csv").read_text().splitlines()
    assert rows[0].startswith("stage,")
    assert [r.split(",")[0] for r in rows[1:]] == ["0", "1", "all"]


def test_a_newer_record_with_unknown_fields_still_reads(tmp_path: Path) -> None:
    info, summary = record(tmp_path)
    write_record(tmp_path, info, summary)
    data = json.loads((tmp_path / "summary.json").read_text())
    data["from_the_future"] = 1
    data["overall"]["new_figure"] = {"count": 1}
    (tmp_path / "summary.json").write_text(json.dumps(data))
    assert read_record(tmp_path)[1] == summary


@pytest.mark.parametrize(
    ("name", "damage", "message"),
    [
        ("run.json", lambda d: d.pop("kind"), "run.json: kind: Field required"),
        (
            "summary.json",
            lambda d: d["stages"][1].update(sent="many"),
            "summary.json: stages.1.sent: Input should be a valid integer",
        ),
    ],
)
def test_a_damaged_record_is_one_line_naming_the_field(
    tmp_path: Path, name: str, damage: object, message: str
) -> None:
    info, summary = record(tmp_path)
    write_record(tmp_path, info, summary)
    data = json.loads((tmp_path / name).read_text())
    damage(data)  # type: ignore[operator]
    (tmp_path / name).write_text(json.dumps(data))
    with pytest.raises(ConfigError) as caught:
        read_record(tmp_path)
    text = str(caught.value)
    assert "\n" not in text
    assert text.startswith(str(tmp_path / name))
    assert message in text


def test_every_figure_reaches_the_json_the_csv_and_back(tmp_path: Path) -> None:
    """A figure declared in FIGURES is summed, written and read back with nothing
    else to change: here every one of them, from requests that have them all."""
    from servemon.loadgen.record.figures import FIGURE_NAMES

    tally = Tally()
    for i in range(5):
        t = timing(i, 0)
        tally.add(
            RequestTiming(
                **{
                    **{f: getattr(t, f) for f in t.__dataclass_fields__},
                    "server_queue_s": 0.01,
                    "server_prefill_s": 0.02,
                    "server_decode_s": 0.2,
                    "first_answer_s": t.first_content_s,
                }
            )
        )
    stages, overall = tally.results([StageResult(0, "1 rps", 1.0, sent=5)], [None])
    assert set(overall.figures) == set(FIGURE_NAMES)
    info = RunInfo(
        kind="ramp", status="completed", clock_origin=ClockOrigin(), stages=stages
    )
    summary = RunSummary(
        kind="ramp", status="completed", stages=stages, overall=overall
    )
    write_record(tmp_path, info, summary)
    header = (tmp_path / "summary.csv").read_text().splitlines()[0].split(",")
    for name in FIGURE_NAMES:
        assert f"{name}_p95_s" in header
    back = read_record(tmp_path)[1]
    assert back is not None
    assert back.overall == overall
    assert back.overall.value("server_decode_p50") == pytest.approx(0.2)


def test_slo_terms_are_kept_structured_and_an_older_record_still_reads(
    tmp_path: Path,
) -> None:
    """``run.json`` keeps the SLO's terms as fields (a reader judges by them, not
    by parsing text again) and their text, derived from them; a record written
    before the terms is judged by its text."""
    info, summary = record(tmp_path)
    terms = parse_slo("ttft_p95<=0.5,error_rate<=0.01")
    info = RunInfo(
        kind="ramp",
        status="completed",
        clock_origin=info.clock_origin,
        stages=info.stages,
        slo_terms=terms,
    )
    write_record(tmp_path, info, summary)
    raw = json.loads((tmp_path / "run.json").read_text())
    assert raw["slo_terms"] == [
        {"figure": "ttft", "stat": "p95", "threshold": 0.5},
        {"figure": "error_rate", "stat": "ratio", "threshold": 0.01},
    ]
    back, _ = read_record(tmp_path)
    assert back.terms() == terms
    del raw["slo_terms"]  # as servemon wrote it before
    (tmp_path / "run.json").write_text(json.dumps(raw))
    older, _ = read_record(tmp_path)
    assert older.slo_terms == terms  # parsed from the text as it is read
    assert older.slo == raw["slo"]
