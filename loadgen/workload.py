"""Prompts to send. So far: random prompts of a given length in words.

Each word is a plain lowercase word, one token for the simulator's tokenizer and one
to two for BPE tokenizers; exact lengths for real tokenizers come with the workload
layer (a local ``tokenizer.json`` or the target's ``/tokenize``).
"""

from __future__ import annotations

import random
from typing import Any

__all__ = ["chat_body", "random_prompt"]

_WORDS_TEXT = (
    "alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike "
    "november oscar papa quebec romeo sierra tango uniform victor whiskey xray "
    "yankee zulu river mountain forest ocean desert valley island meadow canyon "
    "glacier harbor lantern compass anchor beacon bridge castle garden market "
    "orchard village tower window mirror silver copper marble velvet "
)
_WORDS = tuple(_WORDS_TEXT.split())


def random_prompt(rng: random.Random, words: int) -> str:
    """``words`` random words separated by spaces."""
    return " ".join(rng.choice(_WORDS) for _ in range(words))


def chat_body(
    model: str,
    prompt: str,
    max_tokens: int,
    *,
    stream: bool = True,
    ignore_eos: bool = False,
) -> dict[str, Any]:
    """A chat completion request that asks for usage in the stream."""
    body: dict[str, Any] = {
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
