"""A seeded pool of words that texts of an exact token count are cut from: the trace
and sessions workloads build their prompts so (the same key, the same text)."""

from __future__ import annotations

import random
from functools import lru_cache

from servemon.loadgen.workloads.tokens import TOKENS_PER_WORD

__all__ = ["POOL_WORDS", "pool_text"]


#: Words in a seeded pool that :func:`pool_text` cuts texts from.
POOL_WORDS = 1 << 17


def pool_text(
    words: tuple[str, ...], seed: int, key: str, tokens: int, *, exact: bool
) -> str:
    """``tokens`` tokens of words from a seeded pool of ``words``, from an offset
    seeded by ``key``: the same text for the same key, a different one for another.
    With ``exact`` (words that count one token each) one word a token; else as many
    words as the estimate says. A text longer than the pool goes round it again: no
    prefix cache takes the repeat for sharing, since it hashes each block with
    everything before it."""
    count = tokens if exact else max(1, round(tokens / TOKENS_PER_WORD))
    pool = _pool(words, seed)
    rng = random.Random(f"{seed}:{key}")
    if count < POOL_WORDS:
        start = rng.randrange(POOL_WORDS - count)
        return " ".join(pool[start : start + count])
    start = rng.randrange(POOL_WORDS)
    parts, left = [], count
    while left:
        take = min(left, POOL_WORDS - start)
        parts.append(" ".join(pool[start : start + take]))
        left -= take
        start = 0
    return " ".join(parts)


@lru_cache(maxsize=4)
def _pool(words: tuple[str, ...], seed: int) -> tuple[str, ...]:
    rng = random.Random(f"trace-pool:{seed}")
    return tuple(rng.choice(words) for _ in range(POOL_WORDS))
