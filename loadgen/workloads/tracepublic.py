"""The public production traces as published, read from their CSV as it is
downloaded (:mod:`servemon.loadgen.workloads.tracefile` picks them by their header):

- **Azure LLM inference** CSV, 2023 and 2024 (Azure/AzurePublicDataset): header
  ``TIMESTAMP,ContextTokens,GeneratedTokens``, ``TIMESTAMP`` a date and time (2023:
  ``2023-11-16 18:17:03.9799600``, seven fractional digits, no zone; 2024:
  ``2024-05-12 00:00:00.001163+00:00``, six digits or none, with its offset). Times
  are kept to the nanosecond as integers and offsets taken from the earliest line,
  so they are exact (a float of seconds since 1970 keeps only about 0.2 µs).
- **BurstGPT** CSV (HPMLL/BurstGPT): header ``Timestamp,Model,Request tokens,
  Response tokens,Total tokens,Log Type`` (columns found by name, so a release with
  more columns reads too), ``Timestamp`` in seconds. A line whose ``Response
  tokens`` is 0 is a failed request in that trace: skipped and counted by default,
  or kept (:data:`~servemon.loadgen.workloads.traceentry.FailedLines`) with no output
  budget of its own. Its ``Model`` (ChatGPT, GPT-4) is not a model a target serves, so
  it is counted (``TraceFile.labels``), not asked for.

Every line is checked; a bad one is a one-line :class:`ConfigError` naming the
file, the line and the field. Lines are read one at a time (:func:`published_rows`
is a generator over a csv reader): a week of Azure's 2024 trace or of BurstGPT
(10-17 GB) is never held as text.
"""

from __future__ import annotations

import csv
import math
import re
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

from servemon.core.errors import ConfigError
from servemon.loadgen.workloads.traceentry import Reading, Stamped, TraceEntry

__all__ = ["PUBLISHED_HEADERS", "published_format", "published_rows"]

#: The header columns that name a published trace's CSV.
_AZURE = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
_BURSTGPT = ("Timestamp", "Request tokens", "Response tokens")
_BURSTGPT_LABELS = ("Model", "Log Type")
#: The headers as published, for messages.
PUBLISHED_HEADERS = (
    "Azure's TIMESTAMP,ContextTokens,GeneratedTokens or BurstGPT's "
    "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type"
)


def published_format(header: list[str]) -> str | None:
    """``azure`` or ``burstgpt`` for a published trace's CSV header, else None."""
    names = {name.strip() for name in header}
    if set(_AZURE) <= names:
        return "azure"
    if set(_BURSTGPT) <= names:
        return "burstgpt"
    return None


def published_rows(
    rows: Any, header: list[str], reading: Reading, where: str
) -> Iterator[Stamped]:
    """The entries of a published trace's CSV (``rows``: a csv reader past its
    ``header``; ``reading.format`` as :func:`published_format` named it), in the
    file's order, each with its stamp: Azure's in integer nanoseconds since 1970
    (exact), BurstGPT's in seconds. Failed lines and labels are counted into
    ``reading`` as they are read."""
    header = [n.strip() for n in header]
    try:
        if reading.format == "azure":
            yield from _azure(rows, header, where)
        else:
            yield from _burstgpt(rows, header, reading, where)
    except csv.Error as exc:  # a field over the csv module's limit
        raise ConfigError(f"{where}: line {rows.line_num}: {exc}") from None


def _fields(row: list[str], header: list[str], at: str) -> None:
    if len(row) != len(header):
        raise ConfigError(f"{at}: {len(row)} fields, the header names {len(header)}")


def _azure(rows: Any, header: list[str], where: str) -> Iterator[Stamped]:
    stamp, prompt, output = (header.index(name) for name in _AZURE)
    for row in rows:
        if not row:
            continue
        number = rows.line_num
        at = f"{where}: line {number}"
        _fields(row, header, at)
        # The entry's time is set from the stamp by the reader: offsets from the
        # earliest line, in integer nanoseconds, then seconds.
        yield (
            _datetime_ns(row[stamp].strip(), at),
            TraceEntry(
                at_s=0.0,
                prompt_tokens=_whole(row[prompt], "ContextTokens", at),
                output_tokens=_whole(row[output], "GeneratedTokens", at),
                line=number,
            ),
        )


def _burstgpt(
    rows: Any, header: list[str], reading: Reading, where: str
) -> Iterator[Stamped]:
    col = {n: header.index(n) for n in _BURSTGPT + _BURSTGPT_LABELS if n in header}
    stamp, prompt, output = (col[name] for name in _BURSTGPT)
    labels = {name: Counter[str]() for name in _BURSTGPT_LABELS if name in col}
    reading.labels = labels
    keep = reading.failed_lines == "keep"
    for row in rows:
        if not row:
            continue
        number = rows.line_num
        at = f"{where}: line {number}"
        _fields(row, header, at)
        at_s = _number(row[stamp].strip(), "Timestamp", at)
        if not math.isfinite(at_s) or at_s < 0:
            raise ConfigError(
                f"{at}: Timestamp: must be finite and >= 0, got {row[stamp]!r}"
            )
        answer = _whole(row[output], "Response tokens", at, minimum=0)
        for name, counts in labels.items():
            counts[row[col[name]].strip()] += 1
        if answer == 0:  # the trace's mark of a failed request
            reading.failed += 1
            if not keep:
                _whole(row[prompt], "Request tokens", at, minimum=0)
                continue
        length = _whole(row[prompt], "Request tokens", at)
        yield (
            at_s,
            TraceEntry(
                at_s=at_s,
                prompt_tokens=length,
                output_tokens=answer or None,
                line=number,
            ),
        )


def _whole(text: str, key: str, at: str, *, minimum: int = 1) -> int:
    """A published trace's count: a whole number of at least ``minimum``."""
    try:
        value = int(text)
    except ValueError:
        number = _number(text.strip(), key, at)
        value = int(number) if number.is_integer() else -1
    if value < minimum:
        raise ConfigError(
            f"{at}: {key}: must be a whole number >= {minimum}, got {text.strip()!r}"
        )
    return value


#: ``YYYY-MM-DD HH:MM:SS[.fraction][Z|+HH:MM]`` (a ``T`` for the space too).
_DATETIME = re.compile(
    r"(\d{4}-\d{2}-\d{2})[ T](\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,9}))?"
    r"(Z|[+-]\d{2}:?\d{2})?"
)
#: Seconds since 1970 of a date, hour and zone seen (the memo of the hot path:
#: a trace's lines share them for an hour at a time).
_HOURS: dict[tuple[str, str, str], int] = {}


def _datetime_ns(text: str, at: str) -> int:
    """Nanoseconds since 1970 (UTC) of an Azure trace's ``TIMESTAMP``; a time
    without a zone is taken as UTC (offsets between lines are what count)."""
    match = _DATETIME.fullmatch(text)
    if match is None:
        raise ConfigError(
            f"{at}: TIMESTAMP: not a date and time "
            f"(YYYY-MM-DD HH:MM:SS[.fraction][+HH:MM]): {text!r}"
        )
    day, hour, minute, second, fraction, zone = match.groups()
    key = (day, hour, zone or "")
    base = _HOURS.get(key)
    if base is None:
        try:
            moment = datetime.fromisoformat(f"{day}T{hour}:00:00{_zone(zone)}")
        except ValueError:
            raise ConfigError(
                f"{at}: TIMESTAMP: not a date and time: {text!r}"
            ) from None
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=UTC)
        base = int(moment.timestamp())
        if len(_HOURS) > 4096:
            _HOURS.clear()
        _HOURS[key] = base
    if int(minute) > 59 or int(second) > 59:
        raise ConfigError(f"{at}: TIMESTAMP: not a date and time: {text!r}")
    ns = (base + int(minute) * 60 + int(second)) * 1_000_000_000
    if fraction:
        ns += int(fraction.ljust(9, "0"))
    return ns


def _zone(zone: str | None) -> str:
    if not zone or zone == "Z":
        return "+00:00" if zone else ""
    return zone if ":" in zone else f"{zone[:3]}:{zone[3:]}"


def _number(text: str, key: str, at: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise ConfigError(f"{at}: {key}: not a number: {text!r}") from None
