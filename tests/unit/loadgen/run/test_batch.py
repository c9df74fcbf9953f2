"""A batch of records folded into the run at once (a fleet's sliced credits) gives
what the same requests give one at a time: summaries, live histograms, the
progress counts, the guard rail's verdict, and the lines written as they came."""

from __future__ import annotations

import io
import math
from dataclasses import asdict
from pathlib import Path

import orjson
import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from rich.console import Console

from servemon.core.slo import parse_slo
from servemon.loadgen.record.line import request_line
from servemon.loadgen.record.record import RunDirectory
from servemon.loadgen.record.slo import request_meets
from servemon.loadgen.record.summary import Summarizer
from servemon.loadgen.record.tally import Tally
from servemon.loadgen.run.batch import (
    BatchError,
    RunBatch,
    group_lines,
    summarize_lines,
)
from servemon.loadgen.run.clientwatch import ClientWatch
from servemon.loadgen.run.guard import GuardRail
from servemon.loadgen.run.live import LiveMetrics
from servemon.loadgen.run.progress import Progress
from servemon.loadgen.send.timing import Outcome, RequestTiming, TokenSource


def timing(i: int) -> RequestTiming:
    """Requests of every kind the run sees: ok streams of several lengths (some
    with the server's own figures, a model of a mix, reasoning), failures,
    cancellations."""
    sent = 100.0 + i * 0.01
    if i % 7 == 3:
        return RequestTiming(
            request_id=f"t-{i}",
            stage=i % 2,
            scheduled_s=sent - 0.0005,
            sent_s=sent,
            end_s=sent + 0.2,
            outcome=Outcome.HTTP_ERROR if i % 2 else Outcome.CANCELLED,
            status=503 if i % 2 else None,
            reconnects=i % 3,
        )
    chunks = tuple(sent + 0.03 + 0.004 * k + 0.0001 * (i % 5) for k in range(2 + i % 6))
    return RequestTiming(
        request_id=f"t-{i}",
        stage=i % 2,
        scheduled_s=sent - 0.001 * (i % 4),
        sent_s=sent,
        headers_s=sent + 0.01,
        first_chunk_s=chunks[0] - 0.001,
        content_s=chunks,
        end_s=chunks[-1] + 0.001,
        outcome=Outcome.OK,
        status=200,
        prompt_tokens=16 + i,
        output_tokens=len(chunks),
        token_source=TokenSource.USAGE if i % 2 else TokenSource.CHUNKS,
        done_sentinel=i % 5 != 0,
        cached_tokens=i % 4 if i % 3 == 0 else None,
        server_queue_s=0.002 if i % 4 == 1 else None,
        server_prefill_s=0.01 if i % 4 == 1 else None,
        server_decode_s=0.05 if i % 4 == 1 else None,
        reasoning_tokens=3 if i % 6 == 2 else None,
        model="b" if i % 3 == 1 else None,
        worker=i % 4,
    )


TIMINGS = [timing(i) for i in range(60)]
LINES = [orjson.loads(orjson.dumps(request_line(t))) for t in TIMINGS]
SLO = parse_slo("ttft_p95<=0.0322,itl_p90<=0.0041,e2e_p99<=1")


def _same(a: object, b: object) -> None:
    if isinstance(a, float) and isinstance(b, float):
        assert math.isclose(a, b, rel_tol=1e-12, abs_tol=1e-15) or a == b
    elif isinstance(a, dict) and isinstance(b, dict):
        assert a.keys() == b.keys()
        for key in a:
            _same(a[key], b[key])
    elif isinstance(a, list | tuple) and isinstance(b, list | tuple):
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            _same(x, y)
    else:
        assert a == b


def test_a_summary_of_a_batch_is_the_summary_of_its_requests() -> None:
    one_by_one = {stage: Summarizer(SLO) for stage in (0, 1)}
    for t in TIMINGS:
        one_by_one[t.stage].add(t)
    batched = {stage: Summarizer(SLO) for stage in (0, 1)}
    # Two batches, so that a stage is added to twice.
    for lines in (LINES[:25], LINES[25:]):
        for group in group_lines(lines):
            summarize_lines(batched[group.stage], group)
    for stage in (0, 1):
        _same(
            asdict(one_by_one[stage].summary()),
            asdict(batched[stage].summary()),
        )
        assert batched[stage].good == one_by_one[stage].good > 0


def test_a_line_meets_the_slo_as_its_request_does() -> None:
    from servemon.loadgen.run.batch import _meets

    for t, line in zip(TIMINGS, LINES, strict=True):
        if t.outcome is Outcome.OK:
            assert _meets(line, SLO) == request_meets(t, SLO)


def _samples(live: LiveMetrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = generate_latest(live.registry).decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if not s.name.endswith("_created")
    }


def _bookkeeping(tmp_path: Path, name: str) -> RunBatch:
    progress = Progress(Console(file=io.StringIO()), live=False)
    return RunBatch(
        rundir=RunDirectory(tmp_path / name),
        live=LiveMetrics("http://t", "m", SLO),
        tally=Tally(list(SLO)),
        progress=progress,
        watch=ClientWatch(origin_s=0.0, stage_of=lambda: 0, on_limit=print),
        guard=GuardRail(),
        abort=lambda _why: None,
        sink=lambda _t: None,
        starter=lambda _i, _at, _p: None,
    )


def test_a_batch_counts_in_the_run_as_its_requests_one_by_one(tmp_path: Path) -> None:
    one = _bookkeeping(tmp_path, "one")
    for t in TIMINGS:  # as RunContext._finished takes each
        one.live.in_flight.dec()
        one.rundir.append_request(t)
        one.live.observe(t)
        one.tally.add(t)
        one.progress.request_done(t)
        one.watch.observe(t)
    many = _bookkeeping(tmp_path, "many")
    for lines in (LINES[:31], LINES[31:]):
        raw = b"".join(orjson.dumps(line) + b"\n" for line in lines)
        many.lines(raw, lines)
    _same(_samples(one.live), _samples(many.live))
    for stage in (0, 1):
        _same(
            asdict(one.tally.stages[stage].summary()),
            asdict(many.tally.stages[stage].summary()),
        )
    assert sorted(one.tally.models) == sorted(many.tally.models) == ["b"]
    assert one.progress._per_stage == many.progress._per_stage
    assert one.watch._fresh == many.watch._fresh == len(TIMINGS)
    one.rundir.close()
    many.rundir.close()
    # The lines as they came: the same bytes the run writes for each request.
    assert (tmp_path / "one" / "requests.jsonl").read_bytes() == (
        tmp_path / "many" / "requests.jsonl"
    ).read_bytes()


def test_a_batch_of_failures_trips_the_guard_rail(tmp_path: Path) -> None:
    run = _bookkeeping(tmp_path, "run")
    said: list[str | None] = []
    run.abort = said.append
    failed = [
        orjson.loads(
            orjson.dumps(
                request_line(
                    RequestTiming(
                        request_id=f"f-{i}",
                        scheduled_s=100.0 + i,
                        sent_s=100.0 + i,
                        end_s=100.5 + i,
                        outcome=Outcome.CONNECT_ERROR,
                    )
                )
            )
        )
        for i in range(12)
    ]
    run.lines(b"".join(orjson.dumps(x) + b"\n" for x in failed), failed)
    assert any(why and "stopped answering" in why for why in said)


@pytest.mark.parametrize(
    "broken",
    [
        {"outcome": "fine"},
        {"sent_s": "soon"},
        {"stage": None},
        {"id": 7},
    ],
)
def test_a_line_that_does_not_read_fails_the_batch_before_anything(
    broken: dict[str, object],
) -> None:
    lines = [dict(LINES[0]), {**LINES[1], **broken}]
    with pytest.raises(BatchError):
        group_lines(lines)
    missing = {k: v for k, v in LINES[2].items() if k != "end_s"}
    with pytest.raises(BatchError):
        group_lines([missing])


def test_a_capacity_step_judges_a_batch_as_its_requests_one_by_one() -> None:
    from servemon.loadgen.drivers.capacity import _Step
    from servemon.loadgen.run.stages import StageRecord

    def step() -> _Step:
        record = StageRecord(1, "1 req/s", 1.0, None, 10.0, start_s=100.0)
        return _Step(record, list(SLO), settle_s=0.2)

    one, many = step(), step()
    for t in TIMINGS:
        one(t)
    many.take_lines(LINES[:20])
    many.take_lines(LINES[20:])
    assert 0 < one.judged.requests < one.every.requests
    _same(asdict(one.summary()), asdict(many.summary()))
    _same(asdict(one.every.summary()), asdict(many.every.summary()))
    assert list(one.lags) == list(many.lags)
