"""The append-only request record: what is written reads back, whatever the
server sent."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from servemon.loadgen.record.line import LINE, keys, request_line, timing_from_line
from servemon.loadgen.record.record import RunDirectory, read_jsonl
from servemon.loadgen.send.timing import Outcome, RequestTiming

ROOT = Path(__file__).resolve().parents[4]


def timing(**fields: object) -> RequestTiming:
    base: dict[str, object] = {
        "request_id": "r-1",
        "scheduled_s": 10.0,
        "sent_s": 10.001,
        "end_s": 10.5,
        "outcome": Outcome.OK,
        "first_chunk_s": 10.05,
        "content_s": (10.1, 10.2, 10.35),
        "output_tokens": 3,
        "prompt_tokens": 16,
        "finish_reason": "length",
    }
    return RequestTiming(**{**base, **fields})  # type: ignore[arg-type]


def test_a_request_line_reads_back_as_the_standard_library_writes_it(
    tmp_path: Path,
) -> None:
    run = RunDirectory(tmp_path / "run")
    t = timing()
    run.append_request(t)
    run.close()
    (line,) = (tmp_path / "run" / "requests.jsonl").read_text().splitlines()
    assert line == json.dumps(request_line(t), separators=(",", ":"))
    assert timing_from_line(json.loads(line)) == t


def test_text_from_the_server_that_utf8_cannot_hold_is_escaped_not_fatal(
    tmp_path: Path,
) -> None:
    # A server's JSON may carry "\\ud800" (a lone surrogate) in a finish reason or
    # an error text; the record keeps it, escaped.
    run = RunDirectory(tmp_path / "run")
    odd = timing(finish_reason="stop\ud800", error="bad \udfff text")
    run.append_request(odd)
    run.append_request(timing(request_id="r-2"))
    run.close()
    lines = list(read_jsonl(tmp_path / "run" / "requests.jsonl"))
    assert [line["id"] for line in lines] == ["r-1", "r-2"]
    assert lines[0]["finish_reason"] == "stop\ud800"
    assert lines[0]["error"] == "bad \udfff text"


def test_the_line_is_declared_once_and_documented() -> None:
    """The writer writes exactly the declared keys, docs/metrics.md documents
    exactly those, and a reader asking for an undeclared key fails at once."""
    t = timing()
    assert list(request_line(t)) == [key.name for key in LINE]
    docs = (ROOT / "docs" / "metrics.md").read_text(encoding="utf-8")
    table = docs.split("## requests.jsonl", 1)[1].split("\n## ", 1)[0]
    documented = {
        name
        for row in table.splitlines()
        if row.startswith("| `")
        for name in re.findall(r"`(\w+)`", row.split(" | ")[0])
    }
    assert documented == {key.name for key in LINE}, documented ^ {
        key.name for key in LINE
    }
    with pytest.raises(KeyError, match=r"not a requests\.jsonl key: ttft"):
        keys("ttft_s", "ttft")
