"""Stand-ins for targets and a Prometheus that fail as real ones do, for the fault
tests: each serves on 127.0.0.1 port 0 from an event loop in a thread of the test
process, so a test can run the console script against it and change its mind while
the run goes on.

- :func:`hung_target`: lists a model, answers ``/version``, ``/tokenize`` and
  ``/metrics`` with 404, and accepts every completion request and never answers
  it (a wedged engine behind a live HTTP front); a raw socket server.
- :func:`gateway_502`: lists a model and answers every completion with a 502 and
  nginx's HTML error page, as a gateway whose upstream is gone.
- :func:`tls_target`: the same model listing over TLS, with a certificate signed
  by a CA of the test's own (:mod:`tests.support.certs`).
- :class:`FakePrometheus`: ``/api/v1/query`` answering servemon's signal queries
  (:mod:`servemon.core.signals`) with a fixed queue and fresh samples, that can be made
  to answer 503 (restarting), to refuse connections (down) and to come back.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import ssl
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from aiohttp import web

__all__ = [
    "MODEL",
    "NGINX_502",
    "FakePrometheus",
    "gateway_502",
    "hung_target",
    "tls_target",
    "when",
]

MODEL = "stand-in"
NGINX_502 = (
    "<html>\r\n<head><title>502 Bad Gateway</title></head>\r\n<body>\r\n"
    "<center><h1>502 Bad Gateway</h1></center>\r\n<hr><center>nginx/1.24.0</center>"
    "\r\n</body>\r\n</html>\r\n"
)
_LISTING = {"object": "list", "data": [{"id": MODEL, "object": "model"}]}
_T = TypeVar("_T")


class _Loop:
    """An event loop running in a daemon thread until closed."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()

    def run(self, coro: Awaitable[_T], timeout: float = 10.0) -> _T:
        """Run ``coro`` on the loop and wait for its result."""

        async def wrapped() -> _T:
            return await coro

        return asyncio.run_coroutine_threadsafe(wrapped(), self.loop).result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()


@contextlib.contextmanager
def _serving_app(
    app: web.Application, ssl_context: ssl.SSLContext | None = None
) -> Iterator[str]:
    loop = _Loop()
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.1)

    async def start() -> str:
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=ssl_context)
        await site.start()
        port = runner.addresses[0][1]
        return f"{'https' if ssl_context else 'http'}://127.0.0.1:{port}"

    try:
        yield loop.run(start())
    finally:
        with contextlib.suppress(Exception):
            loop.run(runner.cleanup())
        loop.close()


def _listing_app() -> web.Application:
    async def models(request: web.Request) -> web.Response:
        return web.json_response(_LISTING)

    app = web.Application()
    app.router.add_get("/v1/models", models)
    return app


@contextlib.contextmanager
def gateway_502() -> Iterator[str]:
    """A gateway with nothing behind it: the base URL."""

    async def bad_gateway(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(status=502, text=NGINX_502, content_type="text/html")

    app = _listing_app()
    app.router.add_post("/v1/chat/completions", bad_gateway)
    app.router.add_post("/v1/completions", bad_gateway)
    with _serving_app(app) as url:
        yield url


@contextlib.contextmanager
def tls_target(cert: Path, key: Path) -> Iterator[str]:
    """The model listing over TLS with ``cert``: the base URL (``https://``)."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    with _serving_app(_listing_app(), context) as url:
        yield url


@contextlib.contextmanager
def hung_target(*, lists_models: bool = True) -> Iterator[str]:
    """Accepts completions and never answers them (nor anything at all, without
    ``lists_models``): the base URL."""
    loop = _Loop()
    held: set[asyncio.StreamWriter] = set()
    listing = json.dumps(_LISTING).encode()

    async def handle(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        held.add(writer)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                method, path = head.split(b" ", 2)[:2]
                if b"/completions" in path or not lists_models:
                    await reader.read()  # hold it, read on until the client leaves
                    return
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":", 1)[1])
                if length:
                    await reader.readexactly(length)
                if method == b"GET" and path == b"/v1/models":
                    status, body = b"200 OK", listing
                else:
                    status, body = b"404 Not Found", b'{"detail":"Not Found"}'
                writer.write(
                    b"HTTP/1.1 " + status + b"\r\ncontent-type: application/json\r\n"
                    b"content-length: " + str(len(body)).encode() + b"\r\n\r\n" + body
                )
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, ValueError):
            return
        finally:
            held.discard(writer)
            writer.close()

    async def start() -> tuple[asyncio.Server, str]:
        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        return server, f"http://127.0.0.1:{port}"

    async def stop(server: asyncio.Server) -> None:
        server.close()
        for writer in list(held):
            writer.close()
        await server.wait_closed()

    server, url = loop.run(start())
    try:
        yield url
    finally:
        with contextlib.suppress(Exception):
            loop.run(stop(server))
        loop.close()


class FakePrometheus:
    """Answers servemon's signal queries: ``waiting`` (the queue, summed) is
    :attr:`waiting`, every freshness query a sample 0.5 s old, every other signal
    no data. :meth:`restarting` makes it answer 503 as Prometheus does before it
    is ready, :meth:`down` closes its port (connection refused), :meth:`up`
    brings it back on the same port. Counts the queries it answered."""

    def __init__(self, waiting: float = 1.0) -> None:
        self.waiting = waiting
        self.answered = 0
        self._mode = "up"
        self._loop = _Loop()
        self._runner: web.AppRunner | None = None
        self._port = 0
        self.url = self._loop.run(self._start())

    async def _query(self, request: web.Request) -> web.Response:
        if self._mode == "restarting":
            return web.Response(status=503, text="Service Unavailable")
        query = request.query.get("query", "")
        result: list[dict[str, Any]] = []
        if query.startswith("time() - "):
            result = [{"metric": {}, "value": [0, "0.5"]}]
        elif "servemon_engine_requests_waiting" in query:
            result = [{"metric": {}, "value": [0, repr(self.waiting)]}]
        self.answered += 1
        return web.json_response(
            {"status": "success", "data": {"resultType": "vector", "result": result}}
        )

    async def _start(self) -> str:
        app = web.Application()
        app.router.add_get("/api/v1/query", self._query)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.1)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", self._port, reuse_address=True)
        await site.start()
        self._port = self._runner.addresses[0][1]
        return f"http://127.0.0.1:{self._port}"

    async def _stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    def restarting(self) -> None:
        """Answer 503 to every query until :meth:`up`."""
        self._mode = "restarting"

    def down(self) -> None:
        """Close the port: connections are refused until :meth:`up`."""
        self._loop.run(self._stop())

    def up(self) -> None:
        """Answer again (on the same port)."""
        self._mode = "up"
        if self._runner is None:
            self._loop.run(self._start())

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._loop.run(self._stop())
        self._loop.close()


def when(predicate: Callable[[], Any], timeout: float, what: str) -> Any:
    """Poll ``predicate`` (every 20 ms) until it is truthy; its value. Raises
    AssertionError naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"{what} not within {timeout} s (last: {value!r})")
        time.sleep(0.02)
