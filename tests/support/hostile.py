"""A hostile server (or a broken proxy): answers that try to exhaust the client.

:func:`hostile_target` serves on 127.0.0.1 port 0 from an event loop in a thread of
the test process (:mod:`tests.support.faulty`'s), and answers every request with
one of :data:`KINDS`, in turn (``kinds`` chooses which):

- ``bomb``: a non-streamed answer, ``Content-Encoding: gzip``, about 2 MB that
  inflate to 2 GiB of zeros;
- ``sse_bomb``: a streamed answer, the same bomb behind ``data: ``;
- ``header_flood``: 5,000 headers; ``huge_header``: one header of 1 MiB;
- ``endless``: content chunks every 10 ms, forever;
- ``drip``: one byte every 100 ms, forever;
- ``ok``: a small, good answer (streamed or not, as asked).

The bombs are built once from a deflate stream flushed after every MiB of zeros
(``Z_FULL_FLUSH`` resets the window, so every later MiB compresses to the same
bytes), and streamed out piece by piece: neither the server nor the test ever
holds what they inflate to. ``/tokenize``, ``/metrics``, ``/version`` and
Prometheus' ``/api/v1/query`` answer with a bomb too, ``/v1/models`` when asked.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import zlib
from collections.abc import Iterator, Sequence

from aiohttp import web

from tests.support.faulty import MODEL, _serving_app

__all__ = ["BOMB_INFLATED", "KINDS", "MODEL", "gzip_bomb", "hostile_target"]

KINDS = ("bomb", "sse_bomb", "header_flood", "huge_header", "endless", "drip", "ok")
MIB = 1024 * 1024
#: What a bomb inflates to.
BOMB_INFLATED = 2048 * MIB


def gzip_bomb(prefix: bytes = b"") -> tuple[bytes, bytes, int]:
    """(head, piece, pieces): ``head`` is a gzip header with ``prefix`` and the
    first MiB of zeros, every ``piece`` one more MiB; ``pieces`` of them make
    :data:`BOMB_INFLATED`. The stream has no end (the client stops first)."""
    packer = zlib.compressobj(9, zlib.DEFLATED, 31)
    zeros = bytes(MIB)
    head = packer.compress(prefix + zeros) + packer.flush(zlib.Z_FULL_FLUSH)
    piece = packer.compress(zeros) + packer.flush(zlib.Z_FULL_FLUSH)
    again = packer.compress(zeros) + packer.flush(zlib.Z_FULL_FLUSH)
    assert piece == again, "a full flush resets the window: every MiB the same"
    return head, piece, BOMB_INFLATED // MIB - 1


async def _send_bomb(
    request: web.Request, content_type: str, prefix: bytes = b""
) -> web.StreamResponse:
    head, piece, pieces = gzip_bomb(prefix)
    resp = web.StreamResponse(
        headers={"Content-Type": content_type, "Content-Encoding": "gzip"}
    )
    with contextlib.suppress(ConnectionError):
        await resp.prepare(request)
        await resp.write(head)
        for _ in range(pieces):
            await resp.write(piece * 16)  # 16 MiB inflated a write
    return resp


def _chunk(text: str, finish: str | None = None) -> bytes:
    choice = {"index": 0, "delta": {"content": text}, "finish_reason": finish}
    return f"data: {json.dumps({'choices': [choice]})}\n\n".encode()


async def _endless(request: web.Request) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    with contextlib.suppress(ConnectionError):
        for _ in itertools.count():  # ended by the client going away
            await resp.write(_chunk("word "))
            await asyncio.sleep(0.01)
    return resp


async def _drip(request: web.Request) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    with contextlib.suppress(ConnectionError):
        for _ in itertools.count():  # ended by the client going away
            await resp.write(b":")
            await asyncio.sleep(0.1)
    return resp


async def _ok(request: web.Request, stream: bool) -> web.StreamResponse:
    if not stream:
        message = {"role": "assistant", "content": "fine"}
        return web.json_response(
            {
                "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 4, "completion_tokens": 1},
            }
        )
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    await resp.write(_chunk("fine") + _chunk("", "stop") + b"data: [DONE]\n\n")
    return resp


@contextlib.contextmanager
def hostile_target(
    kinds: Sequence[str] = KINDS, *, bombed_models: bool = False
) -> Iterator[str]:
    """Serve hostile answers, ``kinds`` in turn: the base URL. ``/v1/models``
    lists :data:`MODEL` unless ``bombed_models``."""
    turn = itertools.cycle(kinds)
    # Connections whose client walked away mid-answer, with bytes still queued:
    # aborted at shutdown, so that none is left closing when the loop ends.
    transports: list[asyncio.BaseTransport] = []

    async def completion(request: web.Request) -> web.StreamResponse:
        if request.transport is not None:
            transports.append(request.transport)
        body = await request.json()
        kind = next(turn)
        if kind == "bomb":
            return await _send_bomb(request, "application/json")
        if kind == "sse_bomb":
            return await _send_bomb(request, "text/event-stream", b"data: ")
        if kind == "header_flood":
            return web.Response(headers={f"x-flood-{i}": "x" for i in range(5000)})
        if kind == "huge_header":
            return web.Response(headers={"x-huge": "x" * MIB})
        if kind == "endless":
            return await _endless(request)
        if kind == "drip":
            return await _drip(request)
        return await _ok(request, bool(body.get("stream")))

    async def bomb(request: web.Request) -> web.StreamResponse:
        if request.transport is not None:
            transports.append(request.transport)
        return await _send_bomb(request, "application/json")

    async def abort_all(_app: web.Application) -> None:
        for transport in transports:
            if isinstance(transport, asyncio.Transport):
                transport.abort()

    async def models(request: web.Request) -> web.StreamResponse:
        if bombed_models:
            return await bomb(request)
        return web.json_response({"object": "list", "data": [{"id": MODEL}]})

    app = web.Application()
    app.on_shutdown.append(abort_all)
    app.router.add_post("/v1/chat/completions", completion)
    app.router.add_post("/v1/completions", completion)
    app.router.add_get("/v1/models", models)
    for path in ("/metrics", "/api/v1/query", "/version"):
        app.router.add_get(path, bomb)
    app.router.add_post("/tokenize", bomb)
    with _serving_app(app) as url:
        yield url
