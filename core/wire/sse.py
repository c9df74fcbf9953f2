"""Server-sent events from an aiohttp response, and what an OpenAI chunk carries.

The framing is the part of the SSE standard that OpenAI-compatible servers use:
``data:`` lines (several join with newlines), events ended by a blank line, comment
lines starting with ``:``, other fields ignored, an event with no data not dispatched.
Lines are split here rather than by aiohttp's line reader, which refuses lines over
512 KiB; one event may be up to ``max_event_bytes`` long (1 MiB by default, past
which :class:`EventTooLarge` is raised) and the whole stream ``max_stream_bytes``
(128 MiB, :class:`~servemon.core.wire.limits.ResponseTooLarge`), counted after inflating
(:mod:`servemon.core.wire.limits`). A stream that ends mid-event yields what it had.

When an answer is complete (:func:`ends_answer`): a streamed OpenAI answer is
complete once a chunk has carried a ``finish_reason`` (or, for servers that put the
end there, a ``usage`` object) and the body then ends cleanly. ``data: [DONE]`` is
optional: vLLM and llama.cpp send it, Transformers Serve does not. A body that ends
before any finish is cut short, whatever else it carried.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping

from aiohttp import StreamReader

from servemon.core.wire.limits import (
    DEFAULT_LIMITS,
    PIECE_BYTES,
    ResponseTooLarge,
    size,
)

__all__ = [
    "ANSWER_KEYS",
    "CONTENT_KEYS",
    "EventTooLarge",
    "answer_text",
    "choice_text",
    "ends_answer",
    "is_done",
    "iter_events",
]

#: Fields of a streamed choice (or its ``delta``) that carry generated text.
CONTENT_KEYS = ("content", "reasoning_content", "reasoning", "text")
#: Those that carry the answer itself; the others carry reasoning (vLLM sent it as
#: ``reasoning_content`` until its rename of November 2025, vllm-project/vllm#27752,
#: and as ``reasoning`` since; llama.cpp and SGLang as ``reasoning_content``).
ANSWER_KEYS = ("content", "text")


class EventTooLarge(ResponseTooLarge):
    """An SSE event longer than the limit."""


async def iter_events(
    content: StreamReader,
    *,
    max_event_bytes: int = DEFAULT_LIMITS.event_bytes,
    max_stream_bytes: int = DEFAULT_LIMITS.stream_bytes,
) -> AsyncIterator[str]:
    """Yield each event's data as text."""
    data: list[str] = []
    event_size = 0
    total = 0
    unyielded = 0
    pending = b""
    async for chunk in content.iter_any():
        total += len(chunk)
        if total > max_stream_bytes:
            raise ResponseTooLarge(f"an SSE stream over {size(max_stream_bytes)}")
        pending += chunk
        *lines, pending = pending.split(b"\n")
        for raw in lines:
            event = _take_line(raw, data)
            event_size += len(raw)
            if event is not None:
                event_size = 0
                if event:
                    yield event
            elif event_size > max_event_bytes:
                raise EventTooLarge(f"an SSE event over {size(max_event_bytes)}")
        # The unfinished line only: a chunk of many short lines is not one long one.
        if len(pending) > max_event_bytes:
            raise EventTooLarge(f"an SSE line over {size(max_event_bytes)}")
        # Read from a full buffer, iter_any does not give the loop a turn: a stream
        # that is all bombs must not hold it (a token stream rarely gets here).
        unyielded += len(chunk)
        if unyielded >= PIECE_BYTES:
            unyielded = 0
            await asyncio.sleep(0)
    if pending:
        _take_line(pending, data)
    if data and "\n".join(data):
        yield "\n".join(data)


def _take_line(raw: bytes, data: list[str]) -> str | None:
    """Add one line to ``data``; at a blank line return the event (and reset)."""
    line = raw.decode("utf-8", errors="replace").rstrip("\r")
    if not line:
        event = "\n".join(data)
        data.clear()
        return event
    if line.startswith(":"):
        return None
    name, _, value = line.partition(":")
    if name == "data":
        data.append(value[1:] if value.startswith(" ") else value)
    return None


def choice_text(choice: Mapping[str, object]) -> str | None:
    """The generated text an OpenAI-style streamed choice carries, if any.

    A chunk with only the role, or empty content, carries none: it is not a token.
    """
    return _text(choice, CONTENT_KEYS)


def answer_text(choice: Mapping[str, object]) -> str | None:
    """The answer text (not reasoning) a streamed choice carries, if any."""
    return _text(choice, ANSWER_KEYS)


def _text(choice: Mapping[str, object], keys: tuple[str, ...]) -> str | None:
    delta = choice.get("delta")
    part = delta if isinstance(delta, dict) else choice
    for key in keys:
        value = part.get(key)
        if isinstance(value, str) and value:
            return value
    return None


def is_done(data: str) -> bool:
    """Whether an event's data is the ``[DONE]`` sentinel."""
    return data.strip() == "[DONE]"


def ends_answer(event: Mapping[str, object]) -> bool:
    """Whether a chunk says the answer is finished: a choice with a
    ``finish_reason``, or a ``usage`` object."""
    if isinstance(event.get("usage"), dict):
        return True
    choices = event.get("choices")
    if isinstance(choices, list):
        for choice in choices:
            if isinstance(choice, dict) and choice.get("finish_reason"):
                return True
    return False
