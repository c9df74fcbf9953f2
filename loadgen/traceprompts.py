"""``trace:PATH``: the prompts of a trace, with its lengths and its prefix structure.

Request ``i`` is trace entry ``i % entries`` (a replay's loop ``i // entries``). An
entry with a real prompt sends it. An entry with ``hash_ids`` is built block by
block: each id is :data:`~loadgen.tracefile.BLOCK_TOKENS` words that count one token
each under the run's counter, the same words for the same id (and loop), different
ones for different ids, the last block cut to the entry's length. So two requests
whose ids start alike share exactly that prefix, token for token, and the server's
prefix cache sees the sharing production did. A loop past the first uses fresh ids
(the same structure, new text), so looping does not turn every request into a hit.
An entry with only a length gets words of its own. Under the estimate counter
(no one-token words) lengths are as close as the estimate allows and
``prompt_tokens`` is the estimate.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field, replace
from pathlib import Path

from loadgen.prompts import OutputBudget, Prompt, Workload
from loadgen.tokens import (
    WORDS,
    TextFitter,
    TokenCounter,
    count_each,
    estimate_tokens,
)
from loadgen.tracefile import BLOCK_TOKENS, TraceEntry, read_trace
from loadgen.wordpool import POOL_WORDS, pool_text
from servemon.errors import ConfigError

__all__ = ["TraceWorkload", "build_trace"]

#: Words of the pool blocks are cut from; a block starts at a seeded offset.
_VERIFY = 4  # prompts counted whole when the workload is built


@dataclass(frozen=True, slots=True)
class TraceWorkload:
    """The prompts of a trace (see the module docstring)."""

    spec: str
    token_source: str
    seed: int
    entries: tuple[TraceEntry, ...]
    counted: tuple[int | None, ...]  # tokens of entries with a real prompt
    pool: tuple[str, ...]  # one-token words, or WORDS under the estimate
    exact: bool
    output: OutputBudget | None
    default_output: int
    _blocks: dict[tuple[int, int], str] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    @property
    def models(self) -> tuple[str, ...]:
        """The models the trace names, in order of first use (empty: none)."""
        return tuple(dict.fromkeys(e.model for e in self.entries if e.model))

    def model_of(self, index: int) -> str | None:
        """The model request ``index`` asks for in the trace, if it names one."""
        return self.entries[index % len(self.entries)].model

    def prompt(self, index: int) -> Prompt:
        loop, at = divmod(index, len(self.entries))
        entry = self.entries[at]
        budget = (
            self.output.draw(self.seed, index)
            if self.output is not None
            else entry.output_tokens or self.default_output
        )
        if entry.text is not None or entry.messages is not None:
            return Prompt(entry.text, entry.messages, self.counted[at], budget)
        assert entry.prompt_tokens is not None
        if entry.hash_ids:
            text = self._blocked(entry, loop)
        else:
            text = self._words(f"own:{loop}:{at}", entry.prompt_tokens)
        tokens = entry.prompt_tokens if self.exact else estimate_tokens(text)
        return Prompt(text, None, tokens, budget)

    def _blocked(self, entry: TraceEntry, loop: int) -> str:
        assert entry.prompt_tokens is not None
        parts = []
        left = entry.prompt_tokens
        for block in entry.hash_ids:
            text = self._block(block, loop)
            if left < BLOCK_TOKENS:
                text = " ".join(text.split(" ")[:left])
            parts.append(text)
            left -= BLOCK_TOKENS
        return " ".join(parts)

    def _block(self, block: int, loop: int) -> str:
        key = (block, loop)
        text = self._blocks.get(key)
        if text is None:
            if len(self._blocks) > 8192:  # bounded: blocks are rebuilt cheaply
                self._blocks.clear()
            text = self._words(f"block:{loop}:{block}", BLOCK_TOKENS)
            self._blocks[key] = text
        return text

    def _words(self, key: str, tokens: int) -> str:
        """``tokens`` words of the pool from an offset seeded by ``key``."""
        return pool_text(self.pool, self.seed, key, tokens, exact=self.exact)


async def build_trace(
    spec: str,
    counter: TokenCounter,
    seed: int,
    path: Path,
    output: OutputBudget | None,
    default_output: int,
) -> Workload:
    entries = tuple(await asyncio.to_thread(read_trace, path))
    longest = max((e.prompt_tokens or 0 for e in entries), default=0)
    if longest >= POOL_WORDS:
        raise ConfigError(
            f"--workload: trace: {path}: line "
            f"{next(e.line for e in entries if (e.prompt_tokens or 0) == longest)}: "
            f"a prompt of {longest} tokens is longer than {POOL_WORDS - 1}"
        )
    real = [(i, e) for i, e in enumerate(entries) if e.text is not None or e.messages]
    texts = [
        e.text or "\n".join(m["content"] for m in e.messages or ()) for _, e in real
    ]
    counts = await count_each(counter, texts) if real else []
    counted: list[int | None] = [None] * len(entries)
    for (i, _), n in zip(real, counts, strict=True):
        counted[i] = n
    fitter = await TextFitter.calibrate(counter)
    workload = TraceWorkload(
        spec=spec,
        token_source=counter.source,
        seed=seed,
        entries=entries,
        counted=tuple(counted),
        pool=fitter.fillers,
        exact=True,
        output=output,
        default_output=default_output,
    )
    if fitter.fillers and counter.source != "estimate":
        # The one-token words add up under this counter: check on a few prompts.
        sized = [i for i, e in enumerate(entries) if e.prompt_tokens][:_VERIFY]
        built = [workload.prompt(i) for i in sized]
        got = await count_each(counter, [p.text or "" for p in built])
        if got == [p.prompt_tokens for p in built]:
            return workload
    return replace(workload, pool=WORDS, exact=False)
