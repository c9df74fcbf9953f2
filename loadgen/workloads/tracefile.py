"""Trace files: yesterday's requests, with their times, lengths and prefix structure.

One reader for the formats a serving engineer has (every line checked; a bad one is a
one-line :class:`ConfigError` naming the file, the line and the field):

- **Mooncake / FAST'25** JSONL: ``{"timestamp": ms, "input_length": N,
  "output_length": M, "hash_ids": [...]}``. ``hash_ids`` name the prompt's blocks of
  :data:`BLOCK_TOKENS` tokens (the last one partial), each id standing for the whole
  prefix up to it: two requests whose ``hash_ids`` start alike share that prefix.
- **Plain** JSONL or CSV (with a header): ``timestamp`` in seconds,
  ``prompt_tokens``, ``output_tokens``, optional ``session_id``, ``model`` (and, in
  JSONL, ``hash_ids`` as above).
- **Prompts** JSONL: ``timestamp`` in seconds with a real ``prompt`` (text) or
  ``messages`` (chat), optional ``output_tokens``, ``session_id``, ``model``.
- **Azure LLM inference** (2023, 2024) and **BurstGPT** CSV as published
  (:mod:`servemon.loadgen.workloads.tracepublic`).

Which a JSONL line is follows from its keys (``input_length``: Mooncake, whose
timestamps are milliseconds); which a CSV is follows from its header. Entries are
returned in time order, times in seconds from the first entry.

A file is read a line at a time (:func:`stream_trace`), never held as text: what
only counts (``servemon trace info``, ``plan --trace``:
:mod:`servemon.loadgen.workloads.tracetally`) keeps no entry, and
:func:`read_trace_file` (a replay sends the entries) keeps the entries alone.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import math
from collections.abc import Iterable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

from servemon.core.errors import ConfigError
from servemon.loadgen.workloads.traceentry import (
    FORMATS,
    FailedLines,
    Reading,
    Stamped,
    TraceEntry,
    TraceFile,
    seconds_after,
)
from servemon.loadgen.workloads.tracepublic import (
    PUBLISHED_HEADERS,
    published_format,
    published_rows,
)

__all__ = [
    "BLOCK_TOKENS",
    "FORMATS",
    "FailedLines",
    "PrefixHits",
    "TraceEntry",
    "TraceFile",
    "parse_trace",
    "parse_trace_file",
    "prefix_hit_ratio",
    "read_trace",
    "read_trace_file",
    "stream_trace",
]

#: Tokens per ``hash_ids`` block in the Mooncake format.
BLOCK_TOKENS = 512
_ROLES = frozenset({"system", "user", "assistant", "tool", "developer"})


def read_trace(path: Path) -> list[TraceEntry]:
    """The entries of a trace file (:func:`read_trace_file`, failed lines skipped)."""
    return list(read_trace_file(path).entries)


def read_trace_file(
    path: Path, *, failed: FailedLines = "skip", where: str | None = None
) -> TraceFile:
    """Read and check a trace file (``.csv``: CSV, else JSONL); ``where`` starts
    every error (``--workload: trace: PATH`` unless given).

    The config check, the plan and the workload each ask for the trace before a
    run starts; the last file parsed is kept with its entries (frozen), so an
    unchanged file is parsed once (its bytes hashed each time, a chunk at a time:
    a file rewritten within the file system's timestamp granularity is still seen
    to change)."""
    where = where or f"--workload: trace: {path}"
    csv_format = path.suffix.lower() == ".csv"
    key = (csv_format, failed, _digest(path, where))
    if _LAST[0] == key:
        found: TraceFile = _LAST[1]
        return found
    trace = _whole(stream_trace(path, failed=failed, where=where), where)
    _LAST[:] = [key, trace]
    return trace


#: The last trace parsed: [(format, failed lines, hash of its bytes), its TraceFile].
_LAST: list[Any] = [None, None]


def stream_trace(
    path: Path, *, failed: FailedLines = "skip", where: str | None = None
) -> Reading:
    """A trace file as it is read, a line at a time (``.csv``: CSV, else JSONL):
    its entries in the file's order with their stamps, nothing kept."""
    where = where or f"--workload: trace: {path}"
    return _reading(
        _file_lines(path, where), where, path.suffix.lower() == ".csv", failed
    )


def _file_lines(path: Path, where: str) -> Iterator[str]:
    try:
        with path.expanduser().open(encoding="utf-8") as lines:
            yield from lines
    except OSError as exc:
        raise ConfigError(f"{where}: cannot read: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{where}: not UTF-8 text") from None


def _digest(path: Path, where: str) -> bytes:
    digest = hashlib.blake2b(digest_size=16)
    try:
        with path.expanduser().open("rb") as raw:
            while chunk := raw.read(1 << 20):
                digest.update(chunk)
    except OSError as exc:
        raise ConfigError(f"{where}: cannot read: {exc.strerror or exc}") from None
    return digest.digest()


def parse_trace(content: str, where: str, *, csv_format: bool) -> list[TraceEntry]:
    """The entries of a trace's text (``where`` prefixes every error)."""
    return list(parse_trace_file(content, where, csv_format=csv_format).entries)


def parse_trace_file(
    content: str, where: str, *, csv_format: bool, failed: FailedLines = "skip"
) -> TraceFile:
    """A trace's text read (``where`` prefixes every error)."""
    return _whole(_reading(io.StringIO(content), where, csv_format, failed), where)


def _whole(reading: Reading, where: str) -> TraceFile:
    """Every entry read, in time order (a stable sort: ties keep the file's
    order), times in seconds from the earliest."""
    rows = sorted(reading.rows, key=lambda row: row[0])
    if not rows:
        raise ConfigError(f"{where}: no requests in the file")
    base = rows[0][0]
    entries = tuple(replace(e, at_s=seconds_after(at, base)) for at, e in rows)
    return reading.found(entries)


def _reading(
    lines: Iterable[str], where: str, csv_format: bool, failed: FailedLines
) -> Reading:
    if not csv_format:
        return Reading("jsonl", _jsonl(lines, where))
    rows = csv.reader(lines)
    try:
        head = next(rows, [])
    except csv.Error as exc:
        raise ConfigError(f"{where}: line {rows.line_num}: {exc}") from None
    published = published_format(head)
    if published is None:
        return Reading("csv", _csv_rows(rows, head, where))
    reading = Reading(
        published, failed_lines=failed if published == "burstgpt" else "skip"
    )
    reading.rows = published_rows(rows, head, reading, where)
    return reading


def _jsonl(lines: Iterable[str], where: str) -> Iterator[Stamped]:
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        at = f"{where}: line {number}"
        try:
            item = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{at}: invalid JSON: {exc.msg}") from None
        except RecursionError:
            raise ConfigError(f"{at}: invalid JSON: nested too deeply") from None
        except ValueError:  # not a JSONDecodeError: past int()'s digit limit
            raise ConfigError(
                f"{at}: invalid JSON: a number with too many digits"
            ) from None
        if not isinstance(item, dict):
            raise ConfigError(f"{at}: expected a JSON object")
        entry = _entry(item, at, number)
        yield entry.at_s, entry


def _csv_rows(rows: Any, head: list[str], where: str) -> Iterator[Stamped]:
    names = [n.strip() for n in head]
    missing = {"timestamp", "prompt_tokens", "output_tokens"} - set(names)
    if missing:
        raise ConfigError(
            f"{where}: line 1: the CSV header needs timestamp, prompt_tokens, "
            f"output_tokens (missing {', '.join(sorted(missing))}), or to be "
            f"{PUBLISHED_HEADERS}"
        )
    try:
        for row in rows:
            if not row:
                continue
            number = rows.line_num
            at = f"{where}: line {number}"
            if len(row) > len(names):
                raise ConfigError(f"{at}: more fields than the header names")
            item: dict[str, Any] = {}
            for key, value in zip(names, row, strict=False):
                text = value.strip()
                if text:
                    item[key] = text
            for key in ("timestamp", "prompt_tokens", "output_tokens"):
                if key in item:
                    item[key] = _csv_number(item[key], key, at)
            entry = _entry(item, at, number)
            yield entry.at_s, entry
    except csv.Error as exc:  # a field over the csv module's limit
        raise ConfigError(f"{where}: line {rows.line_num}: {exc}") from None


def _csv_number(text: str, key: str, at: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise ConfigError(f"{at}: {key}: not a number: {text!r}") from None


def _entry(item: dict[str, Any], at: str, number: int) -> TraceEntry:
    prompt: int | None
    output: int | None
    if "input_length" in item:  # Mooncake: milliseconds
        prompt = _count(item, "input_length", at)
        output = _count(item, "output_length", at)
        at_s = _time(item, at) / 1000.0
        text, messages = None, None
    else:
        at_s = _time(item, at)
        text, messages = _prompt(item, at)
        prompt = None if text or messages else _count(item, "prompt_tokens", at)
        output = (
            _count(item, "output_tokens", at)
            if "output_tokens" in item or prompt is not None
            else None
        )
    hash_ids = _hash_ids(item, prompt, at)
    return TraceEntry(
        at_s=at_s,
        prompt_tokens=prompt,
        output_tokens=output,
        hash_ids=hash_ids,
        session_id=_text(item, "session_id", at),
        model=_text(item, "model", at),
        text=text,
        messages=messages,
        line=number,
    )


def _time(item: dict[str, Any], at: str) -> float:
    value = item.get("timestamp")
    if value is None:
        raise ConfigError(f"{at}: timestamp: missing")
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(f"{at}: timestamp: must be a number, got {value!r}")
    if not math.isfinite(value) or value < 0:
        raise ConfigError(f"{at}: timestamp: must be finite and >= 0, got {value!r}")
    return float(value)


def _count(item: dict[str, Any], key: str, at: str) -> int:
    value = item.get(key)
    if value is None:
        raise ConfigError(f"{at}: {key}: missing")
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{at}: {key}: must be a whole number >= 1, got {value!r}")
    return value


def _text(item: dict[str, Any], key: str, at: str) -> str | None:
    value = item.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise ConfigError(f"{at}: {key}: must be a string, got {value!r}")
    return str(value) or None


def _prompt(
    item: dict[str, Any], at: str
) -> tuple[str | None, tuple[dict[str, str], ...] | None]:
    if "prompt" in item:
        prompt = item["prompt"]
        if not isinstance(prompt, str) or not prompt:
            raise ConfigError(f"{at}: prompt: must be a non-empty string")
        return prompt, None
    if "messages" in item:
        messages = item["messages"]
        if not isinstance(messages, list) or not messages:
            raise ConfigError(f"{at}: messages: must be a non-empty list")
        out = []
        for n, message in enumerate(messages):
            if (
                not isinstance(message, dict)
                or message.get("role") not in _ROLES
                or not isinstance(message.get("content"), str)
            ):
                raise ConfigError(
                    f"{at}: messages[{n}]: needs a role ({', '.join(sorted(_ROLES))})"
                    " and a string content"
                )
            out.append({"role": message["role"], "content": message["content"]})
        return None, tuple(out)
    return None, None


def _hash_ids(item: dict[str, Any], prompt: int | None, at: str) -> tuple[int, ...]:
    value = item.get("hash_ids")
    if value is None:
        return ()
    if not isinstance(value, list) or not all(
        isinstance(x, int) and not isinstance(x, bool) for x in value
    ):
        raise ConfigError(f"{at}: hash_ids: must be a list of integers")
    if prompt is None:
        raise ConfigError(f"{at}: hash_ids: needs a prompt length, not a prompt")
    blocks = math.ceil(prompt / BLOCK_TOKENS)
    if len(value) != blocks:
        raise ConfigError(
            f"{at}: hash_ids: {len(value)} blocks for {prompt} prompt tokens; "
            f"blocks of {BLOCK_TOKENS} tokens make {blocks}"
        )
    return tuple(value)


class PrefixHits:
    """The share of prompt tokens a prefix cache of unbounded size would serve,
    from the ``hash_ids`` of entries added in time order: a request's leading
    blocks whose id an earlier request had (at most all but its last token, as an
    engine always computes one). It keeps every block id seen."""

    __slots__ = ("hit", "seen", "total")

    def __init__(self) -> None:
        self.seen: set[int] = set()
        self.hit = self.total = 0

    def add(self, entry: TraceEntry) -> None:
        if not entry.hash_ids or entry.prompt_tokens is None:
            return
        cached = 0
        for block in entry.hash_ids:
            if block not in self.seen:
                break
            cached += 1
        self.hit += min(cached * BLOCK_TOKENS, entry.prompt_tokens - 1)
        self.total += entry.prompt_tokens
        self.seen.update(entry.hash_ids)

    @property
    def ratio(self) -> float | None:
        """None when no entry had ``hash_ids``."""
        return self.hit / self.total if self.total else None


def prefix_hit_ratio(entries: list[TraceEntry]) -> float | None:
    """:class:`PrefixHits` over ``entries`` (in time order); None when the trace
    has no ``hash_ids``."""
    hits = PrefixHits()
    for entry in entries:
        hits.add(entry)
    return hits.ratio
