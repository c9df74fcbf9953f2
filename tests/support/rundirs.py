"""What the end-to-end tests of runs share: waiting for a condition with a deadline,
and reading a run directory's JSON files."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

__all__ = ["only_run", "poll", "read_json", "read_jsonl"]


def poll(check: Callable[[], Any], timeout: float, what: str) -> Any:
    """``check()`` until it is truthy (an OSError counts as not yet); a failure
    naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while True:
        try:
            last = check()
        except OSError as exc:
            last = exc
        if last and not isinstance(last, BaseException):
            return last
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not within {timeout} s (last: {last!r})")
        time.sleep(0.02)


def read_json(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """A JSONL file's objects (none while it does not exist yet)."""
    if not path.exists():
        return []
    lines = path.read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def only_run(out: Path) -> Path:
    """The one run directory under ``out`` (hidden folders, such as a local
    fleet's logs, are not runs)."""
    found = [p for p in out.iterdir() if p.is_dir() and not p.name.startswith(".")]
    assert len(found) == 1, found
    return found[0]
