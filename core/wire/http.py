"""Sending a POST once, as HTTP clients do over pooled keep-alive connections.

A server may close an idle keep-alive connection at any moment, and some close it
after every streamed answer while still advertising ``Keep-Alive`` (llama.cpp's
``llama-server`` does). A request that goes out on such a connection fails before
the server has read it: the write fails, or the connection is found closed before
any response byte. Clients resend such a request at once on a new connection
(RFC 9112 §9.3.1; httpcore and browsers do); aiohttp does it only for idempotent
methods, and a completion request is a POST. :func:`post` does it for any method,
only when the failed connection came from the pool, and counts each resend. A
failure on a fresh connection is raised as it is: that server really did not answer.

Whether a connection came from the pool is told by :class:`PoolConnector`, a
``TCPConnector`` that marks each connection it hands out as used. Sessions made
with another connector get no resends.
"""

from __future__ import annotations

import asyncio
import contextvars
import json
import weakref
from collections.abc import Mapping
from typing import TYPE_CHECKING

import aiohttp
import orjson
from aiohttp.client_proto import ResponseHandler

from servemon.core.errors import TargetError
from servemon.core.wire.limits import read_body

if TYPE_CHECKING:
    from aiohttp.tracing import Trace

__all__ = ["NotAnswered", "PoolConnector", "encode_json", "post", "post_json"]

#: The connections a request in flight was given, True for each one from the pool.
_GIVEN: contextvars.ContextVar[list[bool] | None] = contextvars.ContextVar(
    "servemon_connections_given", default=None
)

#: Resends of one request at most. Each failed pooled connection is dropped, so the
#: resends end at the first fresh connection; this only bounds a pathological pool.
MAX_RESENDS = 64


class PoolConnector(aiohttp.TCPConnector):
    """A ``TCPConnector`` that tells :func:`post` whether a connection was reused."""

    def __init__(self, *, limit: int = 100, limit_per_host: int = 0) -> None:
        super().__init__(limit=limit, limit_per_host=limit_per_host)
        self._used: weakref.WeakSet[ResponseHandler] = weakref.WeakSet()

    async def connect(
        self,
        req: aiohttp.ClientRequest,
        traces: list[Trace],
        timeout: aiohttp.ClientTimeout,  # noqa: ASYNC109 (aiohttp's signature)
    ) -> aiohttp.connector.Connection:
        conn = await super().connect(req, traces, timeout)
        given = _GIVEN.get()
        proto = conn.protocol
        if given is not None and proto is not None:
            given.append(proto in self._used)
            self._used.add(proto)
        return conn


def encode_json(body: object) -> bytes:
    """A request body as JSON bytes: orjson (a 12,000-word prompt, 72 KB, in 3 µs,
    where the standard library that aiohttp's ``json=`` uses takes 200 µs), the
    standard library for what orjson refuses (integers past 64 bits, non-string
    keys). A dispatcher encodes ahead of the send (:func:`post`'s ``data``)."""
    try:
        return orjson.dumps(body)
    except TypeError:
        return json.dumps(body).encode()


class NotAnswered(Exception):
    """The server closed a fresh connection before answering (or the resends ran
    out: ``fresh`` is False then)."""

    def __init__(self, cause: BaseException, resends: int, *, fresh: bool) -> None:
        super().__init__(f"{type(cause).__name__}: {cause}")
        self.cause = cause
        self.resends = resends
        self.fresh = fresh


async def post(
    session: aiohttp.ClientSession,
    url: str,
    *,
    body: object = None,
    data: bytes | None = None,
    headers: Mapping[str, str],
    resends: list[int] | None = None,
) -> aiohttp.ClientResponse:
    """POST JSON (``body``, or ``data``: the body encoded already, by
    :func:`encode_json`) and return the response once its headers are in.

    A failure on a connection taken from the pool, before any response, is resent
    at once; each resend is counted in ``resends[0]``. aiohttp drops the failed
    connection, so a pool of several dead ones is drained one resend each until the
    request goes out on a fresh connection (bounded by :data:`MAX_RESENDS`). A
    failure on a fresh connection raises :class:`NotAnswered`; connect errors and
    timeouts propagate as aiohttp raises them.
    """
    count = resends if resends is not None else [0]
    payload = encode_json(body) if data is None else data
    sent = dict(headers)
    if not any(k.lower() == "content-type" for k in sent):
        sent["Content-Type"] = "application/json"
    while True:
        given: list[bool] = []
        token = _GIVEN.set(given)
        try:
            return await session.post(url, data=payload, headers=sent)
        except aiohttp.ClientConnectorError:
            raise
        except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError) as exc:
            reused = bool(given and given[-1])
            if not reused or count[0] >= MAX_RESENDS:
                raise NotAnswered(exc, count[0], fresh=not reused) from exc
            count[0] += 1
        finally:
            _GIVEN.reset(token)


async def post_json(
    session: aiohttp.ClientSession,
    url: str,
    body: Mapping[str, object],
    headers: Mapping[str, str],
    timeout_s: float,
) -> object:
    """``POST`` a JSON body and decode the JSON answer (a ``/tokenize`` call).
    Anything but a 200 with JSON within ``timeout_s``, or a body past the client's
    bounds, is a one-line :class:`TargetError`. Resent on a new connection if the
    server had closed the pooled one (llama-server closes after every answer)."""
    try:
        async with asyncio.timeout(timeout_s):
            resp = await post(session, url, body=dict(body), headers=headers)
            async with resp:
                if resp.status != 200:
                    raise TargetError(f"POST {url}: HTTP {resp.status}")
                answer: object = json.loads(await read_body(resp))
    except (aiohttp.ClientError, NotAnswered, TimeoutError, ValueError) as exc:
        raise TargetError(f"POST {url}: {type(exc).__name__}: {exc}") from exc
    return answer
