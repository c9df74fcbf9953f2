"""Counting prompt tokens: a local tokenizer, the target's ``/tokenize`` or a guess.

This module owns the :class:`TokenCounter` seam and its three implementations, and
:func:`pick_counter`, which chooses one for a run:

- ``--tokenizer PATH`` → :class:`LocalTokenizer` (a ``tokenizer.json`` read by the
  optional ``tokenizers`` package: ``pip install 'servemon[tokenizer]'``);
- else the target's ``POST /tokenize`` (vLLM's endpoint) when it answers →
  :class:`ServerTokenizer`;
- else :class:`EstimateCounter`, a guess of 1.3 tokens a word.

Every counter counts content tokens only: no special tokens, no chat template. Its
``source`` (``"tokenizer"``, ``"server"`` or ``"estimate"``) goes into the run record.

It also owns making text of a given token count under a counter
(:class:`TextFitter`), and counting many texts with bounded concurrency
(:func:`count_each`), since a count may be a network call.
"""

from __future__ import annotations

import asyncio
import importlib
import random
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

import aiohttp

from servemon.core.errors import ConfigError, TargetError
from servemon.core.wire.http import post_json

__all__ = [
    "WORDS",
    "EstimateCounter",
    "LocalTokenizer",
    "ServerTokenizer",
    "TextFitter",
    "TokenCounter",
    "count_each",
    "estimate_tokens",
    "pick_counter",
]

#: Tokens per whitespace-separated word assumed by the estimate (English text, BPE).
TOKENS_PER_WORD = 1.3

#: How long :func:`pick_counter` waits for the target's ``/tokenize`` to answer.
PROBE_TIMEOUT_S = 5.0


class TokenCounter(Protocol):
    """Counts the content tokens of a text (no special tokens, no template)."""

    @property
    def source(self) -> str:
        """``"tokenizer"``, ``"server"`` or ``"estimate"``: what the counts rest on."""
        ...

    async def count(self, text: str) -> int:
        """Number of tokens in ``text``."""
        ...


def estimate_tokens(text: str) -> int:
    """Whitespace-separated words times 1.3, rounded: the estimate."""
    return round(len(text.split()) * TOKENS_PER_WORD)


class EstimateCounter:
    """Source ``"estimate"``: words times 1.3, rounded (no tokenizer, no network).

    Only a guess: real tokenizers differ by language, vocabulary and punctuation.
    """

    __slots__ = ()

    @property
    def source(self) -> str:
        """Always ``"estimate"``."""
        return "estimate"

    async def count(self, text: str) -> int:
        """The estimate of :func:`estimate_tokens`."""
        return estimate_tokens(text)


class _Encoding(Protocol):
    @property
    def ids(self) -> list[int]: ...


class _Encoder(Protocol):
    def encode(self, text: str, *, add_special_tokens: bool) -> _Encoding: ...


class LocalTokenizer:
    """Source ``"tokenizer"``: a local ``tokenizer.json`` through ``tokenizers``.

    Loading raises a one-line :class:`ConfigError` naming ``--tokenizer`` when the
    package is missing or the file cannot be read. Loading a large file takes a
    moment: :func:`pick_counter` does it in a thread.
    """

    __slots__ = ("_encoder", "path")

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        try:
            module: Any = importlib.import_module("tokenizers")
        except ImportError:
            raise ConfigError(
                "--tokenizer: needs the 'tokenizers' package "
                "(pip install 'servemon[tokenizer]')"
            ) from None
        try:
            self._encoder: _Encoder = module.Tokenizer.from_file(str(self.path))
        except Exception as exc:  # tokenizers raises plain Exception subclasses
            reason = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            raise ConfigError(
                f"--tokenizer: {self.path}: cannot load a tokenizer.json"
                f"{': ' + reason if reason else ''}"
            ) from None

    @property
    def source(self) -> str:
        """Always ``"tokenizer"``."""
        return "tokenizer"

    async def count(self, text: str) -> int:
        """Length of ``encode(text, add_special_tokens=False)``."""
        return len(self._encoder.encode(text, add_special_tokens=False).ids)


class ServerTokenizer:
    """Source ``"server"``: the target's ``POST /tokenize``, as vLLM serves it.

    Sends ``{"model", "prompt", "add_special_tokens": false}`` (and the text again as
    ``content``, llama.cpp's name for it, which vLLM ignores) through the given
    session, with the run's request headers (llama-server's ``--api-key`` and a
    gateway guard ``/tokenize`` too); the answer's ``count`` (or the length of
    ``tokens``) is the count. A failed call raises :class:`TargetError`.
    """

    __slots__ = ("headers", "model", "session", "timeout_s", "url")

    def __init__(
        self,
        session: aiohttp.ClientSession,
        base_url: str,
        model: str,
        *,
        headers: Mapping[str, str] | None = None,
        timeout_s: float = 30.0,
    ) -> None:
        self.session = session
        self.url = base_url.rstrip("/") + "/tokenize"
        self.model = model
        self.headers = dict(headers or {})
        self.timeout_s = timeout_s

    @property
    def source(self) -> str:
        """Always ``"server"``."""
        return "server"

    async def count(self, text: str) -> int:
        """Tokens in ``text`` according to the target."""
        body = {
            "model": self.model,
            "prompt": text,
            "content": text,
            "add_special_tokens": False,
        }
        answer = await post_json(
            self.session, self.url, body, self.headers, self.timeout_s
        )
        count = _count_of(answer)
        if count is None:
            raise TargetError(f"POST {self.url}: no 'count' or 'tokens' in the answer")
        return count


def _count_of(answer: object) -> int | None:
    if not isinstance(answer, dict):
        return None
    count = answer.get("count")
    if isinstance(count, int) and not isinstance(count, bool) and count >= 0:
        return count
    tokens = answer.get("tokens")
    return len(tokens) if isinstance(tokens, list) else None


async def pick_counter(
    session: aiohttp.ClientSession,
    base_url: str,
    model: str,
    tokenizer_path: str | None,
    headers: Mapping[str, str] | None = None,
) -> TokenCounter:
    """The counter for a run: ``--tokenizer``, else the target's ``/tokenize`` (sent
    the run's request ``headers``), else the estimate.

    A tokenizer path that cannot be used is a :class:`ConfigError`. The target is
    tried once with a short timeout; any failure (404, refused, bad answer) falls
    back to :class:`EstimateCounter` silently: the counter's ``source`` says which.
    """
    if tokenizer_path is not None:
        return await asyncio.to_thread(LocalTokenizer, tokenizer_path)
    server = ServerTokenizer(
        session, base_url, model, headers=headers, timeout_s=PROBE_TIMEOUT_S
    )
    try:
        probe = await server.count("hello world")
    except TargetError:
        return EstimateCounter()
    if probe <= 0:
        return EstimateCounter()
    return ServerTokenizer(session, base_url, model, headers=headers)


# --- texts of a given token count ---------------------------------------------

_MAX_COUNTS = 8  # counts spent fitting one text
_PAD_LIMIT = 8  # a shortfall up to this many tokens is padded with one-token words
_FILLER_GROUP = 8  # filler candidates counted together
_CONCURRENCY = 16  # counts in flight at once (count_each, TextFitter.fit_distinct)
_DEDUP_ROUNDS = 4  # redraws of texts that came out equal to an earlier one

T = TypeVar("T")
R = TypeVar("R")

#: Words for random text: common English words of every kind, letters only, so the
#: simulator's tokenizer counts one token each and BPE tokenizers one to three.
_WORDS_TEXT = """
    able about above across act actually add afraid after afternoon again against
    age ago agree air alive allow almost alone along already also always amount
    angle animal answer anyone apple area arm army around arrive art ask asleep
    attack autumn avoid awake away baby back bad bag balance ball band bank base
    basket bath beach bear beautiful because bed before begin behind believe bell
    below belt bench best better between bicycle big bird birth bit bitter black
    blade blanket blind blood blue board boat body boil bone book border borrow
    bottle bottom box boy brain branch brave bread break breath brick brief bright
    bring broad brother brown brush bucket build burn busy butter button buy cabin
    cake calm camera camp candle capital captain card care carpet carry cause
    ceiling center chain chair chalk chance change cheap cheese chest chicken chief
    child choose church circle city claim clean clear climb clock close cloth cloud
    coast coat coffee cold collect color comfort common compare complete concern
    copy corner cotton cough count country courage cousin cover cow crack cream
    create crime cross crowd crown cry cup curious current curtain curve custom cut
    damage dance danger dark daughter dead deal dear decide deep degree depend
    describe desert design desk detail develop different difficult dinner direction
    dirty discover dish distance divide doctor dog door double doubt drag drawer
    dream dress drink drive drop dry dust duty eager early earth east easy edge egg
    eight elbow empty end enemy engine enjoy enough enter equal escape evening event
    exact example exchange exercise expect expert explain eye face fact fair fall
    false family famous farm fast father fault fear feather feel fellow fence few
    field fight figure fill final find fine finger finish fire firm fish fit flag
    flame flat flight float floor flower fly fold follow food foot force forest
    forget fork form fortune forward frame free fresh friend front fruit full fun
    future game garden gate gentle gift girl give glad glass glove goat gold grain
    grass gray green grey ground group grow guard guess guest guide habit hair half
    hall hammer hand happy harbor hard harvest hat heart heat heavy height help
    hidden high hill history hold hole holiday hollow home honest hope horn horse
    hospital hot hour house human humor hunger hurry husband ice idea image inch
    increase ink insect inside invent iron island jacket jelly jewel join journey
    judge juice jump just keen kettle key kind king kitchen knee knife knot
    knowledge ladder lake lamp land language large late laugh lead leaf learn leather
    leave left leg lemon length lesson letter level library lift light limit line
    lion lip liquid list listen little live lock long loose loud love low luck lunch
    machine mad magic main manner map mark market marry mass match meal measure meat
    medicine meet memory metal middle milk mind minute mirror miss mix modern moment
    money monkey month moon morning mother motion mountain mouse mouth move music
    nail name narrow nation natural near neck need needle nerve nest net news night
    noise north nose note notice number nurse ocean offer office oil open opinion
    orange order ordinary organ oven owner page pain paint pair paper parcel parent
    park part party pass past paste path pause peace pen pencil people pepper
    perfect period person picture piece pig pin pipe place plain plan plant plate
    play please plenty plough pocket poem point poison polish pool poor popular
    porch position potato powder power present pretty price print prison private
    prize problem produce profit promise proof proper protest proud pull pump punish
    pure purpose push quarter queen question quick quiet quite rabbit race rail rain
    range rare rat raw reach ready real reason record regret relief remain remember
    rent repair report rest reward rhythm rice rich ride ring ripe river road rock
    roof room root rope rough round royal rule run sad safe sail salt sand save
    school science scissors screen sea season seat second secret seed sell send sense
    serious servant settle shade shadow shake shape share sharp sheep shelf shell
    shine ship shirt shock shoe short shoulder shout side sign silk silver simple
    sister size skin skirt sky sleep slope slow small smell smile smoke smooth snake
    snow soap soft soldier solid song sort sound soup south space speak special
    speed spoon spring square stage stamp star start station steam steel step stick
    stiff stone stop store storm story straight strange street stretch strong
    student study sudden sugar summer sun supper surprise sweet swim table tail
    talk tall taste teacher tent thick thin thread throat thumb ticket tight tired
    title today toe together tomorrow tongue tool tooth top touch tower town toy
    trade train travel tray tree trick trouble truck true trust tune turn twist
    umbrella uncle under unit upper useful valley value vessel village violent visit
    voice wait walk wall warm wash waste watch water wave wax weather week weight
    west wheel whistle white wide wife wild wind window wine winter wire wise woman
    wood wool word worry wrong yard yellow young zebra zero
    """
WORDS: tuple[str, ...] = tuple(_WORDS_TEXT.split())

# Candidate one-token words for padding and shared-prefix suffixes: among the most
# frequent English words, one token (with a leading space) in the usual tokenizers.
# Which of them really are one token is checked under the run's counter.
_FILLER_CANDIDATES_TEXT = """
    the of and to in is that for it as was with be by on not he this are or his
    from at which but have an they you were her she there one all we their has been
    when who will more no if out so said what up its about into than them can only
    other new some could time these two may then do first any my now such like our
    """
_FILLER_CANDIDATES: tuple[str, ...] = tuple(_FILLER_CANDIDATES_TEXT.split())


async def _map(func: Callable[[T], Awaitable[R]], items: Sequence[T]) -> list[R]:
    """``func`` over ``items``, at most ``_CONCURRENCY`` at once; results in order."""
    results: dict[int, R] = {}
    indices = iter(range(len(items)))

    async def worker() -> None:
        for i in indices:
            results[i] = await func(items[i])

    try:
        async with asyncio.TaskGroup() as group:
            for _ in range(min(_CONCURRENCY, len(items))):
                group.create_task(worker())
    except BaseExceptionGroup as failed:
        raise failed.exceptions[0] from None
    return [results[i] for i in range(len(items))]


@dataclass(frozen=True, slots=True)
class TextFitter:
    """Random texts of an exact token count under one counter.

    Build it with :meth:`calibrate`, which measures the counter's mean tokens per
    word and finds which common words count one token each (``fillers``; none under
    the estimate, whose counts do not add up word by word). :meth:`fit` draws about
    enough words, counts, and adjusts: too long drops one word per surplus token (a
    word is never less than one token), a shortfall of up to 8 is padded with
    fillers, a larger one with more words. It stops at the exact count or after 8
    counts, returning the closest text and its count (under the estimate, as close
    as the estimate allows). Usually 1 to 3 counts a text.
    """

    counter: TokenCounter
    tokens_per_word: float
    fillers: tuple[str, ...]  # words that count one token each, in any sequence

    @classmethod
    async def calibrate(cls, counter: TokenCounter) -> TextFitter:
        """Measure ``counter`` on the word lists (a few dozen counts)."""
        total = await counter.count(" ".join(WORDS))
        groups = [
            _FILLER_CANDIDATES[i : i + _FILLER_GROUP]
            for i in range(0, len(_FILLER_CANDIDATES), _FILLER_GROUP)
        ]

        async def one_token_words(group: tuple[str, ...]) -> tuple[str, ...]:
            if await counter.count(" ".join(group)) == len(group):
                return group
            # Twice in a row, so a counter that is not additive (the estimate) fails.
            checks = [await counter.count(f"{word} {word}") for word in group]
            return tuple(w for w, n in zip(group, checks, strict=True) if n == 2)

        found = await _map(one_token_words, groups)
        return cls(
            counter=counter,
            tokens_per_word=max(total / len(WORDS), 1.0),
            fillers=tuple(word for group in found for word in group),
        )

    async def count(self, text: str) -> int:
        """The counter's count; 0 for the empty text without asking."""
        return await self.counter.count(text) if text else 0

    async def fit(self, seed: int, target: int) -> tuple[str, int]:
        """Random words, ``target`` tokens long (or the closest of a few tries)."""
        rng = random.Random(seed)
        words = self.random_words(rng, target)
        best: tuple[int, str, int] | None = None
        for _ in range(_MAX_COUNTS):
            text = " ".join(words)
            got = await self.count(text)
            if best is None or abs(got - target) < best[0]:
                best = (abs(got - target), text, got)
            if got == target:
                break
            if got > target:
                del words[max(len(words) - (got - target), 0) :]
            elif self.fillers and target - got <= _PAD_LIMIT:
                words += [rng.choice(self.fillers) for _ in range(target - got)]
            else:
                words += self.random_words(rng, target - got)
        assert best is not None
        return best[1], best[2]

    def random_words(self, rng: random.Random, tokens: int) -> list[str]:
        """About ``tokens`` tokens' worth of random words (at least one)."""
        n = max(int(tokens / self.tokens_per_word), 1)
        return [rng.choice(WORDS) for _ in range(n)]

    async def fit_distinct(
        self, rng: random.Random, number: int, target: int
    ) -> list[tuple[str, int]]:
        """``number`` fitted texts, redrawing any equal to an earlier one."""
        seeds = [rng.getrandbits(64) for _ in range(number)]
        fitted = await _map(lambda s: self.fit(s, target), seeds)
        for _ in range(_DEDUP_ROUNDS):
            seen: set[str] = set()
            again: list[int] = []
            for i, (text, _count) in enumerate(fitted):
                if text in seen:
                    again.append(i)
                seen.add(text)
            if not again:
                break
            redrawn = await _map(
                lambda s: self.fit(s, target), [rng.getrandbits(64) for _ in again]
            )
            for i, result in zip(again, redrawn, strict=True):
                fitted[i] = result
        return fitted


async def count_each(counter: TokenCounter, texts: Sequence[str]) -> list[int]:
    """Count every text, at most 16 at once; counts in the order of ``texts``.

    The empty text counts 0 without asking the counter.
    """

    async def count(text: str) -> int:
        return await counter.count(text) if text else 0

    return await _map(count, texts)
