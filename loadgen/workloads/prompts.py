"""What a workload yields and what a request becomes: :class:`Prompt`, the
:class:`Workload` protocol every kind of workload follows, output budgets, and the
request body built from a prompt (:func:`request_body`)."""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal, Protocol

__all__ = [
    "OutputBudget",
    "Prompt",
    "Workload",
    "chat_body",
    "random_prompt",
    "request_body",
]

# The word list of random_prompt, unchanged so recorded benchmark prompts reproduce.
_BENCH_WORDS_TEXT = """
    alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike
    november oscar papa quebec romeo sierra tango uniform victor whiskey xray yankee
    zulu river mountain forest ocean desert valley island meadow canyon glacier
    harbor lantern compass anchor beacon bridge castle garden market orchard village
    tower window mirror silver copper marble velvet
    """
_BENCH_WORDS: tuple[str, ...] = tuple(_BENCH_WORDS_TEXT.split())


@dataclass(frozen=True, slots=True)
class Prompt:
    """One request's input and output budget."""

    #: The text for the completions API, or a single user message for chat.
    text: str | None
    #: Chat messages, when the source had them.
    messages: tuple[dict[str, str], ...] | None
    #: Content tokens as counted by the workload's counter (no chat template);
    #: ``None`` when unknown.
    prompt_tokens: int | None
    #: ``max_tokens`` to ask for.
    max_tokens: int
    #: Why this request is not to be sent, where it is not (``over_context``: a
    #: trace's line longer than the target's context, ``--over-context skip``).
    skip: str | None = None


class Workload(Protocol):
    """A deterministic source of prompts, indexed by request number."""

    @property
    def spec(self) -> str:
        """The ``--workload`` spec as given."""
        ...

    @property
    def token_source(self) -> str:
        """The counter's ``source`` the lengths rest on, or ``"none"``."""
        ...

    def prompt(self, index: int) -> Prompt:
        """The prompt of request ``index``: the same for the same seed and index."""
        ...


def random_prompt(rng: random.Random, words: int) -> str:
    """``words`` random words separated by spaces (one token each in the simulator)."""
    return " ".join(rng.choice(_BENCH_WORDS) for _ in range(words))


def chat_body(
    model: str,
    prompt: str,
    max_tokens: int,
    *,
    stream: bool = True,
    ignore_eos: bool = False,
) -> dict[str, object]:
    """A chat completion request that asks for usage in the stream."""
    body: dict[str, object] = {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "stream": stream,
    }
    if stream:
        body["stream_options"] = {"include_usage": True}
    if ignore_eos:
        body["ignore_eos"] = True
    return body


def request_body(
    prompt: Prompt,
    *,
    api: Literal["chat", "completions"],
    model: str,
    stream: bool,
    ignore_eos: bool,
    extra_body: Mapping[str, object] | None,
) -> dict[str, object]:
    """The JSON body of a chat or completions request for ``prompt``.

    Chat sends the prompt's messages (or its text as one user message); completions
    sends its text (or the messages' contents joined by blank lines). Streaming asks
    for usage. ``extra_body`` is merged last, nested objects key by key.
    """
    body: dict[str, object] = {"model": model}
    if api == "chat":
        if prompt.messages is not None:
            body["messages"] = [dict(message) for message in prompt.messages]
        else:
            body["messages"] = [{"role": "user", "content": prompt.text or ""}]
    elif prompt.text is not None:
        body["prompt"] = prompt.text
    else:
        body["prompt"] = "\n\n".join(m["content"] for m in prompt.messages or ())
    body["max_tokens"] = prompt.max_tokens
    body["stream"] = stream
    if stream:
        body["stream_options"] = {"include_usage": True}
    if ignore_eos:
        body["ignore_eos"] = True
    return _merged(body, extra_body) if extra_body else body


def _merged(
    base: Mapping[str, object], extra: Mapping[str, object]
) -> dict[str, object]:
    out = dict(base)
    for key, value in extra.items():
        if isinstance(value, Mapping):
            below = out.get(key)
            out[key] = _merged(below if isinstance(below, Mapping) else {}, value)
        else:
            out[key] = value
    return out


@dataclass(frozen=True, slots=True)
class OutputBudget:
    """Output budgets: fixed, or uniform in ``[low, high]`` per request index."""

    low: int
    high: int

    def draw(self, seed: int, index: int) -> int:
        if self.low == self.high:
            return self.low
        return random.Random(f"{seed}:output:{index}").randint(self.low, self.high)
