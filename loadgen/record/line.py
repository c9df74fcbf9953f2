"""A ``requests.jsonl`` line, declared once: each key, how a request gives its value,
and how a value reads back into a :class:`RequestTiming`.

The writer (:func:`request_line`), the reader (:func:`timing_from_line`) and the
report's streaming pass (:mod:`servemon.loadgen.record.scan`, through :func:`keys`) all
take the keys from :data:`LINE`, so a key renamed or dropped here fails where it is
used, at import. The format is documented in ``docs/metrics.md`` and stable: keys are
only ever added, so a reader takes a missing key as its default.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from servemon.loadgen.send.timing import Outcome, RequestTiming, TokenSource

__all__ = ["LINE", "Key", "Line", "keys", "request_line", "timing_from_line"]

#: A line as read back: its keys and their JSON values.
Line = dict[str, Any]


def _same(value: Any) -> Any:
    return value


@dataclass(frozen=True, slots=True)
class Key:
    """One key of the line."""

    name: str
    #: The value a request gives it.
    write: Callable[[RequestTiming], Any]
    #: The :class:`RequestTiming` field it reads back into; None: derived, never
    #: read back (a figure the timing computes again).
    field: str | None = None
    #: The read-back value from the JSON one (a missing key gives None).
    read: Callable[[Any], Any] = _same
    #: A monotonic time, moved with the run when read back (``shift_s``).
    time: bool = False
    #: Every line has it; a line without it is not a request's.
    required: bool = False


def _count(value: Any) -> int:
    return int(value or 0)


def _time(name: str, *, required: bool = False) -> Key:
    return Key(name, lambda t: getattr(t, name), name, float, True, required)


def _kept(name: str) -> Key:
    return Key(name, lambda t: getattr(t, name), name)


LINE: tuple[Key, ...] = (
    Key("id", lambda t: t.request_id, "request_id", str, required=True),
    Key("stage", lambda t: t.stage, "stage", _count),
    Key("outcome", lambda t: str(t.outcome), "outcome", Outcome, required=True),
    _kept("status"),
    _time("scheduled_s", required=True),
    _time("sent_s", required=True),
    _time("headers_s"),
    _time("first_chunk_s"),
    # The content chunks' times are rebuilt from these two (timing_from_line).
    Key("first_content_s", lambda t: t.first_content_s),
    _time("end_s", required=True),
    Key("ttft_s", lambda t: t.ttft),
    Key("ttfc_s", lambda t: t.time_to_first_chunk),
    Key("e2e_s", lambda t: t.e2e),
    Key("tpot_s", lambda t: t.tpot),
    Key("itl_s", lambda t: t.itl),
    Key("dispatch_lag_s", lambda t: t.dispatch_lag),
    Key("ttft_from_scheduled_s", lambda t: t.ttft_from_scheduled),
    Key("e2e_from_scheduled_s", lambda t: t.e2e_from_scheduled),
    _kept("prompt_tokens"),
    Key(
        "output_tokens",
        lambda t: t.output_tokens,
        "output_tokens",
        lambda v: int(v or 0),
    ),
    Key(
        "token_source",
        lambda t: str(t.token_source),
        "token_source",
        lambda v: TokenSource(v or "chunks"),
    ),
    _kept("finish_reason"),
    _kept("error"),
    Key("done_sentinel", lambda t: t.done_sentinel, "done_sentinel", bool),
    Key("reconnects", lambda t: t.reconnects, "reconnects", _count),
    _kept("cached_tokens"),
    Key("cached_fraction", lambda t: t.cached_fraction),
    _kept("server_source"),
    _kept("server_queue_s"),
    _kept("server_prefill_s"),
    _kept("server_decode_s"),
    Key("server_ttft_s", lambda t: t.server_ttft),
    Key("ttft_gap_s", lambda t: t.ttft_gap),
    _time("first_answer_s"),
    Key("ttfa_s", lambda t: t.ttfa),
    _kept("reasoning_tokens"),
    _kept("model"),
    _kept("session"),
    _kept("turn"),
    _kept("history_tokens"),
    _kept("worker"),
)
_NAMES = frozenset(key.name for key in LINE)


def keys(*names: str) -> tuple[str, ...]:
    """``names`` as they are declared here; an undeclared one raises at once (a
    reader of the line asks for its keys through this at import)."""
    unknown = [name for name in names if name not in _NAMES]
    if unknown:
        raise KeyError(f"not a requests.jsonl key: {', '.join(unknown)}")
    return names


FIRST_CONTENT, ITL = keys("first_content_s", "itl_s")


def request_line(t: RequestTiming) -> dict[str, Any]:
    """The ``requests.jsonl`` form of one request (monotonic seconds)."""
    return {key.name: key.write(t) for key in LINE}


def timing_from_line(line: dict[str, Any], shift_s: float = 0.0) -> RequestTiming:
    """A ``requests.jsonl`` line back as a timing (times moved by ``shift_s``).

    Content chunk times are rebuilt from ``first_content_s`` and the ITL gaps.
    """
    given: dict[str, Any] = {}
    for key in LINE:
        if key.field is None:
            continue
        value = line[key.name] if key.required else line.get(key.name)
        if key.time:
            value = None if value is None else key.read(value) + shift_s
        elif key.read is not _same:
            value = key.read(value)
        given[key.field] = value
    content: list[float] = []
    first = line.get(FIRST_CONTENT)
    if first is not None:
        content.append(float(first) + shift_s)
        for gap in line.get(ITL) or []:
            content.append(content[-1] + float(gap))
    return RequestTiming(content_s=tuple(content), **given)
