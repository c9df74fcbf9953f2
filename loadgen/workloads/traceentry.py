"""A trace's requests, as every trace format is read into them
(:mod:`servemon.loadgen.workloads.tracefile`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = ["FORMATS", "FailedLines", "TraceEntry", "TraceFile"]

#: What to do with a trace's failed lines (BurstGPT: ``Response tokens`` 0).
FailedLines = Literal["skip", "keep"]
#: The formats a trace file can be in, by name, as a summary names them.
FORMATS = {
    "jsonl": "JSONL",
    "csv": "CSV",
    "azure": "Azure LLM inference CSV",
    "burstgpt": "BurstGPT CSV",
}


@dataclass(frozen=True, slots=True)
class TraceEntry:
    """One request of a trace."""

    #: Seconds after the trace's first request.
    at_s: float
    #: Prompt tokens the trace says (None for a real prompt: counted when built).
    prompt_tokens: int | None
    output_tokens: int | None
    hash_ids: tuple[int, ...] = ()
    session_id: str | None = None
    model: str | None = None
    text: str | None = None
    messages: tuple[dict[str, str], ...] | None = None
    #: The file's line, for messages.
    line: int = 0


@dataclass(frozen=True, slots=True)
class TraceFile:
    """A trace file read: its entries, in time order, and what reading found."""

    entries: tuple[TraceEntry, ...]
    #: A key of :data:`FORMATS`.
    format: str
    #: Lines the trace marks failed (BurstGPT: ``Response tokens`` 0), kept or not.
    failed: int = 0
    failed_lines: FailedLines = "skip"
    #: How often each value of a label column appears (BurstGPT: ``Model``,
    #: ``Log Type``), failed lines included: ((column, ((value, lines), ...)), ...).
    labels: tuple[tuple[str, tuple[tuple[str, int], ...]], ...] = ()
