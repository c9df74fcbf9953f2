"""The ``prefix`` workload: prompts built so that an engine's prefix cache serves an
asked fraction of their tokens.

A paged prefix cache (vLLM's, the simulator's) keys each *full* block of
``block_size`` prompt tokens by a hash chain over everything before it, and never
serves the last prompt token from the cache. So the fraction of a prompt's tokens
it can serve moves in whole blocks: this module picks the whole number of blocks
``k`` that comes closest to the asked rate, and builds each request as

``[template head] [group prefix] [tail of the request's own]``

where the template head (``overhead_tokens``, what a chat template puts before the
content) and the group prefix together are exactly ``k`` blocks, and the tail begins
with a few words that encode the request's index, so nothing past the prefix can
hit. The server counts ``overhead + prompt + tail_tokens`` tokens (the template's
tail after the content), and ``k * block_size`` of them hit.

Every text is made of words that count one token each under the run's counter
(the fitter's fillers), so lengths are exact without a count per request; a few
whole prompts are counted when the workload is built, and a counter under which
the words do not add up (the estimate) is refused: it cannot place a block
boundary. One warm prompt per group (the group's prefix, then a word no request has
there) puts the prefixes in the cache before a run, so that the first request of a
group does not miss.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from servemon.core.errors import ConfigError
from servemon.loadgen.workloads.prompts import OutputBudget, Prompt
from servemon.loadgen.workloads.tokens import TextFitter, TokenCounter, count_each

__all__ = ["WARM_MAX_TOKENS", "PrefixWorkload", "build_prefix", "choose_blocks"]

#: ``max_tokens`` of a warm prompt: it only has to be prefilled.
WARM_MAX_TOKENS = 1
#: Distinct request heads: at least this many requests before one repeats.
_DISTINCT_HEADS = 10**9
_POOL = 16  # bodies of the tails, drawn once
_VERIFY = 4  # requests counted whole when the workload is built
#: Shared prefixes may take at most this fraction of the engine's cache.
_CACHE_SHARE = 0.5


@dataclass(frozen=True, slots=True)
class PrefixWorkload:
    """``prefix``: ``groups`` shared prefixes of whole blocks, a tail per request.

    ``prompt(i)`` is group ``i % groups``'s prefix followed by a tail of its own
    (a head of ``head_length`` words encoding ``i`` with the seed's shuffle, then a
    body from a small pool); ``warm[g]`` is group ``g``'s prefix followed by a word
    that starts no request's tail.
    """

    spec: str
    token_source: str
    seed: int
    #: The rate the spec asked for, and what ``hit_blocks`` whole blocks give.
    asked_hit: float
    expected_hit: float
    #: Content tokens of each group's prefix (the template head not included).
    shared_tokens: int
    block_size: int
    #: Blocks of each prompt the cache serves (template head and prefix).
    hit_blocks: int
    #: Content tokens of every prompt (``Prompt.prompt_tokens``).
    prompt_tokens: int
    #: What the chat template adds before and after the content.
    overhead_tokens: int
    tail_tokens: int
    #: One prompt per group that puts its prefix in the cache; not to be recorded.
    warm: tuple[Prompt, ...]
    prefixes: tuple[str, ...]
    head_words: tuple[str, ...]
    head_length: int
    shuffles: tuple[tuple[int, ...], ...]  # per head position, digit -> word
    bodies: tuple[str, ...]  # each tail_length - head_length words
    output: OutputBudget

    @property
    def groups(self) -> int:
        """How many shared prefixes the requests cycle through."""
        return len(self.prefixes)

    @property
    def server_tokens(self) -> int:
        """Tokens the server counts for one prompt (template included)."""
        return self.overhead_tokens + self.prompt_tokens + self.tail_tokens

    def head(self, index: int) -> list[str]:
        """The words that make request ``index``'s tail its own."""
        base = len(self.head_words)
        words = []
        for position in range(self.head_length):
            index, digit = divmod(index, base)
            words.append(self.head_words[self.shuffles[position][digit]])
        return words

    def prompt(self, index: int) -> Prompt:
        """Group ``index % groups``'s prefix, then the tail of request ``index``."""
        parts = [self.prefixes[index % len(self.prefixes)], *self.head(index)]
        parts.append(self.bodies[index % len(self.bodies)])
        text = " ".join(part for part in parts if part)
        return Prompt(
            text, None, self.prompt_tokens, self.output.draw(self.seed, index)
        )


def choose_blocks(
    hit: float, server_tokens: int, content_tokens: int, block_size: int, overhead: int
) -> tuple[int, int, int]:
    """The whole blocks whose hits come closest to ``hit`` of ``server_tokens``,
    with the fewest and most possible: ``(chosen, lowest, highest)``.

    The template head's full blocks are shared by every request (``lowest``); at most
    ``(server_tokens - 1) // block_size`` blocks can hit, since the last token is
    always computed, and at least one content token is left to the request's own
    tail (``highest``).
    """
    lowest = overhead // block_size
    highest = min(
        (server_tokens - 1) // block_size, (overhead + content_tokens - 1) // block_size
    )
    chosen = round(hit * server_tokens / block_size)
    return max(lowest, min(chosen, highest)), lowest, highest


async def build_prefix(
    spec: str,
    counter: TokenCounter,
    seed: int,
    *,
    hit: float,
    prompt: int,
    groups: int,
    output: OutputBudget,
    block_size: int,
    overhead_tokens: int = 0,
    tail_tokens: int = 0,
    cache_tokens: int | None = None,
) -> PrefixWorkload:
    """Build the ``prefix`` workload for an engine with ``block_size``-token blocks.

    ``overhead_tokens`` and ``tail_tokens``: what the chat template adds before and
    after the content (0 for the completions API of a model without a BOS token);
    ``cache_tokens``: the engine's cache (``num_gpu_blocks * block_size``) where it
    is known. A rate the blocks cannot come within half a block of, prefixes that
    would not stay cached, or a counter whose counts do not add up word by word
    are one-line :class:`ConfigError` s naming the key.
    """
    if block_size < 1 or overhead_tokens < 0 or tail_tokens < 0:
        raise ValueError(
            f"block_size >= 1, overhead and tail >= 0 (got {block_size}, "
            f"{overhead_tokens}, {tail_tokens})"
        )
    where = f"--workload: {spec}"
    total = overhead_tokens + prompt + tail_tokens
    blocks, lowest, highest = choose_blocks(
        hit, total, prompt, block_size, overhead_tokens
    )
    expected = blocks * block_size / total
    if abs(expected - hit) > block_size / (2 * total) + 1e-12:
        why = (
            f"at most {highest * block_size} of its {total} tokens can hit: "
            "whole blocks of the prompt, the last token always computed"
            if blocks == highest
            else f"the chat template's first {lowest * block_size} tokens "
            "are the same in every prompt and always hit"
        )
        raise ConfigError(
            f"{where}: hit={hit:g} cannot be met within half a block with "
            f"block size {block_size}: {why} (closest: {expected:.4f})"
        )
    shared = max(0, blocks * block_size - overhead_tokens)
    if cache_tokens is not None:
        # The template head's blocks are one for all groups; the rest is each one's.
        held = (lowest + groups * (blocks - lowest)) * block_size
        if held > _CACHE_SHARE * cache_tokens:
            raise ConfigError(
                f"{where}: groups={groups}: {groups} prefixes of {shared} tokens "
                f"need {held} tokens of cache, over half the engine's {cache_tokens}: "
                "requests in flight would evict them and the rate would fall short "
                "(use fewer groups or a shorter prompt)"
            )
    fitter = await TextFitter.calibrate(counter)
    words = tuple(dict.fromkeys(fitter.fillers))
    if counter.source == "estimate" or len(words) < 2:
        raise ConfigError(
            f"{where}: needs exact token counts to place block boundaries "
            f"(a --tokenizer, or a target with /tokenize; the counter is "
            f"{counter.source!r})"
        )
    workload = _assemble(
        spec,
        counter.source,
        seed,
        words,
        hit=hit,
        expected=expected,
        shared=shared,
        block_size=block_size,
        blocks=blocks,
        prompt=prompt,
        overhead=overhead_tokens,
        tail_template=tail_tokens,
        groups=groups,
        output=output,
    )
    samples = [workload.prompt(i) for i in range(_VERIFY)] + list(workload.warm[:1])
    counted = await count_each(counter, [p.text or "" for p in samples])
    if any(n != prompt for n in counted):
        raise ConfigError(
            f"{where}: the counter's counts do not add up word by word "
            f"(asked {prompt} tokens, counted {counted}): block boundaries cannot "
            "be placed"
        )
    return workload


def _assemble(
    spec: str,
    source: str,
    seed: int,
    words: tuple[str, ...],
    *,
    hit: float,
    expected: float,
    shared: int,
    block_size: int,
    blocks: int,
    prompt: int,
    overhead: int,
    tail_template: int,
    groups: int,
    output: OutputBudget,
) -> PrefixWorkload:
    """The workload's texts, every word one token: prefixes, heads, bodies, warm
    prompts. ``words[0]`` starts every warm prompt's tail and no request's."""
    marker, head_words = words[0], words[1:]
    tail = prompt - shared
    base = len(head_words)
    head_length = 1
    while base**head_length < _DISTINCT_HEADS and head_length < 16:
        head_length += 1
    head_length = min(head_length, tail)
    rng = random.Random(f"{seed}:prefix")
    shuffles = tuple(tuple(rng.sample(range(base), base)) for _ in range(head_length))
    # Groups differ from their first word where there are words enough.
    prefixes = tuple(
        " ".join(
            [words[(g + 1) % len(words)]]
            + [rng.choice(words) for _ in range(shared - 1)]
        )
        if shared
        else ""
        for g in range(groups)
    )
    bodies = tuple(
        " ".join(rng.choice(words) for _ in range(tail - head_length))
        for _ in range(_POOL)
    )
    warm = tuple(
        Prompt(
            " ".join(
                part
                for part in (
                    prefixes[g],
                    marker,
                    " ".join(rng.choice(words) for _ in range(tail - 1)),
                )
                if part
            ),
            None,
            prompt,
            WARM_MAX_TOKENS,
        )
        for g in range(groups)
    )
    return PrefixWorkload(
        spec=spec,
        token_source=source,
        seed=seed,
        asked_hit=hit,
        expected_hit=expected,
        shared_tokens=shared,
        block_size=block_size,
        hit_blocks=blocks,
        prompt_tokens=prompt,
        overhead_tokens=overhead,
        tail_tokens=tail_template,
        warm=warm,
        prefixes=prefixes,
        head_words=head_words,
        head_length=head_length,
        shuffles=shuffles,
        bodies=bodies,
        output=output,
    )
