"""A deterministic word-level tokenizer, so prompt token counts are exact.

A token is a run of word characters or a single other non-space character. Its id is
a stable hash of its text, the same in every process and every run. The output side
draws words from a fixed list; each output token is one word with a leading space,
so re-tokenizing generated text gives back exactly the count the server reported.
"""

from __future__ import annotations

import random
import re
import zlib

__all__ = ["VOCAB_SIZE", "WORDS", "WordTokenizer"]

VOCAB_SIZE = 151_936
_TOKEN = re.compile(r"\w+|[^\w\s]")

_WORDS_TEXT = (
    "the of and to in is that for it as was with be by on not he this are or his "
    "from at which but have an they you were her she there one all we their has "
    "been when who will more no if out so said what up its about into than them can "
    "only other new some could time these two may then do first any my now such "
    "like our over man me even most made after also did many before must through "
    "back years where much your way well down should because each just those people "
    "how too little state good very make world still own see men work long get here "
    "between both life being under never day same another know while last might us "
    "great old year off come since against go came right used take three cache "
    "token batch queue block prefix decode prefill latency engine server request "
    "model kernel "
)
WORDS: tuple[str, ...] = tuple(_WORDS_TEXT.split())


class WordTokenizer:
    """Encode text into stable token ids and generate output tokens."""

    __slots__ = ()

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``."""
        return [
            zlib.crc32(piece.encode("utf-8")) % VOCAB_SIZE
            for piece in _TOKEN.findall(text)
        ]

    def count(self, text: str) -> int:
        """Number of tokens in ``text``."""
        return sum(1 for _ in _TOKEN.finditer(text))

    def output_piece(self, rng: random.Random) -> str:
        """One output token's text: a word with a leading space."""
        return " " + WORDS[rng.randrange(len(WORDS))]
