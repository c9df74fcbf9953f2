"""``servemon trace info``: a trace's length, rate over time, burstiness and
length quantiles, from one summary the terminal and JSON render."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from click.testing import CliRunner

from servemon.commands.trace import trace
from servemon.loadgen.workloads.traceentry import TraceEntry, TraceFile
from servemon.loadgen.workloads.traceinfo import Lengths, summarize
from tests.support.publictraces import AZURE_2023, BURSTGPT


def test_a_summary_gives_rate_burstiness_and_length_quantiles() -> None:
    entries = tuple(
        TraceEntry(at_s=t, prompt_tokens=p, output_tokens=o)
        for t, p, o in [(0, 10, 1), (1, 20, 2), (2, 30, 3), (4, 1000, 4)]
    )
    summary = summarize(TraceFile(entries, "csv"))
    assert summary.requests == 4
    assert summary.duration_s == 4
    assert summary.mean_rate == 1.0
    assert summary.bin_s == 1
    assert summary.rates == (1.0, 1.0, 1.0, 0.0, 1.0)
    # Gaps 1, 1, 2: mean 4/3, standard deviation sqrt(2)/3.
    assert summary.gap_cv == pytest.approx(1 / (2 * math.sqrt(2)))
    assert summary.prompt == Lengths(4, 265.0, 20, 1000, 1000, 1000)
    assert summary.output == Lengths(4, 2.5, 2, 4, 4, 4)


def test_a_long_trace_is_binned_in_at_most_60_round_bins() -> None:
    entries = tuple(
        TraceEntry(at_s=float(t), prompt_tokens=1, output_tokens=1)
        for t in range(0, 7 * 86_400, 97)
    )
    summary = summarize(TraceFile(entries, "azure"))
    assert summary.bin_s == 3 * 3600
    assert len(summary.rates) <= 60
    assert summary.gap_cv == pytest.approx(0.0)


def test_trace_info_prints_a_burstgpt_summary_with_its_failed_lines(
    tmp_path: Path,
) -> None:
    path = tmp_path / "BurstGPT_1.csv"
    path.write_text(BURSTGPT)
    done = CliRunner().invoke(trace, ["info", str(path)])
    assert done.exit_code == 0, done.output
    assert f"{path}: BurstGPT CSV" in done.output
    assert "requests      2\n" in done.output
    assert "duration      41.5 s" in done.output
    assert "prompt tokens p50 10, p90 472, p99 472, max 472" in done.output
    assert "failed lines  1 (Response tokens 0), skipped" in done.output
    assert "Model         ChatGPT 2, GPT-4 1" in done.output
    shown = CliRunner().invoke(trace, ["info", str(path), "--json", "--keep-failed"])
    record = json.loads(shown.output)
    assert (record["requests"], record["failed"]) == (3, 1)
    assert record["format"] == "burstgpt"


def test_trace_info_reads_an_azure_trace(tmp_path: Path) -> None:
    path = tmp_path / "AzureLLMInferenceTrace_code.csv"
    path.write_text(AZURE_2023)
    done = CliRunner().invoke(trace, ["info", str(path)])
    assert done.exit_code == 0, done.output
    assert "Azure LLM inference CSV" in done.output
    assert "requests      3" in done.output
    assert "failed lines" not in done.output


def test_trace_info_names_the_file_line_and_field_of_a_bad_line(
    tmp_path: Path,
) -> None:
    path = tmp_path / "AzureLLMInferenceTrace_conv.csv"
    path.write_text(AZURE_2023 + "2023-11-16 18:17,5,1\n")
    done = CliRunner().invoke(trace, ["info", str(path)])
    assert str(done.exception).startswith(
        f"{path}: line 5: TIMESTAMP: not a date and time"
    )
