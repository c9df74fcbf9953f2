"""One request's timeline as the client saw it, and the figures derived from it.

All times are ``time.monotonic()`` seconds. Definitions (see ``docs/metrics.md``):

- TTFT: first chunk carrying non-empty content (or reasoning content) minus the
  actual send. A role-only or empty chunk is not content; its time is kept as
  ``first_chunk_s`` and reported as time to first chunk.
- ITL: each gap between consecutive content chunks.
- TPOT: (E2E - TTFT) / (output tokens - 1).
- dispatch lag: actual send minus scheduled send.
- TTFT and E2E from the scheduled send: the same ends, measured from when the request
  was due, so a client that fell behind its schedule cannot hide the wait.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from enum import StrEnum

__all__ = ["Outcome", "RequestTiming", "TokenSource"]


class Outcome(StrEnum):
    """How a request ended."""

    OK = "ok"
    HTTP_ERROR = "http_error"
    TIMEOUT = "timeout"
    CONNECT_ERROR = "connect_error"
    STREAM_ERROR = "stream_error"
    CANCELLED = "cancelled"


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
    def tpot(self) -> float | None:
        """(E2E - TTFT) / (output tokens - 1); None below two tokens."""
        ttft = self.ttft
        if ttft is None or self.output_tokens < 2:
            return None
        return (self.e2e - ttft) / (self.output_tokens - 1)
