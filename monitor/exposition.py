"""The one parser of the Prometheus text format in servemon, memoized per line key.

An engine's exposition keeps its lines from one scrape to the next; only the values
move. :class:`ExpositionParser` therefore splits each line at its last space and
remembers what the part before it (the line key, ``name{labels}``) means: a
sample's name and labels. Comment lines (``# HELP``, ``# TYPE``, others) are
remembered whole. Only a line it has not seen is parsed character by character.

It accepts what prometheus_client's parser
(:func:`~prometheus_client.parser.text_string_to_metric_families`) accepts, and
groups samples into families by the same rules (the tests hold the two to the same
result): a ``# HELP`` or ``# TYPE`` line starts a family; a sample whose name the
current family does not take is a family of its own; a counter is named without
``_total`` and its samples with it; a later family of a name replaces an earlier one,
except that untyped ones are joined. Anything else raises ValueError: a sample line
that will not split, a value that is not a number (``1_000`` neither), a label set
that will not parse, a type the library does not know.

A line is *regular* when it is its key, one space and a plain value: then every
scrape of the same shape starts the line with ``key + " "``, and only the value after
it needs reading (see :mod:`servemon.monitor.normalize`). Other sample lines
(timestamps, tabs, surrounding whitespace) are parsed whole and stay as they are.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final, TypeVar

from prometheus_client.metrics_core import METRIC_TYPES, Metric
from prometheus_client.parser import parse_labels
from prometheus_client.samples import Sample

__all__ = ["ExpositionParser", "Family", "Header", "Lines", "SampleKey", "number"]

_METRIC_NAME: Final = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
_WHITESPACE: Final = " \t\n\r\x0b\x0c"
#: Sample names a family of each type takes, after the family name.
_TAKES: Final = {
    "counter": ("",),
    "gauge": ("",),
    "summary": ("_count", "_sum", ""),
    "histogram": ("_count", "_sum", "_bucket"),
}
_ESCAPES: Final = {"\\\\": "\\", "\\n": "\n", '\\"': '"'}
_HELP_ESCAPE: Final = re.compile(r"\\[\\n]")
_LABEL_ESCAPE: Final = re.compile(r'\\[\\n"]')
_CACHE_LIMIT = 50_000  # line keys and comment lines remembered: cleared when full
_V = TypeVar("_V")


def number(text: str) -> float:
    """A sample value as the text format reads it (an integer where it is one).

    Raises ValueError for anything else, ``1_000`` included (``float`` takes it).
    """
    if "_" in text or text != text.strip():
        raise ValueError(f"not a sample value: {text!r}")
    try:
        return int(text)
    except ValueError:
        return float(text)


@dataclass(frozen=True, slots=True, eq=False)
class SampleKey:
    """What a sample line's key means: the sample's name and labels."""

    name: str
    labels: dict[str, str]


@dataclass(frozen=True, slots=True)
class Header:
    """A ``# HELP name doc`` (``is_help``) or ``# TYPE name type`` line."""

    name: str
    is_help: bool
    text: str


Entry = SampleKey | Header | None  # None: a blank line or another comment


@dataclass(slots=True)
class Lines:
    """An exposition's lines, classified."""

    entries: list[Entry]
    #: Per line: the sample's value text ("" for other lines).
    values: list[str]
    #: Per line: what every exposition of the same shape starts it with (a regular
    #: sample's key and a space; the whole of any other line).
    starts: list[str]
    #: The sample lines.
    samples: list[int]
    #: The sample lines that are not regular, with their timestamp text (or None).
    irregular: dict[int, str | None] = field(default_factory=dict)


@dataclass(slots=True)
class Family:
    """A family as prometheus_client names it; its samples are line indices."""

    name: str
    doc: str
    type: str
    members: list[int]
    #: A counter declared without ``_total``: its samples take the suffix.
    rename_total: bool = False


class ExpositionParser:
    """Classifies and groups expositions; keep one per target (it remembers)."""

    def __init__(self, max_cached: int = _CACHE_LIMIT) -> None:
        self._keys: dict[str, SampleKey] = {}
        self._comments: dict[str, Entry] = {}
        self._limit = max_cached

    def classify(self, lines: list[str]) -> Lines:
        """What each line is; raises ValueError where the text format is broken."""
        keys, comments = self._keys, self._comments
        out = Lines([], [], [], [])
        learned = False
        for i, raw in enumerate(lines):
            key, _, value = raw.rpartition(" ")
            entry: Entry = keys.get(key) if key else None
            if entry is not None and _plain(value):
                out.entries.append(entry)
                out.values.append(value)
                out.starts.append(key + " ")
                out.samples.append(i)
                continue
            line = raw.strip()
            if not line or line[0] == "#":
                if raw in comments:
                    entry = comments[raw]
                else:
                    entry = _comment(line)
                    self._remember(comments, raw, entry)
                out.entries.append(entry)
                out.values.append("")
                out.starts.append(raw)
                continue
            name, labels, text, stamp = _sample_line(line)
            entry = SampleKey(name, labels)
            out.entries.append(entry)
            out.values.append(text)
            out.samples.append(i)
            if stamp is None and key and value == text:
                self._remember(keys, key, entry)
                learned = True
                out.starts.append(key + " ")
            else:
                out.starts.append(raw)
                out.irregular[i] = stamp
        if learned and len(self._keys) > len(out.samples):
            # A new shape: keep this exposition's line keys, forget those only
            # older shapes had (a changed label value must not leave them behind).
            current: dict[str, SampleKey] = {}
            for i in out.samples:
                entry = out.entries[i]
                if i not in out.irregular and isinstance(entry, SampleKey):
                    current[out.starts[i][:-1]] = entry
            self._keys = current
        return out

    def _remember(self, cache: dict[str, _V], key: str, entry: _V) -> None:
        if len(cache) >= self._limit:
            cache.clear()
        cache[key] = entry

    def parse(
        self, text: str, keep: Callable[[str], bool] | None = None
    ) -> dict[str, Metric]:
        """Families by name as prometheus_client objects (``keep(name)`` drops)."""
        lines = self.classify(text.split("\n"))
        families = group(lines, keep)
        return {name: metric(lines, family) for name, family in families.items()}


def group(lines: Lines, keep: Callable[[str], bool] | None = None) -> dict[str, Family]:
    """The families of ``lines`` by name, as prometheus_client's parser makes them;
    ``keep(name)`` False: the family is checked, not made."""
    families: dict[str, Family] = {}
    name, doc, typ = "", "", "untyped"
    members: list[int] = []
    takes: tuple[str, ...] = ()

    def store(name: str, doc: str, typ: str, members: list[int]) -> None:
        if typ not in METRIC_TYPES and typ != "untyped":
            raise ValueError(f"invalid metric type: {typ}")
        if keep is not None and not keep(name):
            return
        rename = False
        if typ == "counter":
            if name.endswith("_total"):
                name = name[:-6]
            else:
                rename = True
        typ = "unknown" if typ == "untyped" else typ
        earlier = families.get(name)
        if earlier is not None and typ == "unknown" == earlier.type:
            earlier.members = [*earlier.members, *members]  # untyped runs, joined
            return
        families[name] = Family(name, doc, typ, members, rename)

    for i, entry in enumerate(lines.entries):
        if isinstance(entry, SampleKey):
            if entry.name in takes:
                members.append(i)
                continue
            if name:
                store(name, doc, typ, members)
            name, doc, typ, members, takes = "", "", "untyped", [], ()
            store(entry.name, "", "untyped", [i])
        elif isinstance(entry, Header):
            if entry.name != name:
                if name:
                    store(name, doc, typ, members)
                name, typ, members = entry.name, "untyped", []
                if entry.is_help:
                    takes = (name,)
                else:
                    doc = ""
            if entry.is_help:
                doc = entry.text
            else:
                typ = entry.text
                takes = tuple(name + s for s in _TAKES.get(typ, ("",)))
    if name:
        store(name, doc, typ, members)
    return families


def sample_name(lines: Lines, family: Family, i: int) -> str:
    """The name of sample line ``i`` in ``family`` (a counter's with ``_total``)."""
    entry = lines.entries[i]
    assert isinstance(entry, SampleKey)
    return entry.name + "_total" if family.rename_total else entry.name


def metric(lines: Lines, family: Family) -> Metric:
    """``family`` as the prometheus_client object its parser makes."""
    out = Metric(family.name, family.doc, family.type)
    for i in family.members:
        entry = lines.entries[i]
        assert isinstance(entry, SampleKey)
        stamp = lines.irregular.get(i)
        out.samples.append(
            Sample(
                sample_name(lines, family, i),
                entry.labels,
                number(lines.values[i]),
                None if stamp is None else number(stamp) / 1000,
            )
        )
    return out


# -- one line, character by character ----------------------------------------------


def _plain(value: str) -> bool:
    """``value`` reads as a number on its own (no whitespace in it)."""
    try:
        number(value)
    except (ValueError, OverflowError):
        return False
    return True


def _escaped(text: str, at: int) -> bool:
    """Whether ``text[at]`` follows an odd number of backslashes."""
    n = 0
    while at > n and text[at - 1 - n] == "\\":
        n += 1
    return n % 2 == 1


def _unquoted(text: str, chars: str, start: int = 0) -> int:
    """Where the first of ``chars`` outside double quotes is (from ``start``);
    -1 where there is none."""
    quoted = False
    for i in range(start, len(text)):
        c = text[i]
        if c == '"' and not _escaped(text, i):
            quoted = not quoted
        elif not quoted and c in chars:
            return i
    return -1


def _unquote(text: str) -> tuple[str, bool]:
    """``text`` without its double quotes and escapes; whether it was quoted."""
    quoted = False
    text = text.strip()
    if text[:1] == '"':
        if len(text) == 1 or text[-1] != '"':
            raise ValueError("missing close quote")
        text, quoted = text[1:-1], True
    if "\\" in text:
        text = _LABEL_ESCAPE.sub(lambda m: _ESCAPES[m.group(0)], text)
    return text, quoted


def _split_comment(line: str) -> list[str]:
    """A comment line split at whitespace outside quotes: at most three words and
    the rest of the line."""
    words: list[str] = []
    at = 0
    while at < len(line):
        end = _unquoted(line, _WHITESPACE, at)
        if end == at:
            at += 1
            continue
        if len(words) == 3 or end < 0:
            words.append(line[at:])
            break
        words.append(line[at:end])
        at = end + 1
    return words


def _comment(line: str) -> Entry:
    """A stripped blank or comment line: a header, or None."""
    words = _split_comment(line)
    if len(words) < 2 or (len(words) > 2 and words[1] not in ("HELP", "TYPE")):
        return None
    name = ""
    if len(words) > 2:
        name, quoted = _unquote(words[2])
        if not quoted and not _METRIC_NAME.match(name):
            raise ValueError(f"invalid metric name in {line!r}")
    if words[1] == "HELP":
        doc = words[3] if len(words) == 4 else ""
        if "\\" in doc:
            doc = _HELP_ESCAPE.sub(lambda m: _ESCAPES[m.group(0)], doc)
        return Header(name, True, doc)
    if words[1] == "TYPE":
        if len(words) < 4:
            raise ValueError(f"TYPE without a type: {line!r}")
        return Header(name, False, words[3])
    return None


def _sample_line(line: str) -> tuple[str, dict[str, str], str, str | None]:
    """A stripped sample line: name, labels, value text and timestamp text."""
    brace = _unquoted(line, "{")
    if brace < 0 or " # " in line[:brace]:
        end = _unquoted(line, " \t")
        name = line[:end].strip()
        if not _METRIC_NAME.match(name):
            raise ValueError(f"invalid metric name in {line!r}")
        value, stamp = _value_and_timestamp(line[end + 1 :])
        return name, {}, value, stamp
    name = line[:brace].strip()
    end = _unquoted(line[brace:], "}") + brace
    labels = parse_labels(line[brace + 1 : end], False)
    if not name:
        if "__name__" not in labels:
            raise ValueError(f"a sample without a name: {line!r}")
        name = labels.pop("__name__")
    elif "__name__" in labels:
        raise ValueError(f"metric name given twice: {line!r}")
    value, stamp = _value_and_timestamp(line[end + 1 :])
    return name, labels, value, stamp


def _value_and_timestamp(text: str) -> tuple[str, str | None]:
    """The value and timestamp texts after a sample's name and labels (the first
    and the last word), each checked to be a number."""
    text = text.lstrip()
    words = [w.strip() for w in text.split(" " if " " in text else "\t") if w.strip()]
    if not words:
        raise ValueError("a sample without a value")
    stamp = words[-1] if len(words) > 1 else None
    for word in (words[0], stamp):
        if word is not None and not _plain(word):
            raise ValueError(f"not a sample value: {word!r}")
    return words[0], stamp
