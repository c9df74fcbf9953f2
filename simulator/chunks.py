"""The answer's wire format as each server writes it: SSE chunks and whole bodies.

:class:`ChunkWriter` builds one request's events and final JSON in a dialect
(vLLM, Transformers Serve, llama.cpp), with what the server says about the request
(:class:`ServerFacts`: usage, vLLM's per-request ``metrics``, llama.cpp's
``timings``). Parsing requests is :mod:`servemon.simulator.openai`'s.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

__all__ = [
    "DONE",
    "MALFORMED",
    "ChunkWriter",
    "ServerFacts",
    "llamacpp_timings",
    "vllm_metrics",
]


@dataclass(frozen=True, slots=True)
class ServerFacts:
    """What a server may say about one finished request (engine monotonic times)."""

    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    #: Of the completion tokens, those of the reasoning that came first.
    reasoning_tokens: int
    queued_s: float
    scheduled_s: float | None
    first_token_s: float | None
    last_token_s: float | None


class ChunkWriter:
    """Builds one request's SSE events and final JSON, as a dialect formats them.

    ``vllm``: a role chunk ``{"role":"assistant","content":""}``, content chunks, the
    finish reason on the last content chunk, a usage chunk with empty ``choices``
    when asked (``stream_options.include_usage``), ``data: [DONE]``.
    ``transformers`` (Transformers Serve 5.x): a role chunk without content, content
    chunks, then a finish chunk with an empty delta that carries ``usage`` always,
    and no ``[DONE]``. ``llamacpp`` (llama-server): a role chunk with
    ``"content": null``, content chunks, a finish chunk with an empty delta, a usage
    chunk when asked (``prompt_tokens_details.cached_tokens`` in it), ``timings`` on
    the last chunk, ``[DONE]``.

    Reasoning (chat only) goes in ``reasoning_field`` of the delta or message
    (``both``: ``reasoning`` and ``reasoning_content``, the same text); with
    ``reasoning_usage``, usage has ``completion_tokens_details.reasoning_tokens``.
    A completion's reasoning is plain text, as vLLM's completions API gives it.
    """

    __slots__ = (
        "_head",
        "_reasoning_keys",
        "_tail",
        "api",
        "created",
        "details",
        "dialect",
        "metrics",
        "model",
        "reasoning_usage",
        "response_id",
    )

    def __init__(
        self,
        api: Literal["chat", "completions"],
        response_id: str,
        model: str,
        *,
        dialect: str = "vllm",
        details: bool = False,
        metrics: bool = False,
        reasoning_field: str = "reasoning_content",
        reasoning_usage: bool = False,
    ) -> None:
        self.api = api
        self._reasoning_keys = (
            ("reasoning", "reasoning_content")
            if reasoning_field == "both"
            else (reasoning_field,)
        )
        self.reasoning_usage = reasoning_usage and api == "chat"
        self.response_id = response_id
        self.model = model
        self.dialect = dialect
        #: usage.prompt_tokens_details (vLLM's flag; llama.cpp always).
        self.details = details or dialect == "llamacpp"
        #: vLLM's per-request ``metrics`` object.
        self.metrics = metrics and dialect == "vllm"
        self.created = int(time.time())
        obj = "chat.completion.chunk" if api == "chat" else "text_completion"
        self._head = (
            f'data: {{"id":{json.dumps(response_id)},"object":"{obj}",'
            f'"created":{self.created},"model":{json.dumps(model)},"choices":[{{"index":0,'
        )
        self._tail = "}]}\n\n"

    @property
    def finish_in_content(self) -> bool:
        """Whether the last content chunk carries the finish reason (vLLM)."""
        return self.dialect == "vllm"

    @property
    def sends_done(self) -> bool:
        """Whether the stream ends with ``data: [DONE]``."""
        return self.dialect != "transformers"

    def role(self) -> bytes:
        """The first chat chunk: the role, before any token."""
        if self.dialect == "transformers":
            delta = '"delta":{"role":"assistant"}'
        elif self.dialect == "llamacpp":
            delta = '"delta":{"role":"assistant","content":null}'
        else:
            delta = '"delta":{"role":"assistant","content":""}'
        return (
            self._head + delta + ',"logprobs":null,"finish_reason":null' + self._tail
        ).encode()

    def content(
        self, text: str, finish_reason: str | None, reasoning: str = ""
    ) -> bytes:
        """A chunk carrying generated text (and, for vLLM, the finish on the last);
        ``reasoning`` is text of the reasoning that comes before it."""
        if not self.finish_in_content:
            finish_reason = None
        reason = "null" if finish_reason is None else f'"{finish_reason}"'
        if self.api == "chat":
            parts = [
                f'"{key}":{json.dumps(reasoning)}' for key in self._keys(reasoning)
            ]
            if text or not reasoning:
                parts.append(f'"content":{json.dumps(text)}')
            body = '"delta":{' + ",".join(parts) + '},"logprobs":null,'
        else:
            body = f'"text":{json.dumps(reasoning + text)},"logprobs":null,'
        return (self._head + body + f'"finish_reason":{reason}' + self._tail).encode()

    def _keys(self, reasoning: str) -> tuple[str, ...]:
        return self._reasoning_keys if reasoning else ()

    def finish(
        self, finish_reason: str | None, facts: ServerFacts, *, usage_follows: bool
    ) -> bytes | None:
        """The separate finish chunk of Transformers Serve and llama.cpp."""
        if self.finish_in_content:
            return None
        choice: dict[str, object] = {"index": 0, "finish_reason": finish_reason}
        if self.api == "chat":
            choice["delta"] = {}
        else:
            choice["text"] = ""
        event = self._event([choice])
        if self.dialect == "transformers":
            event["usage"] = _usage(facts.prompt_tokens, facts.completion_tokens)
        elif not usage_follows:
            event["timings"] = llamacpp_timings(facts)
        return _sse(event)

    def usage(self, facts: ServerFacts) -> bytes | None:
        """The usage chunk (``stream_options.include_usage``): no choices."""
        if self.dialect == "transformers":
            return None  # usage rides on its finish chunk
        event = self._event([])
        event["usage"] = self._usage(facts)
        self._add_facts(event, facts)
        return _sse(event)

    def full(
        self,
        text: str,
        finish_reason: str | None,
        facts: ServerFacts,
        reasoning: str = "",
    ) -> dict[str, object]:
        """The non-streaming response body (``reasoning`` before ``text``)."""
        choice: dict[str, object] = {
            "index": 0,
            "logprobs": None,
            "finish_reason": finish_reason,
        }
        if self.api == "chat":
            # All of it reasoning: no content, as vLLM's reasoning parsers leave it.
            content = None if reasoning and not text else text
            message: dict[str, object] = {"role": "assistant", "content": content}
            for key in self._keys(reasoning):
                message[key] = reasoning
            choice["message"] = message
        else:
            choice["text"] = reasoning + text
        body = self._event([choice])
        body["object"] = "chat.completion" if self.api == "chat" else "text_completion"
        body["usage"] = self._usage(facts)
        self._add_facts(body, facts)
        return body

    def _event(self, choices: list[dict[str, object]]) -> dict[str, object]:
        obj = "chat.completion.chunk" if self.api == "chat" else "text_completion"
        return {
            "id": self.response_id,
            "object": obj,
            "created": self.created,
            "model": self.model,
            "choices": choices,
        }

    def _usage(self, facts: ServerFacts) -> dict[str, object]:
        usage: dict[str, object] = {
            **_usage(facts.prompt_tokens, facts.completion_tokens)
        }
        if self.details:
            usage["prompt_tokens_details"] = {"cached_tokens": facts.cached_tokens}
        if self.reasoning_usage:
            usage["completion_tokens_details"] = {
                "reasoning_tokens": facts.reasoning_tokens
            }
        return usage

    def _add_facts(self, event: dict[str, object], facts: ServerFacts) -> None:
        if self.metrics:
            event["metrics"] = vllm_metrics(facts)
        if self.dialect == "llamacpp":
            event["timings"] = llamacpp_timings(facts)


def vllm_metrics(facts: ServerFacts) -> dict[str, float]:
    """vLLM's per-request ``metrics`` (``--enable-per-request-metrics``): queue =
    scheduled - queued, TTFT = first token - scheduled, generation = last - first
    token, mean ITL over the gaps, tokens per second from scheduling; in ms."""
    out: dict[str, float] = {}
    sched, first, last = facts.scheduled_s, facts.first_token_s, facts.last_token_s
    if sched is not None:
        out["queue_time_ms"] = (sched - facts.queued_s) * 1000.0
    if sched is not None and first is not None:
        out["time_to_first_token_ms"] = (first - sched) * 1000.0
    if first is not None and last is not None:
        out["generation_time_ms"] = (last - first) * 1000.0
        if facts.completion_tokens > 1:
            gaps = facts.completion_tokens - 1
            out["mean_itl_ms"] = (last - first) * 1000.0 / gaps
    if sched is not None and last is not None and last > sched:
        out["tokens_per_second"] = facts.completion_tokens / (last - sched)
    return out


def llamacpp_timings(facts: ServerFacts) -> dict[str, float]:
    """llama.cpp's ``timings``: cached and evaluated prompt tokens, prompt and
    generation time in ms (no queue time: llama.cpp does not report one)."""
    sched, first, last = facts.scheduled_s, facts.first_token_s, facts.last_token_s
    prompt_ms = (first - sched) * 1000.0 if sched is not None and first else 0.0
    predicted_ms = (last - first) * 1000.0 if first is not None and last else 0.0
    evaluated = facts.prompt_tokens - facts.cached_tokens
    return {
        "cache_n": facts.cached_tokens,
        "prompt_n": evaluated,
        "prompt_ms": prompt_ms,
        "prompt_per_token_ms": prompt_ms / evaluated if evaluated else 0.0,
        "predicted_n": facts.completion_tokens,
        "predicted_ms": predicted_ms,
    }


def _sse(event: Mapping[str, object]) -> bytes:
    return b"data: " + json.dumps(event, separators=(",", ":")).encode() + b"\n\n"


def _usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
    }


DONE = b"data: [DONE]\n\n"
MALFORMED = b'data: {"id":"broken","choices":[{"index":0,"delta":{"content":\n\n'
