"""Reading a run directory back in tests: its requests as timings."""

from __future__ import annotations

from pathlib import Path

from loadgen.record import read_jsonl, timing_from_line
from loadgen.timing import RequestTiming

__all__ = ["requests_of"]


def requests_of(run_dir: Path, stage: int | None = None) -> list[RequestTiming]:
    """The finished requests ``run_dir/requests.jsonl`` holds (of one ``stage``)."""
    timings = [
        timing_from_line(line) for line in read_jsonl(run_dir / "requests.jsonl")
    ]
    return [t for t in timings if stage is None or t.stage == stage]
