"""One request's timeline as the client saw it, and the figures derived from it.

All times are ``time.monotonic()`` seconds. Definitions (see ``docs/metrics.md``):

- TTFT: first chunk carrying non-empty content (or reasoning content) minus the
  actual send. A role-only or empty chunk is not content; its time is kept as
  ``first_chunk_s`` and reported as time to first chunk.
- TTFA: the first chunk of the answer itself (content that is not reasoning) minus
  the actual send; equal to TTFT for a model that does not reason.
- ITL: each gap between consecutive content chunks.
- TPOT: (E2E - TTFT) / (output tokens - 1).
- dispatch lag: actual send minus scheduled send.
- TTFT and E2E from the scheduled send: the same ends, measured from when the request
  was due, so a client that fell behind its schedule cannot hide the wait.

What the server said about the request itself, where it said anything, sits beside
(``cached_tokens``, ``server_queue_s``, ``server_prefill_s``, ``server_decode_s``,
``server_source``): from ``usage.prompt_tokens_details``, vLLM's per-request
``metrics`` or llama.cpp's ``timings``. With them TTFT splits into the server's part
(queue + prefill) and the rest, the client-side gap (network, HTTP, the server's
front end, detokenization; for llama.cpp, which reports no queue time, the wait for a
slot too).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from enum import StrEnum

from servemon.core.outcomes import Outcome

__all__ = ["Outcome", "RequestTiming", "TokenSource"]


class TokenSource(StrEnum):
    """Where a request's output token count came from."""

    USAGE = "usage"
    TOKENIZER = "tokenizer"
    CHUNKS = "chunks"


@dataclass(frozen=True, slots=True, kw_only=True)
class RequestTiming:
    """Monotonic timestamps and counts of one request."""

    request_id: str
    stage: int = 0
    scheduled_s: float
    sent_s: float
    end_s: float
    outcome: Outcome
    headers_s: float | None = None
    first_chunk_s: float | None = None
    content_s: tuple[float, ...] = ()
    status: int | None = None
    prompt_tokens: int | None = None
    output_tokens: int = 0
    token_source: TokenSource = TokenSource.CHUNKS
    finish_reason: str | None = None
    error: str | None = None
    #: Whether the stream ended with ``data: [DONE]`` (optional in the protocol).
    done_sentinel: bool = False
    #: Times the request was sent again at once because the pooled connection it
    #: went out on had been closed by the server while idle (nothing reached it).
    reconnects: int = 0
    #: Prompt tokens the server served from its prefix cache, as it reported them.
    cached_tokens: int | None = None
    #: Server-reported seconds in the queue (vLLM: scheduled minus queued).
    server_queue_s: float | None = None
    #: Server-reported seconds from scheduling to the first token (vLLM's
    #: ``time_to_first_token_ms``; llama.cpp's ``prompt_ms``).
    server_prefill_s: float | None = None
    #: Server-reported seconds from the first to the last token.
    server_decode_s: float | None = None
    #: Which report those came from: ``vllm`` (per-request metrics), ``llamacpp``
    #: (timings), or None.
    server_source: str | None = None
    #: When the first answer chunk (content that is not reasoning) arrived.
    first_answer_s: float | None = None
    #: Reasoning tokens, as ``usage.completion_tokens_details`` gave them.
    reasoning_tokens: int | None = None
    #: The model the request asked for (one of a ``--model`` mix); None: the run's.
    model: str | None = None
    #: The conversation a turn belongs to (sessions workloads), its 1-based turn
    #: index, and the tokens of history it sent before the new user message.
    session: str | None = None
    turn: int | None = None
    history_tokens: int | None = None
    #: The fleet's worker that sent it (:mod:`servemon.loadgen.fleet`); None: this
    #: process.
    worker: int | None = None
    #: The answer's text, when the caller asked for it (a session's next turn
    #: sends it back); never written to the run record.
    text: str | None = None

    @property
    def first_content_s(self) -> float | None:
        """When the first content chunk arrived."""
        return self.content_s[0] if self.content_s else None

    @property
    def ttft(self) -> float | None:
        """Time to first token: first content chunk minus actual send."""
        first = self.first_content_s
        return None if first is None else first - self.sent_s

    @property
    def ttfa(self) -> float | None:
        """Time to the first answer token (after any reasoning) minus actual send."""
        first = self.first_answer_s
        return None if first is None else first - self.sent_s

    @property
    def time_to_first_chunk(self) -> float | None:
        """First SSE chunk of any kind minus actual send."""
        return None if self.first_chunk_s is None else self.first_chunk_s - self.sent_s

    @property
    def e2e(self) -> float:
        """End minus actual send."""
        return self.end_s - self.sent_s

    @property
    def ttft_from_scheduled(self) -> float | None:
        """First content chunk minus scheduled send: what a user arriving on
        schedule waited for the first token."""
        first = self.first_content_s
        return None if first is None else first - self.scheduled_s

    @property
    def e2e_from_scheduled(self) -> float:
        """End minus scheduled send."""
        return self.end_s - self.scheduled_s

    @property
    def dispatch_lag(self) -> float:
        """How late the request went out against its schedule."""
        return self.sent_s - self.scheduled_s

    @property
    def itl(self) -> list[float]:
        """Gaps between consecutive content chunks."""
        times = self.content_s
        return [b - a for a, b in itertools.pairwise(times)]

    @property
    def server_ttft(self) -> float | None:
        """The server's share of TTFT: its queue time (0 if it reports none) plus
        its time from scheduling to the first token."""
        if self.server_prefill_s is None:
            return None
        return (self.server_queue_s or 0.0) + self.server_prefill_s

    @property
    def ttft_gap(self) -> float | None:
        """Client-side TTFT minus the server's share: network, HTTP and front end."""
        ttft, server = self.ttft, self.server_ttft
        return None if ttft is None or server is None else ttft - server

    @property
    def cached_fraction(self) -> float | None:
        """Cached prompt tokens over prompt tokens, where both are known."""
        if self.cached_tokens is None or not self.prompt_tokens:
            return None
        return min(self.cached_tokens / self.prompt_tokens, 1.0)

    @property
    def tpot(self) -> float | None:
        """(E2E - TTFT) / (output tokens - 1); None below two tokens."""
        ttft = self.ttft
        if ttft is None or self.output_tokens < 2:
            return None
        return (self.e2e - ttft) / (self.output_tokens - 1)
