"""The synthetic workloads: ``random`` (every prompt distinct from its first
tokens on) and ``shared-prefix`` (hot prefixes, a fresh suffix per request), with
exact lengths under the run's token counter (see
:mod:`servemon.loadgen.workloads.workload`)."""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, replace

from servemon.core.errors import ConfigError
from servemon.loadgen.workloads.prompts import OutputBudget, Prompt, Workload
from servemon.loadgen.workloads.tokens import (
    WORDS,
    TextFitter,
    TokenCounter,
    count_each,
    estimate_tokens,
)

__all__ = ["build_random", "build_shared_prefix"]

_VERIFY = 8  # shared-prefix requests counted whole when the workload is built


@dataclass(frozen=True, slots=True)
class _RandomWorkload:
    """``random``: a head of its own per request, then a body from a pool.

    The head is request ``index`` written as ``head_length`` digits in base
    ``len(head_words)`` (each digit a word), with every position's digits shuffled
    by the seed: distinct indices get distinct heads, so two prompts differ from
    their first few tokens on and a prefix cache finds nothing to share. Heads
    repeat only past ``len(head_words) ** head_length`` requests.
    """

    spec: str
    token_source: str
    seed: int
    pool: tuple[tuple[str, int], ...]  # bodies and their counts
    head_words: tuple[str, ...]
    head_length: int
    head_tokens: int
    shuffles: tuple[tuple[int, ...], ...]  # per head position, digit -> word index
    exact: bool  # head words count one token each and add up with the body
    output: OutputBudget

    def head(self, index: int) -> str:
        base = len(self.head_words)
        words = []
        for position in range(self.head_length):
            index, digit = divmod(index, base)
            words.append(self.head_words[self.shuffles[position][digit]])
        return " ".join(words)

    def prompt(self, index: int) -> Prompt:
        """Head ``index``, then pool entry ``index % len(pool)``."""
        body, body_tokens = self.pool[index % len(self.pool)]
        text = f"{self.head(index)} {body}" if body else self.head(index)
        if self.exact:
            tokens: int | None = self.head_tokens + body_tokens
        elif self.token_source == "estimate":
            tokens = estimate_tokens(text)
        else:
            tokens = None
        return Prompt(text, None, tokens, self.output.draw(self.seed, index))


#: Head length: distinct heads for at least this many requests.
_DISTINCT_HEADS = 10**9
_MIN_HEAD = 4
_HEAD_CANDIDATES = 64  # words counted for a head when no word counts one token


async def build_random(
    spec: str,
    counter: TokenCounter,
    seed: int,
    pool_size: int,
    *,
    tokens: int,
    output: OutputBudget,
) -> Workload:
    if pool_size < 1:
        raise ConfigError(
            f"--workload: random: pool size must be >= 1, got {pool_size}"
        )
    fitter = await TextFitter.calibrate(counter)
    estimated = counter.source == "estimate"
    # Head words of one known count each: the one-token words where the counter
    # has them, else the commonest count among a few of the word list's words.
    head_words: tuple[str, ...] = tuple(dict.fromkeys(fitter.fillers))
    per_word = 1
    if not head_words:
        candidates = WORDS[:_HEAD_CANDIDATES]
        counts = await count_each(counter, list(candidates))
        per_word = max(1, Counter(counts).most_common(1)[0][0])
        head_words = tuple(w for w, n in zip(candidates, counts, strict=True) if n)
        head_words = (
            tuple(w for w, n in zip(candidates, counts, strict=True) if n == per_word)
            or head_words
        )
    length = _MIN_HEAD
    while len(head_words) ** length < _DISTINCT_HEADS and length < 16:
        length += 1
    length = max(1, min(length, tokens // per_word))
    rng = random.Random(f"{seed}:heads")
    shuffles = tuple(
        tuple(rng.sample(range(len(head_words)), len(head_words)))
        for _ in range(length)
    )
    head_tokens = (
        estimate_tokens(" ".join(WORDS[:length])) if estimated else (length * per_word)
    )
    body_tokens = tokens - head_tokens
    if body_tokens > 0:
        pool = await fitter.fit_distinct(random.Random(seed), pool_size, body_tokens)
    else:
        pool = [("", 0)]
    workload = _RandomWorkload(
        spec=spec,
        token_source=counter.source,
        seed=seed,
        pool=tuple(pool),
        head_words=head_words,
        head_length=length,
        head_tokens=head_tokens,
        shuffles=shuffles,
        exact=not estimated,
        output=output,
    )
    # Heads and bodies add up under this counter? Check a few whole prompts.
    if workload.exact and not await _lengths_add_up(workload, counter, 2 * len(pool)):
        workload = replace(workload, exact=False)
    return workload


async def _lengths_add_up(workload: Workload, counter: TokenCounter, most: int) -> bool:
    """Whether the first few prompts count as long as the workload says they are
    (its parts' counts add up under this counter)."""
    samples = [workload.prompt(i) for i in range(min(_VERIFY, most))]
    counted = await count_each(counter, [p.text or "" for p in samples])
    return all(n == p.prompt_tokens for n, p in zip(counted, samples, strict=True))


@dataclass(frozen=True, slots=True)
class _SharedPrefixWorkload:
    """``shared-prefix``: group prefixes, each followed by a per-request suffix."""

    spec: str
    token_source: str
    seed: int
    prefixes: tuple[tuple[str, int], ...]
    suffix_words: tuple[str, ...]
    suffix_length: int  # words
    suffix_tokens: int | None  # tokens a suffix adds, when known exactly
    estimated: bool  # the counter is the estimate: count the whole text (cheap)
    output: OutputBudget

    def prompt(self, index: int) -> Prompt:
        """Prefix ``index % prompts`` and a suffix drawn for ``index``."""
        prefix, prefix_tokens = self.prefixes[index % len(self.prefixes)]
        rng = random.Random(f"{self.seed}:suffix:{index}")
        words = [rng.choice(self.suffix_words) for _ in range(self.suffix_length)]
        text = " ".join([prefix, *words])
        tokens: int | None = None
        if self.suffix_tokens is not None:
            tokens = prefix_tokens + self.suffix_tokens
        elif self.estimated:
            tokens = estimate_tokens(text)
        return Prompt(text, None, tokens, self.output.draw(self.seed, index))


async def build_shared_prefix(
    spec: str,
    counter: TokenCounter,
    seed: int,
    *,
    prefix: int,
    groups: int,
    suffix: int,
    output: OutputBudget,
) -> Workload:
    fitter = await TextFitter.calibrate(counter)
    prefixes = await fitter.fit_distinct(random.Random(seed), groups, prefix)
    estimated = counter.source == "estimate"
    if fitter.fillers and not estimated:
        workload = _SharedPrefixWorkload(
            spec=spec,
            token_source=counter.source,
            seed=seed,
            prefixes=tuple(prefixes),
            suffix_words=fitter.fillers,
            suffix_length=suffix,
            suffix_tokens=suffix,
            estimated=False,
            output=output,
        )
        if await _lengths_add_up(workload, counter, 2 * groups):
            return workload
    # No one-token words (or they do not add up): words at the counter's mean rate.
    length = max(round(suffix / fitter.tokens_per_word), 1) if suffix else 0
    return _SharedPrefixWorkload(
        spec=spec,
        token_source=counter.source,
        seed=seed,
        prefixes=tuple(prefixes),
        suffix_words=WORDS,
        suffix_length=length,
        suffix_tokens=None,
        estimated=estimated,
        output=output,
    )
