"""One timed request against an OpenAI-compatible endpoint.

:func:`send_request` never raises for what the network or the server does: every
ending is an :class:`~servemon.loadgen.send.timing.Outcome` on the returned record. Only
the caller's own cancellation propagates.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TypedDict, TypeGuard

import aiohttp
import orjson

from servemon.core.jsonvalue import JSONObject, JSONValue
from servemon.core.wire.failures import ENDINGS, ending, error_message
from servemon.core.wire.http import PoolConnector, encode_json, post
from servemon.core.wire.limits import (
    DEFAULT_LIMITS,
    ResponseLimits,
    read_body,
    session_options,
)
from servemon.core.wire.sse import answer_text, choice_text, is_done, iter_events
from servemon.loadgen.send.timing import Outcome, RequestTiming, TokenSource

__all__ = [
    "ClientSettings",
    "RequestOptions",
    "RequestTags",
    "ServerFacts",
    "make_session",
    "parse_event",
    "send_request",
    "server_facts",
]


@dataclass(frozen=True, slots=True)
class ClientSettings:
    """Connection limits and timeouts, set explicitly and recorded with a run."""

    max_connections: int = 1024
    timeout_s: float = 600.0
    connect_timeout_s: float = 10.0
    #: What one answer may cost (:mod:`servemon.core.wire.limits`).
    limits: ResponseLimits = DEFAULT_LIMITS


def make_session(settings: ClientSettings) -> aiohttp.ClientSession:
    """A session for load: explicit connection limit, no environment lookups."""
    connector = PoolConnector(
        limit=settings.max_connections, limit_per_host=settings.max_connections
    )
    timeout = aiohttp.ClientTimeout(
        total=None, connect=settings.connect_timeout_s, sock_read=settings.timeout_s
    )
    return aiohttp.ClientSession(
        connector=connector,
        timeout=timeout,
        trust_env=False,
        **session_options(settings.limits),
    )


async def send_request(
    session: aiohttp.ClientSession,
    url: str,
    body: Mapping[str, object],
    *,
    request_id: str,
    stage: int = 0,
    scheduled_s: float | None = None,
    headers: dict[str, str] | None = None,
    timeout_s: float = 600.0,
    cancel_after_s: float | None = None,
    cancel_after_tokens: int | None = None,
    record_interruption: bool = False,
    keep_text: bool = False,
    tags: RequestTags | None = None,
    on_first_token: Callable[[], None] | None = None,
    limits: ResponseLimits = DEFAULT_LIMITS,
    encoded: bytes | None = None,
) -> RequestTiming:
    """POST ``body`` to ``url`` and time it; streaming if ``body["stream"]``.
    ``encoded`` is ``body`` as JSON already (:func:`encode_json`), made ahead of the
    send time so that a long prompt's encoding is not in its dispatch lag, nor in
    that of another request due in the same instant.

    ``cancel_after_s`` / ``cancel_after_tokens`` close the connection that long after
    the send, or after that many content chunks, and record ``cancelled``: a client
    walking away. With ``record_interruption``, cancelling the calling task (a run
    being stopped) also returns a ``cancelled`` record with what was measured so far,
    instead of raising. ``keep_text`` keeps the answer's text on the record (a
    session sends it back in its next turn); ``tags`` go on the record as they are.
    ``on_first_token`` is called as the first content chunk of a stream arrives.
    An answer past ``limits`` ends as ``response_too_large``, naming the bound.
    """
    probe = _Probe(request_id, time.monotonic() if scheduled_s is None else scheduled_s)
    probe.stage = stage
    probe.tags = tags
    if keep_text:
        probe.text = []
    probe.cancel_after_tokens = cancel_after_tokens
    probe.on_first_token = on_first_token
    sent_headers = {"X-Request-Id": request_id, **(headers or {})}
    resends = [0]
    data = encode_json(body) if encoded is None else encoded
    probe.sent_s = time.monotonic()
    walk_away = asyncio.timeout(cancel_after_s)
    deadline = asyncio.timeout(timeout_s)
    try:
        async with deadline, walk_away:
            resp = await post(
                session, url, data=data, headers=sent_headers, resends=resends
            )
            async with resp:
                probe.headers_s = time.monotonic()
                probe.status = resp.status
                if resp.status != 200:
                    raw = await read_body(resp, limits.answer_bytes)
                    probe.fail(Outcome.HTTP_ERROR, error_message(raw))
                elif body.get("stream"):
                    await probe.read_stream(resp, limits)
                else:
                    probe.read_whole(await read_body(resp, limits.answer_bytes))
                if probe.outcome is Outcome.CANCELLED:
                    resp.close()
    except asyncio.CancelledError:
        if not record_interruption:
            raise
        probe.fail(Outcome.CANCELLED, "interrupted: the run stopped first")
    except ENDINGS as exc:
        if walk_away.expired():
            probe.fail(Outcome.CANCELLED, f"client closed after {cancel_after_s:g} s")
        elif deadline.expired():
            probe.fail(Outcome.TIMEOUT, f"no complete answer within {timeout_s:g} s")
        else:
            probe.fail(*ending(exc, probe.where()))
    probe.reconnects = resends[0]
    return probe.result()


@dataclass(frozen=True, slots=True)
class RequestTags:
    """What the caller knows about a request that the wire does not say: the model
    of a mix it asked for, and its place in a conversation."""

    model: str | None = None
    session: str | None = None
    turn: int | None = None
    history_tokens: int | None = None


class RequestOptions(TypedDict, total=False):
    """What a driver chooses for one request beyond its body: the keyword arguments
    of :func:`send_request` that change from one request to the next."""

    #: The client walks away this long after the send, or after this many chunks.
    cancel_after_s: float | None
    cancel_after_tokens: int | None
    #: Keep the answer's text (a session sends it back in its next turn).
    keep_text: bool
    tags: RequestTags | None
    #: The body as JSON, made ahead of the send time.
    encoded: bytes | None


class ServerFacts(TypedDict, total=False):
    """What a server reported about one request (:func:`server_facts`), by the
    :class:`~servemon.loadgen.send.timing.RequestTiming` field each goes to."""

    cached_tokens: int
    reasoning_tokens: int
    server_source: str
    server_queue_s: float | None
    server_prefill_s: float | None
    server_decode_s: float | None


class _Probe:
    """Mutable state while one request is in flight."""

    def __init__(self, request_id: str, scheduled_s: float) -> None:
        self.request_id = request_id
        self.stage = 0
        self.cancel_after_tokens: int | None = None
        self.on_first_token: Callable[[], None] | None = None
        self.scheduled_s = scheduled_s
        self.sent_s = scheduled_s
        self.headers_s: float | None = None
        self.first_chunk_s: float | None = None
        self.done_s: float | None = None
        self.content_s: list[float] = []
        self.first_answer_s: float | None = None
        self.text: list[str] | None = None  # the answer's pieces, when kept
        self.tags: RequestTags | None = None
        self.status: int | None = None
        self.usage: JSONObject | None = None
        self.finish_reason: str | None = None
        self.outcome = Outcome.OK
        self.error: str | None = None
        self.finished = False  # a chunk carried a finish_reason (or usage)
        self.done_sentinel = False
        self.reconnects = 0
        self.metrics: JSONObject | None = None  # vLLM's per-request metrics
        self.timings: JSONObject | None = None  # llama.cpp's timings

    def fail(self, outcome: Outcome, error: str) -> None:
        if self.outcome is Outcome.OK:
            self.outcome, self.error = outcome, error

    def where(self) -> str:
        """Where in the answer the stream stands, for an error message."""
        if self.finished:
            return "after the finish chunk"
        if self.first_chunk_s is None:
            return "before any chunk"
        return f"mid-answer, after {len(self.content_s)} content chunks"

    async def read_stream(
        self, resp: aiohttp.ClientResponse, limits: ResponseLimits = DEFAULT_LIMITS
    ) -> None:
        events = iter_events(
            resp.content,
            max_event_bytes=limits.event_bytes,
            max_stream_bytes=limits.stream_bytes,
        )
        async for data in events:
            now = time.monotonic()
            if self.first_chunk_s is None:
                self.first_chunk_s = now
            if is_done(data):
                self.done_sentinel = True
                self.done_s = now
                # Read to the end of the body, so that the connection is reused
                # rather than closed (a new connect would land in a later TTFT);
                # what follows is ignored, read within the same bounds.
                async for _after in events:
                    pass
                return
            try:
                event = parse_event(data)
            except ValueError:
                self.fail(Outcome.STREAM_ERROR, f"malformed SSE data: {data[:80]!r}")
                continue
            self.take_event(event, now)
            limit = self.cancel_after_tokens
            if limit is not None and len(self.content_s) >= limit:
                self.fail(Outcome.CANCELLED, f"client closed after {limit} chunks")
                return
        # The body ended cleanly without [DONE]: complete if a finish came.
        self.done_s = time.monotonic()
        if not self.finished:
            self.fail(
                Outcome.STREAM_ERROR,
                f"stream ended {self.where()} without a finish_reason",
            )

    def take_event(self, event: object, now: float) -> None:
        if not isinstance(event, dict):
            self.fail(Outcome.STREAM_ERROR, "SSE data is not a JSON object")
            return
        if "error" in event:
            self.fail(Outcome.STREAM_ERROR, error_message(json.dumps(event).encode()))
        if isinstance(event.get("usage"), dict):
            self.usage = event["usage"]
            # core.wire.sse.ends_answer's rule, folded into this one pass over the chunk
            self.finished = True
        if isinstance(event.get("metrics"), dict):
            self.metrics = event["metrics"]
        if isinstance(event.get("timings"), dict):
            self.timings = event["timings"]
        choices = event.get("choices")
        if choices is not None and not isinstance(choices, list):
            self.fail(Outcome.STREAM_ERROR, "choices is not a list")
            return
        for choice in choices or ():
            if not isinstance(choice, dict):
                continue
            if choice_text(choice):
                self.content_s.append(now)
                if len(self.content_s) == 1 and self.on_first_token is not None:
                    self.on_first_token()
                if self.first_answer_s is None or self.text is not None:
                    answer = answer_text(choice)
                    if answer is not None:
                        if self.first_answer_s is None:
                            self.first_answer_s = now
                        if self.text is not None:
                            self.text.append(answer)
            if choice.get("finish_reason"):
                self.finish_reason = str(choice["finish_reason"])
                self.finished = True

    def read_whole(self, raw: bytes) -> None:
        now = time.monotonic()
        try:
            event = json.loads(raw)
        except json.JSONDecodeError:
            self.fail(Outcome.STREAM_ERROR, "response body is not JSON")
            return
        if isinstance(event, dict) and isinstance(event.get("choices"), list):
            for choice in event["choices"]:
                if isinstance(choice, dict) and isinstance(choice.get("message"), dict):
                    choice = {**choice, **choice["message"]}
                    event = {**event, "choices": [choice]}
        self.first_chunk_s = now
        self.take_event(event, now)

    def result(self) -> RequestTiming:
        end = self.done_s if self.done_s is not None else time.monotonic()
        usage = self.usage or {}
        completion = usage.get("completion_tokens")
        prompt = usage.get("prompt_tokens")
        if isinstance(completion, int):
            tokens, source = completion, TokenSource.USAGE
        else:
            tokens, source = len(self.content_s), TokenSource.CHUNKS
        facts = server_facts(usage, self.metrics, self.timings)
        tags = self.tags or _NO_TAGS
        return RequestTiming(
            request_id=self.request_id,
            stage=self.stage,
            scheduled_s=self.scheduled_s,
            sent_s=self.sent_s,
            end_s=end,
            outcome=self.outcome,
            headers_s=self.headers_s,
            first_chunk_s=self.first_chunk_s,
            content_s=tuple(self.content_s),
            status=self.status,
            prompt_tokens=prompt if isinstance(prompt, int) else None,
            output_tokens=tokens,
            token_source=source,
            finish_reason=self.finish_reason,
            error=self.error,
            done_sentinel=self.done_sentinel,
            reconnects=self.reconnects,
            first_answer_s=self.first_answer_s,
            model=tags.model,
            session=tags.session,
            turn=tags.turn,
            history_tokens=tags.history_tokens,
            text=None if self.text is None else "".join(self.text),
            **facts,
        )


_NO_TAGS = RequestTags()


def parse_event(data: str) -> JSONValue:
    """One SSE event's JSON: orjson (0.75 µs for a vLLM token chunk against 2.6 µs
    for the standard library, run once per token), else the standard library, which
    also reads what orjson refuses (``NaN``/``Infinity`` literals, integers past
    64 bits). Raises ValueError when neither can read it (nesting too deep too)."""
    value: JSONValue
    try:
        value = orjson.loads(data)
    except orjson.JSONDecodeError:
        try:
            value = json.loads(data)
        except RecursionError as exc:
            raise ValueError("JSON nested too deeply") from exc
    return value


def server_facts(
    usage: Mapping[str, object],
    metrics: Mapping[str, object] | None,
    timings: Mapping[str, object] | None,
) -> ServerFacts:
    """What the server reported about the request, as RequestTiming fields.

    ``usage.completion_tokens_details.reasoning_tokens`` (OpenAI's, and servers
    that follow it); ``usage.prompt_tokens_details.cached_tokens`` (vLLM with
    ``--enable-prompt-tokens-details``, llama.cpp, OpenAI); vLLM's ``metrics``
    (``--enable-per-request-metrics``: ``queue_time_ms`` = scheduled - queued,
    ``time_to_first_token_ms`` = first token - scheduled, ``generation_time_ms`` =
    last token - first token); llama.cpp's ``timings`` (``cache_n`` cached prompt
    tokens, ``prompt_ms`` prompt processing, ``predicted_ms`` generation; no queue
    time). Absent or ill-typed values are left out, never guessed.
    """
    facts: ServerFacts = {}
    details = usage.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    if timings is not None and not _is_count(cached):
        cached = timings.get("cache_n")
    if _is_count(cached):
        facts["cached_tokens"] = cached
    details = usage.get("completion_tokens_details")
    reasoning = details.get("reasoning_tokens") if isinstance(details, dict) else None
    if _is_count(reasoning):
        facts["reasoning_tokens"] = reasoning
    if metrics is not None:
        queue = _ms(metrics.get("queue_time_ms"))
        prefill = _ms(metrics.get("time_to_first_token_ms"))
        if queue is not None or prefill is not None:
            facts["server_source"] = "vllm"
            facts["server_queue_s"] = queue
            facts["server_prefill_s"] = prefill
            facts["server_decode_s"] = _ms(metrics.get("generation_time_ms"))
    elif timings is not None:
        prefill = _ms(timings.get("prompt_ms"))
        if prefill is not None:
            facts["server_source"] = "llamacpp"
            facts["server_prefill_s"] = prefill
            facts["server_decode_s"] = _ms(timings.get("predicted_ms"))
    return facts


def _is_count(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _ms(value: object) -> float | None:
    """Milliseconds as seconds; None for anything but a finite number >= 0."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if not 0 <= value < float("inf"):
        return None
    return value / 1000.0
