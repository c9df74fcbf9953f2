"""SSE framing: :func:`servemon.core.wire.sse.iter_events` over a real aiohttp
``StreamReader``.

The reader is the class a client response's ``.content`` is, on a protocol that
believes it is connected (a bare transport that is never written to), fed by hand as
the connection would feed it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

import pytest
from aiohttp import StreamReader
from aiohttp.base_protocol import BaseProtocol

from servemon.core.wire.sse import iter_events

LIMIT = 2**16


def make_reader() -> StreamReader:
    loop = asyncio.get_running_loop()
    protocol = BaseProtocol(loop)
    protocol.connection_made(asyncio.Transport())  # lets a read wait for data
    return StreamReader(protocol, LIMIT, loop=loop)


async def events_of(pieces: Iterable[bytes]) -> list[str]:
    """Feed ``pieces`` and EOF, then read every event."""
    reader = make_reader()
    for piece in pieces:
        reader.feed_data(piece)
    reader.feed_eof()
    return [event async for event in iter_events(reader)]


@pytest.mark.asyncio
async def test_single_line_data_events() -> None:
    stream = b'data: {"a": 1}\n\ndata: two\n\ndata: [DONE]\n\n'
    assert await events_of([stream]) == ['{"a": 1}', "two", "[DONE]"]


@pytest.mark.asyncio
async def test_multi_line_data_joins_with_newlines() -> None:
    stream = b"data: first\ndata: second\ndata:\ndata: fourth\n\ndata: next\n\n"
    assert await events_of([stream]) == ["first\nsecond\n\nfourth", "next"]


@pytest.mark.asyncio
async def test_comment_lines_are_ignored() -> None:
    stream = b": keep-alive\n\ndata: a\n: inside an event\ndata: b\n\n:\n\n"
    assert await events_of([stream]) == ["a\nb"]


@pytest.mark.asyncio
async def test_crlf_line_endings() -> None:
    stream = b"data: one\r\n\r\ndata: two\r\ndata: three\r\n\r\n"
    assert await events_of([stream]) == ["one", "two\nthree"]


@pytest.mark.asyncio
async def test_data_without_a_space_and_only_one_space_stripped() -> None:
    stream = b"data:tight\n\ndata:  two spaces\n\ndata: a: colon\n\n"
    assert await events_of([stream]) == ["tight", " two spaces", "a: colon"]


@pytest.mark.asyncio
async def test_other_fields_are_ignored() -> None:
    stream = (
        b"event: message\nid: 7\nretry: 1000\ndata: payload\nfoo: bar\n\n"
        b"event: ping\n\n"
        b"id: 8\ndata: next\n\n"
    )
    assert await events_of([stream]) == ["payload", "next"]


@pytest.mark.asyncio
async def test_a_stream_that_ends_mid_event_yields_what_it_had() -> None:
    assert await events_of([b"data: done\n\ndata: half\ndata: way"]) == [
        "done",
        "half\nway",
    ]
    assert await events_of([b"data: no blank line\n"]) == ["no blank line"]
    assert await events_of([]) == []
    assert await events_of([b": only a comment\n\n"]) == []


@pytest.mark.asyncio
async def test_events_split_across_reads_byte_by_byte() -> None:
    stream = b'data: {"x": "\xc3\xa9"}\r\n\r\n: c\ndata: y\n\n'
    pieces = [stream[i : i + 1] for i in range(len(stream))]
    assert await events_of(pieces) == ['{"x": "\u00e9"}', "y"]


@pytest.mark.asyncio
async def test_each_event_is_yielded_when_its_blank_line_arrives() -> None:
    # The client times chunks as they are yielded: an event must not wait for
    # the next one, nor for the end of the stream.
    reader = make_reader()
    events = iter_events(reader)
    reader.feed_data(b"data: first\n")
    pending = asyncio.ensure_future(anext(events))
    for _ in range(10):  # let the reader run as far as the data allows
        await asyncio.sleep(0)
    assert not pending.done(), "yielded before the event's blank line"
    reader.feed_data(b"\ndata: sec")
    assert await asyncio.wait_for(pending, timeout=1) == "first"
    reader.feed_data(b"ond\n\n")
    assert await asyncio.wait_for(anext(events), timeout=1) == "second"
    reader.feed_eof()
    with pytest.raises(StopAsyncIteration):
        await asyncio.wait_for(anext(events), timeout=1)
