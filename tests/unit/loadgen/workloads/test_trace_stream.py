"""Traces counted as a stream (``servemon trace info``, ``plan --trace``): memory
stays far below the file's size, and the figures are those of the trace read whole
(:func:`read_trace_file`, entries sorted)."""

from __future__ import annotations

import tracemalloc
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

import pytest

from servemon.core.errors import ConfigError
from servemon.loadgen.workloads.tracefile import FailedLines, read_trace_file
from servemon.loadgen.workloads.traceinfo import summarize, summarize_file
from servemon.loadgen.workloads.tracetally import tally_trace
from tests.support.publictraces import AZURE_2024

LINES = 200_000
HEADER = "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"


def burstgpt(path: Path, lines: int = LINES) -> Path:
    """A BurstGPT file of ``lines`` requests over about 5.8 hours, in time order,
    every 97th failed (``Response tokens`` 0), bursts every 20,000 lines."""
    with path.open("w", encoding="utf-8") as out:
        out.write(HEADER)
        at = 0.0
        for i in range(lines):
            at += 0.01 if i % 20_000 < 2_000 else 0.11 + (i % 7) * 0.01
            prompt = 10 + (i * 37) % 3000
            answer = 0 if i % 97 == 0 else 1 + (i * 13) % 700
            model = "GPT-4" if i % 3 == 0 else "ChatGPT"
            out.write(f"{at:.3f},{model},{prompt},{answer},{prompt + answer},"
                      "Conversation log\n")  # fmt: skip
    return path


def peak_bytes(call: Callable[[], object]) -> int:
    tracemalloc.start()
    try:
        call()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.fixture(scope="module")
def big(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return burstgpt(tmp_path_factory.mktemp("stream") / "BurstGPT_1.csv")


def test_trace_info_counts_200k_lines_in_memory_far_below_the_file(big: Path) -> None:
    """What it keeps: 60 bins, and a count per distinct length (3,700 here); a
    plan reads through the same tally, its bins the trace's duration over --bin
    (measured by hand: 0.49 MB at the peak here, against 79 MB read whole)."""
    size = big.stat().st_size
    assert size > 8_000_000
    peak = peak_bytes(lambda: summarize_file(big, failed="skip", where=str(big)))
    assert peak < size / 10, f"peak {peak:,} bytes for a file of {size:,}"


@pytest.mark.parametrize(("failed", "lines"), [("skip", LINES), ("keep", 5_000)])
def test_the_stream_gives_the_figures_of_the_whole_file(
    big: Path, tmp_path: Path, failed: FailedLines, lines: int
) -> None:
    if lines != LINES:
        big = burstgpt(tmp_path / "BurstGPT_2.csv", lines)
    whole = read_trace_file(big, failed=failed)
    streamed = asdict(summarize_file(big, failed=failed, where=str(big)))
    expected = asdict(summarize(whole))
    assert streamed.pop("gap_cv") == pytest.approx(expected.pop("gap_cv"), rel=1e-9)
    assert streamed == expected
    assert streamed["requests"] == lines - (0 if failed == "keep" else lines // 97 + 1)
    # A plan's bins and lengths: those of the entries read whole.
    tally, _ = tally_trace(big, bin_s=300.0, failed=failed)
    counts = [0] * (int(whole.entries[-1].at_s // 300) + 1)
    for entry in whole.entries:
        counts[int(entry.at_s // 300)] += 1
    assert tally.counts == counts
    prompts = sorted(e.prompt_tokens for e in whole.entries if e.prompt_tokens)
    assert sorted(tally.prompt.elements()) == prompts


def test_a_file_out_of_time_order_is_sorted_as_the_whole_read_sorts_it(
    tmp_path: Path,
) -> None:
    path = tmp_path / "azure.csv"
    path.write_text(AZURE_2024)  # its lines go back in time
    assert asdict(summarize_file(path, failed="skip", where="t")) == asdict(
        summarize(read_trace_file(path))
    )
    # From 23:59:59.999999 UTC: 1 us, 1.164 ms and 0.500001 s later.
    tally, _ = tally_trace(path, bin_s=0.25)
    assert tally.counts == [3, 0, 1]


def test_a_bad_line_deep_in_a_stream_names_the_file_line_and_field(
    tmp_path: Path,
) -> None:
    path = burstgpt(tmp_path / "BurstGPT_1.csv", lines=5_000)
    lines = path.read_text().splitlines()
    fields = lines[4_000].split(",")
    lines[4_000] = ",".join([*fields[:2], "many", *fields[3:]])
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(ConfigError) as raised:
        tally_trace(path, where=f"--trace: {path}")
    assert str(raised.value) == (
        f"--trace: {path}: line 4001: Request tokens: not a number: 'many'"
    )
