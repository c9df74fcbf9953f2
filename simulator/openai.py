"""The OpenAI-compatible requests as vLLM takes them: parsing, errors.

Chat prompts go through a small chat template: each message costs its content's
tokens plus three (start marker, role, end marker), and the assistant's turn opens
with one more, so one 128-token user message is a 132-token prompt.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from servemon.simulator.tokenizer import VOCAB_SIZE, WordTokenizer

__all__ = ["ApiError", "ParsedRequest", "error_body", "parse_request"]

IM_START, IM_END, ASSISTANT = VOCAB_SIZE, VOCAB_SIZE + 1, VOCAB_SIZE + 2
_ROLE_IDS = {"system": VOCAB_SIZE + 3, "user": VOCAB_SIZE + 4, "assistant": ASSISTANT}


class ApiError(Exception):
    """A request the API refuses, answered with OpenAI's error JSON."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        kind: str = "BadRequestError",
        param: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.kind = kind
        self.param = param

    def body(self, dialect: str = "vllm") -> dict[str, object]:
        """The JSON body."""
        return error_body(
            self.status, self.message, self.kind, self.param, dialect=dialect
        )


def error_body(
    status: int,
    message: str,
    kind: str,
    param: str | None = None,
    *,
    dialect: str = "vllm",
) -> dict[str, object]:
    """OpenAI's error object (FastAPI's ``{"detail": ...}`` for Transformers Serve)."""
    if dialect == "transformers":
        return {"detail": message}
    return {"error": {"message": message, "type": kind, "param": param, "code": status}}


@dataclass(frozen=True, slots=True)
class ParsedRequest:
    """What the engine needs from a completion request."""

    api: Literal["chat", "completions"]
    model: str | None
    prompt: list[int]
    max_tokens: int | None
    min_tokens: int
    ignore_eos: bool
    stream: bool
    include_usage: bool


def parse_request(
    api: Literal["chat", "completions"], body: object, tokenizer: WordTokenizer
) -> ParsedRequest:
    """Validate a request body; raise :class:`ApiError` naming the bad field."""
    if not isinstance(body, dict):
        raise ApiError(400, "The request body must be a JSON object.")
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise ApiError(400, "model must be a string", param="model")
    prompt = (
        _chat_prompt(body, tokenizer)
        if api == "chat"
        else _text_prompt(body, tokenizer)
    )
    limit = body.get("max_completion_tokens", body.get("max_tokens"))
    max_tokens = _int(body, "max_tokens", limit, minimum=1, optional=True)
    min_tokens = _int(body, "min_tokens", body.get("min_tokens", 0), minimum=0) or 0
    n = _int(body, "n", body.get("n", 1), minimum=1)
    if n != 1:
        raise ApiError(400, "Only n=1 is supported by this server.", param="n")
    stream = _bool(body, "stream", default=False)
    options = body.get("stream_options") or {}
    if not isinstance(options, dict):
        raise ApiError(400, "stream_options must be an object", param="stream_options")
    include_usage = bool(options.get("include_usage", False))
    if include_usage and not stream:
        raise ApiError(
            400,
            "Stream options can only be defined when `stream=True`.",
            param="stream_options",
        )
    if max_tokens is not None and min_tokens > max_tokens:
        raise ApiError(
            400,
            "min_tokens must be less than or equal to max_tokens",
            param="min_tokens",
        )
    return ParsedRequest(
        api=api,
        model=model,
        prompt=prompt,
        max_tokens=max_tokens,
        min_tokens=min_tokens,
        ignore_eos=_bool(body, "ignore_eos", default=False),
        stream=stream,
        include_usage=include_usage,
    )


def _int(
    body: Mapping[str, object],
    name: str,
    value: object,
    *,
    minimum: int,
    optional: bool = False,
) -> int | None:
    if value is None and optional:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ApiError(
            400, f"{name} must be an integer >= {minimum}, got {value!r}", param=name
        )
    return value


def _bool(body: Mapping[str, object], name: str, *, default: bool) -> bool:
    value = body.get(name, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise ApiError(400, f"{name} must be a boolean, got {value!r}", param=name)
    return value


def _chat_prompt(body: Mapping[str, object], tokenizer: WordTokenizer) -> list[int]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ApiError(400, "messages must be a non-empty list", param="messages")
    tokens: list[int] = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise ApiError(400, f"messages[{i}] must be an object", param="messages")
        role = message.get("role")
        if role not in ("system", "user", "assistant", "tool", "developer"):
            raise ApiError(
                400,
                f"messages[{i}].role is not a known role: {role!r}",
                param="messages",
            )
        tokens += (IM_START, _ROLE_IDS.get(role, VOCAB_SIZE + 5))
        tokens += tokenizer.encode(_content_text(message.get("content"), i))
        tokens.append(IM_END)
    tokens.append(IM_START)  # the assistant's turn opens the generation
    return tokens


def _content_text(content: object, index: int) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, dict) and part.get("type") == "text":
                parts.append(str(part.get("text", "")))
        return "\n".join(parts)
    raise ApiError(
        400,
        f"messages[{index}].content must be a string or a list of parts",
        param="messages",
    )


def _text_prompt(body: Mapping[str, object], tokenizer: WordTokenizer) -> list[int]:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1:
        prompt = prompt[0]
    if isinstance(prompt, str):
        return tokenizer.encode(prompt)
    if (
        isinstance(prompt, list)
        and prompt
        and all(
            isinstance(t, int) and not isinstance(t, bool) and 0 <= t < VOCAB_SIZE
            for t in prompt
        )
    ):
        return list(prompt)
    raise ApiError(
        400,
        "prompt must be a string or a list of token ids (one prompt)",
        param="prompt",
    )
