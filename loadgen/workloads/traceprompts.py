"""``trace:PATH``: the prompts of a trace, with its lengths and its prefix structure.

Request ``i`` is trace entry ``i % entries`` (a replay's loop ``i // entries``). An
entry with a real prompt sends it. An entry with ``hash_ids`` is built block by
block: each id is :data:`~servemon.loadgen.workloads.tracefile.BLOCK_TOKENS` words that
count one token each under the run's counter, the same words for the same id (and loop),
different ones for different ids, the last block cut to the entry's length. So two
requests whose ids start alike share exactly that prefix, token for token, and the
server's prefix cache sees the sharing production did. A loop past the first uses fresh
ids (the same structure, new text), so looping does not turn every request into a hit.
An entry with only a length gets words of its own. Under the estimate counter
(no one-token words) lengths are as close as the estimate allows and
``prompt_tokens`` is the estimate.

Prompts are as long as the trace says, whatever their length (the word pool wraps
round for the longest). Where the target publishes its context (vLLM's
``max_model_len`` in ``/v1/models``), an entry whose prompt and output budget do not
fit it is handled as ``--over-context`` says (:class:`ContextFit`): ``error`` (the
default) refuses the run before anything starts, in one line that says how many
entries; ``skip`` leaves them out of the sends (counted as skipped,
``over_context``); ``truncate`` cuts their prompts to what fits, less
:data:`TEMPLATE_ALLOWANCE` tokens for what the chat template adds (the head stays:
so does the prefix structure); ``send`` sends them for the server to refuse.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal

from servemon.core.errors import ConfigError
from servemon.loadgen.workloads.prompts import OutputBudget, Prompt, Workload
from servemon.loadgen.workloads.tokens import (
    WORDS,
    TextFitter,
    TokenCounter,
    count_each,
    estimate_tokens,
)
from servemon.loadgen.workloads.tracefile import BLOCK_TOKENS, TraceEntry, TraceFile
from servemon.loadgen.workloads.wordpool import pool_text

__all__ = ["ContextFit", "OverContext", "TraceWorkload", "build_trace"]

OverContext = Literal["error", "skip", "truncate", "send"]
#: Tokens a truncated prompt leaves for the chat template's own (role markers, a
#: default system prompt): the trace counts content tokens only.
TEMPLATE_ALLOWANCE = 64


@dataclass(frozen=True, slots=True)
class ContextFit:
    """How a trace's entries fit the target's context (prompt plus output budget)."""

    #: The target's context in tokens (None: it does not say).
    context: int | None
    policy: OverContext
    #: Trace entries that do not fit, of ``entries``.
    over: int = 0
    entries: int = 0
    #: The longest entry that does not fit: (line, prompt + output tokens).
    longest: tuple[int, int] | None = None

    def fits(self, prompt_tokens: int | None, output: int) -> bool:
        return (
            self.context is None
            or prompt_tokens is None
            or prompt_tokens + output <= self.context
        )


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
    fit: ContextFit = ContextFit(None, "error")
    #: The trace file's format and failed lines (:class:`TraceFile`).
    source: TraceFile | None = field(default=None, repr=False, compare=False)
    _blocks: dict[tuple[int, int], str] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    def said(self) -> str | None:
        """One line for the terminal on the failed lines the trace marks (None:
        it marks none)."""
        source = self.source
        if source is None or not source.failed:
            return None
        if source.failed_lines == "keep":
            return (
                f"trace: {source.failed} failed lines (Response tokens 0) sent, "
                "with the default output budget"
            )
        return (
            f"trace: {source.failed} failed lines (Response tokens 0) skipped, of "
            f"{source.failed + len(source.entries)} (replay --keep-failed, or "
            "trace:PATH,failed=keep, sends them)"
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
        length = entry.prompt_tokens
        if entry.text is not None or entry.messages is not None:
            length = self.counted[at]
        if not self.fit.fits(length, budget):
            if self.fit.policy == "skip":
                return Prompt(None, None, length, budget, skip="over_context")
            if self.fit.policy == "truncate" and self.fit.context is not None:
                length = max(1, self.fit.context - budget - TEMPLATE_ALLOWANCE)
        if entry.text is not None or entry.messages is not None:
            return Prompt(entry.text, entry.messages, self.counted[at], budget)
        assert length is not None
        if entry.hash_ids:
            text = self._blocked(entry, loop, length)
        else:
            text = self._words(f"own:{loop}:{at}", length)
        tokens = length if self.exact else estimate_tokens(text)
        return Prompt(text, None, tokens, budget)

    def _blocked(self, entry: TraceEntry, loop: int, length: int) -> str:
        parts = []
        left = length
        for block in entry.hash_ids:
            text = self._block(block, loop)
            if left < BLOCK_TOKENS:
                text = " ".join(text.split(" ")[:left])
            parts.append(text)
            left -= BLOCK_TOKENS
            if left <= 0:
                break
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


def fit_context(
    entries: tuple[TraceEntry, ...],
    counted: tuple[int | None, ...],
    budget: OutputBudget | None,
    default_output: int,
    context: int | None,
    policy: OverContext,
    where: str,
) -> ContextFit:
    """How ``entries`` fit ``context``; under ``error`` one ConfigError line when
    any does not."""
    fit = ContextFit(context, policy, entries=len(entries))
    if context is None:
        return fit
    over = 0
    longest: tuple[int, int] | None = None
    for entry, real in zip(entries, counted, strict=True):
        prompt = entry.prompt_tokens if real is None else real
        output = budget.high if budget is not None else entry.output_tokens
        need = (prompt or 0) + (output or default_output)
        if need > context:
            over += 1
            if longest is None or need > longest[1]:
                longest = (entry.line, need)
    if over and policy == "error":
        assert longest is not None
        raise ConfigError(
            f"{where}: {over} of {len(entries)} requests do not fit the target's "
            f"context of {context} tokens (prompt + output; the longest, line "
            f"{longest[0]}, needs {longest[1]}): choose --over-context skip, "
            "truncate or send"
        )
    return replace(fit, over=over, longest=longest)


async def build_trace(
    spec: str,
    counter: TokenCounter,
    seed: int,
    path: Path,
    trace: TraceFile | Sequence[TraceEntry],
    output: OutputBudget | None,
    default_output: int,
    *,
    context: int | None = None,
    over_context: OverContext = "error",
) -> Workload:
    """The workload of a trace (its file read, or its entries) read from ``path``
    (named in errors)."""
    source = trace if isinstance(trace, TraceFile) else None
    entries = trace.entries if isinstance(trace, TraceFile) else tuple(trace)
    real = [(i, e) for i, e in enumerate(entries) if e.text is not None or e.messages]
    texts = [
        e.text or "\n".join(m["content"] for m in e.messages or ()) for _, e in real
    ]
    counts = await count_each(counter, texts) if real else []
    counted: list[int | None] = [None] * len(entries)
    for (i, _), n in zip(real, counts, strict=True):
        counted[i] = n
    fit = fit_context(
        entries,
        tuple(counted),
        output,
        default_output,
        context,
        over_context,
        f"--workload: trace: {path}",
    )
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
        fit=fit,
        source=source,
    )
    if fitter.fillers and counter.source != "estimate":
        # The one-token words add up under this counter: check on a few prompts.
        sized = [
            i
            for i, e in enumerate(entries)
            if e.prompt_tokens and fit.fits(e.prompt_tokens, default_output)
        ][:_VERIFY]
        built = [workload.prompt(i) for i in sized]
        got = await count_each(counter, [p.text or "" for p in built])
        if got == [p.prompt_tokens for p in built]:
            return workload
    return replace(workload, pool=WORDS, exact=False)
