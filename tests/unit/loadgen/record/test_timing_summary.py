"""What is derived from one request's timeline, and the figures over many."""

from __future__ import annotations

import dataclasses
import io
from typing import Any

import pytest
from rich.console import Console

from servemon.core.outcomes import count_failed, count_not_judged
from servemon.core.slo import parse_slo
from servemon.loadgen.drivers.control.signal import ClientWindow
from servemon.loadgen.record.figures import exact_quantile
from servemon.loadgen.record.slo import request_meets
from servemon.loadgen.record.summary import Distribution, flat_row, summarize
from servemon.loadgen.run.progress import Progress
from servemon.loadgen.run.stages import StageRecord
from servemon.loadgen.send.timing import Outcome, RequestTiming, TokenSource


def timing(**fields: Any) -> RequestTiming:
    base: dict[str, Any] = {
        "request_id": "r",
        "scheduled_s": 100.0,
        "sent_s": 100.0,
        "end_s": 101.0,
        "outcome": Outcome.OK,
    }
    return RequestTiming(**{**base, **fields})


STATS = ("mean", "p50", "p90", "p95", "p99")


def stats(d: Distribution | None) -> tuple[float, ...]:
    """Count, mean and percentiles of a distribution, by name."""
    assert d is not None
    return (d.count, *(getattr(d, name) for name in STATS))


# -- one request ------------------------------------------------------------------


def test_ttft_counts_from_the_first_content_chunk_not_the_first_chunk() -> None:
    t = timing(
        sent_s=100.0,
        headers_s=100.01,
        first_chunk_s=100.02,  # the role chunk
        content_s=(100.25, 100.30, 100.40),
        end_s=100.5,
        output_tokens=3,
    )
    assert t.first_content_s == 100.25
    assert t.ttft == pytest.approx(0.25)
    assert t.time_to_first_chunk == pytest.approx(0.02)
    assert t.e2e == pytest.approx(0.5)


def test_itl_is_every_gap_between_content_chunks() -> None:
    t = timing(content_s=(100.1, 100.15, 100.35, 100.36))
    assert t.itl == pytest.approx([0.05, 0.2, 0.01])
    assert timing(content_s=(100.1,)).itl == []
    assert timing().itl == []


def test_tpot_spreads_the_time_after_the_first_token_over_the_rest() -> None:
    # 5 tokens from usage, delivered in 3 chunks: TPOT divides by tokens, not chunks.
    t = timing(
        sent_s=100.0,
        content_s=(100.2, 100.5, 101.0),
        end_s=101.0,
        output_tokens=5,
        token_source=TokenSource.USAGE,
    )
    assert t.tpot == pytest.approx((1.0 - 0.2) / 4)
    two = timing(sent_s=100.0, content_s=(100.2, 100.3), end_s=100.3, output_tokens=2)
    assert two.tpot == pytest.approx(0.1)


@pytest.mark.parametrize("tokens", [0, 1])
def test_tpot_is_none_below_two_tokens(tokens: int) -> None:
    t = timing(content_s=(100.2,), end_s=100.3, output_tokens=tokens)
    assert t.tpot is None


def test_no_content_means_no_ttft_and_no_tpot() -> None:
    t = timing(first_chunk_s=100.1, output_tokens=4)
    assert t.first_content_s is None
    assert t.ttft is None
    assert t.tpot is None
    assert t.time_to_first_chunk == pytest.approx(0.1)
    assert timing().time_to_first_chunk is None


def test_dispatch_lag_is_actual_minus_scheduled_send() -> None:
    assert timing(scheduled_s=10.0, sent_s=10.003).dispatch_lag == pytest.approx(0.003)
    assert timing(scheduled_s=10.0, sent_s=10.0).dispatch_lag == 0.0


def test_a_timing_is_a_frozen_value() -> None:
    t = timing()
    with pytest.raises(dataclasses.FrozenInstanceError):
        t.end_s = 5.0  # type: ignore[misc]
    assert t == timing()
    assert t.token_source is TokenSource.CHUNKS


# -- distributions ----------------------------------------------------------------


def test_percentiles_of_known_inputs() -> None:
    d = Distribution.of([float(v) for v in range(101, 0, -1)])  # 1..101, unsorted
    assert stats(d) == pytest.approx((101, 51.0, 51.0, 91.0, 96.0, 100.0))


def test_percentiles_interpolate_between_samples() -> None:
    d = Distribution.of([10.0, 0.0])
    assert stats(d) == pytest.approx((2, 5.0, 5.0, 9.0, 9.5, 9.9))


def test_single_sample_distribution() -> None:
    assert stats(Distribution.of([0.25])) == (1, 0.25, 0.25, 0.25, 0.25, 0.25)


def test_empty_distribution_is_none() -> None:
    assert Distribution.of([]) is None


# -- summaries ----------------------------------------------------------------------


def test_only_ok_requests_count_in_latency_and_throughput() -> None:
    ok_a = timing(
        request_id="a",
        sent_s=10.0,
        content_s=(10.1, 10.2, 10.3),
        end_s=10.4,
        output_tokens=3,
        prompt_tokens=5,
    )
    ok_b = timing(
        request_id="b",
        sent_s=10.5,
        content_s=(10.7, 10.8),
        end_s=11.0,
        output_tokens=2,
        prompt_tokens=7,
    )
    cut = timing(
        request_id="c",
        sent_s=10.2,
        content_s=(10.25, 10.26, 10.9),
        end_s=11.0,
        output_tokens=3,
        prompt_tokens=100,
        outcome=Outcome.STREAM_ERROR,
    )
    late = timing(request_id="d", sent_s=10.3, end_s=12.0, outcome=Outcome.TIMEOUT)
    refused = timing(
        request_id="e", sent_s=10.4, end_s=10.41, outcome=Outcome.HTTP_ERROR
    )
    s = summarize([ok_a, cut, ok_b, late, refused])

    assert s.requests == 5
    assert s.outcomes == {"ok": 2, "stream_error": 1, "timeout": 1, "http_error": 1}
    # Duration spans every request, first send to last end.
    assert s.duration_s == pytest.approx(2.0)
    assert s.request_throughput == pytest.approx(2 / 2.0)
    assert s.output_throughput == pytest.approx(5 / 2.0)
    assert s.mean_prompt_tokens == pytest.approx(6.0)
    assert s.mean_output_tokens == pytest.approx(2.5)

    # ttft 0.1 and 0.2; tpot (0.4 - 0.1) / 2 and (0.5 - 0.2) / 1; e2e 0.4 and 0.5
    assert stats(s.figure("ttft"))[:3] == pytest.approx((2, 0.15, 0.15))
    assert stats(s.figure("tpot"))[:3] == pytest.approx((2, 0.225, 0.225))
    assert stats(s.figure("e2e"))[:3] == pytest.approx((2, 0.45, 0.45))
    # Two gaps of a, one of b; none of the cut stream's.
    assert stats(s.figure("itl")) == pytest.approx((3, 0.1, 0.1, 0.1, 0.1, 0.1))


def test_prompt_tokens_missing_from_some_requests() -> None:
    with_usage = timing(content_s=(100.1,), output_tokens=1, prompt_tokens=8)
    without = timing(content_s=(100.1,), output_tokens=1)
    assert summarize([with_usage, without]).mean_prompt_tokens == 8.0
    assert summarize([without]).mean_prompt_tokens is None


def test_a_single_request() -> None:
    s = summarize(
        [timing(sent_s=1.0, content_s=(1.5, 2.0), end_s=3.0, output_tokens=2)]
    )
    assert s.requests == 1
    assert s.duration_s == pytest.approx(2.0)
    assert s.request_throughput == pytest.approx(0.5)
    assert s.output_throughput == pytest.approx(1.0)
    assert stats(s.figure("ttft")) == (1, 0.5, 0.5, 0.5, 0.5, 0.5)
    assert stats(s.figure("tpot")) == (1, 1.5, 1.5, 1.5, 1.5, 1.5)
    assert stats(s.figure("itl")) == (1, 0.5, 0.5, 0.5, 0.5, 0.5)
    assert stats(s.figure("e2e")) == (1, 2.0, 2.0, 2.0, 2.0, 2.0)


def test_only_failures_give_counts_and_no_latencies() -> None:
    s = summarize(
        [
            timing(sent_s=1.0, end_s=2.0, outcome=Outcome.CONNECT_ERROR),
            timing(sent_s=1.0, end_s=3.0, outcome=Outcome.CONNECT_ERROR),
        ]
    )
    assert s.requests == 2
    assert s.outcomes == {"connect_error": 2}
    assert s.duration_s == pytest.approx(2.0)
    assert s.request_throughput == s.output_throughput == 0.0
    assert s.mean_output_tokens is None
    assert set(s.figures) == {"dispatch_lag"}  # latencies are over ok requests


def test_empty_input() -> None:
    s = summarize([])
    assert s.requests == 0
    assert s.outcomes == {}
    assert s.duration_s == 0.0
    assert s.request_throughput == s.output_throughput == 0.0
    assert s.mean_prompt_tokens is s.mean_output_tokens is None
    assert s.figures == {}


def test_merged_summarizers_sum_up_as_one() -> None:
    from servemon.loadgen.record.summary import Summarizer

    timings = [
        timing(
            request_id=str(i),
            sent_s=10.0 + i,
            end_s=10.5 + i,
            outcome=Outcome.OK if i % 3 else Outcome.TIMEOUT,
            output_tokens=2,
            prompt_tokens=4,
        )
        for i in range(9)
    ]
    left, right = Summarizer().extend(timings[:4]), Summarizer().extend(timings[4:])
    left.merge(right)
    assert left.summary() == summarize(timings)


def test_cancelled_requests_are_neither_ok_nor_errors() -> None:
    """One definition of "failed" (core.outcomes) behind the summary, the CSV
    row, the tables and the progress line: a request the client cancelled (walked
    away from, or cut short when a step ended) is counted apart, never an error."""
    timings = [
        timing(outcome=Outcome.OK),
        timing(outcome=Outcome.HTTP_ERROR),
        timing(outcome=Outcome.CANCELLED),
        timing(outcome=Outcome.CANCELLED),
    ]
    s = summarize(timings)
    assert (s.ok, s.failed, s.cancelled) == (1, 1, 2)
    assert s.error_rate == pytest.approx(0.5)
    row = flat_row(s)
    assert (row["ok"], row["errors"], row["cancelled"]) == (1, 1, 2)

    console = Console(file=io.StringIO(), width=200)
    progress = Progress(console, live=False)
    progress.start([StageRecord(0, "4 rps", 4.0, None, 1.0)])
    progress.stage_started(0)
    for t in timings:
        progress.request_done(t)
    progress.stage_started(1)
    said = console.file.getvalue()  # type: ignore[attr-defined]
    assert "4 finished, 1 ok, 1 errors, 2 cancelled" in said, said


def test_an_outcome_this_version_does_not_know_counts_as_failed() -> None:
    by_outcome = {"ok": 3, "cancelled": 1, "quota_exceeded": 2}
    assert count_failed(by_outcome) == 2
    assert count_not_judged(by_outcome) == 1


def test_the_p95_the_controller_holds_is_the_reports_p95() -> None:
    """One percentile: ``--hold ttft_p95`` steers on, and the live display shows,
    the p95 the summary reports for the same requests."""
    ttfts = [0.05 + 0.013 * ((i * 37) % 41) for i in range(40)]
    timings = [
        timing(sent_s=100.0, content_s=(100.0 + v,), end_s=101.0 + v) for v in ttfts
    ]
    reported = summarize(timings).value("ttft_p95")
    window = ClientWindow(window_s=60.0)
    console = Console(file=io.StringIO(), width=200)
    progress = Progress(console, live=False)
    for t in timings:
        window(t)
        progress.request_done(t)
    assert reported is not None
    assert window.p95(now=110.0) == pytest.approx(reported, abs=1e-12)
    assert progress._p95() == pytest.approx(reported, abs=1e-12)


def test_a_requests_own_itl_percentile_is_the_one_percentile() -> None:
    """Goodput's per-request ITL term reads the request's gaps with the same
    percentile as every other figure (linear between ranks)."""
    gaps = [0.01 * (i + 1) for i in range(10)]  # p95: 0.0955, nearest rank 0.10
    content = [100.0]
    for gap in gaps:
        content.append(content[-1] + gap)
    t = timing(sent_s=99.9, content_s=tuple(content), end_s=content[-1])
    assert exact_quantile(sorted(t.itl), 0.95) == pytest.approx(0.0955)
    assert request_meets(t, parse_slo("itl_p95<=0.096"))
    assert not request_meets(t, parse_slo("itl_p95<=0.095"))
