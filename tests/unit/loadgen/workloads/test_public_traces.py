"""The public production traces read as published: Azure's LLM inference CSVs of
2023 and 2024 and BurstGPT's, recognised by their headers, every bad line named,
BurstGPT's failed lines skipped and counted (or kept)."""

from __future__ import annotations

from pathlib import Path

import pytest

from servemon.core.errors import ConfigError
from servemon.loadgen.record.sections import TraceSource
from servemon.loadgen.run.workloadrecord import trace_record
from servemon.loadgen.workloads.traceentry import TraceFile
from servemon.loadgen.workloads.tracefile import parse_trace_file, read_trace_file
from servemon.loadgen.workloads.traceprompts import TraceWorkload
from servemon.loadgen.workloads.workload import build_workload, parse_workload
from tests.support.publictraces import AZURE_2023, AZURE_2024, BURSTGPT


def read(content: str, **kwargs: object) -> TraceFile:
    return parse_trace_file(content, "t.csv", csv_format=True, **kwargs)  # type: ignore[arg-type]


def error(content: str) -> str:
    with pytest.raises(ConfigError) as info:
        read(content)
    message = str(info.value)
    assert "\n" not in message
    return message


def test_azure_2023_reads_its_seven_digit_times_to_exact_offsets() -> None:
    found = read(AZURE_2023)
    assert found.format == "azure"
    assert found.failed == 0
    assert [
        (e.at_s, e.prompt_tokens, e.output_tokens, e.line) for e in found.entries
    ] == [
        (0.0, 4808, 10, 2),
        (0.052, 3180, 8, 3),
        (0.098189, 110, 27, 4),
    ]
    assert all(e.model is None and not e.hash_ids for e in found.entries)


def test_azure_2024_reads_its_offsets_and_whole_seconds_in_time_order() -> None:
    found = read(AZURE_2024)
    assert [(e.at_s, e.prompt_tokens, e.line) for e in found.entries] == [
        (0.0, 862, 4),  # 23:59:59.999999, the day before
        (1e-06, 584, 3),
        (0.001164, 1452, 2),
        (0.500001, 7, 5),  # 01:00:00.5 at +01:00 is 00:00:00.5 UTC
    ]


def test_burstgpt_skips_its_failed_lines_and_counts_them() -> None:
    found = read(BURSTGPT)
    assert found.format == "burstgpt"
    assert [
        (e.at_s, e.prompt_tokens, e.output_tokens, e.line) for e in found.entries
    ] == [
        (0.0, 472, 18, 2),
        (41.5, 10, 3, 4),
    ]
    assert (found.failed, found.failed_lines) == (1, "skip")
    # Its models are the trace's (ChatGPT, GPT-4), not the target's: counted only.
    assert all(e.model is None for e in found.entries)
    assert dict(found.labels) == {
        "Model": (("ChatGPT", 2), ("GPT-4", 1)),
        "Log Type": (("Conversation log", 2), ("API log", 1)),
    }


def test_burstgpt_keeps_its_failed_lines_on_request_without_an_output() -> None:
    found = read(BURSTGPT, failed="keep")
    assert [(e.at_s, e.output_tokens) for e in found.entries] == [
        (0.0, 18),
        (40.0, None),
        (41.5, 3),
    ]
    assert (found.failed, found.failed_lines) == (1, "keep")


def test_burstgpt_columns_are_found_by_name() -> None:
    found = read(
        "Timestamp,Session ID,Elapsed time,Model,Request tokens,Response tokens,"
        "Total tokens,Log Type\n"
        "0,s1,2.5,GPT-4,30,4,34,API log\n"
    )
    assert [(e.prompt_tokens, e.output_tokens) for e in found.entries] == [(30, 4)]


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (
            AZURE_2023 + "2023-11-16 18:17,5,1\n",
            "t.csv: line 5: TIMESTAMP: not a date and time "
            "(YYYY-MM-DD HH:MM:SS[.fraction][+HH:MM]): '2023-11-16 18:17'",
        ),
        (
            AZURE_2023 + "2023-13-16 18:17:05.1,5,1\n",
            "t.csv: line 5: TIMESTAMP: not a date and time: '2023-13-16 18:17:05.1'",
        ),
        (
            AZURE_2023 + "2023-11-16 18:61:05.1,5,1\n",
            "line 5: TIMESTAMP: not a date and time",
        ),
        (
            AZURE_2023 + "2023-11-16 18:17:05.1,0,1\n",
            "t.csv: line 5: ContextTokens: must be a whole number >= 1, got '0'",
        ),
        (
            AZURE_2023 + "2023-11-16 18:17:05.1,5,many\n",
            "t.csv: line 5: GeneratedTokens: not a number: 'many'",
        ),
        (
            AZURE_2023 + "2023-11-16 18:17:05.1,5\n",
            "line 5: 2 fields, the header names 3",
        ),
        (
            BURSTGPT + "soon,ChatGPT,1,1,2,API log\n",
            "t.csv: line 5: Timestamp: not a number: 'soon'",
        ),
        (
            BURSTGPT + "-3,ChatGPT,1,1,2,API log\n",
            "line 5: Timestamp: must be finite and >= 0, got '-3'",
        ),
        (
            BURSTGPT + "50,ChatGPT,1,-1,0,API log\n",
            "t.csv: line 5: Response tokens: must be a whole number >= 0, got '-1'",
        ),
        (
            BURSTGPT + "50,ChatGPT,1.5,1,2,API log\n",
            "line 5: Request tokens: must be a whole number >= 1, got '1.5'",
        ),
        ("TIMESTAMP,ContextTokens,GeneratedTokens\n", "t.csv: no requests in the file"),
    ],
)
def test_a_bad_line_of_a_published_trace_names_file_line_and_field(
    content: str, expected: str
) -> None:
    assert expected in error(content)


def test_an_unknown_csv_header_names_the_headers_it_could_have() -> None:
    message = error("TIMESTAMP,Context,Generated\n2023-11-16 18:17:03.9,1,1\n")
    assert "line 1: the CSV header needs timestamp, prompt_tokens" in message
    assert "Azure's TIMESTAMP,ContextTokens,GeneratedTokens" in message
    assert "BurstGPT's Timestamp,Model,Request tokens,Response tokens" in message


def test_a_file_is_read_with_the_failed_lines_policy_it_is_asked_for(
    tmp_path: Path,
) -> None:
    path = tmp_path / "BurstGPT_1.csv"
    path.write_text(BURSTGPT)
    assert len(read_trace_file(path).entries) == 2
    assert len(read_trace_file(path, failed="keep").entries) == 3
    assert len(read_trace_file(path).entries) == 2


@pytest.mark.asyncio
async def test_the_workload_sends_kept_failed_lines_and_records_them(
    tmp_path: Path,
) -> None:
    path = tmp_path / "BurstGPT_1.csv"
    path.write_text(BURSTGPT)

    class Words:
        source = "fake"

        async def count(self, text: str) -> int:
            return len(text.split())

    skipped = await build_workload(
        parse_workload(f"trace:{path}"), counter=Words(), seed=1
    )
    assert isinstance(skipped, TraceWorkload)
    assert trace_record(skipped).source == TraceSource("burstgpt", 1, "skip")
    assert "1 failed lines (Response tokens 0) skipped, of 3" in str(skipped.said())
    kept = await build_workload(
        parse_workload(f"trace:{path},failed=keep,output=7:9"), counter=Words(), seed=1
    )
    assert isinstance(kept, TraceWorkload)
    assert trace_record(kept).source == TraceSource("burstgpt", 1, "keep")
    assert [kept.prompt(i).prompt_tokens for i in range(3)] == [472, 1087, 10]
    default = await build_workload(
        parse_workload(f"trace:{path},failed=keep"), counter=Words(), seed=1
    )
    assert default.prompt(1).max_tokens == 128  # no output of its own: the default
    with pytest.raises(ConfigError, match="failed must be skip or keep, got 'maybe'"):
        parse_workload(f"trace:{path},failed=maybe")
