"""The watch on the load generator's own health: when the client is the limit."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest

from servemon.loadgen.record.runrecord import (
    ClientLimit,
    RunInfo,
    RunSummary,
    StageResult,
    read_record,
    write_record,
)
from servemon.loadgen.record.sections import ClockOrigin
from servemon.loadgen.record.summary import Summarizer
from servemon.loadgen.run import clientwatch
from servemon.loadgen.run.clientwatch import ClientWatch, limit_lines
from servemon.loadgen.send.timing import Outcome, RequestTiming


def late(lag_s: float, stage: int = 0) -> RequestTiming:
    return RequestTiming(
        request_id="r",
        stage=stage,
        scheduled_s=100.0,
        sent_s=100.0 + lag_s,
        end_s=101.0,
        outcome=Outcome.OK,
    )


class Seen:
    def __init__(self) -> None:
        self.stage = 0
        self.warnings: list[tuple[int, str, str]] = []

    def watch(self, *, open_loop: bool = True) -> ClientWatch:
        return ClientWatch(
            origin_s=90.0,
            stage_of=lambda: self.stage,
            on_limit=lambda *w: self.warnings.append(w),
            open_loop=open_loop,
        )


def test_a_client_behind_its_schedule_is_flagged_once_per_stage_and_counted() -> None:
    seen = Seen()
    watch = seen.watch()
    for _ in range(clientwatch.LAG_WINDOW):
        watch.observe(late(0.0004))
    assert watch.check(0.3, 101.0).tripped == {}  # on time
    for _ in range(clientwatch.LAG_WINDOW):
        watch.observe(late(0.020))
    assert set(watch.check(0.3, 102.0).tripped) == {"lag"}
    watch.observe(late(0.030))
    watch.check(0.3, 103.0)
    assert [w[:2] for w in seen.warnings] == [(0, "lag")]  # printed once
    assert "--workers" in seen.warnings[0][2]
    (limit,) = watch.stage_limits(0)
    assert limit.reason == "lag"
    assert limit.first_s == 102.0 - 90.0
    assert limit.seconds == 2 * clientwatch.CHECK_S
    assert limit.worst == pytest.approx(0.020)  # the median: one later outlier aside
    # A new stage warns again.
    seen.stage = 1
    watch.observe(late(0.030))
    watch.check(0.3, 104.0)
    assert [w[:2] for w in seen.warnings] == [(0, "lag"), (1, "lag")]


def test_no_fresh_requests_no_lag_verdict_and_a_closed_loop_has_no_schedule() -> None:
    seen = Seen()
    watch = seen.watch()
    for _ in range(clientwatch.LAG_WINDOW):
        watch.observe(late(0.5))
    watch.check(0.1, 101.0)
    assert watch.check(0.1, 102.0).lag is None  # nothing finished since
    closed = seen.watch(open_loop=False)
    for _ in range(clientwatch.LAG_WINDOW):
        closed.observe(late(0.5))
    assert closed.check(0.1, 101.0).tripped == {}


def test_a_full_core_is_flagged_and_nothing_counts_between_stages() -> None:
    seen = Seen()
    watch = seen.watch()
    assert watch.check(0.5, 101.0).tripped == {}
    seen.stage = -1
    assert set(watch.check(0.97, 102.0).tripped) == {"cpu"}
    assert watch.limits == {}  # not in a stage: not recorded
    seen.stage = 2
    watch.check(0.97, 103.0)
    assert [x.reason for x in watch.stage_limits(2)] == ["cpu"]


def test_a_blocked_event_loop_is_seen_by_the_probe() -> None:
    seen = Seen()
    watch = seen.watch()

    async def go() -> set[str]:
        running = asyncio.create_task(watch.run())
        await asyncio.sleep(0.12)
        time.sleep(0.2)  # noqa: ASYNC251 - a blocking call, on purpose
        await asyncio.sleep(0.12)
        tripped = set(watch.check(None, time.monotonic()).tripped)
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)
        return tripped

    assert asyncio.run(go()) == {"loop"}
    (limit,) = watch.stage_limits(0)
    assert limit.worst >= 0.15


def test_client_limits_are_in_the_record_and_an_older_record_has_none(
    tmp_path: Path,
) -> None:
    limit = ClientLimit("cpu", "the client used 97 % of its core", 3.0, 2.0, 0.97)
    stage = StageResult(stage=0, label="900 rps", target_rate=900.0)
    stage.client_limits = [limit]
    summary = RunSummary(
        kind="ramp",
        status="completed",
        stages=[stage],
        overall=Summarizer().summary(),
    )
    info = RunInfo(kind="ramp", status="completed", clock_origin=ClockOrigin(utc="x"))
    write_record(tmp_path, info, summary)
    _, read = read_record(tmp_path)
    assert read is not None
    assert read.stages[0].client_limits == [limit]
    (line,) = limit_lines(read.stages)
    assert line.startswith("stage 1 (900 rps): the client was the limit: the client")
    assert "from 3.0 s, 2 s in all" in line
    assert "cpu" in (tmp_path / "summary.csv").read_text().splitlines()[1]
    data = json.loads((tmp_path / "summary.json").read_text())
    del data["stages"][0]["client_limits"]
    (tmp_path / "summary.json").write_text(json.dumps(data))
    _, older = read_record(tmp_path)
    assert older is not None
    assert older.stages[0].client_limits == []
