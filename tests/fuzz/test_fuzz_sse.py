"""SSE streams, drawn and cut into arbitrary chunks: what is read does not depend on
how the bytes arrived.

A stream is a drawn sequence of events (LF or CRLF line ends, comments and
keep-alive ``:`` lines, other fields, multi-line ``data:``, events near the size
limit and over it, with or without ``[DONE]``), cut at drawn byte boundaries, at
every byte, or not at all. Properties: :func:`servemon.core.wire.sse.iter_events` yields
the same events however the stream is cut (and raises :class:`EventTooLarge`, its one
documented error, at the same place, or not at all); a request's figures read by
``servemon.loadgen.send.client._Probe`` (content chunks, finish, outcome, error) do not
depend on the cut either. The body is handed over by a stand-in for aiohttp's
StreamReader that gives exactly the chunks drawn.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any, cast

import aiohttp
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from servemon.core.wire.sse import EventTooLarge, iter_events
from servemon.loadgen.send.client import _Probe

pytestmark = pytest.mark.fuzz

LIMIT = 200  # max_event_bytes in these tests: "near the limit" stays cheap to draw


class _Body:
    """The part of aiohttp's StreamReader the readers use, giving given chunks."""

    def __init__(self, chunks: list[bytes]) -> None:
        self._chunks = list(chunks)

    async def iter_any(self) -> AsyncIterator[bytes]:
        while self._chunks:
            yield self._chunks.pop(0)

    async def read(self) -> bytes:
        rest, self._chunks = b"".join(self._chunks), []
        return rest


def _cut(body: bytes, at: list[int]) -> list[bytes]:
    edges = [0, *sorted({a for a in at if 0 < a < len(body)}), len(body)]
    return [body[a:b] for a, b in itertools.pairwise(edges) if b > a]


data_text = st.text(
    st.characters(codec="utf-8", exclude_characters="\r\n", exclude_categories=("Cs",)),
    max_size=12,
)


@st.composite
def _event(draw: st.DrawFn) -> list[str]:
    """One event's lines, without line ends."""
    lines = []
    for _ in range(draw(st.integers(0, 2))):
        lines.append(draw(st.sampled_from([":", ": keep-alive", ":ping", "id: 7"])))
    for _ in range(draw(st.integers(0, 3))):
        prefix = draw(st.sampled_from(["data: ", "data:", "data:  "]))
        lines.append(prefix + draw(data_text))
    if draw(st.integers(0, 6)) == 0:  # near the limit, or just over it
        lines.append("data: " + "x" * draw(st.integers(LIMIT - 20, LIMIT + 5)))
    if draw(st.booleans()):
        lines.append(draw(st.sampled_from(["event: message", "retry: 10", "data"])))
    return lines


@st.composite
def streams(draw: st.DrawFn) -> bytes:
    events = draw(st.lists(_event(), max_size=6))
    if draw(st.booleans()):
        events.append(["data: [DONE]"])
    crlf = draw(st.sampled_from(["lf", "crlf", "mixed"]))
    out = []
    for event in [*events]:
        for line in [*event, ""]:
            end = {"lf": "\n", "crlf": "\r\n"}.get(crlf) or draw(
                st.sampled_from(["\n", "\r\n"])
            )
            out.append(line + end)
    body = "".join(out).encode()
    if draw(st.integers(0, 4)) == 0:  # cut short, mid-line maybe
        body = body[: draw(st.integers(0, len(body)))]
    return body


async def _events(chunks: list[bytes]) -> tuple[list[str], bool]:
    """The events read, and whether EventTooLarge ended the reading."""
    got: list[str] = []
    try:
        async for event in iter_events(
            cast(aiohttp.StreamReader, _Body(chunks)), max_event_bytes=LIMIT
        ):
            got.append(event)
    except EventTooLarge:
        return got, True
    return got, False


@given(body=streams(), at=st.lists(st.integers(0, 2_000), max_size=20))
# Two lines of 150 bytes in one chunk: the chunk, not a line nor an event, was held
# to the limit, so the whole body raised EventTooLarge where bytes one by one
# did not.
@example(body=b"data: " + b"a" * 150 + b"\n\ndata: " + b"b" * 150 + b"\n\n", at=[])
def test_events_do_not_depend_on_the_chunking(body: bytes, at: list[int]) -> None:
    whole = asyncio.run(_events([body]))
    assert asyncio.run(_events(_cut(body, at))) == whole
    assert asyncio.run(_events(_cut(body, list(range(len(body)))))) == whole


def _chunk(**fields: Any) -> str:
    return "data: " + json.dumps(
        {"id": "c", "object": "chat.completion.chunk", **fields}
    )


@st.composite
def answers(draw: st.DrawFn) -> bytes:
    """An OpenAI-style streamed answer: role chunk, content chunks (some empty),
    maybe reasoning, maybe a finish, maybe usage, maybe [DONE], maybe a malformed
    event, keep-alives between; LF or CRLF; maybe cut short."""
    lines = []
    if draw(st.booleans()):
        lines.append(_chunk(choices=[{"index": 0, "delta": {"role": "assistant"}}]))
    for _ in range(draw(st.integers(0, 6))):
        key = draw(st.sampled_from(["content", "reasoning_content", "reasoning"]))
        delta = {key: draw(st.sampled_from(["", "a", "é", "tok en"]))}
        lines.append(_chunk(choices=[{"index": 0, "delta": delta}]))
        if draw(st.integers(0, 4)) == 0:
            lines.append(": keep-alive")
    if draw(st.integers(0, 5)) == 0:
        lines.append(draw(st.sampled_from(["data: {not json", "data: [1, 2]"])))
    if draw(st.booleans()):
        reason = draw(st.sampled_from(["stop", "length"]))
        lines.append(
            _chunk(choices=[{"index": 0, "delta": {}, "finish_reason": reason}])
        )
    if draw(st.booleans()):
        usage = {"prompt_tokens": 3, "completion_tokens": draw(st.integers(0, 9))}
        lines.append(_chunk(choices=[], usage=usage))
    if draw(st.booleans()):
        lines.append("data: [DONE]")
    end = draw(st.sampled_from(["\n", "\r\n"]))
    body = "".join(line + end + end for line in lines).encode()
    if draw(st.integers(0, 4)) == 0:
        body = body[: draw(st.integers(0, len(body)))]
    return body


async def _figures(chunks: list[bytes]) -> tuple[Any, ...]:
    probe = _Probe("r-1", 0.0)
    resp = cast(aiohttp.ClientResponse, SimpleNamespace(content=_Body(chunks)))
    await probe.read_stream(resp)
    t = probe.result()
    return (
        len(t.content_s),
        t.first_answer_s is not None,
        t.finish_reason,
        t.output_tokens,
        t.token_source,
        t.outcome,
        t.error,
        t.done_sentinel,
    )


@given(body=answers(), at=st.lists(st.integers(0, 2_000), max_size=20))
def test_a_requests_figures_do_not_depend_on_the_chunking(
    body: bytes, at: list[int]
) -> None:
    whole = asyncio.run(_figures([body]))
    assert asyncio.run(_figures(_cut(body, at))) == whole
    assert asyncio.run(_figures(_cut(body, list(range(len(body)))))) == whole
