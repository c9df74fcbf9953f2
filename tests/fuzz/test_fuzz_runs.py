"""Run directories cut at any byte, as ``kill -9`` (or a full disk) leaves them.

A small real run directory is written by the record's own writers
(:class:`RunDirectory` for ``requests.jsonl``, :func:`write_record` for ``run.json``
and ``summary.json``), with text from a server that is not ASCII in it; then one of
its files is cut at a drawn byte. Properties: :func:`rebuild_summary` and
:func:`read_run` (what ``servemon report`` reads) count every request up to the last
complete line of ``requests.jsonl``; a cut ``run.json`` or ``summary.json`` is
either still whole JSON or a one-line :class:`ConfigError` naming the file, never a
traceback.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from servemon.core.errors import ConfigError
from servemon.core.slo import parse_slo
from servemon.loadgen.record.record import RunDirectory, read_run, rebuild_summary
from servemon.loadgen.record.runrecord import (
    RunInfo,
    RunSummary,
    StageResult,
    write_record,
)
from servemon.loadgen.record.sections import ClockOrigin
from servemon.loadgen.record.tally import Tally
from servemon.loadgen.send.timing import Outcome, RequestTiming

pytestmark = pytest.mark.fuzz

N = 6  # requests in the run


def _timing(i: int) -> RequestTiming:
    sent = 10.0 + i * 0.1
    return RequestTiming(
        request_id=f"r-{i}",
        stage=i % 2,
        scheduled_s=sent,
        sent_s=sent,
        end_s=sent + 0.5,
        outcome=Outcome.OK if i != 3 else Outcome.STREAM_ERROR,
        first_chunk_s=sent + 0.05,
        content_s=(sent + 0.1, sent + 0.2),
        output_tokens=2,
        prompt_tokens=8,
        finish_reason="stop",
        error="coupé — ✂" if i == 3 else None,  # multi-byte UTF-8 to cut inside
    )


def _write_run(path: Path) -> list[int]:
    """A finished two-stage run in ``path``; the byte offset where each line of
    requests.jsonl ends."""
    run = RunDirectory(path)
    tally = Tally(parse_slo("ttft_p95<=0.5"))
    for i in range(N):
        run.append_request(_timing(i))
        tally.add(_timing(i))
    run.close()
    plan = [
        StageResult(0, "1 rps", 1.0, planned_s=5.0, sent=N // 2),
        StageResult(1, "2 rps", 2.0, sent=N // 2),
    ]
    stages, overall = tally.results(plan, [5.0, None])
    info = RunInfo(
        kind="ramp",
        status="completed",
        clock_origin=ClockOrigin(9.0, "2026-12-01T00:00:00+00:00"),
        stages=stages,
        slo_terms=parse_slo("ttft_p95<=0.5"),
        stop_reason="arrêt ✓",
    )
    summary = RunSummary(
        kind="ramp", status="completed", stages=stages, overall=overall, slo=info.slo
    )
    write_record(path, info, summary)
    ends, total = [], 0
    for line in (path / "requests.jsonl").read_bytes().splitlines(keepends=True):
        total += len(line)
        ends.append(total)
    return ends


def _cut(path: Path, at: int) -> int:
    body = path.read_bytes()
    at = min(at, len(body))
    path.write_bytes(body[:at])
    return at


def _assert_one_line(exc: ConfigError, name: str) -> None:
    message = str(exc)
    assert "\n" not in message, message
    assert name in message, message


@given(at=st.integers(0, 4_000))
# Cut inside the multi-byte "é" of a request's error text: the reader decoded the
# file as a whole and UnicodeDecodeError escaped instead of the line being skipped.
@example(at=-1)
def test_a_cut_requests_file_keeps_every_complete_line(at: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp) / "run"
        ends = _write_run(run_dir)
        requests = run_dir / "requests.jsonl"
        if at < 0:  # just past the first byte of "é" in request 3's line
            at = requests.read_bytes().index("é".encode()) + 1
        at = _cut(requests, at)
        complete = sum(1 for end in ends if end <= at)
        # A last line cut just before its newline is still whole JSON: read too.
        whole = complete + (complete < N and at == ends[complete] - 1)
        (run_dir / "summary.json").unlink()  # as a run killed before writing it
        data = read_run(run_dir)
        assert data.record.overall.requests == whole
        assert data.record.status == "unfinished"
        info = data.info
        assert rebuild_summary(run_dir, info).overall.requests == whole


@pytest.mark.parametrize("name", ["run.json", "summary.json"])
@given(at=st.integers(0, 20_000))
def test_a_cut_record_file_reads_whole_or_is_one_line(name: str, at: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp) / "run"
        _write_run(run_dir)
        path = run_dir / name
        size = len(path.read_bytes())
        at = _cut(path, at)
        try:
            data = read_run(run_dir)
        except ConfigError as exc:
            assert at < size - 1  # all but the final newline: still whole JSON
            _assert_one_line(exc, name)
            return
        assert data.record.overall.requests == N
