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
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import math
from dataclasses import replace
from pathlib import Path
from typing import Any

from servemon.core.errors import ConfigError
from servemon.loadgen.workloads.promptfile import read_text
from servemon.loadgen.workloads.traceentry import (
    FORMATS,
    FailedLines,
    TraceEntry,
    TraceFile,
)
from servemon.loadgen.workloads.tracepublic import (
    PUBLISHED_HEADERS,
    published_format,
    read_published,
)

__all__ = [
    "BLOCK_TOKENS",
    "FORMATS",
    "FailedLines",
    "TraceEntry",
    "TraceFile",
    "parse_trace",
    "parse_trace_file",
    "prefix_hit_ratio",
    "read_trace",
    "read_trace_file",
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
    run starts; the last text parsed is kept with its entries (frozen), so an
    unchanged file is parsed once (read and hashed each time: a file rewritten
    within the file system's timestamp granularity is still seen to change)."""
    where = where or f"--workload: trace: {path}"
    content = read_text(path, where)
    csv_format = path.suffix.lower() == ".csv"
    digest = hashlib.blake2b(content.encode(), digest_size=16).digest()
    key = (csv_format, failed, digest)
    if _LAST[0] == key:
        found: TraceFile = _LAST[1]
        return found
    trace = parse_trace_file(content, where, csv_format=csv_format, failed=failed)
    _LAST[:] = [key, trace]
    return trace


#: The last trace parsed: [(format, failed lines, hash of its text), its TraceFile].
_LAST: list[Any] = [None, None]


def parse_trace(content: str, where: str, *, csv_format: bool) -> list[TraceEntry]:
    """The entries of a trace's text (``where`` prefixes every error)."""
    return list(parse_trace_file(content, where, csv_format=csv_format).entries)


def parse_trace_file(
    content: str, where: str, *, csv_format: bool, failed: FailedLines = "skip"
) -> TraceFile:
    """A trace's text read (``where`` prefixes every error)."""
    trace = (
        _csv(content, where, failed)
        if csv_format
        else TraceFile(tuple(_jsonl(content, where)), "jsonl")
    )
    if not trace.entries:
        raise ConfigError(f"{where}: no requests in the file")
    found = sorted(trace.entries, key=lambda e: e.at_s)  # stable: ties keep order
    first = found[0].at_s
    if first:
        found = [replace(e, at_s=e.at_s - first) for e in found]
    return replace(trace, entries=tuple(found))


def _jsonl(content: str, where: str) -> list[TraceEntry]:
    out = []
    for number, line in enumerate(content.split("\n"), 1):
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
        out.append(_entry(item, at, number))
    return out


def _csv(content: str, where: str, failed: FailedLines) -> TraceFile:
    head = next(csv.reader(io.StringIO(content.partition("\n")[0])), [])
    published = published_format(head)
    if published is not None:
        return read_published(content, published, where, failed)
    reader = csv.DictReader(io.StringIO(content))
    try:
        return TraceFile(tuple(_csv_rows(reader, where)), "csv")
    except csv.Error as exc:  # a field over the csv module's limit
        raise ConfigError(f"{where}: line {reader.line_num}: {exc}") from None


def _csv_rows(reader: csv.DictReader[str], where: str) -> list[TraceEntry]:
    names = [n.strip() for n in reader.fieldnames or ()]
    missing = {"timestamp", "prompt_tokens", "output_tokens"} - set(names)
    if missing:
        raise ConfigError(
            f"{where}: line 1: the CSV header needs timestamp, prompt_tokens, "
            f"output_tokens (missing {', '.join(sorted(missing))}), or to be "
            f"{PUBLISHED_HEADERS}"
        )
    out = []
    for row in reader:
        number = reader.line_num
        at = f"{where}: line {number}"
        item: dict[str, Any] = {}
        for key, value in row.items():
            if key is None:
                raise ConfigError(f"{at}: more fields than the header names")
            text = (value or "").strip()
            if text:
                item[key.strip()] = text
        for key in ("timestamp", "prompt_tokens", "output_tokens"):
            if key in item:
                item[key] = _csv_number(item[key], key, at)
        out.append(_entry(item, at, number))
    return out


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


def prefix_hit_ratio(entries: list[TraceEntry]) -> float | None:
    """The share of prompt tokens a prefix cache of unbounded size would serve, from
    the ``hash_ids``: a request's leading blocks whose id an earlier request had
    (at most all but its last token, as an engine always computes one). None when
    the trace has no ``hash_ids``."""
    seen: set[int] = set()
    hit = total = 0
    for entry in entries:
        if not entry.hash_ids or entry.prompt_tokens is None:
            continue
        cached = 0
        for block in entry.hash_ids:
            if block not in seen:
                break
            cached += 1
        hit += min(cached * BLOCK_TOKENS, entry.prompt_tokens - 1)
        total += entry.prompt_tokens
        seen.update(entry.hash_ids)
    return hit / total if total else None
