"""The exporter's fast path: a target's exposition to servemon text, no Sample objects.

:func:`monitor.normalize.normalize` is the reference: it parses every kept sample into
a prometheus_client :class:`Sample`, maps it, and the exporter then encodes the
result sample by sample. An engine's exposition keeps its shape from one scrape to
the next (the same lines in the same order; only the values move), so
:class:`FastNormalizer` works out once per shape what the reference would publish
(a plan) and afterwards only reads the values:

- making a plan splits each line at its last space and classifies what comes before
  (once per distinct text, remembered): a sample's ``name{labels}`` (labels through
  prometheus_client's ``parse_labels``), a ``# HELP``/``# TYPE`` line, a blank line
  or another comment. It then replays on the classified lines exactly the rules of
  :class:`~monitor.exposition.ExpositionParser` (which lines form which family, which
  families are kept) and of ``normalize`` (first source present wins, the label
  rules, folding: gauges mean, counters max, histograms keep the first copy), and
  records which value goes into which output line;
- a scrape checks, in one pass, that every line starts as the plan expects (a
  sample's ``name{labels}`` and a space, or the whole of any other line), takes the
  rest of each sample line as its value, and writes the output lines from their
  starts (written once per plan and format by prometheus_client's own encoder) and
  the values' text (``floatToGoString``, remembered by value text). Every value,
  dropped families' too, must read as a number, as the reference parses them all.

Whatever the plan does not model — whitespace around a sample line, a label set with
more than one brace, a timestamp, a value that is not a number, a type
prometheus_client refuses — makes :meth:`FastNormalizer.normalize` answer None, and
the caller uses the reference instead, so the fast path never publishes what the
reference would not. The rules are a copy, so each new plan's first result is
checked against the reference's; where they differ, the reference keeps that shape
(and the differential tests in ``tests/unit/test_fastpath.py``, which hold the two to
the same output byte for byte, fail: a change to the reference's rules must be made
here too).

:class:`Renderer` writes families in the scraper's format (Prometheus text 0.0.4 or
OpenMetrics): the engine families of several targets merged by name in order of
first appearance, as the exporter always has, and any other families from line
starts it remembers, where prometheus_client's line depends on a sample's name and
labels alone (else prometheus_client writes the family).
"""

from __future__ import annotations

import math
import re
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from itertools import chain
from operator import itemgetter
from typing import Final

from prometheus_client.metrics_core import METRIC_TYPES, Metric
from prometheus_client.parser import parse_labels
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString

from monitor import names
from monitor.exposition import ExpositionParser
from monitor.names import Series, Source
from monitor.normalize import ENGINE_PREFIXES, KNOWN_FAMILIES, Normalized, normalize

__all__ = ["Encoder", "FastNormalized", "FastNormalizer", "Renderer"]

#: prometheus_client's encoders (``generate_latest``, OpenMetrics' and their partials
#: from ``choose_encoder``): anything with ``collect()`` in, bytes out.
Encoder = Callable[[Collector], bytes]

#: Sample names a family of each type takes, after the family name (as
#: ``monitor.exposition`` groups them).
_ALLOWED: Final = {
    "counter": ("",),
    "gauge": ("",),
    "summary": ("_count", "_sum", ""),
    "histogram": ("_count", "_sum", "_bucket"),
}
_METRIC_NAME: Final = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_UNTYPED: Final = ("untyped", "unknown")  # prometheus_client says "unknown"
_MAX, _MEAN = "max", "mean"
_ZERO = "0.0"  # the value text of a histogram's missing _sum (the reference's 0.0)
_CACHE_LIMIT = 50_000  # classified lines, line starts: cleared when full
_TEXTS_LIMIT = 20_000  # value texts: a generation (kept small: looked up per line)
_FORMATS_LIMIT = 8  # formats (content types) written from memory before forgetting
#: How prometheus_client's encoders write a value (the library leaves it untyped).
_go: Callable[[float], str] = floatToGoString


class _Unsupported(Exception):
    """The exposition has something the plan does not model: use the reference."""


# -- classified lines ------------------------------------------------------------------


class _Line:
    """A classified comment or blank line; what it means may depend on its last word
    (``tail``; None: it does not)."""

    __slots__ = ("tail",)

    def __init__(self, tail: str | None) -> None:
        self.tail = tail


class _Skip(_Line):
    """A blank line, or a comment other than ``# HELP`` and ``# TYPE``."""

    __slots__ = ()


class _Header(_Line):
    """``# HELP name doc`` or ``# TYPE name type``."""

    __slots__ = ("is_help", "name", "text")

    def __init__(self, tail: str, name: str, is_help: bool, text: str) -> None:
        super().__init__(tail)
        self.name = name
        self.is_help = is_help
        self.text = text


class _Sample:
    """``name{labels}``: means the same whatever value follows it."""

    __slots__ = ("engine", "labels", "name")

    def __init__(self, name: str, labels: dict[str, str], engine: str) -> None:
        self.name = name
        self.labels = labels
        self.engine = engine  # the engine whose prefix starts the line, or ""


_Entry = _Skip | _Header | _Sample

#: Every line without a space that the reference takes (blank, or a bare comment); a
#: plan checks such lines' text on every scrape.
_NO_SPACE = _Skip(None)


def _classify(raw: str, key: str, value: str) -> _Entry:
    """What ``raw`` (= ``key`` + space + ``value``, or ``value`` alone where ``key``
    is empty) means to the reference."""
    line = raw.strip()
    if not key:
        if line and line[0] != "#":
            raise _Unsupported("a sample line without a space")
        return _NO_SPACE
    if not line or line[0] == "#":
        parts = line.split(None, 3)
        if len(parts) < 2 or parts[1] not in ("HELP", "TYPE"):
            return _Skip(value)
        if len(parts) < 3:
            raise _Unsupported("HELP or TYPE without a name")
        name = parts[2]
        if '"' in name:
            raise _Unsupported("quoted metric name")
        if parts[1] == "HELP":
            doc = parts[3] if len(parts) == 4 else ""
            if "\\" in doc:
                raise _Unsupported("escape in HELP")
            return _Header(value, name, True, doc)
        if len(parts) < 4:
            raise _Unsupported("TYPE without a type")
        return _Header(value, name, False, parts[3])
    # A sample line means the same whatever value follows its key: the value is
    # checked on every scrape, and nothing else may vary.
    if line != raw:
        raise _Unsupported("whitespace around a sample line")
    brace = line.find("{")
    if brace < 0:
        if line.split() != [key, value]:
            raise _Unsupported("unusual sample line")
        name, labels = key, {}
    else:
        # One brace each way (braces inside label values, or an exemplar, go to the
        # reference), closing the key; one space, then the value.
        end = line.rfind("}")
        if end != len(key) - 1 or line.count("{") != 1 or line.count("}") != 1:
            raise _Unsupported("unusual label set")
        name = line[:brace]
        if not name or name != name.strip():
            raise _Unsupported("unusual metric name")
        try:
            labels = parse_labels(line[brace + 1 : end], False)
        except ValueError as exc:
            raise _Unsupported("labels") from exc
        if "__name__" in labels or line[end + 1 :].split() != [value]:
            raise _Unsupported("unusual sample line")
    if not _METRIC_NAME.fullmatch(name):
        raise _Unsupported("not a metric name")
    engine = next((e for e, p in ENGINE_PREFIXES.items() if name.startswith(p)), "")
    return _Sample(name, labels, engine)


# -- families, as the reference groups them --------------------------------------------


@dataclass(slots=True)
class _Family:
    """A kept family: its samples are line indices."""

    name: str
    doc: str
    type: str
    members: list[int]
    #: A counter declared without ``_total`` has its samples renamed with it.
    rename_total: bool = False


def _family(name: str, doc: str, typ: str, members: list[int]) -> _Family:
    """As ``exposition._build``, and ``Metric()``'s checks."""
    if typ not in METRIC_TYPES and typ != "untyped":
        raise _Unsupported("type prometheus_client refuses")
    rename = False
    if typ == "counter":
        if name.endswith("_total"):
            name = name[:-6]
        else:
            rename = True
    return _Family(name, doc, "unknown" if typ == "untyped" else typ, members, rename)


def _find(families: dict[str, _Family], source: Source) -> _Family | None:
    for candidate in (source.name, source.name.removesuffix("_total")):
        family = families.get(candidate)
        if family is not None:
            return family
    return None


def _detect(counts: Counter[str]) -> str:
    """``normalize.detect_engine`` from the number of lines per engine prefix."""
    best = max(ENGINE_PREFIXES, key=lambda k: counts[k])
    return best if counts[best] else "unknown"


def _dialect(engine: str, families: dict[str, _Family]) -> str:
    if engine != "vllm":
        return engine
    has = families.__contains__
    if has("vllm:gpu_prefix_cache_hit_rate") or has("vllm:num_requests_swapped"):
        return "vllm-v0"
    if has("vllm:kv_cache_usage_perc"):
        return "vllm-0.10" if has("vllm:gpu_cache_usage_perc") else "vllm"
    return "vllm-0.8" if has("vllm:gpu_cache_usage_perc") else "vllm"


# -- the plan --------------------------------------------------------------------------


def _picker(indices: Sequence[int]) -> Callable[[list[str]], Sequence[str]]:
    """``itemgetter`` that always answers a sequence."""
    if not indices:
        return lambda values: ()
    if len(indices) == 1:
        one = indices[0]
        return lambda values: (values[one],)
    return itemgetter(*indices)


@dataclass(slots=True)
class _Chunk:
    """One published family of one target: output slots ``start:end``."""

    series: Series
    start: int
    end: int


@dataclass(slots=True)
class _Plan:
    """What the reference publishes for one shape of exposition."""

    context: tuple[str, str | None, str | None]
    #: Per line, what it starts with: a sample's key and a space, or the whole of
    #: any other line ...
    expect: list[str]
    #: ... and where its value starts (nothing may follow another line).
    rests: list[slice]
    tails: Sequence[str]
    pick_tails: Callable[[list[str]], Sequence[str]]
    pick_samples: Callable[[list[str]], Sequence[str]]
    folds: list[tuple[str, list[int]]]
    #: Each output slot's text from [sample value texts..., fold texts..., zero].
    pick_out: Callable[[list[str]], Sequence[str]]
    #: Each output slot's value text from [line values..., fold values..., zero].
    pick_raw: Callable[[list[str]], Sequence[str]]
    chunks: list[_Chunk]
    slots: list[tuple[str, dict[str, str]]]  # output sample name and labels
    engine: str
    dialect: str
    models: frozenset[str]
    info: dict[str, str]
    #: Per format: each output line's start, with a place for its value after it.
    templates: dict[str, list[str]] = field(default_factory=dict)
    #: Checked against the reference when made; False: the reference's to do.
    verified: bool = False


class _Builder:
    """Replays ``ExpositionParser`` and ``normalize`` on classified lines."""

    def __init__(
        self, seq: list[_Entry], target: str, model: str | None, engine: str
    ) -> None:
        self.seq = seq
        self.target = target
        self.model = model
        self.engine = engine
        self.models: set[str] = set()
        self.slots: list[tuple[str, dict[str, str], int]] = []  # name, labels, ref
        self.folds: list[tuple[str, list[int]]] = []
        self.n_lines = len(seq)

    def sample_name(self, family: _Family, index: int) -> str:
        entry = self.seq[index]
        assert isinstance(entry, _Sample)
        return entry.name + "_total" if family.rename_total else entry.name

    def labels(self, series: Series, labels: dict[str, str]) -> tuple[str, ...]:
        model = labels.get("model_name") or self.model or "unknown"
        self.models.add(model)
        rank = labels.get("engine") or labels.get("dp_rank") or "0"
        values = [self.target, model, self.engine, rank]
        if "reason" in series.labels:
            values.append(labels.get("finished_reason", "stop"))
        return tuple(values)

    def fold(self, op: str, members: list[int]) -> int:
        """The value slot of ``op`` over ``members``, computed per scrape."""
        self.folds.append((op, members))
        return self.n_lines + len(self.folds) - 1

    def map(self, series: Series, family: _Family) -> bool:
        """Adds the slots of ``series`` from ``family``; False where the reference's
        ``_Mapper.map`` answers None."""
        if series.kind == "histogram":
            if family.type != "histogram":
                return False
            self._histogram(series, family)
            return True
        if family.type not in (series.kind, "unknown", "untyped"):
            return False
        groups: dict[tuple[str, ...], list[int]] = defaultdict(list)
        for i in family.members:
            if self.sample_name(family, i).endswith("_created"):
                continue
            entry = self.seq[i]
            assert isinstance(entry, _Sample)
            groups[self.labels(series, entry.labels)].append(i)
        if series.kind == "counter":
            name, op = series.base + "_total", _MAX
        else:
            name, op = series.base, _MEAN
        for key, members in groups.items():
            # A gauge is always folded (a mean of one turns -0.0 into 0.0, as the
            # reference's sum() does); a counter only where copies meet.
            ref = members[0] if op == _MAX and len(members) == 1 else None
            if ref is None:
                ref = self.fold(op, members)
            self.slots.append((name, dict(zip(series.labels, key, strict=True)), ref))
        return True

    def _histogram(self, series: Series, family: _Family) -> None:
        buckets: dict[tuple[str, ...], list[tuple[str, int]]] = defaultdict(list)
        sums: dict[tuple[str, ...], int] = {}
        origin: dict[tuple[str, ...], frozenset[tuple[str, str]]] = {}
        for i in family.members:
            entry = self.seq[i]
            assert isinstance(entry, _Sample)
            plain = {k: v for k, v in entry.labels.items() if k != "le"}
            key = self.labels(series, plain)
            ident = frozenset(plain.items())
            if origin.setdefault(key, ident) != ident:
                continue
            name = self.sample_name(family, i)
            if name.endswith("_bucket"):
                if "le" not in entry.labels:
                    raise _Unsupported("bucket without le")
                buckets[key].append((entry.labels["le"], i))
            elif name.endswith("_sum"):
                sums[key] = i
        for key, pairs in buckets.items():
            labels = dict(zip(series.labels, key, strict=True))
            for le, ref in pairs:
                self.slots.append((series.base + "_bucket", {**labels, "le": le}, ref))
            try:
                counted = float(pairs[0][0]) >= 0  # as add_metric(): not for NaN
            except ValueError as exc:
                raise _Unsupported("le is not a number") from exc
            if counted:
                self.slots.append((series.base + "_count", labels, pairs[-1][1]))
                # -1: the reference's 0.0 for a missing _sum (see finish()).
                ref = sums.get(key, -1)
                self.slots.append((series.base + "_sum", dict(labels), ref))

    def finish(self) -> tuple[list[tuple[str, dict[str, str]]], list[int]]:
        """Output slots and the value index of each (the missing sum last)."""
        zero = self.n_lines + len(self.folds)
        refs = [zero if ref < 0 else ref for _, _, ref in self.slots]
        return [(name, labels) for name, labels, _ in self.slots], refs


@dataclass(slots=True)
class _Parsed:
    """An exposition's lines classified and grouped into kept families."""

    seq: list[_Entry]  # per line
    keys: list[str]  # per line: up to its last space
    families: dict[str, _Family]
    engines: Counter[str]  # sample lines per engine prefix
    samples: list[int]  # the sample lines
    others: list[int]  # the other lines


def _parse(lines: list[str], cache: dict[str, _Entry]) -> _Parsed:
    """``ExpositionParser._fast`` (with ``normalize``'s ``keep``) on classified lines:
    which lines make which family."""
    split = [line.rpartition(" ") for line in lines]
    keys = [key for key, _, _ in split]
    out = _Parsed([], keys, {}, Counter(), [], [])
    families = out.families
    name, doc, typ = "", "", "untyped"
    members: list[int] = []
    allowed: tuple[str, ...] = ()

    def store(name: str, doc: str, typ: str, members: list[int]) -> None:
        """As ``exposition._build``: untyped runs of one name are joined."""
        earlier = families.get(name)
        if earlier is not None and typ == "untyped" and earlier.type in _UNTYPED:
            earlier.members = [*earlier.members, *members]
            return
        family = _family(name, doc, typ, members)
        families[family.name] = family

    def flush() -> None:
        if name and name in KNOWN_FAMILIES:
            store(name, doc, typ, members)

    for i, (raw, (key, _, value)) in enumerate(zip(lines, split, strict=True)):
        entry = cache.get(key) if key else None
        if entry is None or (not isinstance(entry, _Sample) and entry.tail != value):
            entry = _classify(raw, key, value)
            if key:
                if len(cache) >= _CACHE_LIMIT:
                    cache.clear()
                    cache[""] = _NO_SPACE
                cache[key] = entry
        out.seq.append(entry)
        if isinstance(entry, _Sample):
            out.samples.append(i)
            out.engines[entry.engine] += 1
            if entry.name in allowed:
                members.append(i)
                continue
            flush()
            name, doc, typ, members, allowed = "", "", "untyped", [], ()
            if entry.name in KNOWN_FAMILIES:
                store(entry.name, "", "untyped", [i])
            continue
        out.others.append(i)
        if isinstance(entry, _Header):
            if entry.name != name:
                flush()
                name, doc, typ, members = entry.name, "", "untyped", []
                allowed = (name,)
            if entry.is_help:
                doc = entry.text
            else:
                typ = entry.text
                allowed = tuple(name + s for s in _ALLOWED.get(typ, ("",)))
    flush()
    out.engines.pop("", None)
    return out


def _info(
    engine: str, parsed: _Parsed, chosen: dict[str, Source], dialect: str
) -> dict[str, str]:
    """As ``normalize._info``."""
    info: dict[str, str] = {"dialect": dialect}
    cache_config = parsed.families.get("vllm:cache_config_info")
    if cache_config is not None and cache_config.members:
        first = parsed.seq[cache_config.members[0]]
        assert isinstance(first, _Sample)
        for label, key in (
            ("block_size", "block_size"),
            ("num_gpu_blocks", "num_gpu_blocks"),
            ("enable_prefix_caching", "prefix_caching"),
        ):
            if label in first.labels:
                info[key] = first.labels[label]
    queries = chosen.get(names.ENGINE_PREFIX_QUERIES.name)
    if queries is not None:
        family = _find(parsed.families, queries)
        help_text = family.doc if family is not None else ""
        info["prefix_cache_unit"] = "blocks" if "block" in help_text else "tokens"
    elif engine == "sglang":
        info["prefix_cache_unit"] = "tokens"
    return info


def _compile(
    lines: list[str],
    cache: dict[str, _Entry],
    context: tuple[str, str | None, str | None],
) -> _Plan:
    """A plan for the shape of ``lines``: ``normalize``'s rules on :func:`_parse`."""
    target, model, engine_arg = context
    parsed = _parse(lines, cache)
    engine = engine_arg or _detect(parsed.engines)
    builder = _Builder(parsed.seq, target, model, engine)
    chunks: list[_Chunk] = []
    chosen: dict[str, Source] = {}
    for series in names.ENGINE_SERIES:
        for source in series.sources:
            if source.engine != engine:
                continue
            family = _find(parsed.families, source)
            if family is None or not family.members:
                continue
            start = len(builder.slots)
            if not builder.map(series, family):
                continue
            chunks.append(_Chunk(series, start, len(builder.slots)))
            chosen[series.name] = source
            break
    dialect = _dialect(engine, parsed.families)
    slots, refs = builder.finish()
    # Output values come from [sample lines' values..., folds..., zero].
    ordinal = {line: n for n, line in enumerate(parsed.samples)}
    n_lines, n_samples = len(lines), len(parsed.samples)
    out = [ordinal[r] if r < n_lines else r - n_lines + n_samples for r in refs]
    expect = [
        key + " " if isinstance(entry, _Sample) else line
        for key, entry, line in zip(parsed.keys, parsed.seq, lines, strict=True)
    ]
    return _Plan(
        context=context,
        expect=expect,
        rests=[slice(len(start), None) for start in expect],
        tails=("",) * len(parsed.others),
        pick_tails=_picker(parsed.others),
        pick_samples=_picker(parsed.samples),
        folds=builder.folds,
        pick_out=_picker(out),
        pick_raw=_picker(refs),
        chunks=chunks,
        slots=slots,
        engine=engine,
        dialect=dialect,
        models=frozenset(builder.models),
        info=_info(engine, parsed, chosen, dialect),
    )


# -- per target ------------------------------------------------------------------------


@dataclass(slots=True)
class FastNormalized:
    """A target's engine families: what ``normalize`` gives, held as output text.

    ``engine``, ``dialect``, ``models`` and ``info`` are those of
    :class:`~monitor.normalize.Normalized`.
    """

    engine: str
    dialect: str
    models: set[str]
    info: dict[str, str]
    _plan: _Plan
    _values: list[str]  # value text per line, then per fold, then the zero
    _texts: Sequence[str]  # floatToGoString(value) + newline per output slot
    _known: dict[str, dict[_SlotKey, str]]  # line prefixes by format, of the target

    def chunks(
        self, encoder: Encoder, content_type: str
    ) -> list[tuple[Series, list[str]]]:
        """Each published family and its sample lines in ``encoder``'s format, as
        pieces of text (each line's start, then its value)."""
        plan = self._plan
        template = plan.templates.get(content_type)
        if template is None:
            if len(plan.templates) >= _FORMATS_LIMIT:
                plan.templates.clear()
            if len(self._known) >= _FORMATS_LIMIT and content_type not in self._known:
                self._known.clear()
            known = self._known.setdefault(content_type, {})
            template = [""] * (2 * len(plan.slots))
            template[::2] = _prefixes(plan, encoder, known)
            plan.templates[content_type] = template
        pieces = template.copy()
        pieces[1::2] = self._texts
        return [(c.series, pieces[2 * c.start : 2 * c.end]) for c in plan.chunks]

    def families(self) -> list[Metric]:
        """The same as prometheus_client families (as ``normalize`` builds them)."""
        out: list[Metric] = []
        plan = self._plan
        raws = plan.pick_raw(self._values)
        for chunk in plan.chunks:
            series = chunk.series
            family = Metric(series.base, series.doc, series.kind)
            for i in range(chunk.start, chunk.end):
                name, labels = plan.slots[i]
                family.samples.append(Sample(name, dict(labels), float(raws[i])))
            out.append(family)
        return out


_SlotKey = tuple[str, tuple[tuple[str, str], ...]]


def _prefixes(plan: _Plan, encoder: Encoder, known: dict[_SlotKey, str]) -> list[str]:
    """Each output slot's line up to its value, as ``encoder`` writes it; ``known``
    keeps them (for this format) across plans."""
    keys = [(name, tuple(labels.items())) for name, labels in plan.slots]
    missing = [i for i, key in enumerate(keys) if key not in known]
    if missing:
        if len(known) + len(missing) > _CACHE_LIMIT:
            known.clear()
            missing = list(range(len(keys)))
        families: list[Metric] = []
        wanted = set(missing)
        for chunk in plan.chunks:  # each sample in its own family, as published
            series = chunk.series
            family = Metric(series.base, series.doc, series.kind)
            for i in range(chunk.start, chunk.end):
                if i in wanted:
                    name, labels = plan.slots[i]
                    family.samples.append(Sample(name, labels, 0.0))
            families.append(family)
        text = encoder(_Collect(families)).decode("utf-8")
        lines = [line for line in text.split("\n") if line and line[0] != "#"]
        if len(lines) != len(missing) or not all(x.endswith(" 0.0") for x in lines):
            raise RuntimeError("prometheus_client wrote the sample lines unexpectedly")
        for i, line in zip(missing, lines, strict=True):
            known[keys[i]] = line[:-3]
    return [known[key] for key in keys]


def _comparable(families: list[Metric]) -> list[object]:
    """Families in a form that compares exactly: NaN equals NaN, -0.0 is not 0.0."""

    def value(x: float) -> object:
        return "NaN" if math.isnan(x) else (x, math.copysign(1.0, x))

    return [
        (
            f.name,
            f.documentation,
            f.type,
            f.unit,
            [(s.name, s.labels, value(s.value), s.timestamp) for s in f.samples],
        )
        for f in families
    ]


class FastNormalizer:
    """One target's fast path; keep one per target for the exporter's lifetime.

    An exposition whose shape changes on every scrape gains nothing from plans: after
    ``patience`` scrapes in a row that needed a new one (or could not have one), the
    next ``rest`` scrapes go straight to the reference.
    """

    def __init__(self, *, patience: int = 3, rest: int = 20) -> None:
        self._patience = patience
        self._rest = rest
        self._streak = 0  # scrapes in a row that needed a new plan
        self._resting = 0  # scrapes left that go straight to the reference
        self._lines: dict[str, _Entry] = {"": _NO_SPACE}
        self._texts: dict[str, str] = {}
        self._retired: dict[str, str] = {}
        self._known: dict[str, dict[_SlotKey, str]] = {}
        self._plan: _Plan | None = None
        self._reference_parser = ExpositionParser()
        #: Expositions handed back to the reference (None answers).
        self.fallbacks = 0
        #: Plans made (1 for an exposition whose shape never changes).
        self.compiles = 0
        #: Plans whose first result the reference disagreed with (a bug: 0).
        self.disagreements = 0

    def normalize(
        self,
        text: str,
        *,
        target: str,
        model: str | None = None,
        engine: str | None = None,
    ) -> FastNormalized | None:
        """What ``normalize(text, ...)`` gives (without passthrough), or None where
        the reference must do it."""
        if self._resting:
            self._resting -= 1
            self.fallbacks += 1
            return None
        try:
            return self._normalize(text, (target, model, engine))
        except _Unsupported:
            self.fallbacks += 1
            return None

    def _normalize(
        self, text: str, context: tuple[str, str | None, str | None]
    ) -> FastNormalized:
        lines = text.split("\n")
        plan = self._plan
        made = False
        if (
            plan is None
            or plan.context != context
            or len(lines) != len(plan.expect)
            or not all(map(str.startswith, lines, plan.expect))
        ):
            plan, made = self._make(lines, context), True
        values = list(map(str.__getitem__, lines, plan.rests))
        if plan.pick_tails(values) != plan.tails:
            plan, made = self._make(lines, context), True
            values = list(map(str.__getitem__, lines, plan.rests))
        if not made:
            self._streak = 0
            if not plan.verified:
                raise _Unsupported("the reference disagreed with this shape's plan")
        # Every sample's value must be a number, as the reference parses them all.
        texts = self._format(plan.pick_samples(values))
        folded: list[str] = []
        for op, members in plan.folds:
            numbers = [float(values[i]) for i in members]
            folded.append(
                repr(max(numbers) if op == _MAX else sum(numbers) / len(numbers))
            )
        values += folded
        values.append(_ZERO)
        texts += self._format(folded)
        texts.append(_ZERO + "\n")
        result = FastNormalized(
            engine=plan.engine,
            dialect=plan.dialect,
            models=set(plan.models),
            info=dict(plan.info),
            _plan=plan,
            _values=values,
            _texts=plan.pick_out(texts),
            _known=self._known,
        )
        if made:
            plan.verified = self._agrees(result, text, context)
            if not plan.verified:
                self.disagreements += 1
                raise _Unsupported("the reference disagrees with this shape's plan")
        return result

    def _make(
        self, lines: list[str], context: tuple[str, str | None, str | None]
    ) -> _Plan:
        self._streak += 1
        if self._streak >= self._patience:
            self._streak, self._resting = 0, self._rest
        self._plan = plan = _compile(lines, self._lines, context)
        self.compiles += 1
        return plan

    def _agrees(
        self,
        result: FastNormalized,
        text: str,
        context: tuple[str, str | None, str | None],
    ) -> bool:
        """A new plan's first result is the reference's (else the reference keeps
        this shape): the fast path's own rules are a copy, so they are checked."""
        target, model, engine = context
        try:
            theirs = normalize(
                text,
                target=target,
                model=model,
                engine=engine,
                parser=self._reference_parser,
            )
        except (ValueError, KeyError, IndexError):
            return False
        ours = (result.engine, result.dialect, result.models, result.info)
        if ours != (theirs.engine, theirs.dialect, theirs.models, theirs.info):
            return False
        return _comparable(result.families()) == _comparable(theirs.families)

    def _format(self, raws: Sequence[str]) -> list[str]:
        """``floatToGoString(float(raw))`` and a newline, per value text.

        Kept in two generations: the current one is retired once it holds more than
        ``_TEXTS_LIMIT`` texts (new values, say), and what a scrape still uses comes
        back from the retired one without being formatted again.
        """
        texts = self._texts
        try:
            return list(map(texts.__getitem__, raws))
        except KeyError:
            pass
        if len(texts) > _TEXTS_LIMIT:
            self._retired, texts = texts, {}
            self._texts = texts
        retired = self._retired
        for raw in set(raws).difference(texts):
            text = retired.get(raw)
            if text is None:
                if "_" in raw:  # float() takes "1_000"; the exposition format not
                    raise _Unsupported("a value that is not a number")
                try:
                    text = _go(float(raw)) + "\n"
                except ValueError as exc:
                    raise _Unsupported("a value that is not a number") from exc
            texts[raw] = text
        return list(map(texts.__getitem__, raws))


# -- writing several targets -----------------------------------------------------------


class _Collect(Collector):
    """A collector over fixed families, for prometheus_client's encoders."""

    def __init__(self, families: Iterable[Metric]) -> None:
        self._families = list(families)

    def collect(self) -> list[Metric]:
        return self._families


class Renderer:
    """Writes families in a scraper's format (engine families of many targets merged,
    as one text); remembers what prometheus_client wrote for each header and each
    sample's line start, per format."""

    def __init__(self) -> None:
        self._headers: dict[tuple[str, str, str, str], str] = {}
        self._trailers: dict[str, str] = {}
        self._starts: dict[str, dict[_SlotKey, str]] = {}

    def trailer(self, encoder: Encoder, content_type: str) -> str:
        """What ``encoder`` writes after the last family (OpenMetrics' ``# EOF``)."""
        found = self._trailers.get(content_type)
        if found is None:
            if len(self._trailers) >= _FORMATS_LIMIT:  # scrapers ask in few ways
                self._trailers.clear()
                self._headers.clear()
                self._starts.clear()
            found = self._trailers[content_type] = encoder(_Collect([])).decode()
        return found

    def encode(
        self, encoder: Encoder, content_type: str, families: Iterable[Metric]
    ) -> str:
        """``families`` as ``encoder`` writes them, without the trailer."""
        self.trailer(encoder, content_type)  # first: it may forget other formats
        out: list[str] = []
        for family in families:
            lines = self._samples(encoder, content_type, family)
            if lines is None:
                out.append(self._library(encoder, content_type, [family]))
            else:
                out.append(self._header_of(encoder, content_type, family))
                out.append(lines)
        return "".join(out)

    def header(
        self, encoder: Encoder, content_type: str, name: str, doc: str, typ: str
    ) -> str:
        """The ``# HELP`` and ``# TYPE`` lines of a family."""
        key = (content_type, name, doc, typ)
        found = self._headers.get(key)
        if found is None:
            found = self._library(encoder, content_type, [Metric(name, doc, typ)])
            self._headers[key] = found
        return found

    def _header_of(self, encoder: Encoder, content_type: str, family: Metric) -> str:
        return self.header(
            encoder, content_type, family.name, family.documentation, family.type
        )

    def _library(
        self, encoder: Encoder, content_type: str, families: Iterable[Metric]
    ) -> str:
        text = encoder(_Collect(families)).decode("utf-8")
        return text.removesuffix(self.trailer(encoder, content_type))

    def _samples(
        self, encoder: Encoder, content_type: str, family: Metric
    ) -> str | None:
        """The sample lines of ``family`` from remembered line starts; None where the
        encoder's lines depend on more than a sample's name and labels."""
        if family.unit:
            return None
        moved = {family.name + s for s in ("_created", "_gsum", "_gcount")}
        starts = self._starts.setdefault(content_type, {})
        out: list[str] = []
        for sample in family.samples:
            if (
                sample.timestamp is not None
                or sample.exemplar is not None
                or getattr(sample, "native_histogram", None) is not None
                or sample.name in moved  # written after the family in text 0.0.4
                or not isinstance(sample.value, int | float)
            ):
                return None
            key = (sample.name, tuple(sample.labels.items()))
            start = starts.get(key)
            if start is None:
                start = self._start(encoder, content_type, family, sample)
                if len(starts) >= _CACHE_LIMIT:
                    starts.clear()
                starts[key] = start
            out.append(start + _go(sample.value) + "\n")
        return "".join(out)

    def _start(
        self, encoder: Encoder, content_type: str, family: Metric, sample: Sample
    ) -> str:
        """A sample's line up to its value, as ``encoder`` writes it."""
        alone = Metric(family.name, family.documentation, family.type)
        alone.samples.append(Sample(sample.name, sample.labels, 0.0))
        text = self._library(encoder, content_type, [alone])
        header = self._header_of(encoder, content_type, family)
        if not text.startswith(header) or not text.endswith(" 0.0\n"):
            raise RuntimeError("prometheus_client wrote a sample line unexpectedly")
        return text[len(header) : -4]

    def render(
        self,
        results: Iterable[Normalized | FastNormalized],
        encoder: Encoder,
        content_type: str,
    ) -> str:
        """The engine families of ``results`` (targets in order) as one text:
        same-named families merged in order of first appearance, as one family."""
        return "".join(self.pieces(results, encoder, content_type))

    def pieces(
        self,
        results: Iterable[Normalized | FastNormalized],
        encoder: Encoder,
        content_type: str,
    ) -> list[str]:
        """:meth:`render`'s text in pieces."""
        self.trailer(encoder, content_type)  # first: it may forget other formats
        blocks: dict[str, list[str]] = {}
        for result in results:
            if isinstance(result, FastNormalized):
                for series, pieces in result.chunks(encoder, content_type):
                    block = blocks.get(series.base)
                    if block is None:
                        header = self.header(
                            encoder, content_type, series.base, series.doc, series.kind
                        )
                        block = blocks[series.base] = [header]
                    block += pieces
                continue
            for family in result.families:
                if family.unit:
                    raise ValueError("engine families carry no unit")
                header = self._header_of(encoder, content_type, family)
                lines = self._samples(encoder, content_type, family)
                if lines is None:
                    text = self._library(encoder, content_type, [family])
                    if not text.startswith(header):
                        raise RuntimeError("prometheus_client wrote a family oddly")
                    lines = text[len(header) :]
                blocks.setdefault(family.name, [header]).append(lines)
        return list(chain.from_iterable(blocks.values()))
