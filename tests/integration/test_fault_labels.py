"""One definition of how a request failed (core.wire.failures): the load generator and
the canary probe label every fault the same way, over real sockets on 127.0.0.1.

Each fault is a small server of its own (or a port where none listens, or a listener
whose accept queue is full, so that a connect hangs until its timeout).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator, Awaitable, Callable

import aiohttp
import pytest

from servemon.core.outcomes import Outcome
from servemon.core.wire.http import PoolConnector
from servemon.core.wire.limits import session_options
from servemon.loadgen.send.client import ClientSettings, make_session, send_request
from servemon.monitor.engine import Target
from servemon.monitor.probe import Prober

pytestmark = pytest.mark.integration

TIMEOUT_S = 1.0
BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}
SSE_HEAD = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
    b"Transfer-Encoding: chunked\r\n\r\n"
)
Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def _read_request(reader: asyncio.StreamReader) -> None:
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(
        (
            int(line.split(b":", 1)[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length:")
        ),
        0,
    )
    await reader.readexactly(length)


def _answering(raw: bytes, *, then_hang: bool = False) -> Handler:
    async def handle(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        try:
            with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
                await _read_request(reader)
                writer.write(raw)
                await writer.drain()
                if then_hang:
                    await asyncio.sleep(3 * TIMEOUT_S)
        finally:
            writer.close()

    return handle


@contextlib.asynccontextmanager
async def _server(handler: Handler) -> AsyncIterator[str]:
    tasks: set[asyncio.Task[None]] = set()

    async def tracked(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        tasks.add(task)
        await handler(r, w)

    server = await asyncio.start_server(tracked, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.close()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


@contextlib.asynccontextmanager
async def _refused() -> AsyncIterator[str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    yield f"http://127.0.0.1:{port}"


@contextlib.asynccontextmanager
async def _accept_queue_full() -> AsyncIterator[str]:
    """A listener that never accepts, its queue filled: a connect hangs (Linux)."""
    with contextlib.ExitStack() as stack:
        listener = stack.enter_context(socket.socket())
        listener.bind(("127.0.0.1", 0))
        listener.listen(0)
        address = listener.getsockname()
        for _ in range(4):
            filler = stack.enter_context(socket.socket())
            filler.setblocking(False)
            with contextlib.suppress(BlockingIOError):
                filler.connect(address)
        yield f"http://127.0.0.1:{address[1]}"


FAULTS: dict[
    str, tuple[Callable[[], contextlib.AbstractAsyncContextManager[str]], Outcome]
] = {
    "nothing listens": (_refused, Outcome.CONNECT_ERROR),
    "the connect hangs": (_accept_queue_full, Outcome.CONNECT_ERROR),
    "no answer": (
        lambda: _server(_answering(b"", then_hang=True)),
        Outcome.TIMEOUT,
    ),
    "a 500": (
        lambda: _server(
            _answering(b"HTTP/1.1 500 Oops\r\nContent-Length: 2\r\n\r\n{}")
        ),
        Outcome.HTTP_ERROR,
    ),
    "cut mid-stream": (
        lambda: _server(
            _answering(SSE_HEAD + b'1e\r\ndata: {"choices": [{"index"\r\n')
        ),
        Outcome.STREAM_ERROR,
    ),
    "a header flood": (
        lambda: _server(
            _answering(
                b"HTTP/1.1 200 OK\r\n"
                + b"".join(b"X-Flood-%d: x\r\n" % i for i in range(1000))
                + b"Content-Length: 0\r\n\r\n"
            )
        ),
        Outcome.RESPONSE_TOO_LARGE,
    ),
}


@pytest.mark.parametrize("fault", list(FAULTS))
@pytest.mark.asyncio
async def test_the_probe_and_the_client_label_a_fault_alike(fault: str) -> None:
    make_server, expected = FAULTS[fault]
    async with make_server() as url:
        settings = ClientSettings(connect_timeout_s=TIMEOUT_S / 2, timeout_s=TIMEOUT_S)
        async with make_session(settings) as session:
            timing = await send_request(
                session,
                url + "/v1/chat/completions",
                BODY,
                request_id="r",
                timeout_s=TIMEOUT_S,
            )
        # The exporter's session, as monitor.exporter makes it, with a short connect.
        async with aiohttp.ClientSession(
            connector=PoolConnector(limit=4),
            trust_env=False,
            timeout=aiohttp.ClientTimeout(total=None, connect=TIMEOUT_S / 2),
            **session_options(),
        ) as session:
            prober = Prober(
                [Target(url=url, name="t", model="m")],
                session,
                lambda target: target.model,
                interval_s=60.0,
                timeout_s=TIMEOUT_S,
            )
            probed = await prober.probe(prober.targets[0])
    assert timing.outcome is expected, (fault, timing.outcome, timing.error)
    assert probed == timing.outcome, (fault, probed, timing.error)
