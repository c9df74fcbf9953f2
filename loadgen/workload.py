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

Output ``O`` is ``N`` (fixed) or ``A:B``: a uniform integer in ``[A, B]`` drawn per
request index from the seed. Given on ``file:``, it overrides the file's budgets.

Exact lengths. Random texts are fitted to a token count by
:class:`~loadgen.tokens.TextFitter` (draw words, count, adjust; at most 8 counts a
text, the closest kept). ``Prompt.prompt_tokens`` is always the counted length of the
content (no chat template), so a miss is visible, never hidden. Under the estimate
counter a length is only as close as the estimate allows, and the run record says so
through ``token_source``. Shared-prefix suffixes are made of words that count one
token each, so that a suffix needs no count per request; whether prefix and suffix
add up is checked on a few requests when the workload is built, and
``prompt_tokens`` is ``None`` where it cannot be known (the estimate's is computed).
"""

from __future__ import annotations

import asyncio
import json
import random
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal, Protocol

from loadgen.tokens import WORDS, TextFitter, TokenCounter, count_each, estimate_tokens
from servemon.errors import ConfigError

__all__ = [
    "Prompt",
    "Workload",
    "build_workload",
    "chat_body",
    "check_workload",
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

_VERIFY = 8  # shared-prefix requests counted whole when the workload is built
_ROLES = frozenset({"system", "user", "assistant", "tool", "developer"})
_HUMAN = frozenset({"human", "user"})
_REPLY = frozenset({"gpt", "assistant", "chatgpt", "bard", "bing", "model"})
_OPTION = re.compile(r"[A-Za-z_][\w-]*=")


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


def request_body(
    prompt: Prompt,
    *,
    api: Literal["chat", "completions"],
    model: str,
    stream: bool,
    ignore_eos: bool,
    extra_body: Mapping[str, Any] | None,
) -> dict[str, Any]:
    """The JSON body of a chat or completions request for ``prompt``.

    Chat sends the prompt's messages (or its text as one user message); completions
    sends its text (or the messages' contents joined by blank lines). Streaming asks
    for usage. ``extra_body`` is merged last, nested objects key by key.
    """
    body: dict[str, Any] = {"model": model}
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


def _merged(base: Mapping[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in extra.items():
        if isinstance(value, Mapping):
            below = out.get(key)
            out[key] = _merged(below if isinstance(below, Mapping) else {}, value)
        else:
            out[key] = value
    return out


def check_workload(spec: str) -> None:
    """Check ``spec`` (and a ``file:``'s every line) without counting anything: a
    bad one is the one-line :class:`ConfigError` :func:`build_workload` would raise,
    before a target or a simulator is started."""
    kind, options = _parse(spec, default_output=1)
    if kind == "file":
        _read_entries(options["path"])


async def build_workload(
    spec: str,
    *,
    counter: TokenCounter,
    seed: int,
    default_output: int = 128,
    pool_size: int = 256,
) -> Workload:
    """Parse ``spec`` and build its prompts, counting them with ``counter``.

    A bad spec or file is a one-line :class:`ConfigError`; a counter that fails
    mid-way raises what it raised.
    """
    kind, options = _parse(spec, default_output=default_output)
    if kind == "random":
        return await _build_random(spec, counter, seed, pool_size, **options)
    if kind == "shared-prefix":
        return await _build_shared_prefix(spec, counter, seed, **options)
    return await _build_file(
        spec, counter, seed, options["path"], options["output"], default_output
    )


def _parse(spec: str, *, default_output: int) -> tuple[str, dict[str, Any]]:
    """The kind and the builder's keyword arguments of a ``--workload`` spec."""
    kind, _, rest = spec.strip().partition(":")
    kind = kind.strip()
    if kind == "random":
        options = _options(kind, rest, ("prompt", "output"))
        return kind, {
            "tokens": _int(kind, "prompt", options.get("prompt", "128")),
            "output": _output(kind, options.get("output", str(default_output))),
        }
    if kind == "shared-prefix":
        known = ("prefix", "prompts", "suffix", "output")
        options = _options(kind, rest, known)
        return kind, {
            "prefix": _int(kind, "prefix", options.get("prefix", "1024")),
            "groups": _int(kind, "prompts", options.get("prompts", "8")),
            "suffix": _int(kind, "suffix", options.get("suffix", "64"), minimum=0),
            "output": _output(kind, options.get("output", str(default_output))),
        }
    if kind == "file":
        path, options = _file_options(rest)
        override = _output(kind, options["output"]) if "output" in options else None
        return kind, {"path": Path(path), "output": override}
    raise ConfigError(
        f"--workload: unknown kind {kind!r} in {spec!r} "
        "(known: random, shared-prefix, file)"
    )


# --- spec parsing -------------------------------------------------------------


def _options(kind: str, text: str, known: Sequence[str]) -> dict[str, str]:
    options: dict[str, str] = {}
    for item in text.split(","):
        if not item.strip():
            continue
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep:
            raise ConfigError(f"--workload: {kind}: expected key=value, got {item!r}")
        if key not in known:
            raise ConfigError(
                f"--workload: {kind}: unknown key {key!r} (known: {', '.join(known)})"
            )
        if key in options:
            raise ConfigError(f"--workload: {kind}: {key!r} given twice")
        options[key] = value.strip()
    return options


def _file_options(text: str) -> tuple[str, dict[str, str]]:
    path = text
    options: dict[str, str] = {}
    while True:
        head, sep, tail = path.rpartition(",")
        if not sep or not _OPTION.match(tail.strip()):
            break
        key = tail.strip().partition("=")[0]
        if key in options:
            raise ConfigError(f"--workload: file: {key!r} given twice")
        options.update(_options("file", tail, ("output",)))
        path = head
    if not path.strip():
        raise ConfigError("--workload: file: needs a path (file:PATH[,output=N])")
    return path.strip(), options


def _int(kind: str, key: str, value: str, *, minimum: int = 1) -> int:
    try:
        number = int(value)
    except ValueError:
        number = minimum - 1
    if number < minimum:
        raise ConfigError(
            f"--workload: {kind}: {key} must be an integer >= {minimum}, got {value!r}"
        )
    return number


def _output(kind: str, value: str) -> _Output:
    low_text, sep, high_text = value.partition(":")
    try:
        low = int(low_text)
        high = int(high_text) if sep else low
    except ValueError:
        low = high = 0
    if low < 1 or high < low:
        raise ConfigError(
            f"--workload: {kind}: output must be N or A:B with 1 <= A <= B, "
            f"got {value!r}"
        )
    return _Output(low, high)


@dataclass(frozen=True, slots=True)
class _Output:
    """Output budgets: fixed, or uniform in ``[low, high]`` per request index."""

    low: int
    high: int

    def draw(self, seed: int, index: int) -> int:
        if self.low == self.high:
            return self.low
        return random.Random(f"{seed}:output:{index}").randint(self.low, self.high)


# --- random and shared-prefix -------------------------------------------------


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
    output: _Output

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


async def _build_random(
    spec: str,
    counter: TokenCounter,
    seed: int,
    pool_size: int,
    *,
    tokens: int,
    output: _Output,
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
    output: _Output

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


async def _build_shared_prefix(
    spec: str,
    counter: TokenCounter,
    seed: int,
    *,
    prefix: int,
    groups: int,
    suffix: int,
    output: _Output,
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


# --- file ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Entry:
    """One parsed object of a workload file, before counting."""

    text: str | None
    messages: tuple[dict[str, str], ...] | None
    max_tokens: int | None
    reply: str | None


@dataclass(frozen=True, slots=True)
class _FileWorkload:
    """``file``: the file's entries in order, cycled."""

    spec: str
    token_source: str
    seed: int
    prompts: tuple[Prompt, ...]
    output: _Output | None  # overrides the file's budgets when given

    def prompt(self, index: int) -> Prompt:
        """Entry ``index % entries``, its budget overridden when ``output=`` given."""
        found = self.prompts[index % len(self.prompts)]
        if self.output is None:
            return found
        return replace(found, max_tokens=self.output.draw(self.seed, index))


async def _build_file(
    spec: str,
    counter: TokenCounter,
    seed: int,
    path: Path,
    output: _Output | None,
    default_output: int,
) -> Workload:
    entries = await asyncio.to_thread(_read_entries, path)
    # Every text to count in one list: each entry's contents, then its reply (the
    # empty text, not counted, where the budget comes from elsewhere).
    texts: list[str] = []
    for entry in entries:
        texts += [m["content"] for m in entry.messages or ()] or [entry.text or ""]
        by_reply = entry.max_tokens is None and output is None
        texts.append((entry.reply or "") if by_reply else "")
    counts = iter(await count_each(counter, texts))
    prompts: list[Prompt] = []
    for entry in entries:
        parts = len(entry.messages) if entry.messages is not None else 1
        tokens = sum(next(counts) for _ in range(parts))
        reply = next(counts)
        budget = entry.max_tokens or (max(reply, 1) if reply else default_output)
        prompts.append(Prompt(entry.text, entry.messages, tokens, budget))
    return _FileWorkload(spec, counter.source, seed, tuple(prompts), output)


def _read_entries(path: Path) -> list[_Entry]:
    where = f"--workload: file: {path}"
    try:
        content = path.expanduser().read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{where}: cannot read: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{where}: not UTF-8 text") from None
    found: list[_Entry | None] = []
    if content.lstrip().startswith("["):
        try:
            items = json.loads(content)
        except json.JSONDecodeError as exc:
            raise ConfigError(
                f"{where}: line {exc.lineno}: invalid JSON: {exc.msg}"
            ) from None
        found = [_entry(item, f"{where}: item {n}") for n, item in enumerate(items, 1)]
    else:
        for number, line in enumerate(content.split("\n"), 1):
            if not line.strip():
                continue
            line_where = f"{where}: line {number}"
            try:
                item = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ConfigError(f"{line_where}: invalid JSON: {exc.msg}") from None
            found.append(_entry(item, line_where))
    entries = [entry for entry in found if entry is not None]
    if not entries:
        raise ConfigError(f"{where}: no prompts in the file")
    return entries


def _entry(item: object, where: str) -> _Entry | None:
    if not isinstance(item, dict):
        raise ConfigError(f"{where}: expected a JSON object, got {_kind(item)}")
    budget = _budget(item, where)
    if "prompt" in item:
        prompt = item["prompt"]
        if not isinstance(prompt, str) or not prompt:
            raise ConfigError(f"{where}: 'prompt' must be a non-empty string")
        return _Entry(prompt, None, budget, None)
    if "messages" in item:
        return _Entry(None, _messages(item["messages"], where), budget, None)
    if "conversations" in item:
        return _sharegpt(item, budget, where)
    raise ConfigError(
        f"{where}: expected 'prompt', 'messages' or 'conversations' (ShareGPT)"
    )


def _budget(item: dict[str, Any], where: str) -> int | None:
    for key in ("max_tokens", "output_tokens"):
        if key in item:
            value = item[key]
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(
                    f"{where}: {key!r} must be an integer >= 1, got {value!r}"
                )
            return value
    return None


def _messages(value: object, where: str) -> tuple[dict[str, str], ...]:
    if not isinstance(value, list) or not value:
        raise ConfigError(f"{where}: 'messages' must be a non-empty list")
    messages: list[dict[str, str]] = []
    for i, message in enumerate(value):
        if not isinstance(message, dict):
            raise ConfigError(f"{where}: messages[{i}] must be an object")
        role, content = message.get("role"), message.get("content")
        if role not in _ROLES:
            raise ConfigError(
                f"{where}: messages[{i}].role must be one of "
                f"{', '.join(sorted(_ROLES))}, got {role!r}"
            )
        if not isinstance(content, str):
            raise ConfigError(f"{where}: messages[{i}].content must be a string")
        messages.append({"role": role, "content": content})
    return tuple(messages)


def _sharegpt(item: dict[str, Any], budget: int | None, where: str) -> _Entry | None:
    turns = item["conversations"]
    if not isinstance(turns, list):
        raise ConfigError(f"{where}: 'conversations' must be a list")
    system = item.get("system") if isinstance(item.get("system"), str) else None
    human: str | None = None
    reply: str | None = None
    for i, turn in enumerate(turns):
        if not (
            isinstance(turn, dict)
            and isinstance(turn.get("from"), str)
            and isinstance(turn.get("value"), str)
        ):
            raise ConfigError(
                f"{where}: conversations[{i}] must be an object with string "
                "'from' and 'value'"
            )
        who, value = turn["from"].lower(), turn["value"]
        if human is None:
            if who == "system":
                system = value
            elif who in _HUMAN:
                human = value
        elif reply is None and who in _REPLY:
            reply = value
        elif reply is None and who in _HUMAN:
            reply = ""  # a second question before any answer: no reply to measure
    if human is None or not human.strip():
        return None  # ShareGPT dumps hold empty and reply-first conversations
    messages = [{"role": "user", "content": human}]
    if system:
        messages.insert(0, {"role": "system", "content": system})
    return _Entry(None, tuple(messages), budget, reply or None)


def _kind(value: object) -> str:
    names = {list: "an array", str: "a string", bool: "a boolean", type(None): "null"}
    return names.get(type(value), "a number")
