"""Traces: reading every format (a bad line named), the prefix structure their
prompts keep, the synthetic generator, and when a replay sends each request."""

from __future__ import annotations

import itertools
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from servemon.core.errors import ConfigError
from servemon.loadgen.run.flat import config_of
from servemon.loadgen.run.plan import make_plan
from servemon.loadgen.workloads.replayplan import replay_plan
from servemon.loadgen.workloads.tokens import EstimateCounter
from servemon.loadgen.workloads.tracefile import (
    BLOCK_TOKENS,
    TraceEntry,
    parse_trace,
    prefix_hit_ratio,
    read_trace,
)
from servemon.loadgen.workloads.tracesynth import SynthSpec, synthesize
from servemon.loadgen.workloads.workload import build_workload, parse_workload


class WordCounter:
    """One token a word (the simulator's tokenizer on plain words)."""

    source = "fake"

    async def count(self, text: str) -> int:
        return len(text.split())


def mooncake(*lines: Mapping[str, object]) -> str:
    return "\n".join(json.dumps(x) for x in lines) + "\n"


def error(content: str, *, csv_format: bool = False) -> str:
    with pytest.raises(ConfigError) as info:
        parse_trace(content, "t.jsonl", csv_format=csv_format)
    message = str(info.value)
    assert "\n" not in message
    return message


def test_mooncake_lines_read_in_time_order_from_the_first_request() -> None:
    text = mooncake(
        {
            "timestamp": 5000,
            "input_length": 600,
            "output_length": 9,
            "hash_ids": [1, 2],
        },
        {"timestamp": 2000, "input_length": 512, "output_length": 3, "hash_ids": [1]},
    )
    late, early = parse_trace(text, "t", csv_format=False)[::-1]
    assert (early.at_s, early.prompt_tokens, early.hash_ids) == (0.0, 512, (1,))
    assert (late.at_s, late.output_tokens, late.line) == (3.0, 9, 1)


def test_plain_csv_and_timed_prompts_read() -> None:
    rows = parse_trace(
        "timestamp,prompt_tokens,output_tokens,session_id,model\n"
        "0.5,100,20,a,qwen\n2.25,50,10,,\n",
        "t.csv",
        csv_format=True,
    )
    assert [(r.at_s, r.prompt_tokens, r.session_id, r.model) for r in rows] == [
        (0.0, 100, "a", "qwen"),
        (1.75, 50, None, None),
    ]
    (chat,) = parse_trace(
        json.dumps(
            {
                "timestamp": 3,
                "messages": [{"role": "user", "content": "hi"}],
                "output_tokens": 4,
            }
        ),
        "t",
        csv_format=False,
    )
    assert chat.messages == ({"role": "user", "content": "hi"},)
    assert chat.prompt_tokens is None
    assert chat.output_tokens == 4


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (
            '{"timestamp": 1}\n{"timestamp": 2, "prompt_tokens": 3}',
            "t.jsonl: line 1: prompt_tokens: missing",
        ),
        (
            '{"timestamp": -1, "input_length": 3, "output_length": 1}',
            "line 1: timestamp: must be finite and >= 0",
        ),
        ('\n\n{"input_length": 3, "output_length": 1}', "line 3: timestamp: missing"),
        (
            '{"timestamp": 0, "input_length": 0, "output_length": 1}',
            "input_length: must be a whole number >= 1",
        ),
        (
            '{"timestamp": 0, "input_length": 1025, "output_length": 1, '
            '"hash_ids": [1, 2]}',
            "hash_ids: 2 blocks for 1025 prompt tokens",
        ),
        (
            '{"timestamp": 0, "input_length": 5, "output_length": 1, '
            '"hash_ids": ["a"]}',
            "hash_ids: must be a list of integers",
        ),
        ("[1, 2]", "line 1: expected a JSON object"),
        ('{"timestamp": 0, "prompt_tokens": 5', "line 1: invalid JSON"),
        (
            '{"timestamp": 0, "messages": [{"role": "robot", "content": "x"}]}',
            "messages[0]: needs a role",
        ),
        ("", "no requests in the file"),
    ],
)
def test_a_bad_line_is_one_line_naming_it(content: str, expected: str) -> None:
    assert expected in error(content)


def test_a_bad_csv_is_named_by_line() -> None:
    assert "line 1: the CSV header needs" in error("time,x\n1,2\n", csv_format=True)
    bad = "timestamp,prompt_tokens,output_tokens\n0,5,1\nsoon,5,1\n"
    assert "line 3: timestamp: not a number: 'soon'" in error(bad, csv_format=True)


def test_the_hit_ratio_of_hash_ids_counts_leading_blocks_seen_before() -> None:
    entries = parse_trace(
        mooncake(
            {
                "timestamp": 0,
                "input_length": 1024,
                "output_length": 1,
                "hash_ids": [1, 2],
            },
            {
                "timestamp": 1,
                "input_length": 1000,
                "output_length": 1,
                "hash_ids": [1, 3],
            },  # shares block 1
            {
                "timestamp": 2,
                "input_length": 1024,
                "output_length": 1,
                "hash_ids": [4, 2],
            },  # 2 after a new block is no prefix hit
            {
                "timestamp": 3,
                "input_length": 1024,
                "output_length": 1,
                "hash_ids": [1, 2],
            },  # all but its last token
        ),
        "t",
        csv_format=False,
    )
    hits = BLOCK_TOKENS + 0 + 1023
    assert prefix_hit_ratio(entries) == pytest.approx(hits / (1024 + 1000 + 2048))


def test_the_synthetic_trace_is_seeded_valid_and_shares_prefixes(
    tmp_path: Path,
) -> None:
    spec = SynthSpec(
        duration_s=300,
        rate=1.0,
        seed=3,
        turns=4,
        think_s=10,
        diurnal=0.5,
        period_s=300,
        bursts_per_hour=20,
    )
    lines = list(synthesize(spec))
    assert lines == list(synthesize(spec))
    assert lines != list(synthesize(SynthSpec(duration_s=300, rate=1.0, seed=4)))
    path = tmp_path / "synth.jsonl"
    path.write_text("\n".join(json.dumps(x) for x in lines))
    entries = read_trace(path)  # every line passes the reader's checks
    assert [e.at_s for e in entries] == sorted(e.at_s for e in entries)
    by_session: dict[str, list[TraceEntry]] = {}
    for e in entries:
        assert e.session_id is not None
        by_session.setdefault(e.session_id, []).append(e)
    multi = [s for s in by_session.values() if len(s) > 1]
    assert multi
    for turns in multi:
        for before, after in itertools.pairwise(turns):
            assert before.prompt_tokens is not None
            assert after.prompt_tokens is not None
            full = before.prompt_tokens // BLOCK_TOKENS
            assert after.hash_ids[:full] == before.hash_ids[:full]
            assert after.prompt_tokens > before.prompt_tokens
    ratio = prefix_hit_ratio(entries)
    assert ratio is not None
    assert 0.2 < ratio < 1
    with pytest.raises(ValueError, match="rate"):
        SynthSpec(rate=0)


def test_replay_times_are_scaled_windowed_and_looped() -> None:
    entries = parse_trace(
        mooncake(
            *(
                {"timestamp": t * 1000, "input_length": 8, "output_length": 1}
                for t in (0, 1, 2, 4, 8)
            )
        ),
        "t",
        csv_format=False,
    )
    plan = replay_plan(entries, time_scale=2.0, rate_scale=4.0)
    assert [o for _, o in plan.sends] == [0.0, 0.5, 1.0, 2.0, 4.0]
    window = replay_plan(entries, start_s=1, end_s=5, loops=2)
    assert window.sends == ((1, 0.0), (2, 1.0), (3, 3.0), (6, 4.0), (7, 5.0), (8, 7.0))
    assert window.duration_s == 8.0
    assert window.rate == 6 / 8
    with pytest.raises(ConfigError, match="no request of the trace in"):
        replay_plan(entries, start_s=9)


@pytest.mark.asyncio
async def test_trace_prompts_keep_the_prefix_structure_token_for_token(
    tmp_path: Path,
) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text(
        mooncake(
            {
                "timestamp": 0,
                "input_length": 1100,
                "output_length": 7,
                "hash_ids": [10, 11, 12],
            },
            {
                "timestamp": 1,
                "input_length": 700,
                "output_length": 5,
                "hash_ids": [10, 13],
            },
            {"timestamp": 2, "input_length": 40, "output_length": 5},
        )
    )
    spec = f"trace:{path}"
    assert parse_workload(spec).trace_path == path
    workload = await build_workload(parse_workload(spec), counter=WordCounter(), seed=1)
    a, b, c = (workload.prompt(i) for i in range(3))
    words = [(p.text or "").split() for p in (a, b, c)]
    assert [len(w) for w in words] == [1100, 700, 40]
    assert [p.prompt_tokens for p in (a, b, c)] == [1100, 700, 40]
    assert [p.max_tokens for p in (a, b, c)] == [7, 5, 5]
    assert words[0][:BLOCK_TOKENS] == words[1][:BLOCK_TOKENS]  # block 10 shared
    assert words[0][BLOCK_TOKENS:700] != words[1][BLOCK_TOKENS:700]
    again = await build_workload(parse_workload(spec), counter=WordCounter(), seed=1)
    assert again.prompt(0) == a
    # A second loop keeps the structure with new text.
    loop2 = (workload.prompt(3).text or "").split()
    assert len(loop2) == 1100
    assert loop2[:BLOCK_TOKENS] != words[0][:BLOCK_TOKENS]
    assert (
        loop2[:BLOCK_TOKENS] == (workload.prompt(4).text or "").split()[:BLOCK_TOKENS]
    )
    # Under the estimate the lengths are as close as it allows.
    rough = await build_workload(
        parse_workload(spec), counter=EstimateCounter(), seed=1
    )
    assert rough.prompt(0).prompt_tokens == pytest.approx(1100, rel=0.1)


def test_an_unchanged_trace_is_parsed_once_and_a_changed_one_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import servemon.loadgen.workloads.tracefile as tracefile

    parsed: list[Path] = []
    real = tracefile.stream_trace

    def counting(path: Path, **kwargs: Any) -> Any:
        parsed.append(path)
        return real(path, **kwargs)

    monkeypatch.setattr(tracefile, "stream_trace", counting)
    path = tmp_path / "t.csv"
    path.write_text("timestamp,prompt_tokens,output_tokens\n0,10,2\n1,20,3\n")
    first = tracefile.read_trace(path)
    assert tracefile.read_trace(path) == first
    assert len(parsed) == 1
    # The same size, rewritten at once (the same timestamp, often): parsed again.
    path.write_text("timestamp,prompt_tokens,output_tokens\n0,10,2\n1,30,3\n")
    assert [e.prompt_tokens for e in tracefile.read_trace(path)] == [10, 30]
    assert len(parsed) == 2


@pytest.mark.asyncio
async def test_a_replay_reads_its_trace_file_once(tmp_path: Path) -> None:
    """Planned (every line checked, the sends made) and built from one read: the
    file can be gone by the time the prompts are built and the driver runs."""
    path = tmp_path / "t.jsonl"
    rows = [
        {"timestamp": 500 * i, "input_length": 64, "output_length": 4} for i in range(6)
    ]
    path.write_text(mooncake(*rows))
    flags = {"workload": f"trace:{path}", "time_scale": 0.5}
    config = config_of("replay", ("flags", flags))
    plan = make_plan("replay", config)
    assert plan.replay is not None
    assert [at for _, at in plan.replay.sends] == [0.0, 0.25, 0.5, 0.75, 1.0, 1.25]
    path.unlink()
    workload = await build_workload(config.workload, counter=WordCounter(), seed=1)
    assert workload.prompt(5).prompt_tokens == 64
