"""Ground truth: one JSON line per finished request with server-side monotonic times.

Times are ``time.monotonic()`` seconds (``CLOCK_MONOTONIC``), the clock a load
generator on the same machine reads, so its measurements can be checked against what
really happened. ``first_token_s`` and ``token_s`` are when content was written to the
socket, not when the engine produced it; ``finished_s`` is when the server was done with
the response (after its last write, or when it was aborted), so it bounds ``token_s``.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TextIO

__all__ = ["TraceRecord", "TraceWriter"]


@dataclass(frozen=True, slots=True)
class TraceRecord:
    """One request as the server saw it."""

    request_id: str
    arrival_s: float
    scheduled_s: float | None
    first_token_s: float | None
    token_s: list[float]
    finished_s: float | None
    finish_reason: str | None
    prompt_tokens: int
    cached_tokens: int
    output_tokens: int
    status: int
    #: When the request entered the engine's queue (after the front end).
    queued_s: float | None = None
    #: When the engine produced the first and the last token (before the write).
    engine_first_token_s: float | None = None
    engine_last_token_s: float | None = None


class TraceWriter:
    """Appends records to a JSONL file, one flushed line each."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file: TextIO = path.open("a", encoding="utf-8")

    def write(self, record: TraceRecord) -> None:
        """Append one record."""
        self._file.write(json.dumps(asdict(record), separators=(",", ":")) + "\n")
        self._file.flush()

    def close(self) -> None:
        """Close the file."""
        self._file.close()
