"""A trace's requests, as every trace format is read into them
(:mod:`servemon.loadgen.workloads.tracefile`): each entry, a file read whole, and a
file being read line by line."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Literal

__all__ = [
    "FORMATS",
    "FailedLines",
    "Reading",
    "Stamp",
    "Stamped",
    "TraceEntry",
    "TraceFile",
    "seconds_after",
]

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


#: When a line's request came as the file says it: seconds (a float), or for
#: Azure's date-times nanoseconds since 1970 (an int, exact).
Stamp = float | int
Stamped = tuple[Stamp, TraceEntry]


def seconds_after(stamp: Stamp, base: Stamp) -> float:
    """Seconds from ``base`` to ``stamp`` (nanoseconds subtracted as integers)."""
    if isinstance(stamp, int) and isinstance(base, int):
        return (stamp - base) / 1e9
    return stamp - base


@dataclass(slots=True)
class Reading:
    """A trace file as it is read, a line at a time: its format, its entries in
    the file's order each with its :data:`Stamp` (an entry's ``at_s`` is set from
    the stamps by whoever reads them), and what reading has found so far (failed
    lines and labels: complete once ``rows`` is exhausted)."""

    format: str
    rows: Iterator[Stamped] = field(default_factory=lambda: iter(()))
    failed_lines: FailedLines = "skip"
    failed: int = 0
    labels: dict[str, Counter[str]] = field(default_factory=dict)

    def close(self) -> None:
        """Stop reading (closes the file)."""
        close = getattr(self.rows, "close", None)
        if close is not None:
            close()

    def found(self, entries: tuple[TraceEntry, ...] = ()) -> TraceFile:
        """What was read, as a :class:`TraceFile` with ``entries``."""
        return TraceFile(
            entries,
            self.format,
            failed=self.failed,
            failed_lines=self.failed_lines,
            labels=tuple(
                (name, tuple(counts.most_common()))
                for name, counts in self.labels.items()
            ),
        )
