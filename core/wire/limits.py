"""What one server's answer may cost servemon: the bounds on every HTTP answer it reads.

A server, or a broken proxy in front of it, can answer with anything: a gzip bomb
(2 MB that inflate to 2 GB), a flood of headers, an SSE event without end, a stream
that never finishes, a byte now and then. Every HTTP client of servemon (the load
generator's requests, the canary probe, the ``/tokenize`` counter, model discovery,
the samplers of ``/metrics`` and of Prometheus, the exporter's scrape) reads its
answers within :class:`ResponseLimits`:

- the head: aiohttp's parser refuses a status line or header field over
  ``header_bytes`` and more than ``header_count`` headers (:func:`session_options`
  sets them on a session; :func:`head_refused` says why in one line);
- a body read whole (:func:`read_body`): at most ``answer_bytes`` for a
  non-streamed completion and ``body_bytes`` for anything else, after inflating,
  read in pieces as they arrive; a ``Content-Length`` over it is refused unread;
- a streamed body (SSE, :func:`servemon.core.wire.sse.iter_events`): one event at most
  ``event_bytes``, the whole stream at most ``stream_bytes``, after inflating.

Inflating is aiohttp's and incremental (since aiohttp 3.14 a compressed body is
inflated a read buffer at a time as the reader asks for it, and the socket is not
read while that waits), so a bomb costs a buffer's worth of memory and time per
step until a bound stops it; the readers here give the loop a turn after every
piece, so a stream that is all bombs still lets every other task keep its schedule.
Compressed bytes are bounded by the same numbers (a deflate body is never much
larger than what it inflates to). What no byte count ends -- a stream that never
finishes, a slow drip, bytes that inflate to nothing -- the request's deadline
ends (``--timeout`` for the load generator).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import TypedDict

import aiohttp
from aiohttp.http_exceptions import HttpProcessingError

__all__ = [
    "DEFAULT_LIMITS",
    "ResponseLimits",
    "ResponseTooLarge",
    "SessionOptions",
    "head_refused",
    "head_too_large",
    "read_body",
    "session_options",
    "size",
]

MIB = 1024 * 1024
#: Pieces a whole body is read in (aiohttp's read buffer, and its inflate step);
#: the readers give the loop a turn at least once per piece.
PIECE_BYTES = 64 * 1024


@dataclass(frozen=True, slots=True)
class ResponseLimits:
    """Bounds on one answer, in bytes after inflating (and before, by the same
    numbers)."""

    #: A non-streamed completion (or an error body) read whole: a chat answer of
    #: 32,000 tokens is about 130 kB.
    answer_bytes: int = 4 * MIB
    #: Any other body read whole: ``/v1/models``, ``/tokenize`` (the tokens of a
    #: 1M-token prompt are about 8 MB), a Prometheus query's answer.
    body_bytes: int = 16 * MIB
    #: One SSE event (its ``data:`` lines together); a token chunk is about 300 B.
    event_bytes: int = 1 * MIB
    #: A whole streamed answer: a 100,000-token answer is about 30 MB of chunks.
    stream_bytes: int = 128 * MIB
    #: The status line and each header field (aiohttp's own default).
    header_bytes: int = 8190
    #: Header fields in one answer (aiohttp's own default).
    header_count: int = 128


DEFAULT_LIMITS = ResponseLimits()


class ResponseTooLarge(ValueError):
    """An answer past one of the bounds; ``str()`` names which one."""


def size(n: int) -> str:
    """A byte count as the bounds are written: ``16 MiB``, ``8190 bytes``."""
    return f"{n // MIB} MiB" if n >= MIB and n % MIB == 0 else f"{n} bytes"


class SessionOptions(TypedDict):
    """The keyword arguments of :func:`session_options`."""

    max_line_size: int
    max_field_size: int
    max_headers: int
    read_bufsize: int


def session_options(limits: ResponseLimits = DEFAULT_LIMITS) -> SessionOptions:
    """``aiohttp.ClientSession`` keyword arguments that bound an answer's head."""
    return {
        "max_line_size": limits.header_bytes,
        "max_field_size": limits.header_bytes,
        "max_headers": limits.header_count,
        "read_bufsize": PIECE_BYTES,
    }


def head_refused(exc: BaseException) -> str | None:
    """One line when ``exc`` is aiohttp refusing an answer's head (too many headers,
    a header or status line too long, or not HTTP at all), else None."""
    if not isinstance(exc, aiohttp.ClientResponseError):
        return None
    if not isinstance(exc.__cause__, HttpProcessingError):
        return None
    why = " ".join(str(exc.message).split())
    if len(why) > 120:
        why = why[:117] + "..."
    return f"response head refused: {why}"


def head_too_large(exc: BaseException) -> bool:
    """Whether :func:`head_refused` is about size (aiohttp's messages for its
    ``max_headers``, ``max_line_size`` and ``max_field_size``)."""
    why = str(getattr(exc, "message", ""))
    return why.startswith(("Too many headers", "Got more than"))


async def read_body(
    resp: aiohttp.ClientResponse, max_bytes: int = DEFAULT_LIMITS.body_bytes
) -> bytes:
    """The whole body, inflated, or :class:`ResponseTooLarge` past ``max_bytes``
    (before reading at all when ``Content-Length`` says so)."""
    length = resp.content_length
    if length is not None and length > max_bytes:
        raise ResponseTooLarge(
            f"a response body of {length} bytes, over {size(max_bytes)}"
        )
    body = bytearray()
    async for piece in resp.content.iter_chunked(PIECE_BYTES):
        body += piece
        if len(body) > max_bytes:
            raise ResponseTooLarge(
                f"a response body over {size(max_bytes)}{_inflated(resp)}"
            )
        # A piece may have come from a full buffer without a turn of the loop: a
        # bomb inflating must not hold it (one turn per piece; a body read whole
        # is a non-streamed answer, not the token path).
        await asyncio.sleep(0)
    return bytes(body)


def _inflated(resp: aiohttp.ClientResponse) -> str:
    """`` (gzip: N bytes on the wire)`` for a compressed body, else nothing."""
    encoding = resp.headers.get("Content-Encoding")
    if not encoding or encoding == "identity":
        return ""
    return f" ({encoding}: {resp.content.total_raw_bytes} bytes on the wire)"
