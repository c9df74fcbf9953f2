"""Workloads: the prompts a run sends, their token lengths and output budgets.

This module owns the ``--workload`` spec language, the :class:`Prompt` values built
from it (:func:`build_workload`), and the request body built from a prompt
(:func:`request_body`). A workload is deterministic: ``prompt(index)`` is the same for
the same spec, seed, counter and index, in every run.

Specs (every key optional; defaults as shown, output defaults to ``default_output``):

``random:prompt=128,output=128``
    Every prompt distinct from every other from its first tokens on, so that a
    prefix cache serves none of it (as ``vllm bench serve`` and GuideLLM make
    theirs): request ``i`` sends a head of a few words that encodes ``i`` (distinct
    for the first 10^9 requests), then body ``i % pool_size`` of a pool of random
    texts built up front; head and body together are exactly ``prompt`` tokens
    under the run's token counter (see below).
``shared-prefix:prefix=1024,prompts=8,suffix=64,output=128``
    ``prompts`` distinct prefixes (groups) of ``prefix`` tokens each. Request ``i``
    sends prefix ``i % prompts`` followed by a random suffix of ``suffix`` tokens
    drawn for ``i`` alone, so the prefix cache sees ``prompts`` hot prefixes while no
    two requests are the same (suffixes repeat only by chance, which is negligible
    unless ``suffix`` is a few tokens).
``prefix:hit=H,prompt=1024,groups=4,output=O``
    Prompts of ``prompt`` content tokens built so that the engine's prefix cache
    serves a fraction ``H`` (``0 <= H < 1``, required) of the tokens the server
    counts, as closely as its blocks allow (:mod:`servemon.loadgen.workloads.prefix`):
    request ``i`` sends group ``i % groups``'s shared prefix, a whole number of
    cache blocks counting what the chat template puts before it, then a tail of
    its own from its first words. One warm prompt per group puts the prefixes in
    the cache before the run. Needs exact counts (a tokenizer or ``/tokenize``).
``file:PATH[,output=O]``
    JSONL, one object a line: ``{"prompt": str}``, ``{"messages": [{"role",
    "content"}, ...]}`` or ShareGPT's ``{"conversations": [{"from", "value"}, ...]}``
    (the first human turn, after a system turn if there is one, becomes the messages;
    the first reply after it sets the output budget). A whole-file JSON array of such
    objects is accepted too (ShareGPT dumps are arrays). ``max_tokens`` (or
    ``output_tokens``) in an object sets its output budget. Request ``i`` sends entry
    ``i % entries`` in file order. ShareGPT conversations without a human turn are
    skipped; anything else malformed is an error naming the line (in an array, the
    item). Every entry is counted when the workload is built, one count a message
    (and reply); ``prompt_tokens`` of messages is the sum of their contents.
``sessions:turns=2:6,think=exp:2,system=0,user=64,output=O,answer=own[,users=N][,file=PATH]``
    Multi-turn conversations, each turn sent with the whole history after a think
    time (:mod:`servemon.loadgen.workloads.sessions`); ``prompt(i)`` is session ``i``'s
    first turn.
``trace:PATH[,output=O][,failed=skip|keep]``
    A trace (:mod:`servemon.loadgen.workloads.tracefile`: Mooncake JSONL with
    ``hash_ids``, plain JSONL/CSV of lengths, timed real prompts, or Azure's and
    BurstGPT's CSVs as published): request ``i`` sends entry ``i % entries``, built with
    the trace's lengths and prefix structure
    (:mod:`servemon.loadgen.workloads.traceprompts`). A ramp sends them at its own
    rates; ``servemon replay`` at the trace's times. ``failed=keep`` sends the lines a
    trace marks failed (BurstGPT's), with the default output budget; by default they are
    skipped and counted.

Output ``O`` is ``N`` (fixed) or ``A:B``: a uniform integer in ``[A, B]`` drawn per
request index from the seed. Given on ``file:``, it overrides the file's budgets.

Exact lengths. Random texts are fitted to a token count by
:class:`~servemon.loadgen.workloads.tokens.TextFitter` (draw words, count, adjust; at
most 8 counts a text, the closest kept). ``Prompt.prompt_tokens`` is always the counted
length of the content (no chat template), so a miss is visible, never hidden. Under the
estimate counter a length is only as close as the estimate allows, and the run record
says so through ``token_source``. Shared-prefix suffixes are made of words that count
one token each, so that a suffix needs no count per request; whether prefix and suffix
add up is checked on a few requests when the workload is built, and
``prompt_tokens`` is ``None`` where it cannot be known (the estimate's is computed).
"""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from servemon.core.errors import ConfigError
from servemon.loadgen.workloads.prefix import build_prefix
from servemon.loadgen.workloads.promptfile import (
    FileEntry,
    build_file,
    read_conversations,
    read_entries,
)
from servemon.loadgen.workloads.prompts import (
    OutputBudget,
    Prompt,
    Workload,
    chat_body,
    random_prompt,
    request_body,
)
from servemon.loadgen.workloads.sessions import (
    SessionsSpec,
    build_sessions,
    parse_sessions,
)
from servemon.loadgen.workloads.specs import (
    spec_fraction,
    spec_int,
    spec_options,
    spec_range,
)
from servemon.loadgen.workloads.synthetic import build_random, build_shared_prefix
from servemon.loadgen.workloads.tokens import TokenCounter
from servemon.loadgen.workloads.tracefile import (
    TraceEntry,
    TraceFile,
    read_trace_file,
)
from servemon.loadgen.workloads.traceprompts import OverContext, build_trace

__all__ = [
    "DEFAULT_OUTPUT",
    "Prompt",
    "Workload",
    "WorkloadSpec",
    "build_workload",
    "chat_body",
    "parse_workload",
    "random_prompt",
    "request_body",
]

_OPTION = re.compile(r"[A-Za-z_][\w-]*=")
#: The output budget of a request whose spec (or file line) does not say one.
DEFAULT_OUTPUT = 128


@dataclass(frozen=True, slots=True)
class WorkloadSpec:
    """A ``--workload`` spec, parsed once where the config is built: its kind and
    the builder's options. ``str()`` gives its text back (the run record's)."""

    text: str
    kind: str
    options: dict[str, Any] = field(compare=False)
    #: The file a ``file:`` or ``trace:`` spec names, once read and checked: a run
    #: reads it once (:meth:`check`, the plan, the build).
    _read: dict[str, list[FileEntry] | TraceFile] = field(
        default_factory=dict, compare=False, repr=False
    )

    def __str__(self) -> str:
        return self.text

    @property
    def sessions(self) -> SessionsSpec | None:
        """A ``sessions:`` spec's options; None for another kind."""
        return self.options["spec"] if self.kind == "sessions" else None

    @property
    def trace_path(self) -> Path | None:
        """The file of a ``trace:`` spec; None for another kind."""
        return self.options["path"] if self.kind == "trace" else None

    @property
    def output_ceiling(self) -> int:
        """The most output tokens a request asks for (a ``file:`` without
        ``output=``: :data:`DEFAULT_OUTPUT`)."""
        budget = self.options.get("output")
        return budget.high if isinstance(budget, OutputBudget) else DEFAULT_OUTPUT

    def trace_entries(self) -> list[TraceEntry]:
        """A ``trace:`` spec's entries (:meth:`trace_file`)."""
        return list(self.trace_file().entries)

    def trace_file(self) -> TraceFile:
        """A ``trace:`` spec's file, read and checked on the first call (every
        line; a bad one is a one-line :class:`ConfigError`) and kept."""
        path = self.trace_path
        if path is None:
            raise ConfigError(f"--workload {self.text}: not a trace (trace:PATH)")
        trace = self._read.get("trace")
        if not isinstance(trace, TraceFile):
            failed = self.options["failed"]
            trace = self._read["trace"] = read_trace_file(path, failed=failed)
        return trace

    def file_entries(self) -> list[FileEntry]:
        """A ``file:`` spec's prompts, read and checked on the first call, and kept."""
        entries = self._read.get("file")
        if not isinstance(entries, list):
            entries = self._read["file"] = read_entries(self.options["path"])
        return entries

    def check(self) -> None:
        """Check the files the spec names (a ``file:``'s every line) without
        counting anything: a bad one is the one-line :class:`ConfigError`
        :func:`build_workload` would raise, before a target or a simulator is
        started."""
        if self.kind == "file":
            self.file_entries()
        if self.kind == "trace":
            self.trace_entries()
        sessions = self.sessions
        if sessions is not None and sessions.file is not None:
            read_conversations(sessions.file)


def parse_workload(text: str) -> WorkloadSpec:
    """``--workload`` text as its spec; a bad one is a one-line :class:`ConfigError`
    naming the key and value at fault."""
    kind, options = _parse(text, default_output=DEFAULT_OUTPUT)
    return WorkloadSpec(text, kind, options)


async def build_workload(
    spec: WorkloadSpec,
    *,
    counter: TokenCounter,
    seed: int,
    pool_size: int = 256,
    context: int | None = None,
    over_context: OverContext = "error",
    block_size: int = 16,
    overhead_tokens: int = 0,
    tail_tokens: int = 0,
    cache_tokens: int | None = None,
) -> Workload:
    """Build the prompts of ``spec``, counting them with ``counter``; ``context``
    (the target's, where it says) and ``over_context`` for a trace's requests that
    do not fit it (:mod:`servemon.loadgen.workloads.traceprompts`); for ``prefix:``, the
    engine's ``block_size``, what the chat template adds before and after the
    content, and the engine's cache in tokens where known
    (:func:`~servemon.loadgen.workloads.prefix.build_prefix`).

    A bad file is a one-line :class:`ConfigError`; a counter that fails mid-way
    raises what it raised.
    """
    kind, options, text = spec.kind, spec.options, spec.text
    if kind == "random":
        return await build_random(text, counter, seed, pool_size, **options)
    if kind == "shared-prefix":
        return await build_shared_prefix(text, counter, seed, **options)
    if kind == "prefix":
        return await build_prefix(
            text,
            counter,
            seed,
            block_size=block_size,
            overhead_tokens=overhead_tokens,
            tail_tokens=tail_tokens,
            cache_tokens=cache_tokens,
            **options,
        )
    if kind == "sessions":
        return await build_sessions(
            text, counter, seed, options["spec"], DEFAULT_OUTPUT
        )
    if kind == "trace":
        return await build_trace(
            text,
            counter,
            seed,
            options["path"],
            await asyncio.to_thread(spec.trace_file),
            options["output"],
            DEFAULT_OUTPUT,
            context=context,
            over_context=over_context,
        )
    return await build_file(
        text,
        counter,
        seed,
        await asyncio.to_thread(spec.file_entries),
        options["output"],
        DEFAULT_OUTPUT,
    )


def _parse(spec: str, *, default_output: int) -> tuple[str, dict[str, Any]]:
    """The kind and the builder's keyword arguments of a ``--workload`` spec."""
    kind, _, rest = spec.strip().partition(":")
    kind = kind.strip()
    if kind == "random":
        options = spec_options(kind, rest, ("prompt", "output"))
        return kind, {
            "tokens": spec_int(kind, "prompt", options.get("prompt", "128")),
            "output": spec_range(
                kind, "output", options.get("output", str(default_output))
            ),
        }
    if kind == "shared-prefix":
        known = ("prefix", "prompts", "suffix", "output")
        options = spec_options(kind, rest, known)
        return kind, {
            "prefix": spec_int(kind, "prefix", options.get("prefix", "1024")),
            "groups": spec_int(kind, "prompts", options.get("prompts", "8")),
            "suffix": spec_int(kind, "suffix", options.get("suffix", "64"), minimum=0),
            "output": spec_range(
                kind, "output", options.get("output", str(default_output))
            ),
        }
    if kind == "prefix":
        options = spec_options(kind, rest, ("hit", "prompt", "groups", "output"))
        if "hit" not in options:
            raise ConfigError(
                "--workload: prefix: hit is required (hit=H with 0 <= H < 1)"
            )
        return kind, {
            "hit": spec_fraction(kind, "hit", options["hit"]),
            "prompt": spec_int(kind, "prompt", options.get("prompt", "1024")),
            "groups": spec_int(kind, "groups", options.get("groups", "4")),
            "output": spec_range(
                kind, "output", options.get("output", str(default_output))
            ),
        }
    if kind == "sessions":
        return kind, {"spec": parse_sessions(rest, default_output)}
    if kind in ("file", "trace"):
        keys = ("output", "failed") if kind == "trace" else ("output",)
        path, options = _file_options(rest, kind, keys)
        override = (
            spec_range(kind, "output", options["output"])
            if "output" in options
            else None
        )
        if kind == "file":
            return kind, {"path": Path(path), "output": override}
        failed = options.get("failed", "skip")
        if failed not in ("skip", "keep"):
            raise ConfigError(
                f"--workload: trace: failed must be skip or keep, got {failed!r}"
            )
        return kind, {"path": Path(path), "output": override, "failed": failed}
    raise ConfigError(
        f"--workload: unknown kind {kind!r} in {spec!r} "
        "(known: random, shared-prefix, prefix, sessions, file, trace)"
    )


# --- spec parsing -------------------------------------------------------------


def _file_options(
    text: str, kind: str = "file", known: tuple[str, ...] = ("output",)
) -> tuple[str, dict[str, str]]:
    path = text
    options: dict[str, str] = {}
    while True:
        head, sep, tail = path.rpartition(",")
        if not sep or not _OPTION.match(tail.strip()):
            break
        key = tail.strip().partition("=")[0]
        if key in options:
            raise ConfigError(f"--workload: {kind}: {key!r} given twice")
        options.update(spec_options(kind, tail, known))
        path = head
    if not path.strip():
        raise ConfigError(f"--workload: {kind}: needs a path ({kind}:PATH[,output=N])")
    return path.strip(), options
